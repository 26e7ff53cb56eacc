//! iota-control: the control plane.
//!
//! - [`orchestrator`]: the run's state machine (sans I/O);
//! - [`service`], [`state_db`]: its gRPC shell and its durable state (SQLite);
//! - [`s3_store`]: the object store on an S3-compatible service (the
//!   orchestrator holds its credentials and presigns URLs for the others);
//! - [`validation`]: which work validators re-check and how their
//!   stake-weighted verdicts become consequences (sans I/O);
//! - [`settlement`]: CLASP attribution and Yuma consensus (sans I/O);
//! - [`cli`], [`commands`], [`swarm`]: run flags and files, the
//!   `iota-control` commands, and the local swarm launcher.
//!
//! The wire schema, signed envelopes, the client and the run configuration
//! are shared with the data plane and live in `iota-protocol`.

// The role state machines are `iota-roles`', re-exported under their old paths.
pub use iota_roles::{orchestrator, settlement, validation};

pub mod audit;
pub mod cli;
pub mod commands;
pub mod dashboard;
pub mod data_cmd;
pub mod epoch_table;
pub mod final_model;
pub mod http_endpoint;
pub mod ledger_cmd;
pub mod merge_auditor;
pub mod metrics;
pub mod s3_store;
pub mod service;
pub mod state_db;
pub mod status_cmd;
pub mod swarm;
mod swarm_outcome;
pub mod tls_server;
pub mod validator;
