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
use iota_checks::slices::encode_slice;
use iota_checks::sparse::ErrorFeedback;
use iota_core::WireCodec;
use iota_protocol::MergeSpec;

use super::{MergeFault, MergeStats};

/// A replica's unsent backlog for the stage it holds (none until its
/// first sparse contribution).
#[derive(Default)]
pub(super) struct Feedback {
    held: Option<(u32, ErrorFeedback)>,
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
