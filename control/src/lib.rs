//! iota-control: the control plane's shells around the pure roles of
//! `iota-roles` (re-exported here as [`orchestrator`], [`validation`],
//! [`settlement`]).
//!
//! - [`service`], [`state_db`]: the orchestrator's gRPC shell and its
//!   durable state (SQLite or PostgreSQL);
//! - [`s3_store`]: the object store on an S3-compatible service (the
//!   orchestrator holds its credentials and presigns URLs for the others);
//!   [`served_store`]: a run without a bucket, its store served by the
//!   orchestrator itself over the same grants;
//! - [`validator`]: the validator process around `validation::round`;
//! - [`cli`], [`run_claim`]: run flags and the run directory claimed;
//! - [`commands`]: the `iota-control` command line, each command in its own
//!   file ([`orchestrator_cmd`], [`validator_cmd`], [`swarm_cmd`], ...);
//! - [`swarm`]: the local swarm launcher.
//!
//! The wire schema, signed envelopes, the client and the run configuration
//! are shared with the data plane and live in `iota-wire` and
//! `iota-protocol`.

// The role state machines are `iota-roles`', re-exported under their old paths.
pub use iota_roles::{orchestrator, settlement, sim, validation};

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
pub mod orchestrator_cmd;
pub mod run_claim;
pub mod s3_store;
pub mod served_store;
pub mod service;
mod service_subscriber;
pub mod state_db;
pub mod status_cmd;
pub mod step_referee;
pub mod swarm;
pub mod swarm_cmd;
mod swarm_outcome;
pub mod swarm_summary;
pub mod tls_server;
pub mod validator;
pub mod validator_cmd;
mod validator_prove;
