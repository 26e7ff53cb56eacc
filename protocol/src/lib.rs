//! iota-protocol: what every networked role (orchestrator, miner, validator)
//! shares, and nothing that only one of them does.
//!
//! - [`pb`]: the gRPC services over the schema's message types;
//! - [`client`]: the typed, signing client of the orchestrator;
//! - [`tls_identity`]: TLS bound to the orchestrator's key;
//!   [`http_endpoint`]: the plain-HTTP side endpoints (metrics, dashboard);
//!   [`store_tls`]: TLS of granted store URLs (a bucket's, or the store
//!   the orchestrator serves itself);
//! - everything pure (envelopes, field rules, refusals, the run's spec and
//!   configuration, store keys, manifests) is `iota-wire`'s, re-exported
//!   here under the same paths.
//!
//! It depends on `iota-core` and `iota-wire` only: no model, no data plane.

pub mod client;
pub mod http_endpoint;
pub mod store_tls;
pub mod tls_identity;

// The pure half lives in `iota-wire`; its modules are re-exported under
// their old paths so every shell names them as before.
pub use iota_wire::{
    MbRef, MergeMethod, MergeSpec, ObjectStore, RunConfig, RunSpec, SharedStore, StoredObject, ValidationSpec,
    ValidatorStake, plan_from_pb, plan_to_pb,
};
pub use iota_wire::{
    auth, commitments_pb, fields, join_token, manifest, object_store, plan_pb, refusal, run_config, run_spec,
    served_grant, source_limits, store_keys,
};

/// The schema's message types (`iota-wire`) and the gRPC services over
/// them, generated from `proto/iota.proto`.
pub mod pb {
    pub use iota_wire::pb::*;
    tonic::include_proto!("iota.v1");
}

/// The gRPC status a refused request is answered with.
pub fn refusal_status(r: &refusal::Rejected) -> tonic::Status {
    tonic::Status::new(tonic::Code::from_i32(r.reason.code() as i32), r.message.clone())
}
