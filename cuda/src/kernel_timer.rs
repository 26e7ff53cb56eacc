//! Per-kernel stream time of a `CudaBackend` (`iota-bench stage-gpu
//! --kernels`): while on, every kernel launch, GEMM and device copy the
//! backend issues sits between two CUDA events, so the next bottleneck is
//! visible without Nsight. Off by default: then it costs one atomic load
//! per launch.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use cudarc::driver::{CudaEvent, CudaStream};

/// One kernel's (or GEMM kind's) share of the work timed.
#[derive(Clone, Debug, PartialEq)]
pub struct KernelTime {
    pub name: &'static str,
    pub launches: usize,
    /// Stream time between its events, summed (milliseconds).
    pub ms: f64,
}

#[derive(Default)]
pub(crate) struct KernelTimer {
    on: AtomicBool,
    marks: Mutex<Vec<(&'static str, CudaEvent, CudaEvent)>>,
}

impl KernelTimer {
    pub(crate) fn set(&self, on: bool) {
        self.on.store(on, Ordering::Relaxed);
    }

    /// Runs `f`, which issues work named `name` on `stream`, between two
    /// events when timing is on.
    pub(crate) fn timed<R>(&self, stream: &CudaStream, name: &'static str, f: impl FnOnce() -> R) -> R {
        if !self.on.load(Ordering::Relaxed) {
            return f();
        }
        let flags = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
        let start = stream.record_event(flags);
        let r = f();
        let end = stream.record_event(flags);
        if let (Ok(start), Ok(end)) = (start, end) {
            self.marks.lock().unwrap_or_else(|p| p.into_inner()).push((name, start, end));
        }
        r
    }

    /// Waits for the timed work and returns it by name, most time first;
    /// the marks are cleared.
    pub(crate) fn take(&self) -> Vec<KernelTime> {
        let marks = std::mem::take(&mut *self.marks.lock().unwrap_or_else(|p| p.into_inner()));
        if let Some((_, _, end)) = marks.last() {
            // Events complete in stream order: the last one covers the rest.
            let _ = end.synchronize();
        }
        summarize(marks.iter().filter_map(|(name, s, e)| s.elapsed_ms(e).ok().map(|ms| (*name, ms as f64))))
    }
}

/// Samples grouped by name: launches and summed time, most time first
/// (ties by name, so the order is stable).
pub fn summarize(samples: impl IntoIterator<Item = (&'static str, f64)>) -> Vec<KernelTime> {
    let mut by: Vec<KernelTime> = Vec::new();
    for (name, ms) in samples {
        match by.iter_mut().find(|k| k.name == name) {
            Some(k) => {
                k.launches += 1;
                k.ms += ms;
            }
            None => by.push(KernelTime { name, launches: 1, ms }),
        }
    }
    by.sort_by(|a, b| b.ms.total_cmp(&a.ms).then(a.name.cmp(b.name)));
    by
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_group_by_name_most_time_first() {
        let k = summarize([("cast_bf16", 0.5), ("gemm", 2.0), ("cast_bf16", 0.25), ("rope", 0.1), ("gemm", 1.0)]);
        let names: Vec<_> = k.iter().map(|k| (k.name, k.launches)).collect();
        assert_eq!(names, [("gemm", 2), ("cast_bf16", 2), ("rope", 1)]);
        assert!((k[0].ms - 3.0).abs() < 1e-12 && (k[1].ms - 0.75).abs() < 1e-12);
        assert!(summarize([]).is_empty());
        // Equal times: by name.
        let tie = summarize([("b", 1.0), ("a", 1.0)]);
        assert_eq!(tie[0].name, "a");
    }
}
