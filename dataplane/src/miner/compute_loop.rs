//! The compute thread of a miner: it feeds the stage worker its inputs
//! (commands, frames, ticks), forwards what the worker emits, times each
//! step for the metrics, and applies the test tools' slowdowns and faults.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use anyhow::Result;
use iota_core::wire::Direction;
use iota_protocol::pb::{self, command::Kind};
use tokio::sync::mpsc;
use tracing::warn;

use crate::miner_metrics::StepKind;

use super::events::{Input, Output};
use super::worker::{self, Worker};
use super::{Adversary, merge};

/// Where a fault-injecting miner stops dead (no goodbye, no more
/// heartbeats), for the chaos tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CrashPoint {
    /// When its epoch's merge plan arrives: it uploaded, and the plan
    /// counts on it.
    MergePlan,
    /// When the epoch's Uploading phase begins: it trained, and its
    /// upload never comes.
    Uploading,
}

/// What a miner did, returned when the run ends.
#[derive(Clone, Debug, PartialEq)]
pub struct MinerSummary {
    pub peer: iota_core::PeerId,
    pub stage: u32,
    pub optimizer_steps: u64,
    pub params: Vec<f32>,
    pub rejected_frames: u64,
    /// Time its stage worker spent handling frames and commands (its
    /// compute, merges and uploads; what validation is weighed against).
    pub compute: std::time::Duration,
    /// What its transport sent and received, by lane.
    pub transport: crate::stats::StatsSnapshot,
    /// The most device memory it held (a GPU's pool high-water mark, or
    /// the most its free memory showed in use); 0 on the CPU.
    pub peak_device_bytes: u64,
    /// Whether its stage recomputed activations in the backward
    /// (`--recompute`).
    pub recomputed: bool,
    /// Its stage worker's time by kind of input.
    pub step_times: crate::stats::StepTimes,
}

/// What the compute thread talks through.
/// Reads the device's memory (in use, in all; bytes).
pub(super) type DeviceMemoryProbe = Box<dyn Fn() -> Option<(u64, u64)> + Send>;

pub(super) struct ComputeIo {
    pub(super) in_rx: mpsc::Receiver<Input>,
    pub(super) out_tx: mpsc::Sender<Output>,
    pub(super) stop: Arc<AtomicBool>,
    pub(super) crash_at: Option<CrashPoint>,
    pub(super) tokens: Arc<AtomicU64>,
    pub(super) in_flight: Arc<AtomicU32>,
    /// The epoch the worker is in (heartbeats and `/metrics` read it).
    pub(super) epoch: Arc<AtomicU64>,
    /// A fault-injecting merge to use instead of the configured one.
    pub(super) fault_merge: Option<Box<dyn merge::Merge>>,
    pub(super) adversary: Option<Adversary>,
    pub(super) commitments: Arc<parking_lot::Mutex<iota_core::commitment::Commitments>>,
    pub(super) sent: Arc<crate::sent_frames::SentFrames>,
    pub(super) evidence_bytes: usize,
    pub(super) evidence_frame_bytes: usize,
    pub(super) evidence_spill: Option<super::evidence_log::SpillDir>,
    pub(super) slowdown: u32,
    pub(super) min_frame: Duration,
    pub(super) metrics: crate::miner_metrics::MinerMetrics,
    /// The device's memory (in use, in all), where there is a device.
    pub(super) device_memory: Option<DeviceMemoryProbe>,
    /// The device memory pool's high-water mark (bytes), where there is one.
    pub(super) device_high_water: Option<Box<dyn Fn() -> Option<u64> + Send>>,
}

/// The compute thread's loop: feed the worker, forward what it emits,
/// stop when the run is done or the miner stops.
pub(super) fn compute_loop<B: iota_model::Backend + 'static>(
    mut w: Worker<B>,
    mut io: ComputeIo,
) -> Result<MinerSummary> {
    equip(&mut w, &mut io);
    let mut out = Vec::new();
    let mut meters = Meters::default();
    let mut coin = iota_core::Rng::derived(0xf1a6, &[u64::from_le_bytes(w.peer().0[..8].try_into().unwrap())]);
    while let Some(input) = io.in_rx.blocking_recv() {
        if crashes_here(io.crash_at, &input) {
            warn!(at = ?io.crash_at, "crashing, as asked (fault injection)");
            break;
        }
        if adversary_ignores(io.adversary, &input, &mut coin) {
            continue;
        }
        let work = matches!(&input, Input::Frame(_) | Input::Command(Kind::Route(_)));
        let kind = step_kind(&input, w.is_head());
        meters.observe_merge_phase(&input, &io.metrics);
        let t0 = std::time::Instant::now();
        if let Err(e) = w.handle(input, &mut out) {
            if e.downcast_ref::<worker::StageDoesNotFit>().is_some() {
                return Err(e);
            }
            warn!(error = %format!("{e:#}"), "stage worker");
        }
        io.epoch.store(w.epoch(), Ordering::Relaxed);
        meters.observe_step(kind, t0.elapsed(), &io);
        pace(&io, work, t0);
        for o in out.drain(..) {
            if io.out_tx.blocking_send(o).is_err() {
                break;
            }
        }
        if w.done || io.stop.load(Ordering::SeqCst) {
            break;
        }
    }
    let stage = w.stage();
    Ok(MinerSummary {
        peer: w.peer(),
        stage: stage.map_or(0, |s| s.spec().index as u32),
        optimizer_steps: w.steps,
        params: stage.map(|s| s.params_host()).unwrap_or_default(),
        rejected_frames: w.rejected_frames,
        compute: meters.compute,
        // Filled in once the last frames are out.
        transport: Default::default(),
        // The memory pool's high-water mark is this process's own; the free
        // memory is the whole device's, which other processes on a shared
        // GPU fill too (six miners on one H200 each read ~83 GiB), so it is
        // only the fallback where the pool does not answer.
        peak_device_bytes: io
            .device_high_water
            .as_ref()
            .and_then(|f| f())
            .filter(|&h| h > 0)
            .unwrap_or(meters.device_peak),
        recomputed: stage.is_some_and(|s| s.recompute()),
        step_times: meters.step_times,
    })
}

/// Hands the worker what it shares with the async side: counters,
/// commitments, the evidence log, a fault-injecting merge, its adversary.
fn equip<B: iota_model::Backend + 'static>(w: &mut Worker<B>, io: &mut ComputeIo) {
    if let Some(m) = io.fault_merge.take() {
        w.set_merge(m);
    }
    w.tokens = io.tokens.clone();
    w.in_flight = io.in_flight.clone();
    w.commitments = io.commitments.clone();
    // A validated sparse merge's records of what it sent go beside the
    // evidence's snapshots rather than in memory.
    if let Some(spill) = &io.evidence_spill {
        w.merge_records_in(spill.dir().to_path_buf());
    }
    let log = super::evidence_log::EvidenceLog::with_spill(io.evidence_bytes, io.evidence_spill.take())
        .with_frame_budget(io.evidence_frame_bytes);
    w.set_evidence(io.sent.clone(), log);
    w.set_adversary(io.adversary);
}

/// Whether a fault-injecting miner stops dead at this input.
fn crashes_here(at: Option<CrashPoint>, input: &Input) -> bool {
    let (Some(at), Input::Command(Kind::Phase(p))) = (at, input) else { return false };
    match at {
        CrashPoint::MergePlan => p.merge_plan.is_some(),
        CrashPoint::Uploading => p.phase == pb::Phase::Uploading as i32,
    }
}

/// Inputs an adversary test tool drops: a silent or closed miner does
/// nothing but notice the end of the run; a flaky one loses 30% of its
/// pipeline frames.
fn adversary_ignores(adversary: Option<Adversary>, input: &Input, coin: &mut iota_core::Rng) -> bool {
    match adversary {
        Some(Adversary::Silent | Adversary::Closed) => {
            !matches!(input, Input::Command(Kind::Phase(p)) if p.phase == pb::Phase::Done as i32)
        }
        Some(Adversary::Flaky) => {
            matches!(input, Input::Frame(f) if f.header.direction != Direction::WeightSlice) && coin.next_f32() < 0.3
        }
        _ => false,
    }
}

/// What an input's handling is timed as (None: a tick, not timed).
fn step_kind(input: &Input, is_head: bool) -> Option<StepKind> {
    match input {
        // Only the head computes on a route; elsewhere it is bookkeeping.
        Input::Command(Kind::Route(_)) if is_head => Some(StepKind::Forward),
        Input::Frame(f) => Some(match f.header.direction {
            Direction::Activation => StepKind::Forward,
            Direction::ActivationGrad => StepKind::Backward,
            Direction::WeightSlice => StepKind::WeightSlice,
            Direction::Control => StepKind::Command,
        }),
        Input::Command(_) => Some(StepKind::Command),
        Input::Tick => None,
    }
}

/// The test tools' pacing after a step of work: a slow adversary takes ten
/// times as long, `--slowdown N` N times, `--min-frame-ms` at least that.
fn pace(io: &ComputeIo, work: bool, t0: std::time::Instant) {
    if io.adversary == Some(Adversary::Slow) && work {
        std::thread::sleep(t0.elapsed() * 9);
    } else if io.slowdown > 1 && work {
        std::thread::sleep(t0.elapsed() * (io.slowdown - 1));
    }
    if work && let Some(rest) = io.min_frame.checked_sub(t0.elapsed()) {
        std::thread::sleep(rest);
    }
}

/// What the compute thread measures as it goes.
#[derive(Default)]
struct Meters {
    compute: Duration,
    step_times: crate::stats::StepTimes,
    /// When this miner's merge plan came (a merge's time as it sees it:
    /// from its plan to the next phase).
    merge_since: Option<std::time::Instant>,
    /// When the device's memory was last read (once a second at most).
    memory_at: Option<std::time::Instant>,
    device_peak: u64,
}

impl Meters {
    fn observe_merge_phase(&mut self, input: &Input, metrics: &crate::miner_metrics::MinerMetrics) {
        let Input::Command(Kind::Phase(p)) = input else { return };
        if p.merge_plan.is_some() && self.merge_since.is_none() {
            self.merge_since = Some(std::time::Instant::now());
        } else if p.merge_plan.is_none()
            && p.phase != pb::Phase::Merging as i32
            && let Some(t) = self.merge_since.take()
        {
            metrics.observe_merge(t.elapsed().as_secs_f64());
        }
    }

    fn observe_step(&mut self, kind: Option<StepKind>, took: Duration, io: &ComputeIo) {
        self.compute += took;
        if let Some(kind) = kind {
            io.metrics.observe_step(kind, took.as_secs_f64());
            self.step_times.of_kind(kind).add(took);
        }
        if let Some(probe) = &io.device_memory
            && self.memory_at.is_none_or(|t: std::time::Instant| t.elapsed() >= Duration::from_secs(1))
        {
            self.memory_at = Some(std::time::Instant::now());
            if let Some((used, total)) = probe() {
                io.metrics.set_device_memory(used, total);
                self.device_peak = self.device_peak.max(used);
            }
        }
    }
}
