//! Inner steps, committed and recomputed (PROTOCOL.md, "Inner steps").
//!
//! A miner's forward and backward frames are checked by `evidence`; what
//! changes the model is the weight gradient its backwards accumulate and
//! the optimizer step it takes with them. For every inner step a miner
//! commits a [`StepHeader`]: the step counter the learning rate is read
//! at, the micro-batch attempts whose backwards it accumulated (in the
//! order it ran them, each with the hash of the weights its forward ran
//! on), and the hashes of the weights and of the optimizer state before
//! and after. The headers are chained (`EpochHeads::steps`), led by the
//! last header of the miner's previous epoch on the stage when there is
//! one (the optimizer state the epoch carries in).
//!
//! For a drawn attempt the miner shows the step its backward went into
//! ([`StepEvidence`]); the validator ([`check_step`]):
//! 1. re-chains the headers to the committed head, and checks they follow
//!    each other (a step's state before is its predecessor's after; the
//!    weights may also be the epoch's merged start, which a late merge
//!    puts in place) and that each step's weights after is the weights
//!    chain's item for it;
//! 2. finds the attempt in a step, or counts it among the fewer than
//!    `grad_accum` completed attempts no step lists (the epoch's last,
//!    partial accumulation, dropped);
//! 3. recomputes the step: every listed micro-batch's forward and backward
//!    from the frames its neighbours signed for it (or the corpus's tokens
//!    and targets), on the committed weights its forward ran on,
//!    accumulated in order, then the optimizer step from the shown state
//!    (whose hash is the committed one) at the committed counter; the
//!    weights and the state after must hash to the committed ones, bit
//!    for bit on the same backend (within `Known::tolerance` of the
//!    weights on another, where only the weights are compared).
//!
//! So a miner that skips its weight gradients, its optimizer steps, or a
//! head's whole backward, commits to weights no recompute reaches. The
//! record of an honest step is what its worker ran, so it is reproduced
//! exactly (the CPU reference gives the same bits whatever its thread
//! count).
//!
//! Not checked here: that the optimizer state the epoch carries in is the
//! one the previous epoch's last step left (its header leads the chain and
//! is committed, so the link can be checked against the previous epoch's
//! head: not yet done).
//!
//! Everything shown is hostile: lengths are bounded before allocation,
//! and nothing panics.

// Store bytes: no unchecked arithmetic or indexing.
#![cfg_attr(not(test), deny(clippy::arithmetic_side_effects, clippy::indexing_slicing))]

use std::collections::BTreeMap;

use anyhow::{Context, Result, ensure};
use iota_core::commitment::Chain;
use iota_core::wire::Direction;
use iota_core::{ParamLayout, PeerId, StageSpec};
use iota_model::optim::AdamW;
use iota_model::{Backend, Stage, StageInput, codec};
use iota_wire::RunConfig;

use crate::evidence::Finding;
use crate::frame::{RunContext, decode_frame};
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
    let mut h = blake3::Hasher::new();
    h.update(b"iota-rs adamw state v1");
    h.update(&t.to_le_bytes());
    h.update(&weights_hash(m));
    h.update(&weights_hash(v));
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
struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self.at.checked_add(n).context("truncated")?;
        let s = self.b.get(self.at..end).context("truncated")?;
        self.at = end;
        Ok(s)
    }
    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into()?))
    }
    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into()?))
    }
    fn h32(&mut self) -> Result<[u8; 32]> {
        Ok(self.take(32)?.try_into()?)
    }
    /// A count of items of `item_len` bytes each, at most `max`, that the
    /// rest of the bytes can hold (so nothing is allocated for a lie).
    fn count(&mut self, max: u64, item_len: usize) -> Result<usize> {
        let n = self.u64()?;
        ensure!(n <= max, "{n} items, at most {max}");
        let n = usize::try_from(n)?;
        let need = n.checked_mul(item_len.max(1)).context("too many items")?;
        ensure!(need <= self.b.len().saturating_sub(self.at), "truncated");
        Ok(n)
    }
    fn bytes(&mut self, max: u64) -> Result<Vec<u8>> {
        let n = self.count(max, 1)?;
        Ok(self.take(n)?.to_vec())
    }
    fn f32s(&mut self, n: usize) -> Result<Vec<f32>> {
        let len = n.checked_mul(4).context("too many values")?;
        Ok(self.take(len)?.chunks_exact(4).filter_map(|c| c.try_into().ok()).map(f32::from_le_bytes).collect())
    }
    fn done(&self) -> Result<()> {
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

    fn read(r: &mut Reader, max_mbs: u64) -> Result<StepHeader> {
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

    fn lists(&self, shard: u32, first_sample: u64, attempt: u32) -> bool {
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

/// What a miner shows of the step a drawn attempt's backward went into.
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
    /// With `index`: the optimizer state before that step, every weights
    /// state it used (its weights before and its micro-batches') and the
    /// one it left, and each micro-batch's frames in the header's order.
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
}

const NO_INDEX: u32 = u32::MAX;
/// Distinct weights states one step may use: its own and those of the few
/// steps its micro-batches' forwards may predate it by.
const MAX_STATES: u64 = 8;

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
        let w = usize::try_from(l.weights)?;
        let t = r.u64()?;
        ensure!(w.checked_mul(8).is_some_and(|need| need <= bytes.len()), "truncated optimizer state");
        ev.optimizer = OptimizerState { t, m: r.f32s(w)?, v: r.f32s(w)? };
        let states = r.count(MAX_STATES, w.saturating_mul(4))?;
        for _ in 0..states {
            ev.weights.push(r.f32s(w)?);
        }
        let mbs = r.count(l.max_mbs, 2 * (8 + 32))?;
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

/// A micro-batch's tokens and targets by (shard, first sample, samples).
pub type MbData<'a> = &'a dyn Fn(u32, u64, u32) -> Option<(Vec<u32>, Vec<u32>)>;

/// What the validator knows of the step's miner without it.
pub struct StepKnown<'a> {
    pub ctx: &'a RunContext,
    pub miner: PeerId,
    pub stage: u32,
    /// The committed steps chain, and the one of the epoch before (None:
    /// not held).
    pub steps: &'a Chain,
    pub previous_steps: Option<&'a Chain>,
    /// The items of its weights chain (already checked against its head).
    pub step_hashes: &'a [[u8; 32]],
    /// The weights the epoch may have started from.
    pub epoch_starts: &'a [[u8; 32]],
    /// The drawn attempt: (shard, first sample, attempt).
    pub attempt: (u32, u64, u32),
    /// The miner's completed attempts this epoch: (shard, first sample,
    /// attempt) -> the pathway (one peer per stage).
    pub completed: &'a BTreeMap<(u32, u64, u32), Vec<PeerId>>,
    /// The miners of each neighbouring stage (a frame of an attempt not
    /// among `completed` must be signed by one of them).
    pub upstream_miners: &'a [PeerId],
    pub downstream_miners: &'a [PeerId],
    /// A micro-batch's tokens and targets, from the corpus.
    pub data: MbData<'a>,
    /// 0: bit for bit (same backend).
    pub tolerance: f64,
}

/// Runs the checks of the module text on `ev`.
pub fn check_step<B: Backend>(be: &std::sync::Arc<B>, cfg: &RunConfig, k: &StepKnown, ev: &StepEvidence) -> Finding {
    let fresh = match stage_weights(cfg, k.stage) {
        Ok(n) => OptimizerState::fresh(n).hash(),
        Err(e) => return Finding::Cheated(format!("{e:#}")),
    };
    match check_chain(cfg.train.grad_accum, fresh, k, ev).and_then(|()| recompute_shown(be, cfg, k, ev)) {
        Ok(()) => Finding::Honest,
        Err(e) => Finding::Cheated(format!("{e:#}")),
    }
}

/// Links 1 and 2: the headers are the committed ones and follow each
/// other, and the attempt is in a step or among the few no step lists.
fn stage_weights(cfg: &RunConfig, stage: u32) -> Result<usize> {
    let specs = StageSpec::split(&cfg.train.model, cfg.train.stages)?;
    let spec = specs.get(stage as usize).context("no such stage")?;
    Ok(ParamLayout::for_stage(&cfg.train.model, spec).total())
}

/// `fresh`: the hash of a fresh optimizer's state for the stage (what a
/// chain that carries nothing in starts from).
fn check_chain(grad_accum: usize, fresh: [u8; 32], k: &StepKnown, ev: &StepEvidence) -> Result<()> {
    let chained = Chain::of(ev.headers.iter().map(StepHeader::hash).collect::<Vec<_>>().iter());
    ensure!(chained == *k.steps, "inner steps: the records shown are not the committed steps chain");
    let own = ev.headers.get(usize::from(ev.carried)..).context("inner steps: a carried record that is not there")?;
    ensure!(
        own.len() == k.step_hashes.len(),
        "inner steps: {} step records for {} committed weights",
        own.len(),
        k.step_hashes.len()
    );
    let mut prev = if ev.carried { ev.headers.first() } else { None };
    for (i, (h, after)) in own.iter().zip(k.step_hashes).enumerate() {
        ensure!(h.weights_after == *after, "inner step {i}: its record's weights are not the weights chain's");
        let (weights, optimizer, step) = match prev {
            Some(p) => (p.weights_after, p.optimizer_after, p.step.checked_add(1)),
            None => (h.weights_before, h.optimizer_before, Some(h.step)),
        };
        ensure!(h.optimizer_before == optimizer, "inner step {i}: an optimizer state its predecessor did not leave");
        ensure!(step == Some(h.step), "inner step {i}: counter {} after {:?}", h.step, step);
        ensure!(
            h.weights_before == weights || k.epoch_starts.contains(&h.weights_before),
            "inner step {i}: stepped from weights neither its predecessor left nor the epoch started from"
        );
        ensure!(!h.mbs.is_empty(), "inner step {i}: no micro-batches");
        prev = Some(h);
    }
    match (ev.carried, ev.headers.first()) {
        // The record carried in must be the one the epoch before ended in.
        (true, Some(c)) => {
            let mut ended = ev.carried_before;
            ended.push(&c.hash());
            ensure!(
                k.previous_steps == Some(&ended),
                "inner steps: the record carried in is not where the previous epoch's steps chain ends"
            );
        }
        (false, Some(first)) => {
            ensure!(first.optimizer_before == fresh, "inner step 0: a first step not from a fresh optimizer");
            ensure!(
                k.epoch_starts.contains(&first.weights_before),
                "inner step 0: not stepped from the weights the epoch started from"
            );
        }
        _ => {}
    }
    let (shard, first, attempt) = k.attempt;
    let listed: std::collections::HashSet<(u32, u64, u32)> =
        own.iter().flat_map(|h| h.mbs.iter().map(|m| (m.shard, m.first_sample, m.attempt))).collect();
    match ev.index {
        Some(i) => {
            let h = own.get(i as usize).context("inner steps: the attempt's step is not in the epoch")?;
            ensure!(h.lists(shard, first, attempt), "inner step {i} does not list the drawn attempt");
        }
        None => {
            ensure!(!listed.contains(&k.attempt), "the drawn attempt is in a step it did not show");
            let unlisted = k.completed.keys().filter(|a| !listed.contains(a)).count();
            let accum = grad_accum.max(1);
            ensure!(
                unlisted < accum,
                "inner steps: {unlisted} completed attempts in no step (at most {} are the last, partial \
                 accumulation)",
                accum.saturating_sub(1)
            );
        }
    }
    Ok(())
}

/// The weights state with `hash` among those shown.
fn state<'a>(ev: &'a StepEvidence, hashes: &[[u8; 32]], hash: &[u8; 32]) -> Result<&'a [f32]> {
    let i = hashes.iter().position(|h| h == hash).context("a weights state the step used is not shown")?;
    Ok(ev.weights.get(i).context("state")?.as_slice())
}

/// Link 3: the step recomputed.
fn recompute_shown<B: Backend>(
    be: &std::sync::Arc<B>,
    cfg: &RunConfig,
    k: &StepKnown,
    ev: &StepEvidence,
) -> Result<()> {
    let Some(i) = ev.index else { return Ok(()) };
    let h = ev.headers.get(usize::from(ev.carried).saturating_add(i as usize)).context("step")?;
    ensure!(
        ev.frames.len() == h.mbs.len(),
        "inner step {i}: frames for {} of {} micro-batches",
        ev.frames.len(),
        h.mbs.len()
    );
    ensure!(
        ev.optimizer.hash() == h.optimizer_before,
        "inner step {i}: the optimizer state shown is not the committed one"
    );
    let hashes: Vec<[u8; 32]> = ev.weights.iter().map(|w| weights_hash(w)).collect();
    let committed = |x: &[u8; 32]| k.epoch_starts.contains(x) || k.step_hashes.contains(x);
    let before = state(ev, &hashes, &h.weights_before)?;
    let specs = StageSpec::split(&cfg.train.model, cfg.train.stages)?;
    let spec = specs.get(k.stage as usize).context("no such stage")?.clone();
    let n = ParamLayout::for_stage(&cfg.train.model, &spec).total();
    ensure!(before.len() == n && ev.optimizer.m.len() == n && ev.optimizer.v.len() == n, "inner step {i}: sizes");
    let mut st = Stage::with_params(be.clone(), &cfg.train.model, spec, before)?;
    st.set_weight_stashing(false);
    let mut current = h.weights_before;
    for (j, (mb, f)) in h.mbs.iter().zip(&ev.frames).enumerate() {
        ensure!(committed(&mb.weights), "inner step {i}, micro-batch {j}: forwarded on uncommitted weights");
        if mb.weights != current {
            st.set_params(state(ev, &hashes, &mb.weights)?)?;
            current = mb.weights;
        }
        accumulate(&mut st, cfg, k, mb, f).with_context(|| format!("inner step {i}, micro-batch {j}"))?;
    }
    if current != h.weights_before {
        st.set_params(before)?;
    }
    let mut opt = AdamW::<B> { m: be.upload(&ev.optimizer.m), v: be.upload(&ev.optimizer.v), t: ev.optimizer.t };
    let lr = cfg.train.schedule.at(h.step);
    opt.step(&mut st, &cfg.train.adamw, lr);
    let after = st.params_host();
    if k.tolerance > 0.0 {
        let want = state(ev, &hashes, &h.weights_after)?;
        let rel = rel_l2(&after, want);
        ensure!(rel <= k.tolerance, "inner step {i}: recomputed weights differ by {rel:.3e} (relative L2)");
        return Ok(());
    }
    ensure!(weights_hash(&after) == h.weights_after, "inner step {i}: recomputed, the step reaches other weights");
    let state_after = optimizer_hash(opt.t, &be.to_host(&opt.m), &be.to_host(&opt.v));
    ensure!(state_after == h.optimizer_after, "inner step {i}: recomputed, the step leaves another optimizer state");
    Ok(())
}

/// How far `a` is from `b`, relative to `b`.
fn rel_l2(a: &[f32], b: &[f32]) -> f64 {
    if a.len() != b.len() {
        return f64::INFINITY;
    }
    let (mut d, mut n) = (0f64, 0f64);
    for (x, y) in a.iter().zip(b) {
        let e = f64::from(*x) - f64::from(*y);
        d += e * e;
        n += f64::from(*y) * f64::from(*y);
    }
    (d / n.max(f64::MIN_POSITIVE)).sqrt()
}

/// A frame of `mb` in `direction`, signed by `signer`, which must be the
/// pathway's neighbour for a completed attempt (or a miner of the
/// neighbouring stage otherwise): its payload.
fn frame_payload<'a>(
    k: &StepKnown,
    mb: &StepMb,
    bytes: &'a [u8],
    signer: [u8; 32],
    direction: Direction,
) -> Result<&'a [u8]> {
    let signer = PeerId(signer);
    let key = (mb.shard, mb.first_sample, mb.attempt);
    let (neighbour_stage, pool) = match direction {
        Direction::Activation => (k.stage.checked_sub(1), k.upstream_miners),
        _ => (k.stage.checked_add(1), k.downstream_miners),
    };
    let neighbour_stage = neighbour_stage.context("no neighbour stage")?;
    match k.completed.get(&key) {
        Some(path) => ensure!(
            path.get(neighbour_stage as usize) == Some(&signer),
            "its {direction:?} frame is not signed by its pathway's neighbour"
        ),
        None => ensure!(pool.contains(&signer), "its {direction:?} frame is signed by no miner of the next stage"),
    }
    let (fh, payload) =
        decode_frame(bytes, k.ctx, signer).map_err(|e| anyhow::anyhow!("its {direction:?} frame: {e}"))?;
    ensure!(
        fh.direction == direction
            && u32::from(fh.stage) == neighbour_stage
            && (fh.shard, fh.first_sample, fh.attempt, fh.samples)
                == (mb.shard, mb.first_sample, mb.attempt, mb.samples),
        "its {direction:?} frame is not the attempt's"
    );
    Ok(payload)
}

/// One micro-batch's backward into `st`'s gradients, as its worker ran it.
fn accumulate<B: Backend>(st: &mut Stage<B>, cfg: &RunConfig, k: &StepKnown, mb: &StepMb, f: &MbFrames) -> Result<()> {
    ensure!(
        mb.samples <= cfg.spec.batch.max(1),
        "a micro-batch of {} samples, the run's hold {}",
        mb.samples,
        cfg.spec.batch
    );
    let (samples, seq) = (mb.samples as usize, cfg.train.seq);
    let rows = samples.checked_mul(seq).filter(|r| *r > 0).context("a micro-batch of no tokens")?;
    let (head, tail) = (st.spec().has_embedding(), st.spec().has_lm_head());
    let width = st.spec().boundary_width;
    let hidden = match head {
        true => None,
        false => {
            let p = frame_payload(k, mb, &f.input, f.input_signer, Direction::Activation)?;
            Some(codec::decode(cfg.train.codec, rows, width, p)?)
        }
    };
    let data = match head || tail {
        true => Some((k.data)(mb.shard, mb.first_sample, mb.samples).context("no corpus data")?),
        false => None,
    };
    let input = match (&hidden, &data) {
        (Some(h), _) => StageInput::Hidden(h),
        (None, Some((x, _))) => StageInput::Tokens(x),
        (None, None) => anyhow::bail!("no input"),
    };
    if tail {
        let (_, y) = data.as_ref().context("targets")?;
        let accum = cfg.train.grad_accum.max(1) as f32;
        st.forward_backward(input, y, samples, seq, 1.0 / accum)?;
        return Ok(());
    }
    let p = frame_payload(k, mb, &f.grad, f.grad_signer, Direction::ActivationGrad)?;
    let g = codec::decode(cfg.train.codec, rows, width, p)?;
    st.forward(0, input, samples, seq)?;
    st.backward(0, &g)?;
    Ok(())
}

#[cfg(test)]
mod tests;
