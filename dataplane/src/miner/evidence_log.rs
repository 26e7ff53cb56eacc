//! What a miner keeps of an epoch's work so it can answer an
//! `EvidenceRequest` (PROTOCOL.md, "Validation"): validators draw a sample
//! of its micro-batch attempts after the epoch's training, and for each it
//! uploads an `EvidenceBundle` (the input frame it received, the output
//! frame it sent, the weights it computed with, and its weights chain's
//! items) for `evidence::check_forward`.
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
//!   endpoint's `SentFrames` (its header is signed there).
//!
//! Bounded: weights snapshots by `budget` bytes, input frames by a quarter
//! of it, attempts by `MAX_ATTEMPTS`. Past a bound the log keeps no more for
//! the epoch and warns once: an honest miner then cannot answer for later
//! attempts, and a validator that samples one counts it as evidence
//! missing. Size the budget for the stage (a snapshot is 4 bytes a weight).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use iota_core::PeerId;
use iota_core::wire::Direction;
use iota_protocol::fields::MAX_EVIDENCE_ITEMS;
use iota_protocol::store_keys::evidence_key;
use iota_protocol::{SharedStore, StoredObject, pb};
use tracing::{info, warn};

use super::events::Output;
use crate::evidence_bundle::EvidenceBundle;
use crate::sent_frames::{SentFrameKey, SentFrames};

/// The default budget for weights snapshots (`MinerOptions::evidence_bytes`).
pub const DEFAULT_EVIDENCE_BYTES: usize = 1 << 30;
/// Attempts kept per epoch (as many as the orchestrator lists for a miner).
pub const MAX_ATTEMPTS: usize = 65_536;

/// A micro-batch attempt: (epoch, shard, first sample, attempt).
pub type MbKey = (u64, u32, u64, u32);

/// One weights state the miner held during the epoch.
struct Version {
    /// None: over the budget, or freed because no attempt used it.
    weights: Option<Vec<f32>>,
    used: bool,
}

/// What is kept of one attempt.
struct Attempt {
    input_frame: Option<Vec<u8>>,
    output: Direction,
    version: usize,
}

/// What the log says about one attempt (tests, logs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttemptInfo {
    /// The weights state it was computed with (0: the epoch's start).
    pub version: usize,
    pub output: Direction,
    pub has_input: bool,
}

struct EpochEvidence {
    epoch: u64,
    stage: u32,
    versions: Vec<Version>,
    step_hashes: Vec<[u8; 32]>,
    /// Steps committed in the epoch's `UploadDone`, once it went out.
    sealed: Option<usize>,
    attempts: HashMap<MbKey, Attempt>,
    snapshot_bytes: usize,
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
            sealed: None,
            attempts: HashMap::new(),
            snapshot_bytes: 0,
            frame_bytes: 0,
            snapshots_full: false,
            frames_full: false,
            attempts_full: false,
        }
    }

    /// Adds a weights state and makes it the current one.
    fn push_version(&mut self, weights: Vec<f32>, budget: usize) {
        // Attempts only ever use the current state: one no attempt used is
        // never needed.
        if let Some(last) = self.versions.last_mut()
            && !last.used
            && let Some(w) = last.weights.take()
        {
            self.snapshot_bytes = self.snapshot_bytes.saturating_sub(4 * w.len());
        }
        let bytes = 4 * weights.len();
        let fits = !self.snapshots_full && self.snapshot_bytes.saturating_add(bytes) <= budget;
        if !fits && !self.snapshots_full {
            self.snapshots_full = true;
            warn!(
                epoch = self.epoch,
                state = self.versions.len(),
                budget,
                "evidence budget reached: no more weights snapshots this epoch; later work cannot be shown to \
                 validators"
            );
        }
        if fits {
            self.snapshot_bytes = self.snapshot_bytes.saturating_add(bytes);
        }
        self.versions.push(Version { weights: fits.then_some(weights), used: false });
    }
}

/// The evidence of the epoch in training (or just trained).
pub struct EvidenceLog {
    budget: usize,
    epoch: Option<EpochEvidence>,
}

impl EvidenceLog {
    /// `budget`: bytes of weights snapshots kept per epoch (input frames
    /// get a quarter of it besides).
    pub fn new(budget: usize) -> Self {
        EvidenceLog { budget, epoch: None }
    }

    fn frame_budget(&self) -> usize {
        self.budget / 4
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
            e.push_version(weights, budget);
        }
    }

    /// The weights were replaced during `epoch`'s training (a merge that
    /// finished late).
    pub fn weights_changed(&mut self, epoch: u64, weights: Vec<f32>) {
        let budget = self.budget;
        if let Some(e) = self.kept_mut(epoch).filter(|e| e.sealed.is_none()) {
            e.push_version(weights, budget);
        }
    }

    /// An inner step of `epoch` left `weights`, whose hash the weights
    /// chain just took.
    pub fn stepped(&mut self, epoch: u64, hash: [u8; 32], weights: Vec<f32>) {
        let budget = self.budget;
        if let Some(e) = self.kept_mut(epoch) {
            e.step_hashes.push(hash);
            e.push_version(weights, budget);
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
        self.kept(epoch).is_some_and(|e| {
            !e.frames_full && !e.attempts_full && e.versions.last().is_some_and(|v| v.weights.is_some())
        })
    }

    /// This miner computed a forward for `key` with its current weights and
    /// sent a frame in direction `output`. False if it is not kept.
    pub fn forward(&mut self, key: MbKey, input_frame: Option<Vec<u8>>, output: Direction) -> bool {
        let frame_budget = self.frame_budget();
        let Some(e) = self.kept_mut(key.0) else { return false };
        let Some(version) = e.versions.len().checked_sub(1) else { return false };
        if e.versions.get(version).is_none_or(|v| v.weights.is_none()) {
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
        let attempt = Attempt { input_frame, output, version };
        if let Some(old) = e.attempts.insert(key, attempt) {
            e.frame_bytes = e.frame_bytes.saturating_sub(old.input_frame.map_or(0, |f| f.len()));
        }
        if let Some(v) = e.versions.get_mut(version) {
            v.used = true;
        }
        true
    }

    /// What is kept of attempt `key`.
    pub fn attempt(&self, key: MbKey) -> Option<AttemptInfo> {
        let a = self.kept(key.0)?.attempts.get(&key)?;
        Some(AttemptInfo { version: a.version, output: a.output, has_input: a.input_frame.is_some() })
    }

    /// The weights snapshot of state `version` of `epoch`, if kept.
    pub fn weights(&self, epoch: u64, version: usize) -> Option<&[f32]> {
        self.kept(epoch)?.versions.get(version)?.weights.as_deref()
    }

    /// The step hashes of `epoch` as committed (all of them before `seal`).
    pub fn step_hashes(&self, epoch: u64) -> Option<&[[u8; 32]]> {
        let e = self.kept(epoch)?;
        e.step_hashes.get(..e.sealed.unwrap_or(e.step_hashes.len()))
    }

    /// Bytes held by weights snapshots and input frames.
    pub fn bytes(&self) -> (usize, usize) {
        self.epoch.as_ref().map_or((0, 0), |e| (e.snapshot_bytes, e.frame_bytes))
    }

    /// The encoded evidence bundle for `key`, around the output frame this
    /// miner sent for it.
    pub fn bundle(&mut self, key: MbKey, output_frame: Vec<u8>) -> Result<Vec<u8>, &'static str> {
        let e = self.kept_mut(key.0).ok_or("the epoch is not kept")?;
        let a = e.attempts.get(&key).ok_or("the attempt is not kept")?;
        let steps = e.sealed.unwrap_or(e.step_hashes.len());
        let step_hashes = e.step_hashes.get(..steps).ok_or("step hashes")?.to_vec();
        let input_frame = a.input_frame.clone();
        let v = e.versions.get_mut(a.version).ok_or("no such weights state")?;
        // Lent to the bundle for the encoding, not copied.
        let weights = v.weights.take().ok_or("its weights were not kept")?;
        let b = EvidenceBundle { input_frame, output_frame, weights, step_hashes };
        let bytes = b.encode();
        v.weights = Some(b.weights);
        Ok(bytes)
    }
}

/// Uploads the evidence for each attempt `r` names and reports each object
/// (`Stored`). Attempts not kept are skipped with a warning; a request for
/// an epoch no longer kept is ignored.
pub(crate) fn answer(
    log: &mut EvidenceLog,
    r: &pb::EvidenceRequest,
    sent: Option<&Arc<SentFrames>>,
    me: PeerId,
    store: &SharedStore,
    rt: &tokio::runtime::Handle,
    out: &mut Vec<Output>,
) {
    let Some(stage) = log.kept(r.epoch).map(|e| e.stage) else {
        warn!(epoch = r.epoch, kept = ?log.epoch(), "evidence asked for an epoch no longer kept; ignored");
        return;
    };
    let Some(sent) = sent else {
        warn!(epoch = r.epoch, "evidence asked, but this miner does not record its sent frames");
        return;
    };
    let mut seen = HashSet::new();
    let mut uploaded = 0usize;
    for item in r.items.iter().take(MAX_EVIDENCE_ITEMS) {
        let key = (r.epoch, item.shard, item.first_sample, item.attempt);
        if !seen.insert(key) {
            continue;
        }
        let skip = |why: &str| warn!(shard = key.1, first = key.2, attempt = key.3, why, "evidence not uploaded");
        let Some(info) = log.attempt(key) else {
            skip("the attempt is not kept (not computed here, or past the evidence bounds)");
            continue;
        };
        let fk =
            SentFrameKey { epoch: key.0, shard: key.1, first_sample: key.2, attempt: key.3, direction: info.output };
        let Some(frame) = sent.get(&fk) else {
            skip("the frame sent for it is not kept");
            continue;
        };
        let bytes = match log.bundle(key, frame.whole()) {
            Ok(b) => b,
            Err(why) => {
                skip(why);
                continue;
            }
        };
        let obj_key = evidence_key(r.epoch, &me, key.1, key.2, key.3);
        let object = StoredObject::of(&obj_key, &bytes, me);
        if let Err(e) = rt.block_on(store.put(&obj_key, bytes)) {
            warn!(key = obj_key, error = %e, "uploading evidence failed");
            continue;
        }
        uploaded = uploaded.saturating_add(1);
        out.push(Output::Report(pb::report::Kind::Stored(pb::Stored {
            epoch: r.epoch,
            stage,
            object: Some(object.to_pb()),
        })));
    }
    info!(epoch = r.epoch, asked = r.items.len(), uploaded, "evidence uploaded");
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: Direction = Direction::Activation;

    fn w(x: f32, n: usize) -> Vec<f32> {
        vec![x; n]
    }

    #[test]
    fn each_attempt_gets_the_weights_it_was_computed_with() {
        let mut log = EvidenceLog::new(1 << 20);
        log.begin(3, 1, w(0.0, 8));
        assert!(log.wants_input(3) && !log.wants_input(2));
        assert!(log.forward((3, 0, 0, 0), Some(vec![1; 10]), A));
        log.stepped(3, [1; 32], w(1.0, 8));
        assert!(log.forward((3, 0, 4, 0), Some(vec![2; 10]), A));
        assert!(log.forward((3, 0, 8, 0), None, Direction::ActivationGrad));
        log.stepped(3, [2; 32], w(2.0, 8));
        log.stepped(3, [3; 32], w(3.0, 8));
        assert!(log.forward((3, 0, 12, 1), None, A));
        assert!(!log.forward((2, 0, 0, 0), None, A), "another epoch");
        let info = |k| log.attempt(k).unwrap();
        assert_eq!(info((3, 0, 0, 0)), AttemptInfo { version: 0, output: A, has_input: true });
        assert_eq!(info((3, 0, 4, 0)).version, 1);
        assert_eq!(info((3, 0, 8, 0)), AttemptInfo { version: 1, output: Direction::ActivationGrad, has_input: false });
        assert_eq!(info((3, 0, 12, 1)).version, 3);
        assert!(log.attempt((3, 0, 12, 0)).is_none());
        assert_eq!(log.weights(3, 0), Some(&w(0.0, 8)[..]));
        assert_eq!(log.weights(3, 1), Some(&w(1.0, 8)[..]));
        assert_eq!(log.weights(3, 2), None, "no attempt used it: freed");
        assert_eq!(log.weights(3, 3), Some(&w(3.0, 8)[..]));
        assert_eq!(log.bytes(), (3 * 32, 20));
        // The bundle: the right frames, weights and step hashes.
        log.seal(3);
        log.stepped(3, [4; 32], w(4.0, 8)); // after the UploadDone: not committed there
        let b = log.bundle((3, 0, 4, 0), vec![9; 5]).unwrap();
        let limits = crate::evidence_bundle::BundleLimits { max_frame: 1 << 20, weights: 8, max_steps: 16 };
        let d = EvidenceBundle::decode(&b, limits).unwrap();
        assert_eq!(d.input_frame, Some(vec![2; 10]));
        assert_eq!(d.output_frame, vec![9; 5]);
        assert_eq!(d.weights, w(1.0, 8));
        assert_eq!(d.step_hashes, vec![[1; 32], [2; 32], [3; 32]]);
        assert_eq!(log.weights(3, 1), Some(&w(1.0, 8)[..]), "lent, then put back");
        assert_eq!(log.bundle((3, 9, 9, 9), Vec::new()), Err("the attempt is not kept"));
        // The next epoch's training frees this one.
        log.begin(4, 1, w(5.0, 8));
        assert_eq!(log.epoch(), Some(4));
        assert!(log.attempt((3, 0, 4, 0)).is_none());
        assert_eq!(log.bytes(), (32, 0));
        assert_eq!(log.step_hashes(4), Some(&[][..]));
    }

    /// Log lines written while `f` runs.
    fn logged(f: impl FnOnce()) -> String {
        #[derive(Clone, Default)]
        struct Buf(Arc<parking_lot::Mutex<Vec<u8>>>);
        impl std::io::Write for Buf {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.lock().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let buf = Buf::default();
        let w = buf.clone();
        let sub = tracing_subscriber::fmt().with_writer(move || w.clone()).with_ansi(false).finish();
        tracing::subscriber::with_default(sub, f);
        String::from_utf8_lossy(&buf.0.lock()).into_owned()
    }

    #[test]
    fn past_the_budget_no_more_snapshots_are_kept() {
        // Room for two snapshots of 8 weights; input frames get 16 bytes.
        let mut log = EvidenceLog::new(64);
        let warned = logged(|| {
            log.begin(0, 0, w(0.0, 8));
            for i in 1..6 {
                log.forward((0, 0, u64::from(i), 0), None, A);
                log.stepped(0, [i; 32], w(1.0, 8));
            }
        });
        assert_eq!(warned.matches("no more weights snapshots").count(), 1, "warned once: {warned}");
        let mut log = EvidenceLog::new(64);
        log.begin(0, 0, w(0.0, 8));
        assert!(log.forward((0, 0, 0, 0), Some(vec![0; 10]), A));
        log.stepped(0, [1; 32], w(1.0, 8));
        assert!(log.forward((0, 0, 1, 0), None, A));
        log.stepped(0, [2; 32], w(2.0, 8));
        assert!(!log.wants_input(0));
        assert!(!log.forward((0, 0, 2, 0), None, A), "its weights are not kept");
        assert_eq!(log.weights(0, 2), None);
        // And stays so for the epoch.
        log.stepped(0, [3; 32], w(3.0, 8));
        assert!(!log.forward((0, 0, 3, 0), None, A));
        assert_eq!(log.step_hashes(0).unwrap().len(), 3, "the hashes are still all kept");
        assert_eq!(log.bytes().0, 64);
        // Input frames have their own bound.
        let mut log = EvidenceLog::new(64);
        log.begin(0, 0, w(0.0, 2));
        assert!(log.forward((0, 0, 0, 0), Some(vec![0; 10]), A));
        assert!(!log.forward((0, 0, 1, 0), Some(vec![0; 10]), A));
        assert!(!log.wants_input(0));
        assert!(!log.forward((0, 0, 2, 0), None, A), "nothing more once full");
        // A restart of the epoch on another stage keeps the chain's items.
        log.stepped(0, [7; 32], w(1.0, 2));
        log.begin(0, 1, w(9.0, 3));
        assert_eq!(log.step_hashes(0), Some(&[[7; 32]][..]));
        assert!(log.attempt((0, 0, 0, 0)).is_none());
        assert!(log.forward((0, 0, 5, 0), None, A));
        assert_eq!(log.weights(0, 0), Some(&w(9.0, 3)[..]));
    }
}
