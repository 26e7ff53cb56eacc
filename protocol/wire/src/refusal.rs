//! Why a request was refused: one closed set of reasons shared by the
//! verifier, the field checks and the orchestrator service, each with the
//! gRPC status a client sees and a stable name the server counts it under.

use iota_core::PeerId;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Reason {
    /// The envelope's fields have the wrong sizes.
    MalformedEnvelope,
    /// The caller's key is of small order or not canonically encoded.
    WeakKey,
    BodyTooLarge,
    BadSignature,
    /// Timestamp outside the server's window.
    StaleTimestamp,
    /// Signed before this server process started (a replay across restarts).
    BeforeStart,
    ReplayedNonce,
    RateLimited,
    TooManyIdentities,
    /// The body does not decode as the method's message.
    BadBody,
    /// A field is out of range, too long or not parseable.
    InvalidField,
    /// The caller must register first.
    NotRegistered,
    /// The run (or the caller's stage) holds as many miners as it takes.
    RunFull,
    /// The caller's role may not call this method.
    WrongRole,
    /// The state machine refused the event (stale or inconsistent report).
    Refused,
    /// An announcement of a store object the caller was not asked to write.
    NotYours,
    /// The run admits listed identities only, and this is not one.
    NotAdmitted,
    /// The memory the miner states holds no stage of the run.
    DoesNotFit,
}

impl Reason {
    pub const ALL: [Reason; 18] = [
        Reason::MalformedEnvelope,
        Reason::WeakKey,
        Reason::BodyTooLarge,
        Reason::BadSignature,
        Reason::StaleTimestamp,
        Reason::BeforeStart,
        Reason::ReplayedNonce,
        Reason::RateLimited,
        Reason::TooManyIdentities,
        Reason::BadBody,
        Reason::InvalidField,
        Reason::NotRegistered,
        Reason::RunFull,
        Reason::WrongRole,
        Reason::Refused,
        Reason::NotYours,
        Reason::NotAdmitted,
        Reason::DoesNotFit,
    ];

    /// The name refusals are counted under (metrics, `RunStatus.refusals`).
    pub fn name(self) -> &'static str {
        match self {
            Reason::MalformedEnvelope => "malformed_envelope",
            Reason::WeakKey => "weak_key",
            Reason::BodyTooLarge => "body_too_large",
            Reason::BadSignature => "bad_signature",
            Reason::StaleTimestamp => "stale_timestamp",
            Reason::BeforeStart => "signed_before_start",
            Reason::ReplayedNonce => "replayed_nonce",
            Reason::RateLimited => "rate_limited",
            Reason::TooManyIdentities => "too_many_identities",
            Reason::BadBody => "bad_body",
            Reason::InvalidField => "invalid_field",
            Reason::NotRegistered => "not_registered",
            Reason::RunFull => "run_full",
            Reason::WrongRole => "wrong_role",
            Reason::Refused => "refused_by_state",
            Reason::NotYours => "not_yours",
            Reason::NotAdmitted => "not_admitted",
            Reason::DoesNotFit => "does_not_fit",
        }
    }

    /// The gRPC status code a client sees for this reason (the networked
    /// shell turns it into its transport's status).
    pub fn code(self) -> Code {
        match self {
            Reason::MalformedEnvelope | Reason::BodyTooLarge | Reason::BadBody | Reason::InvalidField => {
                Code::InvalidArgument
            }
            Reason::WeakKey | Reason::BadSignature | Reason::StaleTimestamp => Code::Unauthenticated,
            // The server just (re)started: the same request signed again
            // goes through, so clients retry it as they do a restart.
            Reason::BeforeStart => Code::Unavailable,
            Reason::ReplayedNonce => Code::AlreadyExists,
            Reason::RateLimited | Reason::TooManyIdentities | Reason::RunFull | Reason::DoesNotFit => {
                Code::ResourceExhausted
            }
            Reason::NotRegistered | Reason::Refused => Code::FailedPrecondition,
            Reason::WrongRole | Reason::NotYours | Reason::NotAdmitted => Code::PermissionDenied,
        }
    }
}

/// The gRPC status codes refusals map to, numbered as the gRPC
/// specification numbers them (`Code as i32` is the wire value).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Code {
    InvalidArgument = 3,
    AlreadyExists = 6,
    PermissionDenied = 7,
    ResourceExhausted = 8,
    FailedPrecondition = 9,
    Unavailable = 14,
    Unauthenticated = 16,
}

/// A refused request: the reason, a message for the caller, and who sent
/// it when the envelope said (a refused envelope's identity is a claim,
/// not a fact, unless its signature verified).
#[derive(Clone, Debug, PartialEq)]
pub struct Rejected {
    pub reason: Reason,
    pub message: String,
    pub peer: Option<PeerId>,
}

impl Rejected {
    pub fn new(reason: Reason, message: impl Into<String>) -> Rejected {
        Rejected { reason, message: message.into(), peer: None }
    }

    pub fn from(mut self, peer: PeerId) -> Rejected {
        self.peer = Some(peer);
        self
    }
}

impl std::fmt::Display for Rejected {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.reason.name(), self.message)
    }
}
