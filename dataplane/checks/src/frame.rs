//! Building frames and validating frames that arrive from the network.
//!
//! Validation happens in the order the bytes arrive and before anything is
//! allocated for the payload: the fixed prefix (magic, header length), the
//! header (rkyv `bytecheck`), its fields against the run's limits, the
//! sender's identity and signature, and, once the payload is in, its hash.
//! Every failure is a typed `FrameError`; nothing panics.

// Input from peers: no unchecked arithmetic or indexing (issue 21).
#![cfg_attr(not(test), deny(clippy::arithmetic_side_effects, clippy::indexing_slicing))]

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use iota_core::wire::{
    Direction, FRAME_MAGIC, FrameHeader, MAX_DIMS, PROTOCOL_VERSION, encode_prefix, header_len, payload_offset,
};
use iota_core::{Identity, PeerId, WireCodec};
use thiserror::Error;

/// Bounds on what a peer may send, from the run configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameLimits {
    /// Largest payload accepted (bytes).
    pub max_payload: u64,
    /// Largest single dimension accepted.
    pub max_dim: u32,
}

impl Default for FrameLimits {
    fn default() -> Self {
        // A 1.5B-model weight slice is at most a few hundred MB; activations far less.
        FrameLimits { max_payload: 512 << 20, max_dim: 1 << 28 }
    }
}

/// Why a frame was rejected. Each kind is counted separately.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum FrameError {
    #[error("bad magic {0:02x?}")]
    BadMagic([u8; 4]),
    #[error("header length {got} (this protocol's header is {expected} bytes)")]
    HeaderLength { got: u32, expected: u32 },
    #[error("malformed header: {0}")]
    Malformed(String),
    #[error("protocol version {0} (we speak {PROTOCOL_VERSION})")]
    Version(u16),
    #[error("unknown codec id {0}")]
    UnknownCodec(u8),
    #[error("shape/codec mismatch: {0}")]
    Shape(String),
    #[error("payload of {got} bytes exceeds the limit of {limit}")]
    TooLarge { got: u64, limit: u64 },
    #[error("frame for run {got}, this run is {expected}")]
    WrongRun { got: u64, expected: u64 },
    #[error("epoch {got} outside the accepted window {min}..={max}")]
    StaleEpoch { got: u32, min: u32, max: u32 },
    #[error("sender {0} is not a known peer")]
    UnknownSender(PeerId),
    #[error("frame claims sender {claimed} but arrived from {peer}")]
    SenderMismatch { claimed: PeerId, peer: PeerId },
    #[error("bad signature")]
    BadSignature,
    #[error("payload hash does not match the header")]
    HashMismatch,
    #[error("replayed or out-of-order frame: seq {got} after {last}")]
    Replay { got: u64, last: u64 },
    #[error("stream ended inside a frame")]
    Truncated,
}

impl FrameError {
    /// Errors after which the stream's framing cannot be trusted any more
    /// (the receiver must stop reading that stream).
    pub fn breaks_framing(&self) -> bool {
        matches!(
            self,
            FrameError::BadMagic(_)
                | FrameError::HeaderLength { .. }
                | FrameError::Malformed(_)
                | FrameError::Truncated
        )
    }

    /// A stable short name (metrics label, log field).
    pub fn kind(&self) -> &'static str {
        match self {
            FrameError::BadMagic(_) => "bad_magic",
            FrameError::HeaderLength { .. } => "header_length",
            FrameError::Malformed(_) => "malformed",
            FrameError::Version(_) => "version",
            FrameError::UnknownCodec(_) => "unknown_codec",
            FrameError::Shape(_) => "shape",
            FrameError::TooLarge { .. } => "too_large",
            FrameError::WrongRun { .. } => "wrong_run",
            FrameError::StaleEpoch { .. } => "stale_epoch",
            FrameError::UnknownSender(_) => "unknown_sender",
            FrameError::SenderMismatch { .. } => "sender_mismatch",
            FrameError::BadSignature => "bad_signature",
            FrameError::HashMismatch => "hash_mismatch",
            FrameError::Replay { .. } => "replay",
            FrameError::Truncated => "truncated",
        }
    }
}

/// What a receiver checks headers against; shared by all its connections.
#[derive(Debug)]
pub struct RunContext {
    run_id: AtomicU64,
    pub limits: FrameLimits,
    epoch_min: AtomicU32,
    epoch_max: AtomicU32,
}

impl RunContext {
    pub fn new(run_id: u64, limits: FrameLimits) -> Self {
        RunContext {
            run_id: AtomicU64::new(run_id),
            limits,
            epoch_min: AtomicU32::new(0),
            epoch_max: AtomicU32::new(0),
        }
    }
    pub fn run_id(&self) -> u64 {
        self.run_id.load(Ordering::SeqCst)
    }
    /// A miner binds its endpoint before it learns the run it joins.
    pub fn set_run_id(&self, id: u64) {
        self.run_id.store(id, Ordering::SeqCst);
    }
    /// Accept frames of epochs `min..=max` (the control plane moves this).
    pub fn set_epoch_window(&self, min: u32, max: u32) {
        self.epoch_min.store(min, Ordering::SeqCst);
        self.epoch_max.store(max.max(min), Ordering::SeqCst);
    }
    pub fn epoch_window(&self) -> (u32, u32) {
        (self.epoch_min.load(Ordering::SeqCst), self.epoch_max.load(Ordering::SeqCst))
    }
}

/// Checks the 8-byte prefix; returns the header length to read next.
pub fn check_prefix(prefix: &[u8; 8]) -> Result<usize, FrameError> {
    let magic: [u8; 4] = prefix[..4].try_into().unwrap();
    if magic != FRAME_MAGIC {
        return Err(FrameError::BadMagic(magic));
    }
    let got = u32::from_le_bytes(prefix[4..8].try_into().unwrap());
    if got as usize != header_len() {
        return Err(FrameError::HeaderLength { got, expected: header_len() as u32 });
    }
    Ok(got as usize)
}

/// Validates archived header bytes (bytecheck) and returns the header.
pub fn parse_header(bytes: &[u8]) -> Result<FrameHeader, FrameError> {
    iota_core::wire::parse_header(bytes).map_err(FrameError::Malformed)
}

/// Checks a parsed header's fields, sender and signature. `peer` is the
/// identity the connection authenticated (TLS), and must be the sender.
pub fn check_header(h: &FrameHeader, ctx: &RunContext, peer: PeerId) -> Result<(), FrameError> {
    if h.version != PROTOCOL_VERSION {
        return Err(FrameError::Version(h.version));
    }
    let codec = WireCodec::from_id(h.codec).map_err(|_| FrameError::UnknownCodec(h.codec))?;
    if h.payload_len > ctx.limits.max_payload {
        return Err(FrameError::TooLarge { got: h.payload_len, limit: ctx.limits.max_payload });
    }
    let nd = h.ndim as usize;
    if nd == 0 || nd > MAX_DIMS {
        return Err(FrameError::Shape(format!("ndim {nd} outside 1..={MAX_DIMS}")));
    }
    if h.shape.get(nd..).unwrap_or(&[]).iter().any(|&d| d != 0) {
        return Err(FrameError::Shape("non-zero entries past ndim".into()));
    }
    if let Some(&d) = h.dims().iter().find(|&&d| d > ctx.limits.max_dim) {
        return Err(FrameError::Shape(format!("dimension {d} exceeds {}", ctx.limits.max_dim)));
    }
    let (rows, cols) = h.rows_cols().ok_or_else(|| FrameError::Shape("shape overflows".into()))?;
    let want = codec.payload_bytes(rows, cols).ok_or_else(|| FrameError::Shape("payload size overflows".into()))?;
    if want as u64 != h.payload_len {
        return Err(FrameError::Shape(format!(
            "{:?} as {} needs {want} bytes, header says {}",
            h.dims(),
            codec.name(),
            h.payload_len
        )));
    }
    if h.run_id != ctx.run_id() {
        return Err(FrameError::WrongRun { got: h.run_id, expected: ctx.run_id() });
    }
    let (min, max) = ctx.epoch_window();
    if h.epoch < min || h.epoch > max {
        return Err(FrameError::StaleEpoch { got: h.epoch, min, max });
    }
    let claimed = PeerId(h.sender);
    if claimed != peer {
        return Err(FrameError::SenderMismatch { claimed, peer });
    }
    if !h.verify_signature() {
        return Err(FrameError::BadSignature);
    }
    Ok(())
}

/// Checks a received payload against its header.
pub fn check_payload(h: &FrameHeader, payload: &[u8]) -> Result<(), FrameError> {
    if payload.len() as u64 != h.payload_len {
        return Err(FrameError::Truncated);
    }
    if *blake3::hash(payload).as_bytes() != h.payload_hash {
        return Err(FrameError::HashMismatch);
    }
    Ok(())
}

/// Everything about a frame except the transport-assigned fields.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FrameMeta {
    pub direction: Direction,
    pub codec: WireCodec,
    pub stage: u16,
    pub epoch: u32,
    pub shard: u32,
    pub first_sample: u64,
    pub samples: u32,
    pub attempt: u32,
    pub shape: Vec<u32>,
    pub answers: [u8; 32],
}

/// Builds and signs the header for `payload`. `seq_no` is the sender's
/// per-lane sequence number.
// The sender's own frame: its shape is checked by the assert above the copy.
#[allow(clippy::indexing_slicing)]
pub fn build_header(meta: &FrameMeta, run_id: u64, seq_no: u64, payload: &[u8], id: &Identity) -> FrameHeader {
    assert!(!meta.shape.is_empty() && meta.shape.len() <= MAX_DIMS, "frame shape must have 1..=4 dims");
    let mut shape = [0u32; MAX_DIMS];
    shape[..meta.shape.len()].copy_from_slice(&meta.shape);
    let mut h = FrameHeader {
        version: PROTOCOL_VERSION,
        direction: meta.direction,
        codec: meta.codec.id(),
        ndim: meta.shape.len() as u8,
        stage: meta.stage,
        run_id,
        epoch: meta.epoch,
        shard: meta.shard,
        first_sample: meta.first_sample,
        samples: meta.samples,
        attempt: meta.attempt,
        seq_no,
        shape,
        payload_len: payload.len() as u64,
        payload_hash: *blake3::hash(payload).as_bytes(),
        answers: meta.answers,
        sender: [0; 32],
        signature: [0; 64],
    };
    h.sign(id);
    h
}

/// The bytes that precede the payload on the wire.
pub fn prefix_bytes(h: &FrameHeader) -> Vec<u8> {
    encode_prefix(h)
}

/// Zero bytes between the header and the payload.
// Constants of the protocol version, not peer input.
#[allow(clippy::arithmetic_side_effects)]
pub fn padding_len() -> usize {
    payload_offset() - 8 - header_len()
}

/// The padding must be zeros (a sender cannot hide data there).
pub fn check_padding(pad: &[u8]) -> Result<(), FrameError> {
    if pad.iter().any(|&b| b != 0) {
        return Err(FrameError::Malformed("non-zero padding".into()));
    }
    Ok(())
}

/// Highest sequence number delivered per lane, to refuse replays.
#[derive(Debug, Default)]
pub struct SeqGuard {
    last: AtomicU64,
    seen_any: std::sync::atomic::AtomicBool,
}

impl SeqGuard {
    /// Accepts `seq` only if it is beyond everything accepted before.
    pub fn accept(&self, seq: u64) -> Result<(), FrameError> {
        let last = self.last.load(Ordering::SeqCst);
        if self.seen_any.load(Ordering::SeqCst) && seq <= last {
            return Err(FrameError::Replay { got: seq, last });
        }
        self.last.store(seq, Ordering::SeqCst);
        self.seen_any.store(true, Ordering::SeqCst);
        Ok(())
    }
}

/// Decodes a complete frame held in memory (what a fuzzer or a validator
/// with a stored frame uses): prefix, header, checks, payload hash.
pub fn decode_frame<'a>(
    bytes: &'a [u8],
    ctx: &RunContext,
    peer: PeerId,
) -> Result<(FrameHeader, &'a [u8]), FrameError> {
    let prefix: &[u8; 8] = bytes.get(..8).and_then(|p| p.try_into().ok()).ok_or(FrameError::Truncated)?;
    let hl = check_prefix(prefix)?;
    let header_end = hl.checked_add(8).ok_or(FrameError::Truncated)?;
    let hbytes = bytes.get(8..header_end).ok_or(FrameError::Truncated)?;
    let h = parse_header(hbytes)?;
    check_padding(bytes.get(header_end..payload_offset()).ok_or(FrameError::Truncated)?)?;
    check_header(&h, ctx, peer)?;
    let start = payload_offset();
    let end = start.checked_add(h.payload_len as usize).ok_or(FrameError::Truncated)?;
    let payload = bytes.get(start..end).ok_or(FrameError::Truncated)?;
    check_payload(&h, payload)?;
    Ok((h, payload))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta() -> FrameMeta {
        FrameMeta {
            direction: Direction::Activation,
            codec: WireCodec::Int8Row,
            stage: 0,
            epoch: 2,
            shard: 1,
            first_sample: 16,
            samples: 2,
            attempt: 0,
            shape: vec![4, 6],
            answers: [0; 32],
        }
    }

    fn frame(id: &Identity, m: &FrameMeta, payload: &[u8]) -> Vec<u8> {
        let h = build_header(m, 7, 1, payload, id);
        let mut v = prefix_bytes(&h);
        v.extend_from_slice(payload);
        v
    }

    fn ctx() -> RunContext {
        let c = RunContext::new(7, FrameLimits::default());
        c.set_epoch_window(2, 3);
        c
    }

    #[test]
    fn valid_frame_decodes() {
        let id = Identity::from_seed([1; 32]);
        let payload = vec![5u8; WireCodec::Int8Row.payload_bytes(4, 6).unwrap()];
        let f = frame(&id, &meta(), &payload);
        let (h, p) = decode_frame(&f, &ctx(), id.peer_id()).unwrap();
        assert_eq!(p, &payload[..]);
        assert_eq!(h.dims(), &[4, 6]);
        assert_eq!(padding_len() + 8 + header_len(), payload_offset());
    }

    #[test]
    fn each_defect_has_its_error() {
        let id = Identity::from_seed([1; 32]);
        let other = Identity::from_seed([2; 32]);
        let payload = vec![5u8; WireCodec::Int8Row.payload_bytes(4, 6).unwrap()];
        let good = frame(&id, &meta(), &payload);
        let c = ctx();
        let kind = |b: &[u8], peer: PeerId| decode_frame(b, &c, peer).unwrap_err().kind();

        let mut b = good.clone();
        b[0] = b'X';
        assert_eq!(kind(&b, id.peer_id()), "bad_magic");
        let mut b = good.clone();
        b[4] ^= 1;
        assert_eq!(kind(&b, id.peer_id()), "header_length");
        assert_eq!(kind(&good[..good.len() - 1], id.peer_id()), "truncated");
        let mut b = good.clone();
        let n = b.len();
        b[n - 1] ^= 1;
        assert_eq!(kind(&b, id.peer_id()), "hash_mismatch");
        assert_eq!(kind(&good, other.peer_id()), "sender_mismatch");
        // Field tampering after signing breaks the signature.
        let mut h = build_header(&meta(), 7, 1, &payload, &id);
        h.first_sample += 1;
        let mut b = prefix_bytes(&h);
        b.extend_from_slice(&payload);
        assert_eq!(kind(&b, id.peer_id()), "bad_signature");
        // Properly signed but outside the rules.
        let mut m = meta();
        m.epoch = 1;
        assert_eq!(kind(&frame(&id, &m, &payload), id.peer_id()), "stale_epoch");
        let mut m = meta();
        m.shape = vec![4, 7];
        assert_eq!(kind(&frame(&id, &m, &payload), id.peer_id()), "shape");
        let h = build_header(&meta(), 8, 1, &payload, &id);
        let mut b = prefix_bytes(&h);
        b.extend_from_slice(&payload);
        assert_eq!(kind(&b, id.peer_id()), "wrong_run");
        let small = RunContext::new(7, FrameLimits { max_payload: 8, max_dim: 100 });
        small.set_epoch_window(2, 2);
        assert_eq!(decode_frame(&good, &small, id.peer_id()).unwrap_err().kind(), "too_large");
        // Garbage header bytes are caught by bytecheck.
        let mut b = good.clone();
        for x in &mut b[8..8 + header_len()] {
            *x = 0xff;
        }
        assert!(decode_frame(&b, &c, id.peer_id()).is_err());
    }

    #[test]
    fn seq_guard_refuses_replays() {
        let g = SeqGuard::default();
        g.accept(0).unwrap();
        g.accept(5).unwrap();
        assert_eq!(g.accept(5).unwrap_err().kind(), "replay");
        assert_eq!(g.accept(3).unwrap_err().kind(), "replay");
        g.accept(6).unwrap();
    }
}
