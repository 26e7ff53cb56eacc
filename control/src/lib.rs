//! iota-control: the control plane.
//!
//! - [`pb`]: the generated gRPC types and services (`proto/iota.proto`);
//! - [`auth`]: signed request envelopes (signature, timestamp, nonce, rate);
//! - [`orchestrator`]: the run's state machine (sans I/O).

pub mod auth;
pub mod orchestrator;

/// Generated from `proto/iota.proto`.
pub mod pb {
    tonic::include_proto!("iota.v1");
}
