//! Counters of one endpoint: what it sent and received, what it rejected and
//! why, and how many times payload bytes were copied on the way in.

use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

use iota_core::wire::Direction;

use crate::frame::FrameError;

/// Frames and bytes (framing included: prefix, header, padding, payload)
/// of one lane: one direction of traffic (activations, their gradients,
/// weight slices, control).
#[derive(Debug, Default)]
pub struct LaneCounters {
    pub frames_sent: AtomicU64,
    pub bytes_sent: AtomicU64,
    pub frames_received: AtomicU64,
    pub bytes_received: AtomicU64,
}

/// A point-in-time copy of one lane's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LaneSnapshot {
    pub frames_sent: u64,
    pub bytes_sent: u64,
    pub frames_received: u64,
    pub bytes_received: u64,
}

/// The lane's name in metrics.
pub fn lane_name(d: Direction) -> &'static str {
    match d {
        Direction::Activation => "activations",
        Direction::ActivationGrad => "activation_grads",
        Direction::WeightSlice => "weight_slices",
        Direction::Control => "control",
    }
}

#[derive(Debug, Default)]
pub struct Stats {
    pub frames_sent: AtomicU64,
    pub bytes_sent: AtomicU64,
    pub frames_received: AtomicU64,
    pub bytes_received: AtomicU64,
    /// Copies of payload bytes between the socket layer and the consumer,
    /// counted per frame (quinn's decrypted buffer -> pool buffer is one).
    pub payload_copies: AtomicU64,
    pub connects: AtomicU64,
    pub send_failures: AtomicU64,
    /// Per lane, indexed by `Direction as usize`.
    lanes: [LaneCounters; 4],
    rejected: Mutex<BTreeMap<&'static str, u64>>,
}

/// A point-in-time copy of `Stats`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StatsSnapshot {
    pub frames_sent: u64,
    pub bytes_sent: u64,
    pub frames_received: u64,
    pub bytes_received: u64,
    pub payload_copies: u64,
    pub connects: u64,
    pub send_failures: u64,
    /// Per lane, in `Direction::ALL` order.
    pub lanes: [(Direction, LaneSnapshot); 4],
    pub rejected: BTreeMap<&'static str, u64>,
}

impl Default for StatsSnapshot {
    fn default() -> Self {
        StatsSnapshot {
            frames_sent: 0,
            bytes_sent: 0,
            frames_received: 0,
            bytes_received: 0,
            payload_copies: 0,
            connects: 0,
            send_failures: 0,
            lanes: Direction::ALL.map(|d| (d, LaneSnapshot::default())),
            rejected: BTreeMap::new(),
        }
    }
}

/// A miner's wire totals as it leaves them for its launcher
/// (`iota-miner run --stats-out FILE`): lanes by name, rejections by reason.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct WireTotals {
    pub lanes: BTreeMap<String, LaneSnapshot>,
    pub rejected: BTreeMap<String, u64>,
    pub send_failures: u64,
    /// The process's peak resident memory and its device's peak (bytes;
    /// 0: not known), for the launcher's summary and `iota-bench scale`.
    #[serde(default)]
    pub peak_rss_bytes: u64,
    #[serde(default)]
    pub peak_device_bytes: u64,
    /// The stage it held at the end.
    #[serde(default)]
    pub stage: Option<u32>,
    /// Whether that stage recomputed activations in the backward.
    #[serde(default)]
    pub recomputed: bool,
    /// Where its stage worker's time went, by kind of input.
    #[serde(default)]
    pub step_times: StepTimes,
}

/// Time spent on one kind of input, and how many were handled.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Busy {
    pub micros: u64,
    pub count: u64,
}

impl Busy {
    pub fn add(&mut self, d: std::time::Duration) {
        self.micros = self.micros.saturating_add(u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
        self.count = self.count.saturating_add(1);
    }
    pub fn seconds(&self) -> f64 {
        self.micros as f64 / 1e6
    }
}

/// A stage worker's time by kind of input (what `iota-bench scale` puts
/// beside one process's step time, to tell a slow stage from a waiting one).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StepTimes {
    /// Micro-batches started at the head, and activations in.
    pub forward: Busy,
    /// Activation gradients in (the backward, and the optimizer when due).
    pub backward: Busy,
    /// Weight slices in (the merge's reduce).
    pub weight_slice: Busy,
    /// Orchestrator commands (phases, merge plans, uploads; routes past
    /// the head).
    pub command: Busy,
}

impl StepTimes {
    /// Forward and backward seconds per micro-batch: the stage's compute
    /// for one micro-batch (None before any). The last stage has no
    /// backward inputs: its forward computes the loss and the backward.
    pub fn seconds_per_micro_batch(&self) -> Option<f64> {
        let n = self.backward.count.max(self.forward.count);
        (n > 0).then(|| (self.forward.seconds() + self.backward.seconds()) / n as f64)
    }
}

impl WireTotals {
    /// Bytes sent across stage boundaries: activations and their gradients.
    pub fn boundary_bytes_sent(&self) -> u64 {
        [Direction::Activation, Direction::ActivationGrad]
            .iter()
            .filter_map(|d| self.lanes.get(lane_name(*d)))
            .map(|l| l.bytes_sent)
            .sum()
    }
}

impl StatsSnapshot {
    pub fn wire_totals(&self) -> WireTotals {
        WireTotals {
            lanes: self.lanes.iter().map(|(d, l)| (lane_name(*d).to_string(), *l)).collect(),
            rejected: self.rejected.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
            send_failures: self.send_failures,
            peak_rss_bytes: 0,
            peak_device_bytes: 0,
            stage: None,
            recomputed: false,
            step_times: StepTimes::default(),
        }
    }

    pub fn rejected_total(&self) -> u64 {
        self.rejected.values().sum()
    }
    pub fn rejected(&self, kind: &str) -> u64 {
        self.rejected.get(kind).copied().unwrap_or(0)
    }
}

impl Stats {
    /// A frame of `wire_bytes` (framing included) went out on `lane`.
    pub fn sent(&self, lane: Direction, wire_bytes: u64) {
        add(&self.frames_sent, 1);
        add(&self.bytes_sent, wire_bytes);
        let l = &self.lanes[lane as usize];
        add(&l.frames_sent, 1);
        add(&l.bytes_sent, wire_bytes);
    }

    /// A frame of `wire_bytes` (framing included) was accepted on `lane`.
    pub fn received(&self, lane: Direction, wire_bytes: u64) {
        add(&self.frames_received, 1);
        add(&self.bytes_received, wire_bytes);
        let l = &self.lanes[lane as usize];
        add(&l.frames_received, 1);
        add(&l.bytes_received, wire_bytes);
    }

    pub fn reject(&self, e: &FrameError) {
        *self.rejected.lock().entry(e.kind()).or_default() += 1;
    }

    pub fn snapshot(&self) -> StatsSnapshot {
        let l = |a: &AtomicU64| a.load(Ordering::SeqCst);
        StatsSnapshot {
            frames_sent: l(&self.frames_sent),
            bytes_sent: l(&self.bytes_sent),
            frames_received: l(&self.frames_received),
            bytes_received: l(&self.bytes_received),
            payload_copies: l(&self.payload_copies),
            connects: l(&self.connects),
            send_failures: l(&self.send_failures),
            lanes: Direction::ALL.map(|d| {
                let c = &self.lanes[d as usize];
                let snap = LaneSnapshot {
                    frames_sent: l(&c.frames_sent),
                    bytes_sent: l(&c.bytes_sent),
                    frames_received: l(&c.frames_received),
                    bytes_received: l(&c.bytes_received),
                };
                (d, snap)
            }),
            rejected: self.rejected.lock().clone(),
        }
    }
}

/// This process's peak resident set (bytes), as the kernel counts it.
pub fn peak_rss_bytes() -> u64 {
    // SAFETY: getrusage fills the struct it is given; zeroed is a valid one.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } != 0 {
        return 0;
    }
    // Linux reports kilobytes.
    (ru.ru_maxrss.max(0) as u64).saturating_mul(1024)
}

pub(crate) fn add(a: &AtomicU64, n: u64) {
    a.fetch_add(n, Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn step_times_add_up_per_micro_batch_and_old_totals_still_read() {
        let mut t = StepTimes::default();
        assert_eq!(t.seconds_per_micro_batch(), None, "nothing yet");
        let mut tail = StepTimes::default();
        tail.forward.add(Duration::from_millis(50));
        assert_eq!(tail.seconds_per_micro_batch(), Some(0.05), "the last stage: forward and backward in one");
        for _ in 0..4 {
            t.forward.add(Duration::from_millis(30));
            t.backward.add(Duration::from_millis(70));
        }
        t.command.add(Duration::from_secs(2));
        assert_eq!(t.forward, Busy { micros: 120_000, count: 4 });
        let per = t.seconds_per_micro_batch().unwrap();
        assert!((per - 0.1).abs() < 1e-9, "{per}");
        // Commands are not compute.
        assert!((t.command.seconds() - 2.0).abs() < 1e-9);
        let mut b = Busy { micros: u64::MAX - 1, count: 0 };
        b.add(Duration::from_secs(1));
        assert_eq!(b.micros, u64::MAX, "saturates");
        // A miner built before the field leaves totals without it.
        let old = r#"{"lanes":{},"rejected":{},"send_failures":0}"#;
        let w: WireTotals = serde_json::from_str(old).unwrap();
        assert_eq!(w.step_times, StepTimes::default());
        let round: WireTotals =
            serde_json::from_str(&serde_json::to_string(&WireTotals { step_times: t, ..w }).unwrap()).unwrap();
        assert_eq!(round.step_times, t);
    }

    #[test]
    fn the_peak_resident_set_counts_memory_once_touched() {
        let before = peak_rss_bytes();
        assert!(before > 0, "the kernel reports a peak");
        let big = vec![1u8; 96 << 20];
        std::hint::black_box(&big);
        let after = peak_rss_bytes();
        assert!(after >= (96 << 20) && after >= before, "{before} -> {after}");
    }
}
