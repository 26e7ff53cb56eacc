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

use super::records::{RecordSpill, Recorded};
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
    /// Where large records are kept (None: in memory; `records.rs`).
    pub(super) spill: Option<RecordSpill>,
}

/// What a sparse replica shows of one epoch: the weights it started from
/// and ended on, its weights chain's items, and the backlog its
/// contributions started from (each the stage's whole).
struct EpochRecord {
    epoch: u64,
    stage: u32,
    start: Recorded,
    last: Recorded,
    items: Vec<[u8; 32]>,
    backlog: Recorded,
}

impl EpochRecord {
    /// This epoch's weights over `range`, as `ContributionWitness::of`.
    fn weights(&self, range: Range<usize>) -> Result<ContributionWitness, String> {
        Ok(ContributionWitness {
            start: self.start.witness(range.clone())?,
            last: self.last.witness(range)?,
            step_hashes: self.items.clone(),
        })
    }
}

impl Feedback {
    /// Nothing held back yet; records kept in memory until given a
    /// directory (`RecordSpill`).
    pub(super) fn new() -> Feedback {
        Feedback::default()
    }

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
    /// what an audit of them is shown, the backlog they start from among
    /// it (its hash goes into the epoch's commitments: `backlog_hash`). A
    /// backlog the last epoch's contributions did not leave whole (it sat
    /// that merge out, or it was cut short) starts afresh, since nothing
    /// could show where it came from. Once per epoch.
    pub(super) fn begin(&mut self, epoch: u64, stage: u32, start: &[f32], last: &[f32], items: &[[u8; 32]]) {
        if self.records.as_ref().is_some_and(|(r, _)| r.epoch == epoch && r.stage == stage) {
            return;
        }
        self.hold(stage, start.len());
        let carried = epoch.checked_sub(1).is_some_and(|e| self.stepped == Some((e, stage)));
        let Some((_, held)) = self.held.as_mut() else { return };
        if !carried {
            *held = ErrorFeedback::new(start.len());
        }
        let spill = self.spill.as_ref();
        let before =
            self.records.take().map(|(now, _)| now).filter(|r| carried && r.epoch + 1 == epoch && r.stage == stage);
        let now = EpochRecord {
            epoch,
            stage,
            start: Recorded::keep(start, spill),
            last: Recorded::keep(last, spill),
            items: items.to_vec(),
            backlog: Recorded::keep(held.residual(), spill),
        };
        self.records = Some((now, before));
    }

    /// The hash of the backlog `begin` recorded for `epoch`.
    pub(super) fn backlog_hash(&self, epoch: u64) -> Option<[u8; 32]> {
        self.records.as_ref().filter(|(r, _)| r.epoch == epoch).map(|(r, _)| r.backlog.hash())
    }

    /// The witness of `epoch`'s contribution to `range` (a validated run).
    /// None: no record of `epoch`, or it could not be read back (warned).
    pub(super) fn witness(&self, epoch: u64, range: Range<usize>) -> Option<SparseWitness> {
        let (now, before) = self.records.as_ref().filter(|(r, _)| r.epoch == epoch)?;
        let shown = || -> Result<SparseWitness, String> {
            let backlog = now.backlog.witness(range.clone())?;
            let before = match before.as_ref().filter(|_| SparseWitness::carries(&backlog, range.clone())) {
                Some(b) => Some((b.weights(range.clone())?, b.backlog.witness(range.clone())?)),
                None => None,
            };
            Ok(SparseWitness { weights: now.weights(range.clone())?, backlog, before })
        };
        shown().inspect_err(|e| tracing::warn!(epoch, error = %e, "no witness for an audited contribution")).ok()
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

#[cfg(test)]
mod tests {
    use iota_checks::sparse::SPARSE_BLOCK;

    use super::*;

    /// An epoch's start, last weights, chain items and backlog, whole.
    type Whole = (Vec<f32>, Vec<f32>, Vec<[u8; 32]>, Vec<f32>);

    /// Two epochs of a replica whose every contribution comes from its
    /// backlog, stage of two sparse blocks: the witnesses of both
    /// partitions of both epochs, and for each the witness built from the
    /// whole vectors (`SparseWitness::of`).
    fn two_epochs(spill: Option<&std::path::Path>) -> Vec<(Vec<u8>, Vec<u8>)> {
        let n = 2 * SPARSE_BLOCK;
        let mut f = Feedback::new();
        f.spill = spill.map(|d| RecordSpill { from_bytes: 0, keep_free: 0, ..RecordSpill::new(d.to_path_buf()) });
        let mut shown = Vec::new();
        let mut before: Option<Whole> = None;
        for epoch in 0..2u64 {
            let start: Vec<f32> = (0..n).map(|i| ((i as u64 + epoch) as f32 * 0.37).sin()).collect();
            let last: Vec<f32> = start.iter().enumerate().map(|(i, s)| s - 1e-3 * (i as f32 * 0.11).cos()).collect();
            let items = vec![[epoch as u8; 32]];
            f.begin(epoch, 0, &start, &last, &items);
            let backlog = f.held.as_ref().unwrap().1.residual().to_vec();
            let (now, _) = f.records.as_ref().unwrap();
            let on_disk = [&now.start, &now.last, &now.backlog].map(|r| r.on_disk());
            assert_eq!(on_disk, [spill.is_some(); 3], "epoch {epoch}: where the records went");
            assert_eq!(f.backlog_hash(epoch), Some(iota_checks::hashes::weights_hash(&backlog)));
            let delta: Vec<f32> = start.iter().zip(&last).map(|(s, l)| s - l).collect();
            for p in 0..2 {
                let range = p * SPARSE_BLOCK..(p + 1) * SPARSE_BLOCK;
                let held = &mut f.held.as_mut().unwrap().1;
                held.encode_frame(range.start, &delta[range.clone()], SPARSE_BLOCK / 20, 0.95).unwrap();
                let weights = ContributionWitness::of(&start, &last, &items, range.clone());
                let b = before.as_ref().map(|(s, l, i, b)| (ContributionWitness::of(s, l, i, range.clone()), &b[..]));
                let whole = SparseWitness::of(weights, &backlog, b, range.clone());
                shown.push((f.witness(epoch, range).unwrap().encode(), whole.encode()));
            }
            f.stepped(epoch, 0);
            before = Some((start, last, items, backlog));
        }
        shown
    }

    /// Records kept on disk show the same witnesses, byte for byte, as
    /// records in memory and as the whole vectors would; the second
    /// epoch's carry the epoch before.
    #[test]
    fn records_on_disk_show_the_witnesses_the_whole_vectors_would() {
        let dir = tempfile::tempdir().unwrap();
        let disk = two_epochs(Some(dir.path()));
        let memory = two_epochs(None);
        assert_eq!(disk.len(), 4);
        for (i, ((d, whole), (m, _))) in disk.iter().zip(&memory).enumerate() {
            assert!(d == whole, "witness {i} on disk is not the whole vectors'");
            assert!(m == whole, "witness {i} in memory is not the whole vectors'");
        }
        let limits = iota_checks::contribution::WitnessLimits {
            weights: 2 * SPARSE_BLOCK as u64,
            partition: SPARSE_BLOCK as u64,
            max_steps: 4,
        };
        let carried: Vec<bool> =
            disk.iter().map(|(d, _)| SparseWitness::decode(d, limits).unwrap().before.is_some()).collect();
        assert_eq!(carried, vec![false, false, true, true], "epoch 1 carries epoch 0's backlog");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "no file left in the directory");
    }
}
