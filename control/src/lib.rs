//! iota-control: the control plane.
//!
//! - [`orchestrator`]: the run's state machine (sans I/O);
//! - [`service`], [`state_db`]: its gRPC shell and its durable state (SQLite);
//! - [`cli`], [`swarm`]: run flags and files, and the local swarm launcher.
//!
//! The wire schema, signed envelopes, the client and the run configuration
//! are shared with the data plane and live in `iota-protocol`.

pub mod cli;
pub mod orchestrator;
pub mod service;
pub mod state_db;
pub mod swarm;
