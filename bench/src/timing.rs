//! Timing helpers shared by the benchmarks.
//!
//! Shared cloud VMs lose CPU to their neighbours ("steal"), which makes wall
//! time swing by 1.5x between runs. Benchmarks therefore report wall time and
//! process CPU time (all threads; steal is not charged to it) side by side,
//! and compare ours with its baseline in alternating pairs.

use std::time::{Duration, Instant};

/// CPU time consumed by this process so far (all threads).
pub fn process_cpu_time() -> Duration {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec through a valid pointer.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return Duration::ZERO;
    }
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Wall and CPU time of one run of `f`.
#[derive(Clone, Copy, Debug)]
pub struct Sample {
    pub wall: Duration,
    pub cpu: Duration,
}

pub fn measure(f: impl FnOnce()) -> Sample {
    let (c0, t0) = (process_cpu_time(), Instant::now());
    f();
    Sample { wall: t0.elapsed(), cpu: process_cpu_time() - c0 }
}

pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}
