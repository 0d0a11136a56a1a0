//! Latency samples and summaries over iterations.

/// Per-operation latencies, in nanoseconds.
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

/// (max, min, mean, population stddev) of a series.
pub fn summary(v: &[f64]) -> (f64, f64, f64, f64) {
    if v.is_empty() {
        return (0.0, 0.0, 0.0, 0.0);
    }
    let max = v.iter().copied().fold(f64::MIN, f64::max);
    let min = v.iter().copied().fold(f64::MAX, f64::min);
    let mean = v.iter().sum::<f64>() / v.len() as f64;
    let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / v.len() as f64;
    (max, min, mean, var.sqrt())
}

#[cfg(test)]
mod tests {
    #[test]
    fn quantiles_and_summary() {
        let mut l = super::Latencies((1..=100).collect());
        assert_eq!(l.quantile(0.5), 51);
        assert_eq!(l.quantile(0.99), 99);
        assert_eq!(l.max(), 100);
        assert_eq!(super::Latencies::default().quantile(0.5), 0);
        let (max, min, mean, sd) = super::summary(&[2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0]);
        assert_eq!((max, min, mean, sd), (9.0, 2.0, 5.0, 2.0));
    }
}
