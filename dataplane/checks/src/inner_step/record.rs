//! The records an inner step is committed as, what a miner shows of one
//! (`StepEvidence`), and their bytes, read as hostile.

// Store bytes: no unchecked arithmetic or indexing.
#![cfg_attr(not(test), deny(clippy::arithmetic_side_effects, clippy::indexing_slicing))]

use anyhow::{Context, Result, ensure};
use iota_core::commitment::Chain;

use crate::hashes::weights_hash;

/// One micro-batch attempt of a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepMb {
    pub shard: u32,
    pub first_sample: u64,
    pub samples: u32,
    pub attempt: u32,
    /// The hash of the weights its forward ran on (its backward runs on
    /// the same: the stage stashes them).
    pub weights: [u8; 32],
}

const MB_LEN: usize = 4 + 8 + 4 + 4 + 32;
const HEADER_FIXED: usize = 8 + 4 + 32 * 4;
const HEADER_DOMAIN: &[u8] = b"iota-rs inner step v1";

/// The record of one inner step.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StepHeader {
    /// The miner's optimizer steps before this one: the learning rate is
    /// the run's schedule at it.
    pub step: u64,
    /// In the order their backwards ran.
    pub mbs: Vec<StepMb>,
    pub weights_before: [u8; 32],
    pub weights_after: [u8; 32],
    pub optimizer_before: [u8; 32],
    pub optimizer_after: [u8; 32],
}

/// The optimizer state a step starts from.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OptimizerState {
    /// Steps taken (the bias correction's counter).
    pub t: u64,
    pub m: Vec<f32>,
    pub v: Vec<f32>,
}

/// The hash an optimizer state is committed as.
pub fn optimizer_hash(t: u64, m: &[f32], v: &[f32]) -> [u8; 32] {
    optimizer_hash_of_roots(t, &weights_hash(m), &weights_hash(v))
}

/// `optimizer_hash` from the roots (`weights_hash`) of m and v.
pub fn optimizer_hash_of_roots(t: u64, m: &[u8; 32], v: &[u8; 32]) -> [u8; 32] {
    let mut h = blake3::Hasher::new();
    h.update(b"iota-rs adamw state v1");
    h.update(&t.to_le_bytes());
    h.update(m);
    h.update(v);
    *h.finalize().as_bytes()
}

impl OptimizerState {
    pub fn hash(&self) -> [u8; 32] {
        optimizer_hash(self.t, &self.m, &self.v)
    }

    /// A fresh optimizer's state for `n` weights (what a stage starts with).
    pub fn fresh(n: usize) -> Self {
        OptimizerState { t: 0, m: vec![0.0; n], v: vec![0.0; n] }
    }
}

fn put32(b: &mut Vec<u8>, x: &[u8; 32]) {
    b.extend_from_slice(x);
}

/// A little-endian reader over hostile bytes.
pub(super) struct Reader<'a> {
    pub(super) b: &'a [u8],
    pub(super) at: usize,
}

impl<'a> Reader<'a> {
    pub(super) fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self.at.checked_add(n).context("truncated")?;
        let s = self.b.get(self.at..end).context("truncated")?;
        self.at = end;
        Ok(s)
    }
    pub(super) fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into()?))
    }
    pub(super) fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into()?))
    }
    pub(super) fn h32(&mut self) -> Result<[u8; 32]> {
        Ok(self.take(32)?.try_into()?)
    }
    /// A count of items of `item_len` bytes each, at most `max`, that the
    /// rest of the bytes can hold (so nothing is allocated for a lie).
    pub(super) fn count(&mut self, max: u64, item_len: usize) -> Result<usize> {
        let n = self.u64()?;
        ensure!(n <= max, "{n} items, at most {max}");
        let n = usize::try_from(n)?;
        let need = n.checked_mul(item_len.max(1)).context("too many items")?;
        ensure!(need <= self.b.len().saturating_sub(self.at), "truncated");
        Ok(n)
    }
    pub(super) fn bytes(&mut self, max: u64) -> Result<Vec<u8>> {
        let n = self.count(max, 1)?;
        Ok(self.take(n)?.to_vec())
    }
    pub(super) fn f32s(&mut self, n: usize) -> Result<Vec<f32>> {
        let len = n.checked_mul(4).context("too many values")?;
        Ok(self.take(len)?.chunks_exact(4).filter_map(|c| c.try_into().ok()).map(f32::from_le_bytes).collect())
    }
    pub(super) fn done(&self) -> Result<()> {
        ensure!(self.at == self.b.len(), "{} bytes after the last section", self.b.len().saturating_sub(self.at));
        Ok(())
    }
}

impl StepHeader {
    // Our own bytes: sizes of vectors in memory.
    #[allow(clippy::arithmetic_side_effects)]
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(HEADER_FIXED + 8 + MB_LEN * self.mbs.len());
        b.extend_from_slice(&self.step.to_le_bytes());
        b.extend_from_slice(&(self.mbs.len() as u64).to_le_bytes());
        for m in &self.mbs {
            b.extend_from_slice(&m.shard.to_le_bytes());
            b.extend_from_slice(&m.first_sample.to_le_bytes());
            b.extend_from_slice(&m.samples.to_le_bytes());
            b.extend_from_slice(&m.attempt.to_le_bytes());
            put32(&mut b, &m.weights);
        }
        for h in [&self.weights_before, &self.weights_after, &self.optimizer_before, &self.optimizer_after] {
            put32(&mut b, h);
        }
        b
    }

    pub(super) fn read(r: &mut Reader, max_mbs: u64) -> Result<StepHeader> {
        let step = r.u64()?;
        let n = r.count(max_mbs, MB_LEN)?;
        let mut mbs = Vec::with_capacity(n);
        for _ in 0..n {
            mbs.push(StepMb {
                shard: r.u32()?,
                first_sample: r.u64()?,
                samples: r.u32()?,
                attempt: r.u32()?,
                weights: r.h32()?,
            });
        }
        Ok(StepHeader {
            step,
            mbs,
            weights_before: r.h32()?,
            weights_after: r.h32()?,
            optimizer_before: r.h32()?,
            optimizer_after: r.h32()?,
        })
    }

    /// What the steps chain commits to.
    pub fn hash(&self) -> [u8; 32] {
        let mut h = blake3::Hasher::new();
        h.update(HEADER_DOMAIN);
        h.update(&self.encode());
        *h.finalize().as_bytes()
    }

    pub(super) fn lists(&self, shard: u32, first_sample: u64, attempt: u32) -> bool {
        self.mbs.iter().any(|m| (m.shard, m.first_sample, m.attempt) == (shard, first_sample, attempt))
    }
}

/// The frames one micro-batch of a step was computed from, each with the
/// neighbour that signed it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MbFrames {
    /// The activation frame it received (empty at the head).
    pub input: Vec<u8>,
    pub input_signer: [u8; 32],
    /// The gradient frame it received (empty at the tail).
    pub grad: Vec<u8>,
    pub grad_signer: [u8; 32],
}

/// What a miner shows of the step a drawn attempt's backward went into:
/// the steps from the last one whose optimizer state it kept (every
/// `validation.step_window`-th of the epoch) through it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StepEvidence {
    /// Every record of the epoch's steps chain, in order.
    pub headers: Vec<StepHeader>,
    /// Whether `headers[0]` is the record carried in from before the
    /// epoch (not a step of it).
    pub carried: bool,
    /// With `carried`: the previous epoch's steps chain before that record
    /// (which it must end in).
    pub carried_before: Chain,
    /// The step the attempt's backward went into; None: it is in none
    /// (the epoch's last, partial accumulation).
    pub index: Option<u32>,
    /// With `index`: the first step replayed (at most `index`, fewer than
    /// the window before it), the optimizer state before it, the weights
    /// states the replay cannot compute itself ([`shown_states`]: what the
    /// first step reads, older states a micro-batch was forwarded on, and
    /// the one the drawn step left), and every replayed micro-batch's
    /// frames, step by step in the headers' order.
    pub from: u32,
    pub optimizer: OptimizerState,
    pub weights: Vec<Vec<f32>>,
    pub frames: Vec<MbFrames>,
}

/// Bounds on a shown step (from the run's shape).
#[derive(Clone, Copy, Debug)]
pub struct StepLimits {
    /// The stage's weight count.
    pub weights: u64,
    /// Most records (inner steps in an epoch, plus the carried one).
    pub max_headers: u64,
    /// Most micro-batches of a step (`grad_accum`).
    pub max_mbs: u64,
    pub max_frame: u64,
    /// Most steps replayed (`validation.step_window`).
    pub window: u64,
}

const NO_INDEX: u32 = u32::MAX;
/// Distinct weights states a replay may be shown: what its first step
/// reads, the few older ones micro-batches' forwards may predate their
/// steps by, and the last step's result.
const MAX_STATES: u64 = 16;
/// Weights states a replay computes and keeps for micro-batches forwarded
/// before the step they went into: the last `RECENT` steps' results.
pub(super) const RECENT: usize = 2;

/// The weights states (by hash) a replay of `steps` (the first one from
/// a shown state) needs shown, in order, without repeats: those no
/// replayed step among the `RECENT` before the one reading it left, and
/// the last step's result.
pub fn shown_states(steps: &[StepHeader]) -> Vec<[u8; 32]> {
    let mut shown: Vec<[u8; 32]> = Vec::new();
    for (j, h) in steps.iter().enumerate() {
        let computed = steps.get(j.saturating_sub(RECENT)..j).unwrap_or(&[]);
        for x in std::iter::once(&h.weights_before).chain(h.mbs.iter().map(|m| &m.weights)) {
            if !computed.iter().any(|c| c.weights_after == *x) && !shown.contains(x) {
                shown.push(*x);
            }
        }
    }
    if let Some(last) = steps.last()
        && !shown.contains(&last.weights_after)
    {
        shown.push(last.weights_after);
    }
    shown
}

impl StepEvidence {
    // Our own bytes: sizes of vectors in memory.
    #[allow(clippy::arithmetic_side_effects)]
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&(self.headers.len() as u64).to_le_bytes());
        for h in &self.headers {
            b.extend_from_slice(&h.encode());
        }
        b.extend_from_slice(&u32::from(self.carried).to_le_bytes());
        if self.carried {
            b.extend_from_slice(&self.carried_before.len.to_le_bytes());
            put32(&mut b, &self.carried_before.head);
        }
        b.extend_from_slice(&self.index.unwrap_or(NO_INDEX).to_le_bytes());
        if self.index.is_none() {
            return b;
        }
        b.extend_from_slice(&self.from.to_le_bytes());
        b.extend_from_slice(&self.optimizer.t.to_le_bytes());
        for x in self.optimizer.m.iter().chain(&self.optimizer.v) {
            b.extend_from_slice(&x.to_le_bytes());
        }
        b.extend_from_slice(&(self.weights.len() as u64).to_le_bytes());
        for w in &self.weights {
            w.iter().for_each(|x| b.extend_from_slice(&x.to_le_bytes()));
        }
        b.extend_from_slice(&(self.frames.len() as u64).to_le_bytes());
        for f in &self.frames {
            for (frame, signer) in [(&f.input, &f.input_signer), (&f.grad, &f.grad_signer)] {
                b.extend_from_slice(&(frame.len() as u64).to_le_bytes());
                b.extend_from_slice(frame);
                put32(&mut b, signer);
            }
        }
        b
    }

    pub fn decode(bytes: &[u8], l: StepLimits) -> Result<StepEvidence> {
        let mut r = Reader { b: bytes, at: 0 };
        let n = r.count(l.max_headers, HEADER_FIXED)?;
        let mut headers = Vec::with_capacity(n);
        for _ in 0..n {
            headers.push(StepHeader::read(&mut r, l.max_mbs)?);
        }
        let carried = match r.u32()? {
            0 => false,
            1 => true,
            x => anyhow::bail!("carried flag {x}"),
        };
        let carried_before = if carried { Chain { len: r.u64()?, head: r.h32()? } } else { Chain::default() };
        let index = Some(r.u32()?).filter(|&i| i != NO_INDEX);
        let mut ev = StepEvidence { headers, carried, carried_before, index, ..Default::default() };
        if index.is_none() {
            r.done()?;
            return Ok(ev);
        }
        ev.from = r.u32()?;
        let w = usize::try_from(l.weights)?;
        let t = r.u64()?;
        ensure!(w.checked_mul(8).is_some_and(|need| need <= bytes.len()), "truncated optimizer state");
        ev.optimizer = OptimizerState { t, m: r.f32s(w)?, v: r.f32s(w)? };
        let states = r.count(MAX_STATES, w.saturating_mul(4))?;
        for _ in 0..states {
            ev.weights.push(r.f32s(w)?);
        }
        let mbs = r.count(l.max_mbs.saturating_mul(l.window.max(1)), 2 * (8 + 32))?;
        for _ in 0..mbs {
            let input = r.bytes(l.max_frame)?;
            let input_signer = r.h32()?;
            let grad = r.bytes(l.max_frame)?;
            let grad_signer = r.h32()?;
            ev.frames.push(MbFrames { input, input_signer, grad, grad_signer });
        }
        r.done()?;
        Ok(ev)
    }
}
