//! The one source of time: every read of wall time in sandflow's host goes
//! through a [`Clock`].

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Tells the time.
pub trait Clock: Send + Sync + std::fmt::Debug {
    /// Milliseconds since the Unix epoch.
    fn now_ms(&self) -> i64;

    /// Whether time moves only when a test says so ([`VirtualClock`]): then
    /// drivers never wait on a real timer.
    fn is_virtual(&self) -> bool {
        false
    }
}

/// The machine's clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> i64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0)
    }
}

/// A clock that moves only forward, and only when told.
#[derive(Debug, Default)]
pub struct VirtualClock {
    ms: AtomicI64,
}

impl VirtualClock {
    /// A clock at `start_ms`.
    pub fn new(start_ms: i64) -> VirtualClock {
        VirtualClock {
            ms: AtomicI64::new(start_ms),
        }
    }

    /// Sets the time; going backwards is an error naming both times.
    pub fn set(&self, ms: i64) -> Result<(), String> {
        let now = self.ms.load(Ordering::SeqCst);
        if ms < now {
            return Err(format!(
                "time cannot go backwards: it is {now} ms, and {ms} ms is earlier"
            ));
        }
        self.ms.store(ms, Ordering::SeqCst);
        Ok(())
    }

    /// Moves the time forward by `d`.
    pub fn advance(&self, d: Duration) {
        self.ms.fetch_add(
            i64::try_from(d.as_millis()).unwrap_or(i64::MAX),
            Ordering::SeqCst,
        );
    }
}

impl Clock for VirtualClock {
    fn now_ms(&self) -> i64 {
        self.ms.load(Ordering::SeqCst)
    }

    fn is_virtual(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn virtual_time_moves_forward_only() {
        let c = VirtualClock::new(1_000);
        c.advance(Duration::from_millis(250));
        assert_eq!(c.now_ms(), 1_250);
        assert!(c.set(2_000).is_ok());
        assert!(c.set(1_999).unwrap_err().contains("backwards"));
        assert_eq!(c.now_ms(), 2_000);
        assert!(SystemClock.now_ms() > 1_600_000_000_000);
    }
}
