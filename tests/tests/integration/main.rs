//! The workspace's integration tests, in one binary (one link on a
//! 2-core CI machine): whole swarms in one process (`swarm`), and a hostile
//! client written from docs/PROTOCOL.md against the orchestrator (`hostile`),
//! every fuzz target's body over its committed seeds (`fuzz_replay`),
//! swarms with a silent, closed, slow or flaky miner (`liveness`), and
//! validators' recompute (`validation`).
//!
//! The binary counts the bytes each thread has allocated and not freed
//! (`iota_model::alloc::ThreadCounted`), so a test can measure what a server keeps per miner
//! without other tests' allocations mixing in.

mod fuzz_replay;
mod hostile;
mod liveness;
mod model_export;
mod netns;
mod object_store;
mod operator_endpoints;
mod overlap;
mod served_store;
mod settlement;
mod sparse_merge;
mod swarm;
mod validation;

#[global_allocator]
static ALLOC: iota_model::alloc::ThreadCounted<std::alloc::System> =
    iota_model::alloc::ThreadCounted(std::alloc::System);
