//! iota-control: the control plane.
//!
//! - [`pb`]: the generated gRPC types and services (`proto/iota.proto`);
//! - [`auth`]: signed request envelopes (signature, timestamp, nonce, rate);
//! - [`orchestrator`]: the run's state machine (sans I/O);
//! - [`service`], [`store`], [`client`]: its gRPC shell, SQLite state, and a signing client.

pub mod auth;
pub mod cli;
pub mod client;
pub mod orchestrator;
pub mod run;
pub mod service;
pub mod store;
pub mod swarm;

/// Generated from `proto/iota.proto`.
pub mod pb {
    tonic::include_proto!("iota.v1");
}
