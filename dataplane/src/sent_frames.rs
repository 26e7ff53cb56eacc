//! An opt-in record of the pipeline frames an endpoint sent, exactly as
//! they were signed and written (PROTOCOL.md, "Validation"): a miner asked
//! for the evidence of a sampled micro-batch uploads the frame it sent for
//! it, and only the endpoint knows that frame's header (its per-lane
//! sequence number and signature are made in `Endpoint::send`).
//!
//! Only activations and their gradients are recorded, keyed by the
//! micro-batch attempt and direction. The payload is the `Bytes` the
//! endpoint sent (a reference, not a copy). Everything is bounded by frame
//! count and bytes; past a bound the oldest epoch goes first, and a frame
//! of the only (or oldest) epoch kept that does not fit is not recorded
//! (counted in `refused`).

use std::collections::{BTreeMap, HashMap};

use bytes::Bytes;
use iota_core::wire::{Direction, FrameHeader};
use parking_lot::Mutex;

use crate::frame;

/// One sent frame's address: the micro-batch attempt and the direction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SentFrameKey {
    pub epoch: u64,
    pub shard: u32,
    pub first_sample: u64,
    pub attempt: u32,
    pub direction: Direction,
}

impl SentFrameKey {
    fn of(h: &FrameHeader) -> SentFrameKey {
        SentFrameKey {
            epoch: u64::from(h.epoch),
            shard: h.shard,
            first_sample: h.first_sample,
            attempt: h.attempt,
            direction: h.direction,
        }
    }
}

/// A frame as it was sent.
#[derive(Clone, Debug)]
pub struct SentFrame {
    pub header: FrameHeader,
    pub payload: Bytes,
}

impl SentFrame {
    /// The whole frame as bytes (what `frame::decode_frame` parses).
    pub fn whole(&self) -> Vec<u8> {
        let mut v = frame::prefix_bytes(&self.header);
        v.extend_from_slice(&self.payload);
        v
    }

    /// What the frame holds in memory, for the byte bound.
    fn cost(&self) -> usize {
        self.payload.len().saturating_add(std::mem::size_of::<FrameHeader>())
    }
}

/// Bounds on what is recorded, over all epochs kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TapLimits {
    pub max_frames: usize,
    pub max_bytes: usize,
}

impl Default for TapLimits {
    /// Two epochs of up to 65,536 attempts each (a miner's evidence is kept
    /// until the next epoch's training starts), 512 MiB.
    fn default() -> Self {
        TapLimits { max_frames: 2 << 16, max_bytes: 512 << 20 }
    }
}

#[derive(Default)]
struct State {
    epochs: BTreeMap<u64, HashMap<SentFrameKey, SentFrame>>,
    frames: usize,
    bytes: usize,
    refused: u64,
}

impl State {
    fn drop_oldest_epoch(&mut self) {
        if let Some((_, frames)) = self.epochs.pop_first() {
            self.frames = self.frames.saturating_sub(frames.len());
            let bytes: usize = frames.values().map(SentFrame::cost).sum();
            self.bytes = self.bytes.saturating_sub(bytes);
        }
    }

    fn remove(&mut self, key: &SentFrameKey) {
        let Some(frames) = self.epochs.get_mut(&key.epoch) else { return };
        if let Some(old) = frames.remove(key) {
            self.frames = self.frames.saturating_sub(1);
            self.bytes = self.bytes.saturating_sub(old.cost());
        }
    }
}

/// The record (shared between the endpoint and its reader).
pub struct SentFrames {
    limits: TapLimits,
    state: Mutex<State>,
}

impl SentFrames {
    pub fn new(limits: TapLimits) -> SentFrames {
        SentFrames { limits, state: Mutex::new(State::default()) }
    }

    /// Records a frame the endpoint sent (other directions are ignored).
    /// A later frame for the same attempt and direction replaces the
    /// earlier one: the last one sent is the one that counts.
    pub fn record(&self, header: &FrameHeader, payload: &Bytes) {
        if !matches!(header.direction, Direction::Activation | Direction::ActivationGrad) {
            return;
        }
        let key = SentFrameKey::of(header);
        let f = SentFrame { header: header.clone(), payload: payload.clone() };
        let cost = f.cost();
        let mut s = self.state.lock();
        s.remove(&key);
        let fits =
            |s: &State| s.frames < self.limits.max_frames && s.bytes.saturating_add(cost) <= self.limits.max_bytes;
        // The oldest epochs make room for a newer one's frames, never the
        // other way round.
        while !fits(&s) && s.epochs.keys().next().is_some_and(|&oldest| oldest < key.epoch) {
            s.drop_oldest_epoch();
        }
        if !fits(&s) {
            s.refused = s.refused.saturating_add(1);
            return;
        }
        s.epochs.entry(key.epoch).or_default().insert(key, f);
        s.frames = s.frames.saturating_add(1);
        s.bytes = s.bytes.saturating_add(cost);
    }

    /// The frame sent for `key`, if it is kept.
    pub fn get(&self, key: &SentFrameKey) -> Option<SentFrame> {
        self.state.lock().epochs.get(&key.epoch)?.get(key).cloned()
    }

    /// Frees every epoch before `epoch`.
    pub fn forget_before(&self, epoch: u64) {
        let mut s = self.state.lock();
        while s.epochs.keys().next().is_some_and(|&oldest| oldest < epoch) {
            s.drop_oldest_epoch();
        }
    }

    /// Frames kept and the bytes they hold.
    pub fn size(&self) -> (usize, usize) {
        let s = self.state.lock();
        (s.frames, s.bytes)
    }

    /// Frames not recorded because they did not fit.
    pub fn refused(&self) -> u64 {
        self.state.lock().refused
    }
}

#[cfg(test)]
mod tests {
    use iota_core::{Identity, WireCodec};

    use super::*;
    use crate::frame::FrameMeta;

    fn header(epoch: u32, first_sample: u64, direction: Direction, payload: &[u8]) -> FrameHeader {
        let meta = FrameMeta {
            direction,
            codec: WireCodec::F32,
            stage: 0,
            epoch,
            shard: 1,
            first_sample,
            samples: 1,
            attempt: 0,
            shape: vec![(payload.len() / 4) as u32],
            answers: [0; 32],
        };
        frame::build_header(&meta, 7, 1, payload, &Identity::from_seed([3; 32]))
    }

    fn key(epoch: u64, first_sample: u64, direction: Direction) -> SentFrameKey {
        SentFrameKey { epoch, shard: 1, first_sample, attempt: 0, direction }
    }

    #[test]
    fn only_pipeline_frames_are_recorded_and_the_last_one_counts() {
        let tap = SentFrames::new(TapLimits::default());
        let p = Bytes::from(vec![1u8; 16]);
        tap.record(&header(0, 0, Direction::WeightSlice, &p), &p);
        assert_eq!(tap.size().0, 0);
        tap.record(&header(0, 0, Direction::Activation, &p), &p);
        tap.record(&header(0, 0, Direction::ActivationGrad, &p), &p);
        assert_eq!(tap.size().0, 2);
        let q = Bytes::from(vec![2u8; 16]);
        tap.record(&header(0, 0, Direction::Activation, &q), &q);
        assert_eq!(tap.size().0, 2);
        assert_eq!(tap.get(&key(0, 0, Direction::Activation)).unwrap().payload, q);
        assert!(tap.get(&key(0, 8, Direction::Activation)).is_none());
    }

    #[test]
    fn bounds_drop_the_oldest_epoch_first_then_refuse() {
        let p = Bytes::from(vec![0u8; 1000]);
        let one = 1000 + std::mem::size_of::<FrameHeader>();
        let tap = SentFrames::new(TapLimits { max_frames: 3, max_bytes: 10 * one });
        for i in 0..3 {
            tap.record(&header(4, i, Direction::Activation, &p), &p);
        }
        // A newer epoch's frame pushes the older epoch out.
        tap.record(&header(5, 0, Direction::Activation, &p), &p);
        assert_eq!(tap.size(), (1, one));
        assert!(tap.get(&key(4, 0, Direction::Activation)).is_none());
        tap.record(&header(5, 1, Direction::Activation, &p), &p);
        tap.record(&header(5, 2, Direction::Activation, &p), &p);
        // Full with the newest epoch: further frames are refused, and an
        // older epoch's frame never pushes a newer one out.
        tap.record(&header(5, 3, Direction::Activation, &p), &p);
        tap.record(&header(4, 9, Direction::Activation, &p), &p);
        assert_eq!(tap.refused(), 2);
        assert_eq!(tap.size(), (3, 3 * one));
        assert!(tap.get(&key(5, 2, Direction::Activation)).is_some());
        // The byte bound holds too.
        let small = SentFrames::new(TapLimits { max_frames: 100, max_bytes: 2 * one });
        for i in 0..3 {
            small.record(&header(0, i, Direction::Activation, &p), &p);
        }
        assert_eq!((small.size(), small.refused()), ((2, 2 * one), 1));
        small.forget_before(1);
        assert_eq!(small.size(), (0, 0));
    }
}
