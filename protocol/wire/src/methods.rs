//! The orchestrator's gRPC method paths: what a signed envelope names (a
//! signature is good for one method), so the verifier, the client and the
//! ledger's re-check of signed reports agree on them.

pub const HELLO: &str = "/iota.v1.Orchestrator/Hello";
pub const REGISTER: &str = "/iota.v1.Orchestrator/Register";
pub const HEARTBEAT: &str = "/iota.v1.Orchestrator/Heartbeat";
pub const SUBSCRIBE: &str = "/iota.v1.Orchestrator/Subscribe";
pub const REPORT: &str = "/iota.v1.Orchestrator/Report";
pub const STATUS: &str = "/iota.v1.Orchestrator/Status";
pub const GRANT: &str = "/iota.v1.Orchestrator/Grant";
pub const VALIDATE: &str = "/iota.v1.Orchestrator/Validate";
