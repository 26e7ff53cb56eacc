//! Micro-batches on their pathways: issuing a route, the two reports that
//! complete it, and re-routing what failed (liveness.rs decides whom a
//! failure is pinned on and which pathway comes next).

use iota_core::{PeerId, Rng};
use iota_wire::{MbRef, pb};

use super::state::MbRecord;
use super::{MbStatus, Ms, Orchestrator, Out};

impl Orchestrator {
    pub(super) fn route_cmd(
        epoch: u64,
        r: &MbRecord,
        attempt: u32,
        pathway: &[PeerId],
        overdue_ms: u64,
    ) -> pb::command::Kind {
        pb::command::Kind::Route(pb::Route {
            epoch,
            shard: r.mb.shard,
            first_sample: r.mb.first_sample,
            samples: r.samples,
            attempt,
            pathway: pathway.iter().map(|p| p.0.to_vec()).collect(),
            seq: r.seq,
            overdue_ms,
        })
    }

    pub(super) fn in_flight_through(&self, peer: PeerId) -> Vec<u64> {
        self.mbs
            .values()
            .filter(|r| matches!(&r.status, MbStatus::InFlight { pathway, .. } if pathway.contains(&peer)))
            .map(|r| r.seq)
            .collect()
    }

    pub(super) fn set_in_flight(&mut self, pathway: &[PeerId], delta: i32) {
        for p in pathway {
            if let Some(m) = self.miners.get_mut(p) {
                m.in_flight = (m.in_flight as i64 + delta as i64).max(0) as u32;
            }
        }
    }

    /// The tail's loss for `mb`'s `attempt` (the current one or its hedge).
    pub(super) fn on_loss(
        &mut self,
        now: Ms,
        peer: PeerId,
        (mb, attempt): (MbRef, u32),
        loss: f32,
        tokens: u32,
        out: &mut Vec<Out>,
    ) {
        let Some(r) = self.mbs.values_mut().find(|r| r.mb == mb) else {
            self.counters.stale_reports += 1;
            return;
        };
        let seq = r.seq;
        let MbStatus::InFlight { attempt: a, pathway, loss: l, hedge, .. } = &mut r.status else {
            self.counters.stale_reports += 1;
            return;
        };
        let slot = if *a == attempt && pathway.last() == Some(&peer) {
            l
        } else if let Some(h) = hedge.as_mut().filter(|h| h.attempt == attempt && h.pathway.last() == Some(&peer)) {
            &mut h.loss
        } else {
            self.counters.stale_reports += 1;
            return;
        };
        if slot.is_none() && loss.is_finite() {
            *slot = Some(loss);
            // Counted when the micro-batch completes (try_complete).
            r.tokens = tokens;
        }
        self.try_complete(now, seq, out);
    }

    /// The head finished its backward of `mb`'s `attempt` (the current one
    /// or its hedge).
    pub(super) fn on_backward_done(&mut self, now: Ms, peer: PeerId, (mb, attempt): (MbRef, u32), out: &mut Vec<Out>) {
        let Some(r) = self.mbs.values_mut().find(|r| r.mb == mb) else {
            self.counters.stale_reports += 1;
            return;
        };
        let seq = r.seq;
        let MbStatus::InFlight { attempt: a, pathway, backward_done, hedge, .. } = &mut r.status else {
            self.counters.stale_reports += 1;
            return;
        };
        if *a == attempt && pathway.first() == Some(&peer) {
            *backward_done = true;
        } else if let Some(h) = hedge.as_mut().filter(|h| h.attempt == attempt && h.pathway.first() == Some(&peer)) {
            h.backward_done = true;
        } else {
            self.counters.stale_reports += 1;
            return;
        }
        self.try_complete(now, seq, out);
    }

    /// A micro-batch is complete once the tail reported its loss and the head
    /// finished its backward (the two reports may arrive in either order),
    /// for the current attempt or its hedge; the other is then cancelled.
    pub(super) fn try_complete(&mut self, now: Ms, seq: u64, out: &mut Vec<Out>) {
        let r = self.mbs.get_mut(&seq).expect("known micro-batch");
        let MbStatus::InFlight { pathway, loss, backward_done, deadline_ms, attempt, hedge, .. } = &r.status else {
            return;
        };
        let first = (*attempt, pathway.clone(), *deadline_ms);
        let second = hedge.as_ref().map(|h| (h.attempt, h.pathway.clone(), h.deadline_ms));
        let ((attempt, pathway, deadline_ms), loss, lost) = match (loss, backward_done, hedge) {
            (Some(l), true, _) => (first, *l, second),
            (_, _, Some(h)) if h.backward_done && h.loss.is_some() => {
                self.counters.hedges_won += 1;
                (second.expect("a hedge"), h.loss.expect("a loss"), Some(first))
            }
            _ => return,
        };
        let issued = deadline_ms.saturating_sub(self.spec.route_timeout_ms);
        let (mb, tokens) = (r.mb, r.tokens);
        // The attempt and pathway stay on record: validators sample them.
        r.status = MbStatus::Done { loss, attempt, pathway: pathway.clone() };
        if let Some((lost_attempt, lost_pathway, _)) = lost {
            self.set_in_flight(&lost_pathway, -1);
            self.cancel(mb, lost_attempt, &lost_pathway, out);
        }
        self.delivered(&pathway, now.saturating_sub(issued).max(1) as f64);
        self.counters.completed += 1;
        // Trained tokens: one count per completed micro-batch, however many
        // attempts reported a loss for it.
        self.counters.tokens += u64::from(tokens);
        self.counters.first_completed_at_ms.get_or_insert(now);
        self.counters.last_loss = loss;
        self.epoch_loss.0 += loss as f64;
        self.epoch_loss.1 += 1;
        self.set_in_flight(&pathway, -1);
        for p in &pathway {
            if let Some(m) = self.miners.get_mut(p) {
                m.work += 1;
            }
        }
    }

    /// Tells `pathway`'s miners to drop `mb`'s `attempt`.
    pub(super) fn cancel(&self, mb: MbRef, attempt: u32, pathway: &[PeerId], out: &mut Vec<Out>) {
        for p in pathway {
            out.push(Out {
                to: *p,
                cmd: pb::command::Kind::Cancel(pb::Cancel {
                    epoch: self.epoch,
                    shard: mb.shard,
                    first_sample: mb.first_sample,
                    attempt,
                }),
            });
        }
    }

    /// Re-issues micro-batches `seqs` on new pathways (avoiding `avoid`).
    /// `attributed`: the failure was pinned on a miner (or it went silent),
    /// which does not count toward `max_attempts`; a micro-batch is dropped
    /// after `max_attempts` failures nobody could be blamed for, or when a
    /// stage has no miner left to take it.
    pub(super) fn reroute_all(
        &mut self,
        now: Ms,
        seqs: Vec<u64>,
        avoid: Option<PeerId>,
        attributed: bool,
        out: &mut Vec<Out>,
    ) {
        self.reroute(now, seqs, avoid, if attributed { Failed::Pinned } else { Failed::Unattributed }, out);
    }

    /// Re-issues `seq`, issued before anything was measured, now that the
    /// measured overdue time has passed with no report: nobody failed (its
    /// miners were told to wait longer), so nobody is penalised and it is
    /// no strike. A silent miner's neighbours are then told the measured
    /// time, and report it.
    pub(super) fn reissue_unmeasured(&mut self, now: Ms, seq: u64, out: &mut Vec<Out>) {
        self.counters.reissued_unmeasured += 1;
        self.reroute(now, vec![seq], None, Failed::NotYet, out);
    }

    fn reroute(&mut self, now: Ms, seqs: Vec<u64>, avoid: Option<PeerId>, failed: Failed, out: &mut Vec<Out>) {
        let mut rng = Rng::derived(self.spec.run_id, &[self.epoch, now, seqs.len() as u64]);
        for seq in seqs {
            let r = self.mbs[&seq].clone();
            let MbStatus::InFlight { attempt, pathway, strikes, hedge, last_attempt, .. } = &r.status else {
                continue;
            };
            let (attempt, old) = (*attempt, pathway.clone());
            tracing::debug!(epoch = self.epoch, seq, attempt, on = ?avoid, failed = ?failed, hedged = hedge.is_some(), "re-issued");
            let strikes = strikes + u32::from(failed == Failed::Unattributed);
            self.set_in_flight(&old, -1);
            // A failed attempt counts against the latency of whom it is
            // pinned on (everyone on it when nobody is blamed), so routing
            // steers away from miners whose work fails.
            let penalty = self.spec.route_timeout_ms as f64;
            if failed != Failed::NotYet {
                for p in old.iter().filter(|p| avoid.is_none_or(|a| a == **p)) {
                    self.penalize(*p, penalty);
                }
            }
            self.cancel(r.mb, attempt, &old, out);
            let last_attempt = attempt.max(*last_attempt);
            // Its hedge is already the next attempt, on miners the failed
            // one did not use.
            if let Some(h) = hedge.clone() {
                self.counters.rerouted += 1;
                self.mbs.get_mut(&seq).unwrap().status = MbStatus::InFlight {
                    attempt: h.attempt,
                    pathway: h.pathway,
                    deadline_ms: h.deadline_ms,
                    loss: h.loss,
                    backward_done: h.backward_done,
                    strikes,
                    waiting: Vec::new(),
                    waiting_since: None,
                    unmeasured: false,
                    hedge: None,
                    last_attempt,
                };
                continue;
            }
            let mut avoid_list: Vec<PeerId> = old.clone();
            avoid_list.extend(avoid);
            let next = last_attempt + 1;
            match (strikes < self.spec.max_attempts).then(|| self.pathway(&mut rng, &avoid_list, false)).flatten() {
                Some(p) => {
                    let overdue = self.overdue_ms(&p);
                    let unmeasured = self.nothing_measured();
                    self.counters.rerouted += 1;
                    self.set_in_flight(&p, 1);
                    for m in &p {
                        out.push(Out { to: *m, cmd: Self::route_cmd(self.epoch, &r, next, &p, overdue) });
                    }
                    let deadline = now + self.spec.route_timeout_ms;
                    self.mbs.get_mut(&seq).unwrap().status = MbStatus::InFlight {
                        attempt: next,
                        pathway: p,
                        deadline_ms: deadline,
                        loss: None,
                        backward_done: false,
                        strikes,
                        waiting: Vec::new(),
                        waiting_since: None,
                        unmeasured,
                        hedge: None,
                        last_attempt: next,
                    };
                }
                None => {
                    self.counters.dropped += 1;
                    self.mbs.get_mut(&seq).unwrap().status = MbStatus::Dropped;
                }
            }
        }
    }
}

/// How a re-issued attempt ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Failed {
    /// Pinned on a miner (or the miner left): no strike.
    Pinned,
    /// Nobody could be blamed: a strike toward `max_attempts`.
    Unattributed,
    /// It had not failed: it was issued with the ceiling overdue time.
    NotYet,
}
