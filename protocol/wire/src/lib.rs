//! iota-wire: the protocol's pure half, shared by the role state machines
//! and the networked shells alike. No async runtime, network, store or
//! database dependency (`scripts/check-graph.py` enforces it).
//!
//! - [`pb`]: the schema's message types (`protocol/proto/iota.proto`; the
//!   gRPC services over them are generated in `iota-protocol`);
//! - [`auth`]: signed request envelopes (sign, and the server's verifier)
//!   and the orchestrator's signed replies and commands;
//! - [`refusal`], [`fields`]: why a request is refused, and the rules its
//!   fields must meet; [`source_limits`]: request budgets per source
//!   address and for the whole server;
//! - [`join_token`]: an orchestrator's address and key in one string;
//!   [`methods`]: the gRPC method paths envelopes are signed for;
//! - [`run_spec`], [`run_config`]: what a run is, as the orchestrator plans
//!   it and as a miner receives it;
//! - [`store_keys`], [`object_store`]: where a run's objects live and the
//!   store interface; [`manifest`]: announced objects readers verify;
//!   [`served_grant`]: grants on the store the orchestrator serves itself;
//! - [`commitments_pb`], [`plan_pb`]: lane commitments and the butterfly
//!   merge plan on the wire.

pub mod auth;
pub mod commitments_pb;
pub mod fields;
pub mod join_token;
pub mod manifest;
pub mod methods;
pub mod object_store;
pub mod plan_pb;
pub mod refusal;
pub mod run_config;
pub mod run_spec;
pub mod served_grant;
pub mod source_limits;
pub mod store_keys;

pub use manifest::StoredObject;
pub use object_store::{ObjectStore, SharedStore};
pub use plan_pb::{plan_from_pb, plan_to_pb};
pub use run_config::RunConfig;
pub use run_spec::{MbRef, MergeMethod, MergeSpec, RunSpec, ValidationSpec, ValidatorStake};

/// The message types generated from `protocol/proto/iota.proto`.
// Generated code: its doc comments are the schema's, as prost lays them out.
#[allow(clippy::all)]
pub mod pb {
    include!(concat!(env!("OUT_DIR"), "/iota.v1.rs"));
}
