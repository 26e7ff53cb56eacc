//! Small timing helpers shared by the benchmarks.

use std::time::{Duration, Instant};

/// Runs `f` `warmup` times untimed, then `iters` times; returns the sorted
/// durations.
pub fn sample(warmup: usize, iters: usize, mut f: impl FnMut()) -> Vec<Duration> {
    for _ in 0..warmup {
        f();
    }
    let mut v: Vec<Duration> = (0..iters)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .collect();
    v.sort();
    v
}

pub fn median(v: &[Duration]) -> Duration {
    v[v.len() / 2]
}

pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}
