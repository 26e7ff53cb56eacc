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
//! ([`StepEvidence`]), replayed from the last optimizer state it kept: a
//! miner keeps AdamW's m and v (two stage-sized snapshots) only at every
//! `validation.step_window`-th step of an epoch, so a drawn step comes
//! with the fewer than `step_window` steps before it back to such a state;
//! the validator ([`check_step`]):
//! 1. re-chains the headers to the committed head, and checks they follow
//!    each other (a step's state before is its predecessor's after; the
//!    weights may also be the epoch's merged start, which a late merge
//!    puts in place) and that each step's weights after is the weights
//!    chain's item for it;
//! 2. finds the attempt in a step, or counts it among the fewer than
//!    `grad_accum` completed attempts no step lists (the epoch's last,
//!    partial accumulation, dropped);
//! 3. recomputes each replayed step in turn (the drawn one last): every
//!    listed micro-batch's forward and backward
//!    from the frames its neighbours signed for it (or the corpus's tokens
//!    and targets), on the committed weights its forward ran on,
//!    accumulated in order, then the optimizer step from the state the
//!    step before left (the first from the shown one, whose hash is the
//!    committed one) at the committed counter; the weights and the state
//!    after must hash to the committed ones, bit for bit on the same
//!    backend (on another, only the drawn step's weights are compared,
//!    within `Known::tolerance`). Weights states the replay does not
//!    compute itself are shown ([`shown_states`]).
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

use anyhow::{Context, Result, ensure};
use iota_core::commitment::Chain;
use iota_core::{ParamLayout, StageSpec};
use iota_model::Backend;
use iota_wire::RunConfig;

use crate::evidence::Finding;

pub mod proof;
pub mod proof_bytes;
pub mod prove;
mod record;
mod replay;
pub mod step_trace;
pub use self::record::{
    MbFrames, OptimizerState, StepEvidence, StepHeader, StepLimits, StepMb, optimizer_hash, shown_states,
};
use self::replay::Replay;
pub use self::replay::{MbData, StepKnown};

/// Runs the checks of the module text on `ev`.
pub fn check_step<B: Backend>(be: &std::sync::Arc<B>, cfg: &RunConfig, k: &StepKnown, ev: &StepEvidence) -> Finding {
    check_step_at(be, cfg, k, ev).0
}

/// `check_step`, and where it failed because a step's recompute on the
/// miner's own backend reached other weights or another optimizer state
/// than the miner committed: that step (among the epoch's own records),
/// whose signed trace turns the failure into a proof (`prove`).
pub fn check_step_at<B: Backend>(
    be: &std::sync::Arc<B>,
    cfg: &RunConfig,
    k: &StepKnown,
    ev: &StepEvidence,
) -> (Finding, Option<u32>) {
    let fresh = match stage_weights(cfg, k.stage) {
        Ok(n) => OptimizerState::fresh(n).hash(),
        Err(e) => return (Finding::Cheated(format!("{e:#}")), None),
    };
    match check_chain(cfg.train.grad_accum, fresh, k, ev).and_then(|()| recompute_shown(be, cfg, k, ev)) {
        Ok(()) => (Finding::Honest, None),
        Err(e) => {
            let at = e.downcast_ref::<replay::Differs>().map(|d| d.step);
            (Finding::Cheated(format!("{e:#}")), at)
        }
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

/// Link 3: the drawn step recomputed, replayed from the shown optimizer
/// state through every step between (each checked the same way).
fn recompute_shown<B: Backend>(
    be: &std::sync::Arc<B>,
    cfg: &RunConfig,
    k: &StepKnown,
    ev: &StepEvidence,
) -> Result<()> {
    let Some(i) = ev.index else { return Ok(()) };
    let own = ev.headers.get(usize::from(ev.carried)..).context("steps")?;
    let window = cfg.spec.validation.step_window.max(1);
    ensure!(
        ev.from <= i && i.saturating_sub(ev.from) < window,
        "inner step {i}: shown from step {}, not within the run's window of {window} steps before it",
        ev.from
    );
    let steps = own.get(ev.from as usize..=i as usize).context("inner steps: the replayed steps are not there")?;
    let mbs = steps.iter().map(|h| h.mbs.len()).fold(0usize, usize::saturating_add);
    ensure!(
        ev.frames.len() == mbs,
        "inner steps {}..={i}: frames for {} of {mbs} micro-batches",
        ev.from,
        ev.frames.len()
    );
    let first = steps.first().context("step")?;
    ensure!(
        ev.optimizer.hash() == first.optimizer_before,
        "inner step {}: the optimizer state shown is not the committed one",
        ev.from
    );
    let mut replay = Replay::start(be, cfg, k, ev, first)?;
    let mut frames = ev.frames.iter();
    for (n, h) in steps.iter().enumerate() {
        let j = ev.from.saturating_add(u32::try_from(n)?);
        let mb_frames: Vec<&MbFrames> = frames.by_ref().take(h.mbs.len()).collect();
        replay.step(j, h, &mb_frames, j == i)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests;
