//! iota-roles: the protocol's roles as pure state machines, fed events, the
//! time and seeded randomness, answering with actions. No async runtime,
//! network, store or database dependency (`scripts/check-graph.py` enforces
//! it): the gRPC, S3 and SQL shells in `iota-control` only translate.
//!
//! - [`orchestrator`]: the run's state machine (admission, routing and
//!   liveness, merges, validation rounds, settling);
//! - [`validation`]: which work validators re-check, the checks they run
//!   and how their stake-weighted verdicts become consequences;
//! - [`settlement`]: CLASP attribution, Yuma consensus, the signed ledger
//!   and the weights a chain is sent;
//! - [`sim`]: a deterministic swarm simulator over the orchestrator, on a
//!   virtual clock (`iota-bench sim`).

pub mod orchestrator;
mod serde_pairs;
pub mod settlement;
pub mod sim;
pub mod validation;
