//! iota-checks: the pure checks, shared by the miner (which builds what is
//! checked), its peers and the validators (which check it). No async
//! runtime, network, store or database dependency
//! (`scripts/check-graph.py` enforces it).
//!
//! - [`frame`]: a frame's header, signature and limits, built and decoded;
//! - [`hashes`]: the token and weight hashes commitments are made of;
//! - [`recompute`]: a stage's forward and backward recomputed from evidence;
//! - [`evidence`], [`evidence_bundle`]: what a miner shows for a drawn
//!   attempt, and the checks a validator runs on it;
//! - [`inner_step`]: an inner step's record, what a miner shows of one,
//!   and its recompute;
//! - [`contribution`]: a merge contribution held against the weights
//!   chain it must come from; [`sparse_contribution`], a sparse one also
//!   against the backlog it committed to and the epoch before that left it;
//! - [`slices`]: a merge partition's slice on the wire and the reduce an
//!   honest owner (and an auditing validator) runs; [`reduce_stream`], the
//!   reduce streamed for the rules that are a weighted mean;
//!   [`tree_hash`], a BLAKE3 hash put together from pieces hashed while in
//!   cache; [`payload_pool`], published-update buffers kept for the next
//!   merge.

pub mod contribution;
pub mod evidence;
pub mod evidence_bundle;
pub mod frame;
pub mod hashes;
pub mod inner_step;
pub mod payload_pool;
pub mod recompute;
pub mod reduce_bf16;
pub mod reduce_stream;
pub mod slices;
pub mod sparse;
pub mod sparse_contribution;
pub mod tree_hash;

pub use frame::{FrameError, FrameLimits, FrameMeta, RunContext};
