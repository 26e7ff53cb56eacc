//! An epoch's life as the orchestrator runs it: its start (the weights it
//! starts from, a fresh record), issuing and re-routing its micro-batches,
//! and its end (the summary, a rollback or the merged weights' hashes, the
//! next epoch or the end of the run).

use std::collections::{BTreeMap, BTreeSet};

use iota_core::{PeerId, Rng};

use super::state::{MbRecord, MinerEpoch};
use super::{EpochSummary, MbStatus, Ms, Orchestrator, Out, Phase};

/// An attempt whose time is up: (seq, attempt, pathway, its `NO_INPUT`
/// reports).
type Expired = (u64, u32, Vec<PeerId>, Vec<(PeerId, PeerId)>);

impl Orchestrator {
    pub(super) fn start_epoch(&mut self, now: Ms, rng: &mut Rng, out: &mut Vec<Out>) {
        self.mbs.clear();
        self.settled_below = (self.epoch, 0);
        self.issued = 0;
        self.uploads.clear();
        self.merged.clear();
        self.merged_hash.clear();
        if self.behind.running().is_none() {
            self.butterfly.clear();
        }
        self.behind.new_epoch();
        self.started_from.insert(self.epoch, self.weights_epoch());
        // Verdicts may still come for the epoch just ended; none for
        // earlier ones.
        let keep = self.epoch.saturating_sub(1);
        for q in [&mut self.validation.quorum, &mut self.validation.merge_quorum].into_iter().flatten() {
            q.forget_before(keep);
        }
        while self.started_from.len() > 4 {
            self.started_from.pop_first();
        }
        self.prune_objects();
        self.liveness_new_epoch();
        self.epoch_loss = (0.0, 0);
        for m in self.miners.values_mut() {
            m.work = 0;
            m.in_flight = 0;
            m.convicted = false;
        }
        self.set_phase(now, Phase::Training, out);
        self.advance_training(now, rng, out);
    }

    pub(super) fn advance_training(&mut self, now: Ms, rng: &mut Rng, out: &mut Vec<Out>) {
        // Timed out, or stalled by a miner its neighbours have reported
        // overdue (after a grace for the reports of everyone waiting to
        // arrive): pinned on a miner when the waiting reports say who
        // stalled it (see liveness.rs), on nobody otherwise.
        // Runs on every event: the live miners are scanned once, and only
        // for a stalled attempt's grace.
        let slowest_live = std::cell::OnceCell::new();
        let from = self.open_mbs();
        let expired: Vec<Expired> = self
            .mbs
            .range(from..)
            .map(|(_, r)| r)
            .filter_map(|r| match &r.status {
                MbStatus::InFlight { deadline_ms, attempt, pathway, waiting, waiting_since, .. } => {
                    // Reported stalled: act after the grace, pinned on a
                    // miner or not (two neighbours waiting on each other lost
                    // a frame between them; waiting out the timeout gains
                    // nothing).
                    let stalled = waiting_since.is_some_and(|t| {
                        let slowest = *slowest_live.get_or_init(|| self.slowest_live_delivery_ms());
                        t + self.waiting_grace_ms_given(pathway, slowest) <= now
                    });
                    (*deadline_ms <= now || stalled).then(|| (r.seq, *attempt, pathway.clone(), waiting.clone()))
                }
                _ => None,
            })
            .collect();
        let expired: Vec<(u64, u32, Option<PeerId>)> = expired
            .into_iter()
            .map(|(seq, attempt, pathway, waiting)| (seq, attempt, self.pin_stall(&pathway, &waiting)))
            .collect();
        // Issued before anything was measured, its miners wait the ceiling
        // overdue time before reporting a silent neighbour (a silent head
        // in the first epoch held the epoch's end for it). Once the
        // measured overdue time (and the grace) passed with no report, it
        // is issued again with that time.
        let measured_any = !self.nothing_measured();
        let slowest_live = self.slowest_live_delivery_ms();
        let unmeasured: Vec<u64> = self
            .mbs
            .range(from..)
            .map(|(_, r)| r)
            .filter_map(|r| match &r.status {
                MbStatus::InFlight { deadline_ms, pathway, waiting_since: None, unmeasured: true, .. }
                    if measured_any =>
                {
                    let measured = self.overdue_ms_given(pathway, slowest_live);
                    let issued = deadline_ms.saturating_sub(self.spec.route_timeout_ms);
                    let late = issued + measured + self.waiting_grace_ms_given(pathway, slowest_live) <= now;
                    (late && *deadline_ms > now).then_some(r.seq)
                }
                _ => None,
            })
            .collect();
        for seq in unmeasured {
            self.reissue_unmeasured(now, seq, out);
        }
        for (seq, attempt, blamed) in expired {
            if let Some(b) = blamed {
                self.blame(now, b, out);
            }
            // Benching re-routes what the benched miner held.
            let still = matches!(&self.mbs[&seq].status, MbStatus::InFlight { attempt: a, .. } if *a == attempt);
            if still {
                self.reroute_all(now, vec![seq], blamed, blamed.is_some(), out);
            }
        }
        let in_flight_now = |o: &Self| {
            o.mbs.range(o.open_mbs_known()..).filter(|(_, r)| matches!(r.status, MbStatus::InFlight { .. })).count()
        };
        let mut in_flight = in_flight_now(self) as u32;
        let room = |issued: u64, in_flight: u32| in_flight < self.spec.max_in_flight_at(self.epoch, issued);
        // Once per pass: it scans every miner.
        let unmeasured = room(self.issued, in_flight) && self.nothing_measured();
        let epoch_len = self.spec.epoch_len(self.epoch);
        // Issuing changes no miner's delivery time: one scan for the loop.
        let slowest_live = self.slowest_live_delivery_ms();
        while self.issued < epoch_len && in_flight < self.spec.max_in_flight_at(self.epoch, self.issued) {
            let Some(p) = self.pathway(rng, &[], true) else {
                break;
            };
            let overdue = self.overdue_ms_given(&p, slowest_live);
            let seq = self.issued;
            let mb = self.spec.micro_batch(self.epoch, seq);
            let r = MbRecord { seq, mb, samples: self.spec.batch, status: MbStatus::Dropped, tokens: 0 };
            for m in &p {
                out.push(Out { to: *m, cmd: Self::route_cmd(self.epoch, &r, 0, &p, overdue) });
            }
            self.set_in_flight(&p, 1);
            let status = MbStatus::InFlight {
                attempt: 0,
                pathway: p,
                deadline_ms: now + self.spec.route_timeout_ms,
                loss: None,
                backward_done: false,
                strikes: 0,
                waiting: Vec::new(),
                waiting_since: None,
                unmeasured,
                hedge: None,
                last_attempt: 0,
            };
            self.mbs.insert(seq, MbRecord { status, ..r });
            self.issued += 1;
            in_flight += 1;
        }
        self.hedge_late(now, rng, out);
        let finished = in_flight_now(self) == 0;
        // With the merge behind compute, the epoch ends once the merge
        // behind it is complete: each replica lands it as it uploads.
        if finished && self.issued == epoch_len && !self.waits_for_overlapped(now) {
            self.set_phase(now, Phase::Uploading, out);
        }
    }

    /// Ends the epoch; `rolled_back`: its merge is discarded, and the next
    /// epoch starts from the weights this one started from.
    pub(super) fn finish_epoch(&mut self, now: Ms, rng: &mut Rng, out: &mut Vec<Out>, rolled_back: bool) {
        let (mut sum, mut n) = self.epoch_loss;
        // Work through a convicted miner is out of the epoch: its losses
        // (a lying tail's, or computed from a cheat's outputs) too.
        let convicted: Vec<PeerId> = self.miners.values().filter(|m| m.convicted).map(|m| m.peer).collect();
        let tainted = |r: &MbRecord| matches!(&r.status, MbStatus::Done { pathway, .. } if pathway.iter().any(|p| convicted.contains(p)));
        for r in self.mbs.values().filter(|r| tainted(r)) {
            if let MbStatus::Done { loss, .. } = r.status {
                sum -= f64::from(loss);
                n = n.saturating_sub(1);
            }
        }
        let excluded = self.mbs.values().filter(|r| tainted(r)).count() as u64;
        let count = |f: fn(&MbStatus) -> bool| self.mbs.values().filter(|r| f(&r.status)).count() as u64;
        let mut completed: BTreeMap<PeerId, u64> = BTreeMap::new();
        for r in self.mbs.values() {
            if let MbStatus::Done { pathway, .. } = &r.status {
                for p in pathway {
                    *completed.entry(*p).or_default() += 1;
                }
            }
        }
        let miners: Vec<MinerEpoch> = self
            .miners
            .values()
            .filter(|m| completed.contains_key(&m.peer) || m.live())
            .map(|m| MinerEpoch {
                peer: m.peer,
                stage: m.stage,
                completed: completed.get(&m.peer).copied().unwrap_or(0),
                credited: m.work,
                merged: self.uploads.get(&m.stage).is_some_and(|u| u.contains_key(&m.peer)) && m.merges(self.epoch),
                convicted: m.convicted,
            })
            .collect();
        let summary = EpochSummary {
            epoch: self.epoch,
            mean_loss: if n > 0 { (sum / n as f64) as f32 } else { f32::NAN },
            losses: self
                .mbs
                .values()
                .map(|r| match r.status {
                    MbStatus::Done { loss, .. } if !tainted(r) => loss,
                    _ => f32::NAN,
                })
                .collect(),
            completed: count(|s| matches!(s, MbStatus::Done { .. })),
            dropped: count(|s| matches!(s, MbStatus::Dropped)),
            excluded,
            convicted,
            rolled_back,
            held_out_loss: self.held_out_loss(),
            miners,
        };
        self.settle(&summary.miners, rolled_back, &summary.convicted, f64::from(summary.mean_loss));
        self.history.push(summary);
        // The next epoch's "epoch before" starts where this one did.
        self.validation.starts_before = self.validation.starts.clone();
        if rolled_back {
            let back_to = self.started_from_epoch();
            tracing::warn!(epoch = self.epoch, to = ?back_to, "the validators rolled the merge back");
            self.counters.rollbacks += 1;
            self.weights_override = Some(back_to);
        } else {
            self.record_stage_starts();
            self.weights_override = None;
        }
        self.epoch += 1;
        // Everyone, newcomers included, now starts from the merged weights.
        for m in self.miners.values_mut() {
            if m.live() {
                m.joining = false;
            }
        }
        self.fitness_changes += 1;
        if self.epoch >= self.spec.epoch_count() {
            self.set_phase(now, Phase::Done, out);
        } else {
            self.start_epoch(now, rng, out);
        }
    }

    /// The merge whose weights the current epoch started from (None: the
    /// run seed's).
    pub(super) fn started_from_epoch(&self) -> Option<u64> {
        self.started_from.get(&self.epoch).copied().unwrap_or_else(|| self.weights_epoch())
    }

    /// The merged weights each stage starts the next epoch from, so
    /// validators know the weights an attempt before the first inner step
    /// must have used: the hash more than half of the run's validator
    /// stake says it loaded from the store, else the one the most
    /// participants reported (a liar among two replicas ties with the
    /// honest one; a stake majority, who hashed the stored weights, breaks
    /// the tie, and a minority validator cannot name the record). A
    /// parameter server's aggregator reports no hash: there only the
    /// validators' can be the record.
    fn record_stage_starts(&mut self) {
        let loaded = self.loaded_merge_hashes();
        let total = self.total_stake();
        let stages: BTreeSet<u32> = self.butterfly.keys().chain(self.merged.keys()).copied().collect();
        for s in stages {
            let by_stake = loaded.get(&s).into_iter().flatten().find(|(_, st)| 2 * u128::from(**st) > total);
            let mut counts: BTreeMap<[u8; 32], usize> = BTreeMap::new();
            let reported = self.butterfly.get(&s).map(|bm| bm.done.values()).into_iter().flatten();
            for h in reported.chain(self.merged_hash.get(&s)) {
                *counts.entry(*h).or_default() += 1;
            }
            let by_reports = counts.into_iter().max_by_key(|(_, n)| *n).map(|(h, _)| h);
            match by_stake.map(|(h, _)| *h).or(by_reports) {
                Some(h) => self.validation.starts.insert(s, h),
                None => self.validation.starts.remove(&s),
            };
        }
    }
}

impl Orchestrator {
    /// The first sequence number of the epoch's micro-batches that may
    /// still be in flight: every one before it is done or dropped, which
    /// no micro-batch leaves until the epoch's are cleared. The training
    /// pass runs on every event; it reads from here on, not the whole
    /// epoch's record.
    pub(super) fn open_mbs(&mut self) -> u64 {
        let mut seq = self.open_mbs_known();
        while self.mbs.get(&seq).is_some_and(|r| matches!(r.status, MbStatus::Done { .. } | MbStatus::Dropped)) {
            seq += 1;
        }
        self.settled_below = (self.epoch, seq);
        seq
    }

    /// As `open_mbs`, as last found (0 in another epoch: a restored
    /// orchestrator reads the whole record once).
    fn open_mbs_known(&self) -> u64 {
        if self.settled_below.0 == self.epoch { self.settled_below.1 } else { 0 }
    }
}
