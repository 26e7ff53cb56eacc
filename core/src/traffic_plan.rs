//! What a stage sends and receives: boundary bytes per token and the
//! butterfly merge's bytes per replica per epoch, counted as the miner
//! sends them (no I/O; `iota-bench scale --plan-only` prints them).
//!
//! The merge (`dataplane/src/miner/merge/butterfly/`, plan in
//! `merge::plan`): the stage's P values are cut into partitions on `BLOCK`
//! boundaries, each with two owners, so a replica owns 2P/R values. It
//! sends its encoded pseudo-gradient slice of each partition to both owners
//! (to one only when it is an owner itself): 2P(R-1)/R values. Each owner
//! sends the encoded update of its partition to half of the R-2
//! non-owners (`MergePlan::sender_of` alternates the two owners): P(R-2)/R
//! values. Received bytes are the same by symmetry. The writer of each
//! partition (one of its owners) also stores the merged slice as f32 in the
//! object store, and the outer momentum when the run keeps one. `iota-bench butterfly` measured
//! the sent and received bytes equal to this at R = 2, 4, 8, 16.

use crate::codec::{BoundaryCost, WireCodec, boundary_cost};
use crate::config::ModelConfig;
use crate::layout::StageSpec;
use crate::memory_plan::merge_encoded_bytes;

/// A replica's merge traffic in one epoch, in bytes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MergeTraffic {
    /// Contributions sent to partition owners.
    pub contributions_sent: f64,
    /// Updates sent to non-owners of this replica's partitions.
    pub updates_sent: f64,
    /// Received: contributions to its partitions and updates of the others.
    pub received: f64,
    /// f32 merged slices (and outer momentum, when the run keeps one) its
    /// partitions' writer puts in the store (on average P/R values of each
    /// per replica).
    pub store_writes: f64,
}

impl MergeTraffic {
    pub fn sent(&self) -> f64 {
        self.contributions_sent + self.updates_sent
    }
}

/// The merge traffic of one replica of a stage with `params` values among
/// `replicas` replicas, slices encoded with `codec`. Partitions are balanced
/// (`MergePlan::bounded`), so these are the per-replica averages; a single
/// replica merges with nobody.
pub fn merge_traffic(params: usize, replicas: usize, codec: WireCodec, outer_momentum: bool) -> MergeTraffic {
    if replicas < 2 {
        return MergeTraffic { contributions_sent: 0.0, updates_sent: 0.0, received: 0.0, store_writes: 0.0 };
    }
    let (p, r) = (params as f64, replicas as f64);
    let contributions = merge_encoded_bytes(2.0 * p * (r - 1.0) / r, codec);
    let updates = merge_encoded_bytes(p * (r - 2.0) / r, codec);
    MergeTraffic {
        contributions_sent: contributions,
        updates_sent: updates,
        received: contributions + updates,
        store_writes: if outer_momentum { 2.0 } else { 1.0 } * 4.0 * p / r,
    }
}

/// What crosses one stage boundary per token.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BoundaryTraffic {
    /// One direction (the activation forward; its gradient back costs the
    /// same: both use the run's codec), against the bf16 hidden state.
    pub per_direction: BoundaryCost,
    /// Boundaries this stage sits on (1 for head and tail, 2 for a body).
    pub boundaries: usize,
}

impl BoundaryTraffic {
    /// Bytes per token this stage sends (activations out, gradients in).
    pub fn sent_per_token(&self) -> usize {
        self.per_direction.bytes_per_token * self.boundaries
    }
}

/// Boundary traffic of a stage (frame headers not counted: one per
/// micro-batch, not per token).
pub fn boundary_traffic(cfg: &ModelConfig, spec: &StageSpec, codec: WireCodec) -> BoundaryTraffic {
    let boundaries = usize::from(spec.index > 0) + usize::from(spec.index + 1 < spec.count);
    BoundaryTraffic { per_direction: boundary_cost(cfg.d_model, spec.boundary_width, codec), boundaries }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory_plan::merge_encoded_bytes;

    #[test]
    fn merge_bytes_follow_the_butterfly_model() {
        let p = 25_000_000;
        // docs/BENCHMARKS.md (butterfly): measured 50, 100, 125, 137.5 MB sent per replica, bf16.
        for (r, mb) in [(2, 50.0), (4, 100.0), (8, 125.0), (16, 137.5)] {
            let t = merge_traffic(p, r, WireCodec::Bf16, false);
            assert!((t.sent() / 1e6 - mb).abs() < 0.01, "R={r}: {} MB", t.sent() / 1e6);
            assert_eq!(t.sent(), t.received);
        }
        assert_eq!(merge_traffic(p, 1, WireCodec::Bf16, false).sent(), 0.0);
        // int8 blocks carry a 2-byte scale per 256 values.
        let int8 = merge_traffic(256 * 1000, 2, WireCodec::Int8Row, false);
        assert_eq!(int8.sent(), 258.0 * 1000.0);
        assert_eq!(merge_encoded_bytes(512.0, WireCodec::F32), 2048.0);
    }

    #[test]
    fn boundary_traffic_counts_each_side_of_a_stage() {
        let c = ModelConfig::preset("1.5b").unwrap();
        let specs = StageSpec::split(&c, 3).unwrap();
        let t: Vec<BoundaryTraffic> = specs.iter().map(|s| boundary_traffic(&c, s, WireCodec::Int8Row)).collect();
        assert_eq!(t.iter().map(|t| t.boundaries).collect::<Vec<_>>(), vec![1, 2, 1]);
        assert_eq!(t[1].sent_per_token(), 2 * 34);
        assert_eq!(t[0].per_direction.bf16_hidden_bytes, 4096);
        let whole = boundary_traffic(&c, &StageSpec::whole(&c), WireCodec::Int8Row);
        assert_eq!(whole.sent_per_token(), 0);
    }
}
