//! How long a miner takes from registering to its first finished
//! micro-batch, and where the time went: logged once, so a slow start
//! (IOTA's 1.5B stages take seconds to build and load) says why.

use std::time::{Duration, Instant};

/// The start-up phases a worker times.
#[derive(Debug)]
pub struct Startup {
    /// When the worker was made: just after the miner registered.
    registered: Instant,
    /// When its (first) assignment arrived.
    assigned: Option<Instant>,
    /// Building the stage (weights initialised), loading announced weights,
    /// loading the corpus.
    pub build: Duration,
    pub weights: Duration,
    pub corpus: Duration,
    /// When the stage was ready to compute.
    ready: Option<Instant>,
    /// When its first micro-batch was routed to it.
    routed: Option<Instant>,
    reported: bool,
}

impl Default for Startup {
    fn default() -> Self {
        Startup {
            registered: Instant::now(),
            assigned: None,
            build: Duration::ZERO,
            weights: Duration::ZERO,
            corpus: Duration::ZERO,
            ready: None,
            routed: None,
            reported: false,
        }
    }
}

/// A start-up slower than this names its largest part.
pub const SLOW_STARTUP: Duration = Duration::from_secs(5);

impl Startup {
    pub fn assigned(&mut self) {
        self.assigned.get_or_insert_with(Instant::now);
    }

    pub fn ready(&mut self) {
        self.ready.get_or_insert_with(Instant::now);
    }

    pub fn routed(&mut self) {
        self.routed.get_or_insert_with(Instant::now);
    }

    /// The first micro-batch finished: the line to log, once.
    pub fn finished(&mut self) -> Option<String> {
        if self.reported {
            return None;
        }
        self.reported = true;
        let now = Instant::now();
        let total = now - self.registered;
        let assigned = self.assigned.map_or(Duration::ZERO, |t| t - self.registered);
        let ready = self.ready.unwrap_or(now);
        let routed = self.routed.unwrap_or(now).max(ready);
        // Between being ready and the first route the swarm was forming
        // (other miners registering, the run's first phase).
        let waited = routed - ready;
        let first = now - routed;
        let parts = [
            ("waiting for an assignment", assigned),
            ("building the stage", self.build),
            ("loading its weights", self.weights),
            ("loading the corpus", self.corpus),
            ("waiting for the swarm to form", waited),
            ("computing the first micro-batch", first),
        ];
        let list: Vec<String> = parts.iter().map(|(what, d)| format!("{what} {:.2}s", d.as_secs_f64())).collect();
        let mut line =
            format!("start-up: first micro-batch {:.2}s after registering ({})", total.as_secs_f64(), list.join(", "));
        if total > SLOW_STARTUP
            && let Some((what, d)) = parts.iter().max_by_key(|(_, d)| *d)
        {
            line += &format!("; over {}s, mostly {what} ({:.2}s)", SLOW_STARTUP.as_secs(), d.as_secs_f64());
        }
        Some(line)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_micro_batch_is_reported_once_with_its_parts_and_a_slow_start_names_the_largest() {
        let registered = Instant::now() - Duration::from_secs(9);
        let assigned = Some(registered + Duration::from_secs(1));
        let mut s = Startup { registered, assigned, ..Startup::default() };
        s.build = Duration::from_secs(6);
        s.ready();
        s.routed();
        let line = s.finished().expect("the first one is reported");
        assert!(line.contains("building the stage 6.00s"), "{line}");
        assert!(line.contains("mostly building the stage"), "{line}");
        assert_eq!(s.finished(), None, "once");
        let mut quick = Startup::default();
        let line = quick.finished().unwrap();
        assert!(!line.contains("mostly"), "{line}");
    }
}
