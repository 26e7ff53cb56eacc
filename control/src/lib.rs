//! iota-control: the control plane.
//!
//! - [`orchestrator`]: the run's state machine (sans I/O);
//! - [`service`], [`state_db`]: its gRPC shell and its durable state (SQLite);
//! - [`cli`], [`commands`], [`swarm`]: run flags and files, the
//!   `iota-control` commands, and the local swarm launcher.
//!
//! The wire schema, signed envelopes, the client and the run configuration
//! are shared with the data plane and live in `iota-protocol`.

pub mod audit;
pub mod cli;
pub mod commands;
pub mod orchestrator;
pub mod service;
pub mod state_db;
pub mod swarm;
