//! What flows into the stage worker and out of it: the async shell feeds it
//! commands, frames and ticks, and carries out the frames and reports it
//! asks for. The merge implementations produce the same outputs.

use bytes::Bytes;
use iota_core::PeerId;
use iota_protocol::pb;

use crate::frame::FrameMeta;
use crate::transport::ReceivedFrame;

/// What the worker reacts to. Not boxed: a command is a few hundred bytes,
/// the worker's queue is bounded, and every test and shell builds these.
#[allow(clippy::large_enum_variant)]
pub enum Input {
    Command(pb::command::Kind),
    Frame(Box<ReceivedFrame>),
    /// Time passed (the merge's retries and store fallbacks).
    Tick,
}

/// What the worker wants done.
#[derive(Debug)]
pub enum Output {
    /// `fallback`: an object-store key where the frame is left, signed, if
    /// it cannot be delivered (the receiver looks there).
    Frame {
        to: PeerId,
        meta: FrameMeta,
        payload: Bytes,
        fallback: Option<String>,
    },
    /// A test tool's frame (`Adversary::FabricatedEvidence`): `wire` goes
    /// out, and the endpoint records, signed as if it had been sent,
    /// `shown` instead: what the miner will upload as its evidence.
    FabricatedFrame {
        to: PeerId,
        meta: FrameMeta,
        wire: Bytes,
        shown: Bytes,
    },
    Report(pb::report::Kind),
    /// Store the frame, signed, at `key` (a merge contribution a validator
    /// audits).
    Store {
        key: String,
        meta: FrameMeta,
        payload: Bytes,
    },
    /// Store `bytes` as they are at `key` (a merge contribution's witness,
    /// `iota_checks::contribution`: it shows itself against committed
    /// hashes, so it is not signed).
    StoreRaw {
        key: String,
        bytes: Bytes,
    },
}
