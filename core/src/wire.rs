//! The data-plane frame: what miners send each other (activations, their
//! gradients, weight slices).
//!
//! On a stream a frame is
//!
//! ```text
//! "IOTF" | header_len: u32 LE | header (rkyv, FrameHeader) | zero pad to 64 | payload
//! ```
//!
//! The header has a fixed archived size, and the payload starts at a 64-byte
//! aligned offset from the frame start so a receiver can read it into an
//! aligned buffer and use it in place. Every header carries the blake3 hash
//! of its payload, the id of the frame it answers (a hash chain along a
//! pathway), its sender and the sender's signature over all of that, so a
//! validator holding a frame can audit it later without the connection it
//! came on.
//!
//! This module defines the schema, sizes and signing rules; validating bytes
//! from the network is `iota-dataplane`'s `frame` module.

// Input from peers: no unchecked arithmetic or indexing (issue 21).
#![cfg_attr(not(test), deny(clippy::arithmetic_side_effects, clippy::indexing_slicing))]

use rkyv::{Archive, Deserialize, Serialize};

use crate::codec::WireCodec;
use crate::identity::{Identity, PeerId};

pub const FRAME_MAGIC: [u8; 4] = *b"IOTF";
pub const PROTOCOL_VERSION: u16 = 1;
/// Payloads start at a multiple of this from the frame start.
pub const PAYLOAD_ALIGN: usize = 64;
/// Dimensions a frame's tensor may have.
pub const MAX_DIMS: usize = 4;

/// What a frame carries.
#[derive(Archive, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[rkyv(derive(Debug, PartialEq, Eq))]
#[repr(u8)]
pub enum Direction {
    /// Boundary activations, head -> tail.
    Activation = 0,
    /// Gradient of boundary activations, tail -> head.
    ActivationGrad = 1,
    /// A slice of a stage's weights or pseudo-gradient (merging).
    WeightSlice = 2,
    /// Small data-plane control messages (e.g. a probe).
    Control = 3,
}

impl Direction {
    pub const ALL: [Direction; 4] =
        [Direction::Activation, Direction::ActivationGrad, Direction::WeightSlice, Direction::Control];

    pub fn from_archived(a: &ArchivedDirection) -> Direction {
        match a {
            ArchivedDirection::Activation => Direction::Activation,
            ArchivedDirection::ActivationGrad => Direction::ActivationGrad,
            ArchivedDirection::WeightSlice => Direction::WeightSlice,
            ArchivedDirection::Control => Direction::Control,
        }
    }
}

/// The header of a frame. Fixed size when archived.
#[derive(Archive, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[rkyv(derive(Debug))]
pub struct FrameHeader {
    pub version: u16,
    pub direction: Direction,
    /// `WireCodec` id of the payload.
    pub codec: u8,
    /// Number of meaningful entries in `shape` (1..=MAX_DIMS).
    pub ndim: u8,
    /// Pipeline stage of the sender.
    pub stage: u16,
    pub run_id: u64,
    pub epoch: u32,
    /// Micro-batch: shard, first sample index, sample count (the sample ids
    /// `(epoch, shard, first..first+count)`).
    pub shard: u32,
    pub first_sample: u64,
    pub samples: u32,
    /// Which issue of the micro-batch this belongs to (a re-routed
    /// micro-batch gets a new attempt; frames of older ones are stale).
    pub attempt: u32,
    /// Per-sender, per-run sequence number (replays are detectable).
    pub seq_no: u64,
    pub shape: [u32; MAX_DIMS],
    pub payload_len: u64,
    pub payload_hash: [u8; 32],
    /// `frame_id` of the frame this one answers (zeros if none).
    pub answers: [u8; 32],
    pub sender: [u8; 32],
    /// Ed25519 signature by `sender` over `signing_digest()`.
    pub signature: [u8; 64],
}

impl FrameHeader {
    /// The tensor's shape.
    pub fn dims(&self) -> &[u32] {
        self.shape.get(..(self.ndim as usize).min(MAX_DIMS)).unwrap_or(&self.shape)
    }

    /// (rows, cols) as the codecs read it: all dimensions but the last are
    /// rows. None when the product overflows.
    pub fn rows_cols(&self) -> Option<(usize, usize)> {
        rows_cols(self.dims())
    }

    /// The digest the sender signs: a domain tag and every field but the
    /// signature, in a fixed little-endian encoding (independent of rkyv's
    /// layout). It is also the frame's id.
    pub fn signing_digest(&self) -> [u8; 32] {
        let mut h = blake3::Hasher::new();
        h.update(b"iota-rs frame v1\0");
        h.update(&self.version.to_le_bytes());
        h.update(&[self.direction as u8, self.codec, self.ndim]);
        h.update(&self.stage.to_le_bytes());
        h.update(&self.run_id.to_le_bytes());
        h.update(&self.epoch.to_le_bytes());
        h.update(&self.shard.to_le_bytes());
        h.update(&self.first_sample.to_le_bytes());
        h.update(&self.samples.to_le_bytes());
        h.update(&self.attempt.to_le_bytes());
        h.update(&self.seq_no.to_le_bytes());
        for d in self.shape {
            h.update(&d.to_le_bytes());
        }
        h.update(&self.payload_len.to_le_bytes());
        h.update(&self.payload_hash);
        h.update(&self.answers);
        h.update(&self.sender);
        *h.finalize().as_bytes()
    }

    /// The frame's id (what an answering frame puts in `answers`).
    pub fn frame_id(&self) -> [u8; 32] {
        self.signing_digest()
    }

    /// Fills `sender` and `signature`.
    pub fn sign(&mut self, id: &Identity) {
        self.sender = id.peer_id().0;
        self.signature = id.sign(&self.signing_digest());
    }

    pub fn verify_signature(&self) -> bool {
        PeerId(self.sender).verify(&self.signing_digest(), &self.signature)
    }

    pub fn wire_codec(&self) -> Option<WireCodec> {
        WireCodec::from_id(self.codec).ok()
    }
}

/// (rows, cols) of a shape as the codecs read it.
pub fn rows_cols(dims: &[u32]) -> Option<(usize, usize)> {
    let (last, rest) = dims.split_last()?;
    let rows = rest.iter().try_fold(1usize, |a, &d| a.checked_mul(d as usize))?;
    Some((rows, *last as usize))
}

/// Bytes of the archived header (fixed for the protocol version).
pub fn header_len() -> usize {
    std::mem::size_of::<ArchivedFrameHeader>()
}

/// Offset of the payload from the frame start.
pub fn payload_offset() -> usize {
    // Constants of the protocol version: no peer input in this arithmetic.
    #[allow(clippy::arithmetic_side_effects)]
    let offset = (8 + header_len()).div_ceil(PAYLOAD_ALIGN) * PAYLOAD_ALIGN;
    offset
}

/// The archived bytes of a header, as a frame carries them after its
/// prefix (and as an owner hands a contribution's header on as evidence).
pub fn header_bytes(h: &FrameHeader) -> Vec<u8> {
    let header = rkyv::to_bytes::<rkyv::rancor::Error>(h).expect("a fixed-size header always serialises");
    debug_assert_eq!(header.len(), header_len());
    header.to_vec()
}

/// Parses archived header bytes from anyone: the length must be this
/// protocol's and the archive must pass `bytecheck`. Nothing is checked
/// about the fields or the signature.
pub fn parse_header(bytes: &[u8]) -> Result<FrameHeader, String> {
    if bytes.len() != header_len() {
        return Err(format!("a header is {} bytes, got {}", header_len(), bytes.len()));
    }
    // rkyv needs the archive aligned; copy into an aligned buffer (the
    // header is a few hundred bytes).
    let mut aligned = rkyv::util::AlignedVec::<16>::with_capacity(bytes.len());
    aligned.extend_from_slice(bytes);
    let a = rkyv::access::<ArchivedFrameHeader, rkyv::rancor::Error>(&aligned).map_err(|e| e.to_string())?;
    rkyv::deserialize::<FrameHeader, rkyv::rancor::Error>(a).map_err(|e| e.to_string())
}

/// The bytes before the payload: magic, length, header, zero padding.
pub fn encode_prefix(h: &FrameHeader) -> Vec<u8> {
    let header = header_bytes(h);
    let mut v = Vec::with_capacity(payload_offset());
    v.extend_from_slice(&FRAME_MAGIC);
    v.extend_from_slice(&(header.len() as u32).to_le_bytes());
    v.extend_from_slice(&header);
    v.resize(payload_offset(), 0);
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn sample_header() -> FrameHeader {
        FrameHeader {
            version: PROTOCOL_VERSION,
            direction: Direction::Activation,
            codec: WireCodec::Int8Row.id(),
            ndim: 2,
            stage: 1,
            run_id: 9,
            epoch: 3,
            shard: 2,
            first_sample: 40,
            samples: 8,
            attempt: 0,
            seq_no: 17,
            shape: [1024, 32, 0, 0],
            payload_len: WireCodec::Int8Row.payload_bytes(1024, 32).unwrap() as u64,
            payload_hash: [1; 32],
            answers: [0; 32],
            sender: [0; 32],
            signature: [0; 64],
        }
    }

    #[test]
    fn prefix_is_aligned_and_round_trips() {
        let id = Identity::from_seed([3; 32]);
        let mut h = sample_header();
        h.sign(&id);
        assert!(h.verify_signature());
        let p = encode_prefix(&h);
        assert_eq!(p.len() % PAYLOAD_ALIGN, 0);
        assert_eq!(&p[..4], b"IOTF");
        let n = u32::from_le_bytes(p[4..8].try_into().unwrap()) as usize;
        assert_eq!(n, header_len());
        let a = rkyv::access::<ArchivedFrameHeader, rkyv::rancor::Error>(&p[8..8 + n]).unwrap();
        let back: FrameHeader = rkyv::deserialize::<FrameHeader, rkyv::rancor::Error>(a).unwrap();
        assert_eq!(back, h);
        assert_eq!(back.rows_cols(), Some((1024, 32)));
    }

    #[test]
    fn signature_covers_every_field() {
        let id = Identity::from_seed([4; 32]);
        let mut h = sample_header();
        h.sign(&id);
        type Tweak = Box<dyn Fn(&mut FrameHeader)>;
        let tweaks: Vec<Tweak> = vec![
            Box::new(|h| h.epoch += 1),
            Box::new(|h| h.seq_no += 1),
            Box::new(|h| h.attempt += 1),
            Box::new(|h| h.shape[0] += 1),
            Box::new(|h| h.payload_hash[5] ^= 1),
            Box::new(|h| h.answers[0] ^= 1),
            Box::new(|h| h.direction = Direction::ActivationGrad),
            Box::new(|h| h.codec = WireCodec::Bf16.id()),
            Box::new(|h| h.sender[0] ^= 1),
        ];
        for t in tweaks {
            let mut g = h.clone();
            t(&mut g);
            assert!(!g.verify_signature());
        }
    }
}
