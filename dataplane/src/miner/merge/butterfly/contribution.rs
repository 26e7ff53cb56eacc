//! What a replica sends as its contribution to a partition, and the frame
//! header it goes in: the slice of its pseudo-gradient in the run's
//! contribution codec. With sparse contributions (`MergeSpec::sparse_density`)
//! the replica adds what its earlier contributions left unsent and keeps
//! what this one leaves (error feedback, `iota_checks::sparse`), so the
//! merge loses none of what it trained, only delays it.

use std::ops::Range;
use std::time::Instant;

use anyhow::Result;
use bytes::Bytes;
use iota_checks::contribution::ContributionWitness;
use iota_checks::slices::encode_slice;
use iota_checks::sparse::ErrorFeedback;
use iota_checks::sparse_contribution::SparseWitness;
use iota_core::WireCodec;
use iota_protocol::MergeSpec;

use super::{MergeFault, MergeStats};

/// A replica's unsent backlog for the stage it holds (none until its
/// first sparse contribution).
#[derive(Default)]
pub(super) struct Feedback {
    held: Option<(u32, ErrorFeedback)>,
    /// The last (epoch, stage) whose every partition's contribution came
    /// from the backlog: the backlog since is what those left.
    stepped: Option<(u64, u32)>,
    /// In a validated run: this epoch's record, and the epoch before's
    /// where its contributions left this epoch's backlog (what an audited
    /// contribution's witness shows, `iota_checks::sparse_contribution`).
    records: Option<(EpochRecord, Option<EpochRecord>)>,
}

/// What a sparse replica shows of one epoch: the weights it started from
/// and ended on, its weights chain's items, and the backlog its
/// contributions started from (each the stage's whole).
struct EpochRecord {
    epoch: u64,
    stage: u32,
    start: Vec<f32>,
    last: Vec<f32>,
    items: Vec<[u8; 32]>,
    backlog: Vec<f32>,
    backlog_hash: [u8; 32],
}

impl Feedback {
    /// Keeps the backlog if it is for `stage` of `len` values, else starts
    /// afresh (a replica moved to another stage, or restarted, has nothing
    /// of the new stage held back).
    pub(super) fn hold(&mut self, stage: u32, len: usize) {
        if !self.held.as_ref().is_some_and(|(s, f)| *s == stage && f.residual().len() == len) {
            self.held = Some((stage, ErrorFeedback::new(len)));
        }
    }

    /// The magnitude still held back (0 with dense contributions).
    pub(super) fn norm(&self) -> f64 {
        self.held.as_ref().map_or(0.0, |(_, f)| f.norm())
    }

    /// Multiplies what is held back by `factor` (the `InflatedBacklog`
    /// test fault).
    pub(super) fn inflate(&mut self, factor: f32) {
        if let Some((_, held)) = self.held.as_mut() {
            let n = held.residual().len();
            held.decay(0..n, factor);
        }
    }

    /// Every partition of `epoch`'s plan on `stage` has had its
    /// contribution from the backlog.
    pub(super) fn stepped(&mut self, epoch: u64, stage: u32) {
        self.stepped = Some((epoch, stage));
    }

    /// A validated run's epoch ends (before its contributions): records
    /// what an audit of them is shown, and returns the hash of the backlog
    /// they start from, for the epoch's commitments. A backlog the last
    /// epoch's contributions did not leave whole (it sat that merge out,
    /// or it was cut short) starts afresh, since nothing could show where
    /// it came from. Once per epoch: a repeat returns the same hash.
    pub(super) fn begin(
        &mut self,
        epoch: u64,
        stage: u32,
        start: &[f32],
        last: &[f32],
        items: &[[u8; 32]],
    ) -> [u8; 32] {
        if let Some((now, _)) = self.records.as_ref().filter(|(r, _)| r.epoch == epoch && r.stage == stage) {
            return now.backlog_hash;
        }
        self.hold(stage, start.len());
        let carried = epoch.checked_sub(1).is_some_and(|e| self.stepped == Some((e, stage)));
        let Some((_, held)) = self.held.as_mut() else { return [0; 32] };
        if !carried {
            *held = ErrorFeedback::new(start.len());
        }
        let backlog = held.residual().to_vec();
        let backlog_hash = iota_checks::hashes::weights_hash(&backlog);
        let before =
            self.records.take().map(|(now, _)| now).filter(|r| carried && r.epoch + 1 == epoch && r.stage == stage);
        let now = EpochRecord {
            epoch,
            stage,
            start: start.to_vec(),
            last: last.to_vec(),
            items: items.to_vec(),
            backlog,
            backlog_hash,
        };
        self.records = Some((now, before));
        backlog_hash
    }

    /// The hash `begin` returned for `epoch`.
    pub(super) fn backlog_hash(&self, epoch: u64) -> Option<[u8; 32]> {
        self.records.as_ref().filter(|(r, _)| r.epoch == epoch).map(|(r, _)| r.backlog_hash)
    }

    /// The witness of `epoch`'s contribution to `range` (a validated run).
    pub(super) fn witness(&self, epoch: u64, range: Range<usize>) -> Option<SparseWitness> {
        let (now, before) = self.records.as_ref().filter(|(r, _)| r.epoch == epoch)?;
        let weights = |r: &EpochRecord| ContributionWitness::of(&r.start, &r.last, &r.items, range.clone());
        let before = before.as_ref().map(|b| (weights(b), &b.backlog[..]));
        Some(SparseWitness::of(weights(now), &now.backlog, before, range.clone()))
    }
}

/// Encodes the contribution of `delta[range]`, timed into the encode phase.
/// A `NanDelta` fault (a test tool) then writes a NaN where the codec
/// would not: a value (f32, bf16), a block scale (int8), or a sparse
/// block's magnitude.
pub(super) fn encode(
    stats: &MergeStats,
    spec: &MergeSpec,
    feedback: &mut Feedback,
    range: Range<usize>,
    delta: &[f32],
    fault: Option<MergeFault>,
) -> Result<Bytes> {
    let t0 = Instant::now();
    let slice = &delta[range.clone()];
    let mut bytes = match spec.contribution_codec() {
        WireCodec::SparseTopK => {
            let (_, k) = spec.contribution_shape(slice.len() as u64);
            let held = &mut feedback.held.get_or_insert_with(|| (0, ErrorFeedback::new(delta.len()))).1;
            held.encode_frame(range.start, slice, k, spec.sparse_decay)?
        }
        c => encode_slice(c, slice)?,
    };
    if fault == Some(MergeFault::NanDelta) {
        let (at, nan) = match spec.contribution_codec() {
            WireCodec::F32 => (0, f32::NAN.to_le_bytes().to_vec()),
            // The block's low magnitude, after its kept count.
            WireCodec::SparseTopK => (2, 0x7fc0u16.to_le_bytes().to_vec()),
            _ => (0, 0x7fc0u16.to_le_bytes().to_vec()),
        };
        bytes[at..at + nan.len()].copy_from_slice(&nan);
    }
    MergeStats::time(&stats.encode_ns, t0);
    Ok(Bytes::from(bytes))
}
