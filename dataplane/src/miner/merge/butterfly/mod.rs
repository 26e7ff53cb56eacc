//! The butterfly merge, one replica's side (`iota_core::merge`: the plan and
//! the reduce; `iota_core::merge::stage`: the orchestrator's side).
//!
//! 1. Uploading: the replica computes its pseudo-gradient
//!    delta = theta_prev - theta_local and reports that it is ready.
//! 2. Merging (plan): it sends slice k of delta, encoded with the merge codec,
//!    to both owners of partition k (`WeightSlice` frames, kind 0). A slice
//!    that cannot be delivered is left in the object store as a signed frame.
//! 3. As an owner, once it holds every participant's slice k, it reduces it
//!    (`reduce_slice`, momentum from the store), reports the hash of the
//!    encoded update, and sends the update to the receivers the plan gives it
//!    (kind 1).
//! 4. The orchestrator accepts one hash per partition (a verdict). Each
//!    replica applies the update with that hash: theta_next = theta_prev - u,
//!    so every replica ends with the same bits. If it never received that
//!    update, it reads the merged slice the verdict's writer stored
//!    (announced to it by a `Stored` command).
//! 5. The writer of each partition stores the merged slice and its momentum
//!    and announces both (`Stored` reports): rejoining replicas and the next
//!    epoch's owners read them, checked against the announcement.
//!
//! `WeightSlice` frame fields: shard = partition index, first_sample = the
//! partition's offset, samples = kind (0 contribution, 1 merged update),
//! attempt = the partition's generation (updates), shape = [blocks, 256]
//! (the slice zero-padded to whole blocks).

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use bytes::Bytes;
use iota_core::merge::{BLOCK, KEEP_PREVIOUS, MergePlan};
use iota_core::{ParamLayout, PeerId, WireCodec};
use iota_protocol::manifest::from_pb_list;
use iota_protocol::store_keys::{contrib_prefix, weights_parts_prefix};
use iota_protocol::{MergeSpec, SharedStore, StoredObject, pb, plan_from_pb};
use rayon::prelude::*;
use tracing::{info, warn};

mod contribution;
mod fault;
mod faulted;
mod intake;
mod missing;
mod records;
use iota_checks::slices;
mod stats;
mod store_io;
#[cfg(test)]
mod tests;

pub use self::fault::MergeFault;
use self::slices::{KIND_CONTRIBUTION, KIND_UPDATE, SliceMsg, blocks, slice_msg};
pub use self::slices::{
    Published, Reduced, decode_contribution, decode_slice, decode_slice_into, encode_contribution, encode_slice,
    reduce_partition, reduce_partition_published, update_hash,
};
pub use self::stats::MergeStats;
use super::Merge;
use super::parts::read_parts;
use crate::frame::{FrameMeta, RunContext};
use crate::miner::events::Output;
use crate::transport::ReceivedFrame;

/// After this long without an expected slice, look in the object store.
const STORE_FALLBACK_AFTER: Duration = Duration::from_millis(1500);

/// Where a finalized partition's merged slice comes from.
enum Source {
    /// The verdict keeps the previous weights.
    Keep,
    /// The accepted update, encoded.
    Update(Bytes),
    /// The merged slice its writer stored.
    Stored(Vec<f32>),
}

/// Values per parallel task when an update is applied (elementwise, so any
/// split gives the same bits).
const APPLY_CHUNK: usize = 1 << 16;

struct OwnResult {
    generation: u32,
    hash: [u8; 32],
    payload: Bytes,
    momentum: Vec<f32>,
}

pub struct Butterfly {
    me: PeerId,
    spec: MergeSpec,
    store: SharedStore,
    rt: tokio::runtime::Handle,
    ctx: Arc<RunContext>,
    pub stats: Arc<MergeStats>,
    pub fault: Option<MergeFault>,
    /// In a validated run: the epoch's weights chain items (`bind`) and
    /// the last weights contributed, for the witness an audited
    /// contribution is stored with.
    bound: Option<(Vec<[u8; 32]>, Vec<f32>)>,
    /// The replicas a `Collude` fault conspires with.
    pub accomplices: Vec<PeerId>,
    epoch: u64,
    stage: u32,
    theta_prev: Vec<f32>,
    delta: Option<Vec<f32>>,
    plan: Option<MergePlan>,
    plan_at: Instant,
    /// `stats.phase_secs()` when this epoch's merge began: the counters run
    /// over the replica's life, and the completion log reports this merge's.
    phases_at_start: [f64; 4],
    encoded: HashMap<usize, Bytes>,
    sent: HashSet<(usize, PeerId)>,
    contribs: HashMap<usize, BTreeMap<PeerId, Bytes>>,
    /// The signed header of each contribution in `contribs` that came as a
    /// frame (our own did not).
    contrib_headers: HashMap<usize, BTreeMap<PeerId, Vec<u8>>>,
    early: VecDeque<SliceMsg>,
    momentum_prev: HashMap<usize, Vec<f32>>,
    /// The stage's momentum parts after the previous merge, as announced.
    momentum_objects: Vec<StoredObject>,
    /// Merged slices of this merge stored by their writers, by offset.
    stored_weights: HashMap<u64, StoredObject>,
    results: HashMap<usize, OwnResult>,
    candidates: HashMap<usize, Vec<([u8; 32], Bytes)>>,
    verdicts: HashMap<usize, (pb::SliceVerdict, Instant)>,
    theta_next: Vec<f32>,
    finalized: Vec<bool>,
    last_store_poll: Instant,
    merged: Option<(u64, Vec<f32>)>,
    finished: bool,
    /// This merge's slices read from the store instead of the data plane:
    /// contributions (as an owner) and merged updates (reported in
    /// `MergeDone`).
    contributions_from_store: u32,
    updates_from_store: u32,
    /// Partitions (and generations) whose missing contributions this
    /// owner has reported (`missing.rs`).
    claimed: HashSet<(usize, u32)>,
    /// The latest a contribution arrived after its plan, this merge.
    latest_contribution: Duration,
    /// With sparse contributions: what this replica's have not sent yet,
    /// for the stage it holds (kept across merges; `contribution.rs`).
    feedback: contribution::Feedback,
}

impl Butterfly {
    pub fn new(
        me: PeerId,
        spec: MergeSpec,
        store: SharedStore,
        rt: tokio::runtime::Handle,
        ctx: Arc<RunContext>,
    ) -> Butterfly {
        Butterfly {
            me,
            spec,
            store,
            rt,
            ctx,
            stats: Arc::new(MergeStats::default()),
            fault: None,
            bound: None,
            accomplices: Vec::new(),
            epoch: 0,
            stage: 0,
            theta_prev: Vec::new(),
            delta: None,
            plan: None,
            plan_at: Instant::now(),
            phases_at_start: [0.0; 4],
            encoded: HashMap::new(),
            sent: HashSet::new(),
            contribs: HashMap::new(),
            contrib_headers: HashMap::new(),
            early: VecDeque::new(),
            momentum_prev: HashMap::new(),
            momentum_objects: Vec::new(),
            stored_weights: HashMap::new(),
            results: HashMap::new(),
            candidates: HashMap::new(),
            verdicts: HashMap::new(),
            theta_next: Vec::new(),
            finalized: Vec::new(),
            last_store_poll: Instant::now(),
            merged: None,
            finished: false,
            contributions_from_store: 0,
            updates_from_store: 0,
            claimed: HashSet::new(),
            latest_contribution: Duration::ZERO,
            feedback: contribution::Feedback::new(),
        }
    }

    fn reset(&mut self, epoch: u64, stage: u32) {
        self.phases_at_start = self.stats.phase_secs();
        self.epoch = epoch;
        self.stage = stage;
        self.delta = None;
        self.plan = None;
        self.encoded.clear();
        self.sent.clear();
        self.contribs.clear();
        self.contrib_headers.clear();
        self.early.clear();
        self.momentum_prev.clear();
        self.momentum_objects.clear();
        self.stored_weights.clear();
        self.results.clear();
        self.candidates.clear();
        self.verdicts.clear();
        self.theta_next.clear();
        self.finalized.clear();
        self.merged = None;
        self.finished = false;
        self.contributions_from_store = 0;
        self.updates_from_store = 0;
        self.claimed.clear();
        self.latest_contribution = Duration::ZERO;
    }

    fn codec(&self) -> WireCodec {
        self.spec.codec
    }

    fn send(&self, to: PeerId, meta: FrameMeta, payload: Bytes, fallback: Option<String>, out: &mut Vec<Output>) {
        self.stats.sent_bytes.fetch_add(payload.len() as u64, Ordering::Relaxed);
        out.push(Output::Frame { to, meta, payload, fallback });
    }

    /// Where a contribution to partition k is left if it cannot be delivered.
    fn fallback_key(&self, k: usize, from: &PeerId) -> String {
        format!("{}{k:06}/{}.frame", contrib_prefix(self.epoch, self.stage), from.to_hex())
    }

    /// Moves the merge as far as it can go.
    fn pump(&mut self, out: &mut Vec<Output>) -> Result<()> {
        let Some(plan) = self.plan.clone() else { return Ok(()) };
        let Some(delta) = self.delta.as_ref() else { return Ok(()) };
        // Contributions: to every current owner that has not had ours.
        for (k, part) in plan.partitions.iter().enumerate() {
            let range = part.offset as usize..(part.offset + part.len) as usize;
            if !self.encoded.contains_key(&k) && self.partner_fault() {
                // A co-owner's copy (or negation) once its contribution came.
                match self.partner_copy(k)? {
                    Some(bytes) => {
                        self.encoded.insert(k, bytes);
                    }
                    None if part.owners.contains(&self.me) => continue,
                    None => {}
                }
            }
            if !self.encoded.contains_key(&k) {
                let bytes = contribution::encode(
                    &self.stats,
                    &self.spec,
                    &mut self.feedback,
                    range.clone(),
                    delta,
                    self.fault,
                )?;
                self.encoded.insert(k, bytes);
            }
            let enc = self.encoded[&k].clone();
            let withheld = self.withholds(&plan, k);
            for o in &part.owners {
                if *o != self.me && withheld {
                    continue;
                }
                if *o == self.me {
                    self.contribs.entry(k).or_default().entry(self.me).or_insert_with(|| enc.clone());
                } else if self.sent.insert((k, *o)) {
                    let meta = self.meta(k, part.offset, part.len, KIND_CONTRIBUTION, 0);
                    let fb = Some(self.fallback_key(k, &self.me));
                    let payload = if self.fault == Some(MergeFault::Equivocate) && part.owners.first() != Some(o) {
                        let tripled: Vec<f32> = delta[range.clone()].iter().map(|d| 3.0 * d).collect();
                        Bytes::from(encode_contribution(&self.spec, &tripled)?)
                    } else {
                        enc.clone()
                    };
                    self.send(*o, meta, payload, fb, out);
                }
            }
        }
        if (0..plan.partitions.len()).all(|k| self.encoded.contains_key(&k)) {
            self.feedback.stepped(self.epoch, self.stage);
        }
        // Frames that came before the plan that makes them acceptable.
        for m in std::mem::take(&mut self.early) {
            self.accept(m, true);
        }
        for k in plan.owned_by(&self.me).collect::<Vec<_>>() {
            self.try_reduce(k, out)?;
        }
        for k in 0..plan.partitions.len() {
            self.try_finalize(k, out)?;
        }
        if !self.finished && !self.finalized.is_empty() && self.finalized.iter().all(|&f| f) {
            self.finished = true;
            // The weights chain's hash (a root over leaves), so a miner
            // starting the next epoch from these weights reports the same.
            let hash = iota_checks::hashes::weights_hash(&self.theta_next);
            let [encode_s, reduce_s, apply_s, store_s] = self.stats.phase_secs_since(self.phases_at_start);
            info!(
                epoch = self.epoch,
                stage = self.stage,
                secs = self.plan_at.elapsed().as_secs_f64(),
                encode_s,
                reduce_s,
                apply_s,
                store_s,
                backlog = self.feedback.norm(),
                "butterfly merge complete"
            );
            // A liar's hash sorts after every other: it wins a tie.
            let hash = if self.fault == Some(MergeFault::LieDone) { [0xff; 32] } else { hash };
            out.push(Output::Report(pb::report::Kind::MergeDone(pb::MergeDone {
                epoch: self.epoch,
                stage: self.stage,
                key: weights_parts_prefix(self.epoch, self.stage),
                weights_hash: hash.to_vec(),
                object: None,
                contributions_from_store: self.contributions_from_store,
                updates_from_store: self.updates_from_store,
            })));
            // Handed over, not copied: a partition stored again after this
            // (a new writer) is rebuilt in a buffer of its own.
            self.merged = Some((self.epoch, std::mem::take(&mut self.theta_next)));
        }
        Ok(())
    }

    /// A dishonest owner's (test tool) update: the honest one decoded,
    /// changed value by value, encoded again.
    fn republished(&self, len: u64, payload: &[u8], f: impl Fn(f32) -> f32) -> Result<(Bytes, [u8; 32])> {
        let u: Vec<f32> = decode_slice(self.codec(), len, payload)?.into_iter().map(f).collect();
        update_hash(self.codec(), &u)
    }

    fn try_reduce(&mut self, k: usize, out: &mut Vec<Output>) -> Result<()> {
        let plan = self.plan.clone().expect("pump checked");
        let part = &plan.partitions[k];
        if self.results.get(&k).is_some_and(|r| r.generation == part.generation) {
            return Ok(());
        }
        let Some(have) = self.contribs.get(&k) else { return Ok(()) };
        if !plan.participants.iter().all(|p| have.contains_key(&p.peer)) {
            return Ok(());
        }
        let t0 = Instant::now();
        let have: Vec<Bytes> = plan.participants.iter().map(|p| have[&p.peer].clone()).collect();
        let payloads: Vec<Option<&[u8]>> = have.iter().map(|b| Some(&b[..])).collect();
        let mut momentum = self.momentum_for(k, part.offset, part.len, out)?;
        // What every honest owner flags, with the same inputs, and leaves
        // out of its reduce (so it agrees with the other honest owner
        // whatever the rule, and an owner that keeps it in disagrees).
        let Published { payload, hash, flagged: flagged_at, stats: st } =
            reduce_partition_published(&self.spec, self.epoch, part.len, &payloads, &plan.weights(), &mut momentum)?;
        let mut flagged: Vec<Vec<u8>> = Vec::new();
        for (i, why) in flagged_at {
            let from = plan.participants[i].peer;
            if from != self.me {
                warn!(k, %from, ?why, "merge contribution flagged and left out");
                flagged.push(from.0.to_vec());
            }
        }
        if st.rejected_non_finite > 0 || st.clipped > 0 {
            warn!(k, rejected = st.rejected_non_finite, clipped = st.clipped, "robust reduce held back contributions");
        }
        let among_accomplices =
            part.owners.len() >= 2 && part.owners.iter().all(|o| *o == self.me || self.accomplices.contains(o));
        let (payload, hash) = match self.fault {
            // Test tools: the update changed before it is published.
            Some(MergeFault::CorruptUpdates) => self.republished(part.len, &payload, |x| x + 0.5)?,
            Some(MergeFault::Collude) if among_accomplices => self.republished(part.len, &payload, |x| -x)?,
            _ => (payload, hash),
        };
        // Without outer momentum nothing reads it again (it is never stored).
        if self.spec.outer.momentum == 0.0 {
            momentum = Vec::new();
        }
        MergeStats::time(&self.stats.reduce_ns, t0);
        // The signed headers of what we reduced: two owners' lists together
        // prove a sender that sent them different slices.
        let headers = self.contrib_headers.get(&k);
        let contributions =
            plan.participants.iter().filter_map(|p| headers.and_then(|h| h.get(&p.peer)).cloned()).collect();
        out.push(Output::Report(pb::report::Kind::SliceDone(pb::SliceDone {
            epoch: self.epoch,
            stage: self.stage,
            partition: k as u32,
            generation: part.generation,
            hash: hash.to_vec(),
            contributions,
            flagged,
        })));
        for p in &plan.participants {
            if plan.sender_of(k, &p.peer) == Some(self.me) {
                let meta = self.meta(k, part.offset, part.len, KIND_UPDATE, part.generation);
                self.send(p.peer, meta, payload.clone(), None, out);
            }
        }
        self.results.insert(k, OwnResult { generation: part.generation, hash, payload, momentum });
        Ok(())
    }

    fn try_finalize(&mut self, k: usize, out: &mut Vec<Output>) -> Result<()> {
        if self.finalized.get(k).copied().unwrap_or(true) {
            return Ok(());
        }
        // The merged slice is built in place in theta_next (taken out while
        // this runs, so the writer's store can borrow self).
        let mut next = std::mem::take(&mut self.theta_next);
        let r = self.finalize_into(k, &mut next, out);
        self.theta_next = next;
        r
    }

    fn finalize_into(&mut self, k: usize, next: &mut [f32], out: &mut Vec<Output>) -> Result<()> {
        let Some((v, at)) = self.verdicts.get(&k).cloned() else { return Ok(()) };
        let plan = self.plan.as_ref().expect("pump checked");
        let part = plan.partitions[k].clone();
        let range = part.offset as usize..(part.offset + part.len) as usize;
        let keep = v.hash == KEEP_PREVIOUS;
        let payload =
            if keep {
                None
            } else {
                self.results.get(&k).filter(|r| r.hash[..] == v.hash[..]).map(|r| r.payload.clone()).or_else(|| {
                    self.candidates.get(&k)?.iter().find(|(h, _)| h[..] == v.hash[..]).map(|(_, p)| p.clone())
                })
            };
        let source = match (keep, payload) {
            (true, _) => Source::Keep,
            (false, Some(p)) => Source::Update(p),
            (false, None) => {
                if at.elapsed() < STORE_FALLBACK_AFTER {
                    return Ok(());
                }
                // The writer announces the slice once it has stored it.
                let Some(obj) = self.stored_weights.get(&part.offset).filter(|o| o.values == part.len).cloned() else {
                    return Ok(());
                };
                let r = self.rt.block_on(read_parts(&self.store, &[obj], part.offset, part.len))?;
                for b in &r.bad {
                    warn!(key = %b.object.key, writer = %b.object.writer, reason = %b.reason, "stored slice rejected");
                    out.push(b.report(self.epoch, self.stage));
                    // Wait for a new writer's announcement.
                    self.stored_weights.remove(&part.offset);
                }
                if r.covered < part.len {
                    return Ok(());
                }
                self.stats.store_fallbacks.fetch_add(1, Ordering::Relaxed);
                self.updates_from_store = self.updates_from_store.saturating_add(1);
                Source::Stored(r.values)
            }
        };
        // Once the merge has handed theta_next over (a new writer after it
        // finished), the slice is rebuilt in a buffer of its own.
        let mut own = Vec::new();
        let slice: &mut [f32] = if next.len() >= range.end {
            &mut next[range.clone()]
        } else {
            own.resize(range.len(), 0.0);
            &mut own
        };
        let t0 = Instant::now();
        let prev = &self.theta_prev[range];
        match source {
            Source::Keep => slice.copy_from_slice(prev),
            Source::Stored(values) => slice.copy_from_slice(&values),
            Source::Update(p) => {
                // theta_next = theta_prev - u, u decoded in place.
                decode_slice_into(self.codec(), &p, slice)?;
                slice.par_chunks_mut(APPLY_CHUNK).zip(prev.par_chunks(APPLY_CHUNK)).for_each(|(s, t)| {
                    s.iter_mut().zip(t).for_each(|(s, t)| *s = t - *s);
                });
            }
        }
        MergeStats::time(&self.stats.apply_ns, t0);
        if v.writer[..] == self.me.0[..] {
            // Before the partition counts as done: a put that fails (the
            // store down, another writer racing us) is tried again at the
            // next step instead of leaving the slice unstored, which every
            // replica without the update would wait for.
            let t0 = Instant::now();
            self.store_partition(k, &part, &v, keep, slice, out)?;
            MergeStats::time(&self.stats.store_ns, t0);
        }
        self.finalized[k] = true;
        Ok(())
    }
}

impl Merge for Butterfly {
    fn contribution_request(&mut self, r: &pb::ContributionRequest, out: &mut Vec<Output>) -> Result<()> {
        self.store_contributions(r, out)
    }

    fn bind(&mut self, step_hashes: Vec<[u8; 32]>) {
        self.bound = Some((step_hashes, Vec::new()));
    }

    fn backlog_hash(&self, epoch: u64) -> Option<[u8; 32]> {
        self.feedback.backlog_hash(epoch)
    }

    fn keep_records_in(&mut self, dir: std::path::PathBuf) {
        self.feedback.spill = Some(records::RecordSpill::new(dir));
    }

    fn epoch_started(&mut self, epoch: u64, stage: u32, params: &[f32]) {
        self.reset(epoch, stage);
        // The previous epoch's buffer, reused: no fresh pages to fault in.
        self.theta_prev.clear();
        self.theta_prev.extend_from_slice(params);
    }

    fn contribute(
        &mut self,
        epoch: u64,
        stage: u32,
        _layout: &ParamLayout,
        params: &[f32],
        work: u64,
        out: &mut Vec<Output>,
    ) -> Result<()> {
        if epoch != self.epoch || stage != self.stage || self.theta_prev.len() != params.len() {
            // We never saw this epoch start (joined late): contribute nothing.
            self.reset(epoch, stage);
            self.theta_prev = params.to_vec();
        }
        if self.fault == Some(MergeFault::InflatedBacklog) {
            self.feedback.inflate(4.0);
        }
        if let Some((items, last)) = self.bound.as_mut() {
            last.clear();
            last.extend_from_slice(params);
            if self.spec.sparse_density > 0.0 {
                self.feedback.begin(epoch, stage, &self.theta_prev, params, items);
            }
        }
        let mut delta: Vec<f32> = self.theta_prev.iter().zip(params).map(|(g, l)| g - l).collect();
        self.fault_delta(epoch, &mut delta);
        self.feedback.hold(stage, delta.len());
        self.delta = Some(delta);
        self.theta_next = self.theta_prev.clone();
        out.push(Output::Report(pb::report::Kind::UploadDone(pb::UploadDone {
            epoch,
            stage,
            key: String::new(),
            micro_batches: work,
            object: None,
            // Added by the worker.
            commitments: Vec::new(),
        })));
        Ok(())
    }

    fn merging(&mut self, p: &pb::PhaseChange, stage: u32, layout: &ParamLayout, out: &mut Vec<Output>) -> Result<()> {
        let Some(pp) = p.merge_plan.as_ref() else {
            return Ok(()); // not a participant: we rejoin by download
        };
        let plan = plan_from_pb(pp).map_err(anyhow::Error::msg)?;
        plan.validate(layout.total() as u64).map_err(anyhow::Error::msg)?;
        // Our slices go to peers with the same limit: a plan we could not
        // receive, they could not either.
        let limit = self.ctx.limits.max_payload;
        if let Some((k, bytes)) = plan
            .partitions
            .iter()
            .map(|p| {
                let update = self.codec().payload_bytes(blocks(p.len), BLOCK as usize).map_or(u64::MAX, |b| b as u64);
                update.max(self.spec.contribution_bytes(p.len).unwrap_or(u64::MAX))
            })
            .enumerate()
            .find(|(_, b)| *b > limit)
        {
            bail!(
                "merge plan partition {k} is a slice of {bytes} bytes, over this miner's frame limit of {limit} \
                 (the run's max_slice_bytes is {})",
                self.spec.max_slice_bytes
            );
        }
        // With the merge behind compute the plan comes with the next
        // epoch's Training phase.
        let behind = self.spec.overlap && p.epoch == self.epoch + 1;
        if plan.epoch != self.epoch || plan.stage != stage || (p.epoch != self.epoch && !behind) {
            bail!(
                "merge plan for epoch {} stage {}, we are at epoch {} stage {stage}",
                plan.epoch,
                plan.stage,
                self.epoch
            );
        }
        if self.delta.is_none() {
            // Restarted after its stage's uploads (the plan may name its
            // earlier life): nothing to merge; its partitions go to the
            // other replicas and it takes the merged weights by download.
            info!(epoch = plan.epoch, stage, "merge plan before this replica's contribution: rejoining by download");
            return Ok(());
        }
        if !plan.is_participant(&self.me) {
            return Ok(());
        }
        if self.finalized.len() != plan.partitions.len() {
            self.finalized = vec![false; plan.partitions.len()];
        }
        self.momentum_objects = from_pb_list(&p.momentum).map_err(|e| anyhow::anyhow!("momentum objects: {e}"))?;
        if self.fault == Some(MergeFault::PlantObjects) && self.plan.is_none() {
            self.plant(out);
        }
        self.plan = Some(plan);
        self.plan_at = Instant::now();
        self.pump(out)
    }

    fn verdict(&mut self, v: pb::SliceVerdict, out: &mut Vec<Output>) -> Result<()> {
        if v.epoch != self.epoch || v.stage != self.stage || v.hash.len() != 32 {
            return Ok(());
        }
        let k = v.partition as usize;
        if self.plan.as_ref().is_none_or(|p| k >= p.partitions.len()) {
            return Ok(());
        }
        // A repeat (the orchestrator re-sends verdicts after a restart or a
        // timeout) changes nothing: no second store, no restarted wait.
        if self.verdicts.get(&k).is_some_and(|(held, _)| *held == v) {
            return self.pump(out);
        }
        // A new writer for a settled partition: store it if we hold it.
        let rewrite = self.finalized.get(k).copied().unwrap_or(false) && v.writer[..] == self.me.0[..];
        self.verdicts.insert(k, (v, Instant::now()));
        if rewrite {
            self.finalized[k] = false;
        }
        self.pump(out)
    }

    fn frame(&mut self, f: ReceivedFrame, out: &mut Vec<Output>) -> Result<()> {
        let Some(m) = slice_msg(&f.header, f.peer, &f.payload) else {
            bail!("malformed merge frame from {}", f.peer);
        };
        drop(f);
        self.accept(m, false);
        self.pump(out)
    }

    fn tick(&mut self, out: &mut Vec<Output>) -> Result<()> {
        if self.plan.is_none() || self.finished {
            return Ok(());
        }
        if self.plan_at.elapsed() >= STORE_FALLBACK_AFTER && self.last_store_poll.elapsed() >= Duration::from_secs(1) {
            self.last_store_poll = Instant::now();
            self.poll_store()?;
            self.claim_missing(out);
        }
        self.pump(out)
    }

    fn take_merged(&mut self) -> Option<(u64, Vec<f32>)> {
        self.merged.take()
    }

    fn stored(&mut self, s: pb::Stored, out: &mut Vec<Output>) -> Result<()> {
        if s.epoch != self.epoch || s.stage != self.stage {
            return Ok(());
        }
        let o = StoredObject::from_pb(&s.object.unwrap_or_default(), None).map_err(anyhow::Error::msg)?;
        if o.is_part() && o.key.starts_with(&weights_parts_prefix(self.epoch, self.stage)) {
            self.stored_weights.insert(o.offset, o);
        }
        self.pump(out)
    }
}
