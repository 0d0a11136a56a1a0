//! Latency samples and their summary.

/// Per-operation latencies of one phase, in nanoseconds.
#[derive(Default, Clone, Debug)]
pub struct Latencies(pub Vec<u64>);

impl Latencies {
    /// The `q` quantile (0..=1), 0 if empty.
    pub fn quantile(&mut self, q: f64) -> u64 {
        if self.0.is_empty() {
            return 0;
        }
        self.0.sort_unstable();
        let i = ((self.0.len() - 1) as f64 * q).round() as usize;
        self.0[i]
    }

    /// The largest sample.
    pub fn max(&self) -> u64 {
        self.0.iter().copied().max().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn quantiles() {
        let mut l = super::Latencies((1..=100).collect());
        assert_eq!(l.quantile(0.5), 51);
        assert_eq!(l.quantile(0.99), 99);
        assert_eq!(l.max(), 100);
        assert_eq!(super::Latencies::default().quantile(0.5), 0);
    }
}
