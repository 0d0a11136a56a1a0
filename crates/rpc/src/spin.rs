//! Spinning before sleeping. A reader about to sleep until its peer's bytes arrive (a
//! service thread between rounds, a client waiting for its reply) first checks the
//! socket for a little while. On a VM a sleeping CPU is woken by an inter-processor
//! interrupt that exits to the hypervisor, which costs more than a metadata RPC's own
//! work: profiled here, a single-threaded native create took 183 µs with each side
//! woken from sleep and 84 µs with both pinned to one CPU. A reader still looking
//! sees the bytes at once. Between checks the spinner yields the CPU to any thread
//! that wants it, and it stops spinning for a while after a few empty spins, so an
//! idle peer costs little.
//!
//! Measured here (docs/BENCHMARKS.md, "Spinning before sleeping") it triples a
//! single-threaded native client's creates and speeds md easy through the mount by
//! 9-26%; md hard came out level or ahead in two sittings of three.
//! `LODE_SPIN_US=0` in a process's environment turns it off there.

use lode_base::limits;
use std::sync::OnceLock;
use std::time::Duration;

/// How long a reader spins before it sleeps: [`limits::SPIN_US`], or `LODE_SPIN_US`
/// from the environment (0: never).
fn configured() -> Duration {
    static US: OnceLock<u64> = OnceLock::new();
    Duration::from_micros(*US.get_or_init(|| {
        std::env::var("LODE_SPIN_US")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(limits::SPIN_US)
    }))
}

/// Whether a reader about to wait for its peer spins first, from how its last spins
/// went: it spins while spinning finds bytes, and after [`limits::SPIN_MISSES`] empty
/// spins in a row sleeps at once for [`limits::SPIN_REST`] waits before it tries
/// again.
pub struct Spin {
    budget: Duration,
    misses: u32,
    rest: u32,
}

impl Default for Spin {
    fn default() -> Self {
        Spin::with_budget(configured())
    }
}

impl Spin {
    /// A policy spinning up to `budget` (zero: never).
    pub fn with_budget(budget: Duration) -> Spin {
        Spin {
            budget,
            misses: 0,
            rest: 0,
        }
    }

    /// How long to spin before this wait (zero: sleep at once).
    pub fn budget(&mut self) -> Duration {
        if self.budget.is_zero() {
            return Duration::ZERO;
        }
        if self.rest > 0 {
            self.rest -= 1;
            return Duration::ZERO;
        }
        self.budget
    }

    /// Whether the spin found bytes.
    pub fn record(&mut self, hit: bool) {
        if hit {
            self.misses = 0;
        } else {
            self.misses += 1;
            if self.misses >= limits::SPIN_MISSES {
                self.misses = 0;
                self.rest = limits::SPIN_REST;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spinning_rests_after_misses_and_resumes() {
        let b = Duration::from_micros(100);
        let mut s = Spin::with_budget(b);
        for _ in 0..limits::SPIN_MISSES {
            assert_eq!(s.budget(), b);
            s.record(false);
        }
        for _ in 0..limits::SPIN_REST {
            assert_eq!(s.budget(), Duration::ZERO);
        }
        assert_eq!(s.budget(), b);
        // A hit forgets the misses before it.
        s.record(false);
        s.record(true);
        for _ in 0..limits::SPIN_MISSES - 1 {
            s.record(false);
        }
        assert_eq!(s.budget(), b);
        // Off: never spins.
        assert_eq!(Spin::with_budget(Duration::ZERO).budget(), Duration::ZERO);
    }
}
