//! iota-control: the control plane.
//!
//! - [`pb`]: the generated gRPC types and services (`proto/iota.proto`);
//! - [`auth`]: signed request envelopes (signature, timestamp, nonce, rate).

pub mod auth;

/// Generated from `proto/iota.proto`.
pub mod pb {
    tonic::include_proto!("iota.v1");
}
