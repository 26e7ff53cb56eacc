//! What a miner keeps of an epoch's work so it can answer an
//! `EvidenceRequest` (PROTOCOL.md, "Validation"): validators draw a sample
//! of its micro-batch attempts after the epoch's training, and for each it
//! uploads an `EvidenceBundle` (the input frame it received, the output
//! frame it sent, the weights it computed with, and its weights chain's
//! items) for `evidence::check_forward`; a middle stage adds its backward
//! (the gradient frame it received, the one it sent, and the weights the
//! backward ran on) for `evidence::check_backward`.
//!
//! Per epoch, from the start of its training until the next epoch's
//! training starts (requests arrive in the Uploading phase, between the
//! two):
//! - the weights states it held, in order: 0 is the weights the epoch
//!   started from, k the weights after its k-th inner step (a restart of
//!   the epoch's training or merged weights arriving late add a state);
//! - the hashes of its weights after each inner step (the items of the
//!   epoch's weights chain; `seal` fixes how many its `UploadDone`
//!   committed to);
//! - per micro-batch attempt it computed a forward for: the whole input
//!   frame (none at the head), the direction of the frame it sent, and
//!   which weights state it used. The output frame itself is kept by the
//!   endpoint's `SentFrames` (its header is signed there);
//! - per attempt a middle stage computed a backward for: the whole
//!   gradient frame it received, and which weights state the backward ran
//!   on (an inner step may come between an attempt's forward and its
//!   backward). The gradient frame it sent is in `SentFrames` too. A
//!   head keeps the gradient frame it received the same way: signed by
//!   its neighbour and answering the head's output, it shows the output
//!   the head uploads is the one that neighbour received.
//!
//! Bounded: weights snapshots by `budget` bytes of memory and, past it, by
//! the spill directory's budget on disk (`spill`: a miner's default keeps
//! every state of an epoch there, as much as its disk holds); received
//! frames (inputs and gradients) by a quarter of the memory budget;
//! attempts by `MAX_ATTEMPTS`. Past a bound the log keeps no more for the
//! epoch and warns once: an honest miner then cannot answer for later
//! attempts, and a validator that samples one counts it as evidence
//! missing. A snapshot is 4 bytes a weight.

use std::collections::HashMap;

use iota_core::wire::Direction;
use tracing::warn;

use self::spill::Snapshot;
pub use self::spill::SpillDir;
pub(crate) use self::spill::{MIN_FREE_BYTES, free_bytes};
use crate::evidence_bundle::{BackwardFrames, EvidenceBundle};
use crate::inner_step::{OptimizerState, StepEvidence, StepHeader};
use iota_checks::hashes::weights_hash;

mod answer;
mod spill;
mod steps;
pub(crate) mod trace_answer;

pub(crate) use self::answer::answer;

/// The default memory budget for weights snapshots (`MinerOptions::evidence_bytes`).
pub const DEFAULT_EVIDENCE_BYTES: usize = 1 << 30;
/// Attempts kept per epoch (as many as the orchestrator lists for a miner).
pub const MAX_ATTEMPTS: usize = 65_536;

/// A micro-batch attempt: (epoch, shard, first sample, attempt).
pub type MbKey = (u64, u32, u64, u32);

/// One weights state the miner held during the epoch.
struct Version {
    weights: Snapshot,
    /// `weights_hash` of it (what step records name it by).
    hash: [u8; 32],
    used: bool,
}

impl Version {
    fn is_kept(&self) -> bool {
        !matches!(self.weights, Snapshot::None)
    }

    /// A copy of its weights (read back from disk where it was spilled).
    fn load(&mut self) -> Result<Vec<f32>, &'static str> {
        match &mut self.weights {
            Snapshot::Memory(w) => Ok(w.clone()),
            Snapshot::Disk(s) => s.load(),
            Snapshot::None => Err("its weights were not kept"),
        }
    }
}

/// What is kept of one attempt.
struct Attempt {
    input_frame: Option<Vec<u8>>,
    output: Direction,
    version: usize,
    /// A middle stage's backward: the gradient frame it received and the
    /// weights state the backward ran on.
    backward: Option<(Vec<u8>, usize)>,
}

impl Attempt {
    fn frame_bytes(&self) -> usize {
        let input = self.input_frame.as_ref().map_or(0, Vec::len);
        input.saturating_add(self.backward.as_ref().map_or(0, |(f, _)| f.len()))
    }
}

/// What the log says about one attempt (tests, logs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttemptInfo {
    /// The weights state it was computed with (0: the epoch's start).
    pub version: usize,
    pub output: Direction,
    pub has_input: bool,
    /// A middle stage's backward is kept too.
    pub has_backward: bool,
}

struct EpochEvidence {
    epoch: u64,
    stage: u32,
    versions: Vec<Version>,
    step_hashes: Vec<[u8; 32]>,
    /// The records of its steps chain (the carried one first) and, per
    /// step of the epoch, what showing it takes.
    steps: steps::StepLog,
    /// Steps committed in the epoch's `UploadDone`, once it went out.
    sealed: Option<usize>,
    attempts: HashMap<MbKey, Attempt>,
    snapshot_bytes: usize,
    /// Bytes of snapshots in the spill directory.
    spilled_bytes: u64,
    frame_bytes: usize,
    /// A bound was hit: nothing more of that kind is kept (warned once).
    snapshots_full: bool,
    frames_full: bool,
    attempts_full: bool,
}

impl EpochEvidence {
    fn new(epoch: u64, stage: u32, step_hashes: Vec<[u8; 32]>) -> Self {
        EpochEvidence {
            epoch,
            stage,
            versions: Vec::new(),
            step_hashes,
            steps: steps::StepLog::default(),
            sealed: None,
            attempts: HashMap::new(),
            snapshot_bytes: 0,
            spilled_bytes: 0,
            frame_bytes: 0,
            snapshots_full: false,
            frames_full: false,
            attempts_full: false,
        }
    }

    /// Adds a weights state and makes it the current one: in memory while
    /// the budget lasts, then in the spill directory while its budget
    /// lasts, then not at all.
    fn push_version(&mut self, weights: Vec<f32>, hash: [u8; 32], budget: usize, spill: Option<&SpillDir>) {
        // Attempts only ever use the current state: one no attempt used is
        // never needed.
        if let Some(last) = self.versions.last_mut()
            && !last.used
        {
            match std::mem::replace(&mut last.weights, Snapshot::None) {
                Snapshot::Memory(w) => self.snapshot_bytes = self.snapshot_bytes.saturating_sub(4 * w.len()),
                Snapshot::Disk(s) => self.spilled_bytes = self.spilled_bytes.saturating_sub(s.bytes()),
                Snapshot::None => {}
            }
        }
        let version = self.versions.len();
        let snapshot = self.keep(version, weights, budget, spill);
        self.versions.push(Version { weights: snapshot, hash, used: false });
    }

    /// A snapshot of `data` (file slot `slot`): in memory while the budget
    /// lasts, then in the spill directory while its budget lasts, then
    /// none (warned once).
    fn keep(&mut self, slot: usize, data: Vec<f32>, budget: usize, spill: Option<&SpillDir>) -> Snapshot {
        let version = slot;
        let bytes = 4 * data.len();
        let snapshot = if self.snapshots_full {
            Snapshot::None
        } else if self.snapshot_bytes.saturating_add(bytes) <= budget {
            self.snapshot_bytes = self.snapshot_bytes.saturating_add(bytes);
            Snapshot::Memory(data)
        } else {
            self.spill(version, data, spill)
        };
        if matches!(snapshot, Snapshot::None) && !self.snapshots_full {
            self.snapshots_full = true;
            warn!(
                epoch = self.epoch,
                state = version,
                budget,
                spilled = self.spilled_bytes,
                spill_dir = spill.map(|s| s.dir().display().to_string()),
                "evidence budget reached: no more weights snapshots this epoch; later work cannot be shown to \
                 validators (give the miner more --evidence-disk-gib, or more free disk)"
            );
        }
        snapshot
    }

    /// Whether the epoch has a steps chain to show (a miner keeps one when
    /// its run has validators).
    fn steps_kept(&self) -> bool {
        self.steps.has_records()
    }

    /// An inner step about to be taken from the current weights state:
    /// its record, the optimizer state it steps from (where it is one to
    /// keep), and its micro-batches' frames' signers.
    fn record_step(
        &mut self,
        header: StepHeader,
        optimizer: Option<OptimizerState>,
        signers: Vec<([u8; 32], [u8; 32])>,
        budget: usize,
        spill: Option<&SpillDir>,
    ) {
        // The step reads the current state: it must stay showable.
        if let Some(v) = self.versions.last_mut() {
            v.used = true;
        }
        let slot = steps::OPTIMIZER_SLOTS.saturating_add(self.steps.len());
        let Some(OptimizerState { t, mut m, v }) = optimizer else {
            self.steps.push(header, 0, Snapshot::None, signers);
            return;
        };
        m.extend_from_slice(&v);
        drop(v);
        let moments = self.keep(slot, m, budget, spill);
        self.steps.push(header, t, moments, signers);
    }

    /// What `key`'s bundle shows of the inner step its backward went into.
    fn step_evidence(&mut self, key: MbKey, window: usize) -> Result<StepEvidence, &'static str> {
        let sealed = self.sealed.unwrap_or(self.step_hashes.len());
        let (versions, attempts) = (&mut self.versions, &self.attempts);
        let load = |hash: &[u8; 32]| -> Result<Vec<f32>, &'static str> {
            let v =
                versions.iter_mut().rev().find(|v| v.hash == *hash).ok_or("a weights state of the step is not kept")?;
            v.load().map_err(|_| "a weights state of the step was not kept")
        };
        // A whole-model stage keeps no frames (it needs none); elsewhere a
        // frame not kept shows as none, and the step cannot be shown.
        let frames = |shard: u32, first: u64, attempt: u32| {
            let a = attempts.get(&(key.0, shard, first, attempt));
            let input = a.and_then(|a| a.input_frame.clone()).unwrap_or_default();
            let grad = a.and_then(|a| a.backward.as_ref()).map(|(f, _)| f.clone()).unwrap_or_default();
            (input, grad)
        };
        self.steps.evidence((sealed, window), (key.1, key.2, key.3), load, frames)
    }

    /// Writes a snapshot past the memory budget to the spill directory,
    /// one write in flight at a time (so memory holds at most one snapshot
    /// past its budget).
    fn spill(&mut self, version: usize, weights: Vec<f32>, spill: Option<&SpillDir>) -> Snapshot {
        let Some(dir) = spill else { return Snapshot::None };
        for v in &mut self.versions {
            if let Snapshot::Disk(s) = &mut v.weights
                && !s.settle()
            {
                // Lost to a failed write: attempts on it cannot be shown.
                self.spilled_bytes = self.spilled_bytes.saturating_sub(s.bytes());
                v.weights = Snapshot::None;
            }
        }
        let bytes = 4 * weights.len() as u64;
        if !dir.has_room(self.spilled_bytes, bytes) {
            return Snapshot::None;
        }
        match dir.spill(self.epoch, self.stage, version, weights) {
            Ok(s) => {
                self.spilled_bytes = self.spilled_bytes.saturating_add(bytes);
                Snapshot::Disk(s)
            }
            Err(e) => {
                warn!(error = %e, "cannot start writing an evidence snapshot");
                Snapshot::None
            }
        }
    }
}

/// The evidence of the epoch in training (or just trained).
pub struct EvidenceLog {
    budget: usize,
    frame_budget: usize,
    /// Inner steps per kept optimizer state (`validation.step_window`).
    step_window: usize,
    spill: Option<SpillDir>,
    epoch: Option<EpochEvidence>,
}

impl EvidenceLog {
    /// `budget`: bytes of weights snapshots kept per epoch (received
    /// frames get a quarter of it besides).
    pub fn new(budget: usize) -> Self {
        EvidenceLog { budget, frame_budget: budget / 4, step_window: 1, spill: None, epoch: None }
    }

    /// As `new`, with snapshots past the memory budget written to `spill`.
    pub fn with_spill(budget: usize, spill: Option<SpillDir>) -> Self {
        EvidenceLog { budget, frame_budget: budget / 4, step_window: 1, spill, epoch: None }
    }

    /// Keeps the optimizer state every `steps` inner steps (the run's
    /// `validation.step_window`) instead of at every step.
    pub fn with_step_window(mut self, steps: u32) -> Self {
        self.step_window = (steps as usize).max(1);
        self
    }

    /// Received frames (inputs and gradients) get `bytes` of memory
    /// instead of a quarter of the snapshots' budget.
    pub fn with_frame_budget(mut self, bytes: usize) -> Self {
        self.frame_budget = bytes;
        self
    }

    fn frame_budget(&self) -> usize {
        self.frame_budget
    }

    fn kept(&self, epoch: u64) -> Option<&EpochEvidence> {
        self.epoch.as_ref().filter(|e| e.epoch == epoch)
    }

    fn kept_mut(&mut self, epoch: u64) -> Option<&mut EpochEvidence> {
        self.epoch.as_mut().filter(|e| e.epoch == epoch)
    }

    /// The epoch kept, if any.
    pub fn epoch(&self) -> Option<u64> {
        self.epoch.as_ref().map(|e| e.epoch)
    }

    /// The training of `epoch` starts on `stage` with `weights` (the merged
    /// weights in place): the previous epoch's evidence is freed. A restart
    /// of the same epoch keeps what it has and adds the weights as a state;
    /// on another stage it starts afresh but keeps the step hashes, which
    /// mirror the epoch's weights chain (that chain does not restart).
    pub fn begin(&mut self, epoch: u64, stage: u32, weights: Vec<f32>) {
        let budget = self.budget;
        match self.epoch.as_mut() {
            Some(e) if e.epoch == epoch && e.stage == stage => {}
            Some(e) if e.epoch == epoch => {
                let hashes = std::mem::take(&mut e.step_hashes);
                self.epoch = Some(EpochEvidence::new(epoch, stage, hashes));
            }
            _ => self.epoch = Some(EpochEvidence::new(epoch, stage, Vec::new())),
        }
        if let Some(e) = self.epoch.as_mut() {
            let hash = weights_hash(&weights);
            e.push_version(weights, hash, budget, self.spill.as_ref());
        }
    }

    /// The weights were replaced during `epoch`'s training (a merge that
    /// finished late).
    pub fn weights_changed(&mut self, epoch: u64, weights: Vec<f32>) {
        let budget = self.budget;
        let spill = self.spill.as_ref();
        if let Some(e) = self.epoch.as_mut().filter(|e| e.epoch == epoch && e.sealed.is_none()) {
            let hash = weights_hash(&weights);
            e.push_version(weights, hash, budget, spill);
        }
    }

    /// An inner step of `epoch` left `weights`, whose hash the weights
    /// chain just took.
    pub fn stepped(&mut self, epoch: u64, hash: [u8; 32], weights: Vec<f32>) {
        let budget = self.budget;
        let spill = self.spill.as_ref();
        if let Some(e) = self.epoch.as_mut().filter(|e| e.epoch == epoch) {
            e.step_hashes.push(hash);
            e.push_version(weights, hash, budget, spill);
        }
    }

    /// The record of the last step this miner took on its stage before
    /// `epoch` (its optimizer state is the one the epoch carries in): the
    /// first of the epoch's steps chain; `before`: the chain it ended
    /// (the epoch before's, just before the record).
    pub fn carry(&mut self, epoch: u64, header: StepHeader, before: iota_core::commitment::Chain) {
        if let Some(e) = self.kept_mut(epoch) {
            e.steps.carry(header, before);
        }
    }

    /// An inner step of `epoch` is about to be taken from the current
    /// weights (call `stepped` after it): its record, the optimizer state
    /// it steps from, and the neighbours that signed each micro-batch's
    /// input and gradient frames (zeros where none).
    pub fn record_step(
        &mut self,
        epoch: u64,
        header: StepHeader,
        optimizer: OptimizerState,
        signers: Vec<([u8; 32], [u8; 32])>,
    ) {
        let (budget, window) = (self.budget, self.step_window);
        let spill = self.spill.as_ref();
        if let Some(e) = self.epoch.as_mut().filter(|e| e.epoch == epoch) {
            let optimizer = e.steps.keeps_next(window).then_some(optimizer);
            e.record_step(header, optimizer, signers, budget, spill);
        }
    }

    /// `epoch`'s `UploadDone` goes out: its weights chain as committed
    /// there is the one evidence must chain to.
    pub fn seal(&mut self, epoch: u64) {
        if let Some(e) = self.kept_mut(epoch)
            && e.sealed.is_none()
        {
            e.sealed = Some(e.step_hashes.len());
        }
    }

    /// Whether a forward of `epoch` computed now would be kept (so the
    /// caller copies its input frame only then).
    pub fn wants_input(&self, epoch: u64) -> bool {
        self.kept(epoch)
            .is_some_and(|e| !e.frames_full && !e.attempts_full && e.versions.last().is_some_and(Version::is_kept))
    }

    /// This miner computed a forward for `key` with its current weights and
    /// sent a frame in direction `output`. False if it is not kept.
    pub fn forward(&mut self, key: MbKey, input_frame: Option<Vec<u8>>, output: Direction) -> bool {
        let frame_budget = self.frame_budget();
        let Some(e) = self.kept_mut(key.0) else { return false };
        let Some(version) = e.versions.len().checked_sub(1) else { return false };
        if e.versions.get(version).is_none_or(|v| !v.is_kept()) {
            return false;
        }
        if e.attempts.len() >= MAX_ATTEMPTS && !e.attempts.contains_key(&key) {
            if !e.attempts_full {
                e.attempts_full = true;
                warn!(epoch = e.epoch, "evidence kept for {MAX_ATTEMPTS} attempts; later ones cannot be shown");
            }
            return false;
        }
        let len = input_frame.as_ref().map_or(0, Vec::len);
        if e.frames_full || e.frame_bytes.saturating_add(len) > frame_budget {
            if !e.frames_full {
                e.frames_full = true;
                warn!(
                    epoch = e.epoch,
                    frame_budget, "evidence budget for input frames reached; later work cannot be shown"
                );
            }
            return false;
        }
        e.frame_bytes = e.frame_bytes.saturating_add(len);
        let attempt = Attempt { input_frame, output, version, backward: None };
        if let Some(old) = e.attempts.insert(key, attempt) {
            e.frame_bytes = e.frame_bytes.saturating_sub(old.frame_bytes());
        }
        if let Some(v) = e.versions.get_mut(version) {
            v.used = true;
        }
        true
    }

    /// Whether the backward of attempt `key` computed now would be kept
    /// (so the caller copies the gradient frame it received only then):
    /// its forward is kept and sent an activation (a head's or a middle
    /// stage's), and the current weights are.
    pub fn wants_backward(&self, key: MbKey) -> bool {
        self.kept(key.0).is_some_and(|e| {
            !e.frames_full
                && e.attempts.get(&key).is_some_and(|a| {
                    a.output == Direction::Activation && e.versions.get(a.version).is_some_and(Version::is_kept)
                })
        })
    }

    /// This miner (a head or a middle stage) computed the backward of
    /// `key` on `received`, the whole gradient frame it got from
    /// downstream, with the weights its forward ran on (the stage stashes
    /// them across inner steps: `Stage::before_update`), and (a middle
    /// stage) sent a gradient upstream. At the head the frame is the
    /// answer that shows its output reached its neighbour as it uploads
    /// it. False if it is not kept.
    pub fn backward(&mut self, key: MbKey, received: Vec<u8>) -> bool {
        let frame_budget = self.frame_budget();
        let Some(e) = self.kept_mut(key.0) else { return false };
        let Some(version) = e.attempts.get(&key).map(|a| a.version) else { return false };
        if e.versions.get(version).is_none_or(|v| !v.is_kept()) {
            return false;
        }
        let Some(a) = e.attempts.get_mut(&key) else { return false };
        if a.output != Direction::Activation {
            return false;
        }
        let old = a.backward.as_ref().map_or(0, |(f, _)| f.len());
        let bytes = e.frame_bytes.saturating_sub(old).saturating_add(received.len());
        if e.frames_full || bytes > frame_budget {
            if !e.frames_full {
                e.frames_full = true;
                warn!(
                    epoch = e.epoch,
                    frame_budget, "evidence budget for received frames reached; later work cannot be shown"
                );
            }
            return false;
        }
        e.frame_bytes = bytes;
        a.backward = Some((received, version));
        if let Some(v) = e.versions.get_mut(version) {
            v.used = true;
        }
        true
    }

    /// What is kept of attempt `key`.
    pub fn attempt(&self, key: MbKey) -> Option<AttemptInfo> {
        let a = self.kept(key.0)?.attempts.get(&key)?;
        Some(AttemptInfo {
            version: a.version,
            output: a.output,
            has_input: a.input_frame.is_some(),
            has_backward: a.backward.is_some(),
        })
    }

    /// The weights state the backward of `key` ran on, if it is kept.
    pub fn backward_version(&self, key: MbKey) -> Option<usize> {
        self.kept(key.0)?.attempts.get(&key)?.backward.as_ref().map(|(_, v)| *v)
    }

    /// A copy of the weights snapshot of state `version` of `epoch`, if
    /// kept (and, where spilled, read back intact).
    pub fn weights(&mut self, epoch: u64, version: usize) -> Option<Vec<f32>> {
        self.kept_mut(epoch)?.versions.get_mut(version)?.load().ok()
    }

    /// Whether state `version` of `epoch` is in the spill directory.
    pub fn is_spilled(&self, epoch: u64, version: usize) -> bool {
        self.kept(epoch).and_then(|e| e.versions.get(version)).is_some_and(|v| matches!(v.weights, Snapshot::Disk(_)))
    }

    /// Bytes of the epoch's snapshots in the spill directory.
    pub fn spilled_bytes(&self) -> u64 {
        self.epoch.as_ref().map_or(0, |e| e.spilled_bytes)
    }

    /// The step hashes of `epoch` as committed (all of them before `seal`).
    pub fn step_hashes(&self, epoch: u64) -> Option<&[[u8; 32]]> {
        let e = self.kept(epoch)?;
        e.step_hashes.get(..e.sealed.unwrap_or(e.step_hashes.len()))
    }

    /// Bytes held by weights snapshots and received frames.
    pub fn bytes(&self) -> (usize, usize) {
        self.epoch.as_ref().map_or((0, 0), |e| (e.snapshot_bytes, e.frame_bytes))
    }

    /// The encoded evidence bundle for `key`, around the output frame this
    /// miner sent for it and, for a middle stage, the gradient frame it
    /// sent upstream (`sent_grad`). A middle stage's attempt whose
    /// backward is not kept, or a head's whose answer is not, has no
    /// bundle: its evidence would be short.
    pub fn bundle(
        &mut self,
        key: MbKey,
        output_frame: Vec<u8>,
        sent_grad: Option<Vec<u8>>,
    ) -> Result<Vec<u8>, &'static str> {
        self.bundle_showing(key, (output_frame, sent_grad), false)
    }

    /// The inner steps attempt `key` went into, as its step object shows
    /// them, and the epoch's stage: what the miner replays to trace one
    /// of them for a validator (`trace_answer`).
    pub fn step_evidence_of(&mut self, key: MbKey) -> Result<(u32, StepEvidence), &'static str> {
        let window = self.step_window;
        let e = self.kept_mut(key.0).ok_or("the epoch is not kept")?;
        if !e.steps_kept() {
            return Err("no inner steps are kept");
        }
        Ok((e.stage, e.step_evidence(key, window)?))
    }

    /// `bundle`, showing the inner steps the attempt went into where
    /// `show_steps` and the epoch keeps a steps chain (a validator asks this of
    /// one drawn attempt per miner: `WorkRef.inner_step`).
    pub fn bundle_showing(
        &mut self,
        key: MbKey,
        (output_frame, sent_grad): (Vec<u8>, Option<Vec<u8>>),
        show_steps: bool,
    ) -> Result<Vec<u8>, &'static str> {
        let window = self.step_window;
        let e = self.kept_mut(key.0).ok_or("the epoch is not kept")?;
        let a = e.attempts.get(&key).ok_or("the attempt is not kept")?;
        let steps = e.sealed.unwrap_or(e.step_hashes.len());
        let step_hashes = e.step_hashes.get(..steps).ok_or("step hashes")?.to_vec();
        let input_frame = a.input_frame.clone();
        let sends_activation = a.output == Direction::Activation;
        let middle = a.input_frame.is_some() && sends_activation;
        let (version, backward) = (a.version, a.backward.clone());
        let backward = match (sends_activation, middle, backward, sent_grad) {
            (false, _, _, _) => None,
            // The head: the gradient that answered its output, and none sent.
            (true, false, Some((received, _)), _) => Some(BackwardFrames { received, sent: Vec::new(), weights: None }),
            (true, false, None, _) => return Err("the gradient that answered its output is not kept"),
            (true, true, None, _) => return Err("its backward is not kept"),
            (true, true, Some(_), None) => return Err("the gradient frame it sent is not kept"),
            (true, true, Some((received, bv)), Some(sent)) => {
                let weights = if bv == version {
                    None
                } else {
                    let v = e.versions.get_mut(bv).ok_or("its backward's weights were not kept")?;
                    Some(v.load().map_err(|_| "its backward's weights were not kept")?)
                };
                Some(BackwardFrames { received, sent, weights })
            }
        };
        // The inner steps the attempt's backward went into, where asked
        // and the epoch has a steps chain (a run without validators keeps
        // none). Read before the attempt's own weights are lent below: the
        // steps may read the same state.
        let step = if show_steps && e.steps_kept() { Some(e.step_evidence(key, window)?.encode()) } else { None };
        let v = e.versions.get_mut(version).ok_or("no such weights state")?;
        // A snapshot in memory is lent to the bundle for the encoding, not
        // copied; a spilled one is read back.
        let (weights, lent) = match std::mem::replace(&mut v.weights, Snapshot::None) {
            Snapshot::Memory(w) => (w, true),
            Snapshot::None => return Err("its weights were not kept"),
            disk @ Snapshot::Disk(_) => {
                v.weights = disk;
                (v.load()?, false)
            }
        };
        let b = EvidenceBundle { input_frame, output_frame, weights, step_hashes, backward, step };
        let bytes = b.encode();
        if lent {
            v.weights = Snapshot::Memory(b.weights);
        }
        Ok(bytes)
    }
}

#[cfg(test)]
mod tests;
