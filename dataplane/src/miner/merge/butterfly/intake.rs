//! A replica's intake of `WeightSlice` frames: checked against the plan,
//! held when they come before the plan that makes them acceptable (a
//! bounded queue), kept as contributions to the partitions it owns or as
//! candidate updates.

use std::sync::atomic::Ordering;

use iota_core::merge::BLOCK;
use iota_core::wire::Direction;
use tracing::debug;

use super::Butterfly;
use super::slices::{KIND_CONTRIBUTION, KIND_UPDATE, SliceMsg, blocks};
use crate::frame::FrameMeta;

impl Butterfly {
    /// The header fields of a slice of partition `k` (`kind`: a
    /// contribution in the contribution codec and shape, or an update in
    /// the merge codec as `[blocks, BLOCK]`).
    pub(super) fn meta(&self, k: usize, offset: u64, len: u64, kind: u32, generation: u32) -> FrameMeta {
        let (codec, (rows, cols)) = if kind == KIND_CONTRIBUTION {
            (self.spec.contribution_codec(), self.spec.contribution_shape(len))
        } else {
            (self.codec(), (blocks(len), BLOCK as usize))
        };
        FrameMeta {
            direction: Direction::WeightSlice,
            codec,
            stage: self.stage as u16,
            epoch: self.epoch as u32,
            shard: k as u32,
            first_sample: offset,
            samples: kind,
            attempt: generation,
            shape: vec![rows as u32, cols as u32],
            answers: [0; 32],
        }
    }

    /// Takes in a checked slice message; `from_early` = it was held back.
    // A peer's frame: no unchecked arithmetic or indexing.
    #[cfg_attr(not(test), deny(clippy::arithmetic_side_effects, clippy::indexing_slicing))]
    pub(super) fn accept(&mut self, m: SliceMsg, from_early: bool) {
        let Some(plan) = self.plan.as_ref() else {
            self.hold(m);
            return;
        };
        if m.epoch != self.epoch {
            if m.epoch > self.epoch {
                self.hold(m);
            }
            return;
        }
        let Some(part) = plan.partitions.get(m.k) else { return };
        let (codec, shape) = if m.kind == KIND_CONTRIBUTION {
            (self.spec.contribution_codec(), self.spec.contribution_shape(part.len))
        } else {
            (self.codec(), (blocks(part.len), BLOCK as usize))
        };
        let ok_shape = m.offset == part.offset
            && (m.rows, m.cols) == shape
            && m.codec == codec.id()
            && plan.is_participant(&m.from);
        if !ok_shape {
            debug!(from = %m.from, k = m.k, "merge slice does not match the plan; dropped");
            return;
        }
        if !from_early {
            self.stats.recv_bytes.fetch_add(m.payload.len() as u64, Ordering::Relaxed);
        }
        match m.kind {
            KIND_CONTRIBUTION if part.owners.contains(&self.me) => {
                // The first one from a sender stays, with its header.
                if let std::collections::btree_map::Entry::Vacant(e) =
                    self.contribs.entry(m.k).or_default().entry(m.from)
                {
                    e.insert(m.payload);
                    self.contrib_headers.entry(m.k).or_default().insert(m.from, m.header);
                    self.latest_contribution = self.latest_contribution.max(self.plan_at.elapsed());
                }
            }
            // Perhaps for a plan (a referee's) that has not reached us yet.
            KIND_CONTRIBUTION => self.hold(m),
            KIND_UPDATE if part.owners.contains(&m.from) || m.generation > part.generation => {
                let c = self.candidates.entry(m.k).or_default();
                // Each owner sends at most one update per generation.
                if c.len() < 8 && !c.iter().any(|(h, _)| *h == m.hash) {
                    c.push((m.hash, m.payload));
                }
            }
            _ => {}
        }
    }

    pub(super) fn hold(&mut self, m: SliceMsg) {
        // Bounded: a peer cannot make us buffer without limit.
        let limit = 4 * self.plan.as_ref().map_or(64, |p| p.partitions.len().max(16));
        if self.early.len() >= limit {
            self.early.pop_front();
        }
        self.early.push_back(m);
    }
}
