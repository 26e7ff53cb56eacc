//! One validator's side of an epoch's validation round, free of I/O.
//!
//! Fed the epoch's work (`EpochWork`), the evidence objects miners
//! announce, the results of the checks the shell ran, and the time, it
//! says what to do: ask for evidence, check an object, vote, and say the
//! round is done. The draw is [`sample::draw`] over the beacon this
//! validator recomputes from the miners' heads (it does not take the
//! orchestrator's word for it) and its own secret seed.
//!
//! A miner's vote is cast once: guilty at its first failed check, or
//! cleared once every drawn attempt passed. A miner that has not delivered
//! the evidence for every drawn attempt within `evidence_timeout_ms` (plus the time a draw of its stage
//! takes to upload at `EVIDENCE_UPLOAD_BYTES_PER_S`) is
//! guilty (an honest miner keeps what it may be asked for; see
//! PROTOCOL.md, "Validation").
//!
//! Every stage is drawn: a head or middle miner's activation is checked by
//! `evidence::check_forward`, the tail's gradient and reported loss by
//! `evidence::check_tail`.

use std::collections::{BTreeMap, BTreeSet};

use iota_core::PeerId;
use iota_core::commitment::EpochHeads;
use iota_wire::store_keys::{parse_any_evidence_key, parse_trace_key};
use iota_wire::{MbRef, StoredObject, pb};

use super::lanes::{LaneRecord, Lanes, Receivers, asked_with_lanes};
use super::sample::{SampleRate, beacon, draw};
use crate::settlement::scores::{Rated, weight_vector};

/// Longest device label kept per miner.
const MAX_DEVICE_CHARS: usize = 64;

use self::vote_hash::evidence_hash;
use super::round_io::TraceWait;
pub use super::round_io::{Action, CheckJob, ProveJob, WorkKey};
use super::shared_clasp::harmful_by_clasp;

/// Most attempts named in one ask (the field rule's bound).
const ASK_CHUNK: usize = iota_wire::fields::MAX_EVIDENCE_ITEMS;
/// What the object showing an attempt's inner steps adds to its upload, in
/// stage-sized states: AdamW's m and v, and the weights states a replay
/// of up to 8 steps is shown (a `small` head's object measured 8 states in
/// all, forwards predating their steps included).
const STEP_OBJECT_WEIGHTS: usize = 10;

/// The upload rate a miner's evidence is given time for: 100 Mbit/s, a
/// modest uplink (the store's side is rarely the slower one).
pub const EVIDENCE_UPLOAD_BYTES_PER_S: u64 = 12_500_000;

/// Time, beyond the base timeout, for a miner to build and upload `drawn`
/// evidence bundles of a stage whose weights are `weights_bytes`: a middle
/// stage's bundle may carry two weights states (its backward's, after an
/// inner step), each read back from the miner's disk.
pub fn evidence_allowance_ms(weights_bytes: u64, drawn: usize) -> u64 {
    let bytes = weights_bytes.saturating_mul(2).saturating_mul(drawn as u64);
    bytes.saturating_mul(1000) / EVIDENCE_UPLOAD_BYTES_PER_S
}

struct MinerWork {
    stage: u32,
    /// The device it registered with (bounded: a label, not data).
    device: String,
    heads: EpochHeads,
    /// Its steps chain of the epoch before (None: not held).
    previous_steps: Option<iota_core::commitment::Chain>,
    /// Attempt -> (samples, pathway, the tail's reported loss).
    items: BTreeMap<WorkKey, (u32, Vec<PeerId>, f32)>,
    /// Each attempt's micro-batch issue order in the epoch.
    order: BTreeMap<WorkKey, u64>,
    /// Its completed attempts' pathways (what a check is given).
    completed: std::sync::Arc<BTreeMap<WorkKey, Vec<PeerId>>>,
}

#[derive(Default)]
struct Verdicts {
    /// Drawn attempts not yet judged.
    pending: BTreeSet<WorkKey>,
    /// Drawn attempts whose evidence is being checked.
    checking: BTreeSet<WorkKey>,
    passed: u32,
    hashes: Vec<[u8; 32]>,
    voted: bool,
    guilty: bool,
    /// Drawn attempts whose gradient upstream is held against its
    /// receiver's record (`lanes`), which is not in yet.
    lanes_pending: BTreeSet<WorkKey>,
    /// The drawn attempt whose inner steps are checked (the first of the
    /// miner's own draw; None: the run checks none).
    step: Option<WorkKey>,
    /// Its recompute failed, and the miner's trace of the failed step is
    /// asked for to prove it (`traces`).
    trace: Option<TraceWait>,
}

impl Verdicts {
    /// `Action::Ask`s for `keys` (in chunks), the step attempt's flagged.
    fn asks(&self, epoch: u64, miner: PeerId, keys: &[WorkKey]) -> Vec<Action> {
        keys.chunks(ASK_CHUNK)
            .map(|chunk| Action::Ask {
                epoch,
                miner,
                items: chunk.to_vec(),
                inner_step: self.step.filter(|k| chunk.contains(k)),
                trace: None,
            })
            .collect()
    }
}

impl Verdicts {
    /// Whether everything drawn of the miner has been judged.
    fn complete(&self) -> bool {
        self.pending.is_empty() && self.checking.is_empty() && self.lanes_pending.is_empty() && self.trace.is_none()
    }
}

struct Round {
    epoch: u64,
    started_ms: u64,
    work: BTreeMap<PeerId, MinerWork>,
    starts: BTreeMap<u32, [u8; 32]>,
    /// Each stage's `weights_from`: 1 + the epoch whose merge it started
    /// from (0: the seed's; older than the last after a rollback).
    from: BTreeMap<u32, u64>,
    drawn: BTreeMap<PeerId, Verdicts>,
    /// Per (receiver, attempt) asked of it: the miner whose gradient to it
    /// on that attempt is held against its record.
    receivers: Receivers,
    lanes: Lanes,
    /// The work's miners in its order (that of the weights).
    order: Vec<PeerId>,
    /// Miners CLASP found significantly harmful.
    harmful: BTreeSet<PeerId>,
    /// Each stage's miners of the work.
    by_stage: Vec<std::sync::Arc<Vec<PeerId>>>,
    done_said: bool,
    /// This round's evidence timeout: the validator's base timeout plus
    /// the time its largest miner's draw takes to upload.
    timeout_ms: u64,
    /// The attempts still pending at half the evidence timeout were asked
    /// for again (a request or an announcement lost on the way, or a
    /// miner's failed upload, is not the miner's dishonesty).
    reasked: bool,
}

impl Round {
    /// Votes `miner` guilty (once).
    fn vote_guilty(&mut self, miner: PeerId, reason: String, proof: Vec<Vec<u8>>, out: &mut Vec<Action>) {
        self.vote_guilty_proven(miner, reason, (proof, Vec::new()), out);
    }

    /// `vote_guilty` with its proofs: two frame headers, or a step proof.
    fn vote_guilty_proven(
        &mut self,
        miner: PeerId,
        reason: String,
        (proof, step_proof): (Vec<Vec<u8>>, Vec<u8>),
        out: &mut Vec<Action>,
    ) {
        let Some(v) = self.drawn.get_mut(&miner).filter(|v| !v.voted) else { return };
        v.voted = true;
        v.guilty = true;
        v.trace = None;
        out.push(Action::Vote {
            epoch: self.epoch,
            miner,
            guilty: true,
            samples: v.passed.saturating_add(1),
            evidence_hash: evidence_hash(&v.hashes),
            reason,
            proof,
            step_proof,
        });
        self.release_lanes(miner, out);
    }

    /// `miner`'s evidence will not be checked further (it is voted):
    /// the lanes that waited for its records are judged without them.
    fn release_lanes(&mut self, miner: PeerId, out: &mut Vec<Action>) {
        let lo = (miner, (0, 0, 0));
        let hi = (miner, (u32::MAX, u64::MAX, u32::MAX));
        let waiting: Vec<((PeerId, WorkKey), PeerId)> =
            self.receivers.range(lo..=hi).map(|(k, sender)| (*k, *sender)).collect();
        for (k, sender) in waiting {
            self.receivers.remove(&k);
            if let Some(s) = self.drawn.get_mut(&sender) {
                s.lanes_pending.remove(&k.1);
            }
            self.clear_if_complete(sender, out);
        }
    }

    /// The two ends of `sender`'s gradient lane on `key` hold different
    /// frames it signed: `proof`, the two headers, goes with the vote.
    fn lane_contradicted(&mut self, sender: PeerId, key: WorkKey, proof: [Vec<u8>; 2], out: &mut Vec<Action>) {
        let why = format!(
            "attempt {key:?}: the gradient frame it showed is not the one its upstream neighbour received (two \
             frames it signed for the attempt)"
        );
        self.vote_guilty(sender, why, proof.into(), out);
    }

    /// Clears `miner` once everything drawn of it has been judged.
    fn clear_if_complete(&mut self, miner: PeerId, out: &mut Vec<Action>) {
        let Some(v) = self.drawn.get_mut(&miner).filter(|v| !v.voted && v.complete()) else { return };
        v.voted = true;
        out.push(Action::Vote {
            epoch: self.epoch,
            miner,
            guilty: false,
            samples: v.passed,
            evidence_hash: evidence_hash(&v.hashes),
            reason: String::new(),
            proof: Vec::new(),
            step_proof: Vec::new(),
        });
    }
}

/// The round's draw ([`draw`] over `eligible`), with the attempts each
/// drawn gradient sender's upstream neighbours are asked for too
/// (`lanes::asked_with_lanes`), and per (receiver, attempt) the sender
/// whose lane waits for it.
/// With `inner_steps`, each miner's first pick is the attempt whose inner
/// steps are checked.
fn draw_with_lanes(
    (beacon, seed, rate): (&[u8; 32], u64, SampleRate),
    inner_steps: bool,
    eligible: &BTreeMap<PeerId, Vec<(MbRef, u32)>>,
    work: &BTreeMap<PeerId, MinerWork>,
) -> (BTreeMap<PeerId, Verdicts>, Receivers) {
    let picks: BTreeMap<PeerId, Vec<WorkKey>> = draw(beacon, seed, rate, eligible)
        .into_iter()
        .map(|(p, picks)| (p, picks.iter().map(|(mb, a)| (mb.shard, mb.first_sample, *a)).collect()))
        .filter(|(_, keys): &(PeerId, Vec<WorkKey>)| !keys.is_empty())
        .collect();
    let steps: BTreeMap<PeerId, WorkKey> =
        picks.iter().filter(|_| inner_steps).filter_map(|(p, keys)| Some((*p, *keys.first()?))).collect();
    let own: BTreeMap<PeerId, BTreeSet<WorkKey>> =
        picks.into_iter().map(|(p, keys)| (p, keys.into_iter().collect())).collect();
    let upstream_of = |p: PeerId, k: WorkKey| -> Option<PeerId> {
        let m = work.get(&p)?;
        let (_, pathway, _) = m.items.get(&k)?;
        let up = *pathway.get(m.stage.checked_sub(1)? as usize)?;
        work.get(&up).filter(|u| u.items.contains_key(&k)).map(|_| up)
    };
    let (asked, receivers) = asked_with_lanes(own, upstream_of);
    let mut drawn: BTreeMap<PeerId, Verdicts> = asked
        .into_iter()
        .map(|(p, keys)| (p, Verdicts { pending: keys, step: steps.get(&p).copied(), ..Verdicts::default() }))
        .collect();
    for ((_, k), sender) in &receivers {
        if let Some(v) = drawn.get_mut(sender) {
            v.lanes_pending.insert(*k);
        }
    }
    (drawn, receivers)
}

/// One validator's rounds (one at a time: a new epoch's work ends the last).
pub struct ValidatorCore {
    run_id: u64,
    stages: u32,
    seed: u64,
    rate: SampleRate,
    evidence_timeout_ms: u64,
    /// Bytes of one evidence bundle's weights per stage (empty: unknown,
    /// the base timeout alone).
    stage_bytes: Vec<u64>,
    /// Validators drawing from each miner (its uploads are all of theirs).
    validators: usize,
    /// Whether the run checks inner steps (`validation.check_inner_steps`):
    /// one drawn attempt per miner is asked with its steps.
    inner_steps: bool,
    /// Whether a failed step is proven with the miner's trace of it before
    /// the vote (`with_step_proofs`).
    step_proofs: bool,
    round: Option<Round>,
    /// Per epoch, the hash of each stage's merged weights as this
    /// validator loaded them from the store (merges it kept; the latest
    /// few).
    merged: BTreeMap<u64, BTreeMap<u32, [u8; 32]>>,
    /// CLASP's finding, shared with the validators of this process.
    shared_clasp: Option<std::sync::Arc<super::shared_clasp::SharedClasp>>,
}

/// Epochs of merged hashes a validator keeps.
const MERGED_KEPT: usize = 4;

fn peer(b: &[u8]) -> Result<PeerId, String> {
    Ok(PeerId(b.try_into().map_err(|_| format!("a peer id of {} bytes", b.len()))?))
}

impl ValidatorCore {
    pub fn new(run_id: u64, stages: u32, seed: u64, rate: SampleRate, evidence_timeout_ms: u64) -> ValidatorCore {
        ValidatorCore {
            run_id,
            stages,
            seed,
            rate,
            evidence_timeout_ms,
            stage_bytes: Vec::new(),
            validators: 1,
            inner_steps: false,
            step_proofs: false,
            round: None,
            merged: BTreeMap::new(),
            shared_clasp: None,
        }
    }

    /// Shares CLASP's finding with the validators holding `shared`.
    pub fn with_shared_clasp(mut self, shared: std::sync::Arc<super::shared_clasp::SharedClasp>) -> Self {
        self.shared_clasp = Some(shared);
        self
    }

    /// Each stage's parameter count, and how many validators draw: a
    /// round's evidence timeout then grows with what its drawn miners must
    /// upload (`evidence_allowance_ms`), for every validator's draw (a
    /// miner uploads them one after another, this one's perhaps last).
    pub fn with_stage_params(mut self, params: &[usize], validators: usize) -> Self {
        self.stage_bytes = params.iter().map(|&p| (p as u64).saturating_mul(4)).collect();
        self.validators = validators.max(1);
        self
    }

    /// Asks one drawn attempt per miner with its inner steps (a run with
    /// `validation.check_inner_steps`).
    pub fn with_inner_steps(mut self, on: bool) -> Self {
        self.inner_steps = on;
        self
    }

    /// Prove a failed inner step before voting: ask the miner's signed
    /// trace of it, and vote with the proof the shell builds from it
    /// (`Action::Prove`, `proved`); without a trace in time, or with one
    /// that proves nothing, the vote goes without a proof.
    pub fn with_step_proofs(mut self, on: bool) -> Self {
        self.step_proofs = on;
        self
    }

    /// The round's evidence timeout for `drawn` attempts per miner on its
    /// stage (the step attempt's object counted as `STEP_OBJECT_WEIGHTS`
    /// more, the states it shows).
    fn round_timeout_ms(&self, drawn: impl Iterator<Item = (u32, usize)>) -> u64 {
        let most = drawn
            .map(|(stage, n)| {
                let weights = self.stage_bytes.get(stage as usize).copied().unwrap_or(0);
                let objects = n.saturating_add(if self.inner_steps { STEP_OBJECT_WEIGHTS } else { 0 });
                evidence_allowance_ms(weights, objects.saturating_mul(self.validators))
            })
            .max()
            .unwrap_or(0);
        self.evidence_timeout_ms.saturating_add(most)
    }

    /// The epoch of the round in progress.
    pub fn epoch(&self) -> Option<u64> {
        self.round.as_ref().map(|r| r.epoch)
    }

    /// This validator loaded `epoch`'s merged model from the store and kept
    /// it (voted not to roll it back): each stage's weights hash. The next
    /// epoch's attempts may start from them, whatever hash the merge's
    /// participants reported to the orchestrator.
    pub fn merge_kept(&mut self, epoch: u64, stage_hashes: BTreeMap<u32, [u8; 32]>) {
        self.merged.insert(epoch, stage_hashes);
        while self.merged.len() > MERGED_KEPT {
            self.merged.pop_first();
        }
    }

    /// The miners this validator voted guilty in `epoch`'s round (none
    /// once a later round has begun).
    pub fn found_guilty(&self, epoch: u64) -> BTreeSet<PeerId> {
        let Some(r) = self.round.as_ref().filter(|r| r.epoch == epoch) else { return BTreeSet::new() };
        r.drawn.iter().filter(|(_, v)| v.voted && v.guilty).map(|(p, _)| *p).collect()
    }

    /// The epoch's work arrived: draw, and ask for the evidence.
    pub fn on_work(&mut self, now: u64, w: &pb::EpochWork) -> Result<Vec<Action>, String> {
        if self.round.as_ref().is_some_and(|r| r.epoch == w.epoch) {
            return Ok(Vec::new()); // sent again (a re-subscription): the round goes on
        }
        let mut work = BTreeMap::new();
        let mut order = Vec::with_capacity(w.miners.len());
        for m in &w.miners {
            let p = peer(&m.peer)?;
            if work.contains_key(&p) {
                return Err(format!("miner {p} is listed twice"));
            }
            order.push(p);
            let heads = iota_wire::commitments_pb::from_pb(m.commitments.as_slice())
                .map_err(|e| format!("miner {p}'s heads: {e}"))?
                .into_iter()
                .find(|h| h.epoch == w.epoch)
                .ok_or_else(|| format!("miner {p} has no heads for epoch {}", w.epoch))?;
            // The epoch before's steps chain (where it ends is checked
            // against what a shown step carries in).
            let previous_steps = w.epoch.checked_sub(1).and_then(|e| {
                let list = iota_wire::commitments_pb::from_pb(m.previous.as_slice()).ok()?;
                list.into_iter().find(|h| h.epoch == e).map(|h| h.steps)
            });
            let mut items = BTreeMap::new();
            let mut issued = BTreeMap::new();
            for it in &m.items {
                let r = it.mb.as_ref().ok_or("a work item without its attempt")?;
                let pathway = it.pathway.iter().map(|b| peer(b)).collect::<Result<Vec<_>, _>>()?;
                if pathway.len() != self.stages as usize || pathway.get(m.stage as usize) != Some(&p) {
                    return Err(format!("miner {p}'s work item has a pathway that does not hold it"));
                }
                items.insert((r.shard, r.first_sample, r.attempt), (it.samples, pathway, it.loss));
                issued.insert((r.shard, r.first_sample, r.attempt), it.order);
            }
            let device: String = m.device.chars().take(MAX_DEVICE_CHARS).collect();
            let completed = Default::default();
            work.insert(
                p,
                MinerWork { stage: m.stage, device, heads, previous_steps, items, order: issued, completed },
            );
        }
        let heads: BTreeMap<PeerId, EpochHeads> = work.iter().map(|(p, m)| (*p, m.heads.clone())).collect();
        let b = beacon(self.run_id, w.epoch, &heads);
        if w.beacon.as_slice() != b.as_slice() {
            return Err("the beacon is not the one over the miners' heads".into());
        }
        let mut starts = BTreeMap::new();
        let mut from = BTreeMap::new();
        for s in &w.starts {
            from.insert(s.stage, s.weights_from);
            if !s.weights_hash.is_empty() {
                let h: [u8; 32] = s.weights_hash.as_slice().try_into().map_err(|_| "a start hash of the wrong size")?;
                starts.insert(s.stage, h);
            }
        }
        let eligible: BTreeMap<PeerId, Vec<(MbRef, u32)>> = work
            .iter()
            .map(|(p, m)| {
                let mbs = m.items.keys().map(|k| (MbRef { epoch: w.epoch, shard: k.0, first_sample: k.1 }, k.2));
                (*p, mbs.collect())
            })
            .collect();
        let mut out = Vec::new();
        let (drawn, receivers) = draw_with_lanes((&b, self.seed, self.rate), self.inner_steps, &eligible, &work);
        // Senders before their receivers (the tail first): the orchestrator
        // lets an ask exceed a miner's own draw only for attempts already
        // asked of the miner downstream of it on their pathway.
        let mut by_stage: Vec<(&PeerId, &Verdicts)> = drawn.iter().collect();
        by_stage.sort_by_key(|(p, _)| std::cmp::Reverse(work.get(*p).map_or(0, |m| m.stage)));
        for (p, v) in by_stage {
            let keys: Vec<WorkKey> = v.pending.iter().copied().collect();
            out.extend(v.asks(w.epoch, *p, &keys));
        }
        // Each attempt once: the tail's listing holds every completed one.
        let tail = self.stages.saturating_sub(1);
        let records = || {
            let tails = work.values().filter(|m| m.stage == tail);
            tails.flat_map(|m| m.items.iter().map(|(k, (_, p, l))| (m.order.get(k).copied().unwrap_or(0), &p[..], *l)))
        };
        let harmful = match &self.shared_clasp {
            Some(shared) => shared.get_or(w, || harmful_by_clasp(self.stages, records())),
            None => harmful_by_clasp(self.stages, records()),
        };
        // What every check of the round is given: each stage's miners, and
        // each miner's completed attempts (once, not once per check).
        let of_stage = |s: u32| work.iter().filter(|(_, m)| m.stage == s).map(|(p, _)| *p).collect();
        let by_stage = (0..self.stages).map(|s| std::sync::Arc::new(of_stage(s))).collect();
        for m in work.values_mut() {
            m.completed = std::sync::Arc::new(m.items.iter().map(|(k, (_, p, _))| (*k, p.clone())).collect());
        }
        let timeout_ms =
            self.round_timeout_ms(drawn.iter().map(|(p, v)| (work.get(p).map_or(0, |m| m.stage), v.pending.len())));
        self.round = Some(Round {
            epoch: w.epoch,
            started_ms: now,
            work,
            starts,
            from,
            drawn,
            receivers,
            lanes: Lanes::default(),
            order,
            harmful,
            by_stage,
            done_said: false,
            timeout_ms,
            reasked: false,
        });
        self.finish(&mut out);
        Ok(out)
    }

    /// A miner announced evidence (handed on by the orchestrator, writer
    /// named): check it if it is for an attempt this validator drew.
    pub fn on_evidence(&mut self, epoch: u64, obj: StoredObject) -> Vec<Action> {
        let Some(r) = self.round.as_mut().filter(|r| r.epoch == epoch) else { return Vec::new() };
        let miner = obj.writer;
        if let Some((key, step)) = parse_trace_key(&obj.key, epoch, &miner) {
            return r.trace_arrived(miner, (key, step), obj);
        }
        let Some((key, shows_steps)) = parse_any_evidence_key(&obj.key, epoch, &miner) else { return Vec::new() };
        let (Some(v), Some(m)) = (r.drawn.get_mut(&miner), r.work.get(&miner)) else { return Vec::new() };
        // The step attempt waits for the object that shows its steps.
        let inner_step = v.step == Some(key);
        if v.voted || (inner_step && !shows_steps) || !v.pending.remove(&key) {
            return Vec::new();
        }
        let Some((samples, pathway, loss)) = m.items.get(&key) else { return Vec::new() };
        v.checking.insert(key);
        let upstream = m.stage.checked_sub(1).and_then(|s| pathway.get(s as usize)).copied();
        let downstream = m.stage.checked_add(1).and_then(|s| pathway.get(s as usize)).copied();
        let reported_loss = (m.stage + 1 == self.stages).then_some(*loss);
        let completed = m.completed.clone();
        let at = |stage: Option<u32>| stage.and_then(|s| r.by_stage.get(s as usize)).cloned().unwrap_or_default();
        let (upstream_miners, downstream_miners) = (at(m.stage.checked_sub(1)), at(m.stage.checked_add(1)));
        vec![Action::Check(Box::new(CheckJob {
            epoch,
            miner,
            stage: m.stage,
            key,
            samples: *samples,
            upstream,
            downstream,
            heads: m.heads.clone(),
            device: m.device.clone(),
            epoch_start: r.starts.get(&m.stage).copied(),
            // The merge this validator kept, if it is the one the stage
            // started from: not one the stake rolled back.
            merged_start: r
                .from
                .get(&m.stage)
                .and_then(|f| f.checked_sub(1))
                .and_then(|e| self.merged.get(&e))
                .and_then(|h| h.get(&m.stage))
                .copied(),
            reported_loss,
            object: obj,
            completed,
            upstream_miners,
            downstream_miners,
            previous_steps: m.previous_steps,
            inner_step,
        }))]
    }

    /// The result of a check the shell ran: `Err(why)` when the evidence
    /// failed a link.
    pub fn checked(&mut self, job: &CheckJob, result: Result<(), String>) -> Vec<Action> {
        self.checked_lanes(job, result, LaneRecord::default())
    }

    /// `checked`, with the gradient frames the object showed
    /// (`Checker::check_lanes`): each is held against the other end of
    /// its lane (`lanes`).
    pub fn checked_lanes(&mut self, job: &CheckJob, result: Result<(), String>, rec: LaneRecord) -> Vec<Action> {
        let mut out = Vec::new();
        let step_proofs = self.step_proofs;
        let Some(r) = self.round.as_mut().filter(|r| r.epoch == job.epoch) else { return out };
        let Some(v) = r.drawn.get_mut(&job.miner) else { return out };
        if !v.checking.remove(&job.key) {
            return out;
        }
        // The lanes first: the frames its sender signed count whatever
        // this miner's own evidence is worth.
        // What it sent upstream, against what its receiver holds.
        if let Some(f) = rec.sent_grad
            && let Some(proof) = r.lanes.shown(job.miner, job.key, f)
        {
            r.lane_contradicted(job.miner, job.key, proof, &mut out);
        }
        // What it received, against what its sender showed.
        if let Some(sender) = r.receivers.remove(&(job.miner, job.key)) {
            if let Some(f) = rec.received_grad
                && let Some(proof) = r.lanes.received(sender, job.key, f)
            {
                r.lane_contradicted(sender, job.key, proof, &mut out);
            }
            if let Some(s) = r.drawn.get_mut(&sender) {
                s.lanes_pending.remove(&job.key);
            }
            r.clear_if_complete(sender, &mut out);
        }
        if let Some(v) = r.drawn.get_mut(&job.miner).filter(|v| !v.voted) {
            v.hashes.push(job.object.hash);
            match (&result, rec.failed_step.filter(|_| step_proofs && job.inner_step)) {
                (Ok(()), _) => v.passed += 1,
                // A failed step is proven with the miner's trace of it
                // before the vote.
                (Err(why), Some(step)) => {
                    let reason = format!("attempt {:?}: {why}", job.key);
                    out.push(v.ask_trace(job, step, reason));
                }
                (Err(why), None) => {
                    r.vote_guilty(job.miner, format!("attempt {:?}: {why}", job.key), Vec::new(), &mut out)
                }
            }
        }
        r.clear_if_complete(job.miner, &mut out);
        self.finish(&mut out);
        out
    }

    /// The shell could not read the object of `job` from the store (after
    /// its retries): no judgement of the miner, whose evidence may be
    /// sound behind a failing read. The attempt is pending again and asked
    /// for once more; if it is never read, the evidence timeout decides
    /// (a miner must keep what it announces readable).
    pub fn unreadable(&mut self, job: &CheckJob) -> Vec<Action> {
        let Some(r) = self.round.as_mut().filter(|r| r.epoch == job.epoch) else { return Vec::new() };
        let Some(v) = r.drawn.get_mut(&job.miner) else { return Vec::new() };
        if v.voted || !v.checking.remove(&job.key) {
            return Vec::new();
        }
        v.pending.insert(job.key);
        v.asks(job.epoch, job.miner, &[job.key])
    }

    /// Time passes: miners whose evidence is overdue are voted guilty.
    pub fn tick(&mut self, now: u64) -> Vec<Action> {
        let mut out = Vec::new();
        let Some(r) = self.round.as_mut() else { return out };
        let waited = now.saturating_sub(r.started_ms);
        if !r.reasked && waited > r.timeout_ms / 2 && waited <= r.timeout_ms {
            r.reasked = true;
            for (miner, v) in r.drawn.iter().filter(|(_, v)| !v.voted && !v.pending.is_empty()) {
                let keys: Vec<WorkKey> = v.pending.iter().copied().collect();
                out.extend(v.asks(r.epoch, *miner, &keys));
            }
        }
        let overdue = r.traces_overdue(now, &mut out);
        if waited <= r.timeout_ms {
            if overdue {
                self.finish(&mut out);
            }
            return out;
        }
        for (miner, v) in r.drawn.iter_mut().filter(|(_, v)| !v.voted && !v.pending.is_empty()) {
            v.voted = true;
            v.guilty = true;
            out.push(Action::Vote {
                epoch: r.epoch,
                miner: *miner,
                guilty: true,
                samples: v.passed,
                evidence_hash: evidence_hash(&v.hashes),
                reason: format!("no evidence for {} drawn attempts within {} ms", v.pending.len(), r.timeout_ms),
                proof: Vec::new(),
                step_proof: Vec::new(),
            });
        }
        // Lanes whose receiver's record never came are not judged: their
        // senders are judged on their own evidence.
        let waiting: Vec<PeerId> =
            r.drawn.iter().filter(|(_, v)| !v.voted && !v.lanes_pending.is_empty()).map(|(p, _)| *p).collect();
        for p in waiting {
            if let Some(v) = r.drawn.get_mut(&p) {
                v.lanes_pending.clear();
            }
            r.clear_if_complete(p, &mut out);
        }
        self.finish(&mut out);
        out
    }

    /// Says the round is done once every drawn miner has its vote.
    fn finish(&mut self, out: &mut Vec<Action>) {
        if let Some(r) = self.round.as_mut()
            && !r.done_said
            && r.drawn.values().all(|v| v.voted)
        {
            r.done_said = true;
            let rated: Vec<Rated> = r
                .order
                .iter()
                .map(|p| Rated {
                    peer: *p,
                    completed: r.work.get(p).map_or(0, |m| m.items.len() as u64),
                    guilty: r.drawn.get(p).is_some_and(|v| v.guilty),
                    harmful: r.harmful.contains(p),
                })
                .collect();
            let miners_hash = super::sample::work_miners_hash(r.epoch, &r.order);
            out.push(Action::Done { epoch: r.epoch, weights: weight_vector(&rated), miners_hash });
        }
    }
}

#[cfg(test)]
#[path = "round_tests.rs"]
mod tests;

mod traces;
mod vote_hash;
