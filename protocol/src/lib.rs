//! iota-protocol: what every networked role (orchestrator, miner, validator)
//! shares, and nothing that only one of them does.
//!
//! - [`pb`]: the gRPC schema (`proto/iota.proto`) and its generated types;
//! - [`auth`]: signed request envelopes (sign, and the server's verifier)
//!   and the orchestrator's signed replies and commands;
//! - [`refusal`], [`fields`]: why a request is refused, and the rules its
//!   fields must meet; [`source_limits`]: request budgets per source
//!   address and for the whole server;
//! - [`client`]: the typed, signing client of the orchestrator;
//!   [`join_token`]: its address and key in one string (`iota://KEY@HOST:PORT`);
//! - [`run_spec`], [`run_config`]: what a run is, as the orchestrator plans
//!   it and as a miner receives it;
//! - [`store_keys`], [`object_store`]: where a run's objects live and the
//!   store interface; [`manifest`]: announced objects readers verify;
//! - [`plan_pb`]: the butterfly merge plan on the wire.
//!
//! It depends on `iota-core` only: no model, no data plane.

pub mod auth;
pub mod client;
pub mod commitments_pb;
pub mod fields;
pub mod http_endpoint;
pub mod join_token;
pub mod manifest;
pub mod object_store;
pub mod plan_pb;
pub mod refusal;
pub mod run_config;
pub mod run_spec;
pub mod source_limits;
pub mod store_keys;
pub mod tls_identity;

pub use manifest::StoredObject;
pub use object_store::{ObjectStore, SharedStore};
pub use plan_pb::{plan_from_pb, plan_to_pb};
pub use run_config::RunConfig;
pub use run_spec::{MbRef, MergeMethod, MergeSpec, RunSpec, ValidationSpec, ValidatorStake};

/// Generated from `proto/iota.proto`.
pub mod pb {
    tonic::include_proto!("iota.v1");
}
