//! Hedging an epoch's stragglers. Once every micro-batch of the epoch has
//! been issued, miners fall idle one by one while the last few micro-batches
//! finish, and one of them stuck behind a miner that dropped its frame held
//! the epoch's end for the whole detection (the neighbour's overdue time,
//! the orchestrator's grace) and then the re-issue. Instead, an attempt out
//! for half its overdue time is issued a second time on idle miners sharing
//! none of its pathway: whichever completes first completes the micro-batch and the other is
//! cancelled (as in MapReduce's backup tasks). If the first attempt fails,
//! its hedge becomes the current attempt (no new pathway to wait for); if
//! the hedge fails, it is dropped and nobody is blamed for it but an
//! unreachable miner. Each attempt is hedged at most once.
//!
//! A hedge costs only capacity the epoch's end leaves unused: it is issued
//! only on miners with nothing in flight. Its work is not counted unless it
//! wins (`work`, deliveries and settlement follow the completing pathway).

use iota_core::{PeerId, Rng};

use super::state::Hedge;
use super::{MbStatus, Ms, Orchestrator, Out};

impl Orchestrator {
    /// After how long an attempt is hedged: half the overdue time its
    /// neighbours wait before reporting (twice the slowest measured
    /// delivery), so a hedge is usually issued before the stall is noticed.
    fn hedge_after_ms(&self, pathway: &[PeerId], slowest_live: f64) -> Ms {
        self.overdue_ms_given(pathway, slowest_live) / 2
    }

    /// Hedges the late attempts of an epoch whose micro-batches have all
    /// been issued, the oldest first, while idle miners are left to take
    /// them.
    pub(super) fn hedge_late(&mut self, now: Ms, rng: &mut Rng, out: &mut Vec<Out>) {
        if self.issued < self.spec.epoch_len(self.epoch) {
            return;
        }
        let timeout = self.spec.route_timeout_ms;
        // Runs on every event once the epoch is issued: one scan of the
        // live miners for every attempt's overdue time.
        let slowest_live = self.slowest_live_delivery_ms();
        let mut late: Vec<(Ms, u64)> = self
            .mbs
            .values()
            .filter_map(|r| match &r.status {
                // Hedged once per attempt: a hedge that stalled is not
                // issued again (it would go to the same idle miners).
                MbStatus::InFlight { deadline_ms, pathway, hedge: None, attempt, last_attempt, .. }
                    if last_attempt <= attempt =>
                {
                    let age = now.saturating_sub(deadline_ms.saturating_sub(timeout));
                    (age >= self.hedge_after_ms(pathway, slowest_live)).then_some((age, r.seq))
                }
                _ => None,
            })
            .collect();
        late.sort_by(|a, b| b.cmp(a));
        for (_, seq) in late {
            let r = self.mbs[&seq].clone();
            let MbStatus::InFlight { attempt, pathway, last_attempt, .. } = &r.status else {
                continue;
            };
            let Some(p) = self.pathway(rng, pathway, true) else {
                continue;
            };
            // Idle miners only. Not only those whose work never failed this
            // epoch: the first accusation of a flaky miner is believed (see
            // `pin_stall`), so it is often its honest neighbour that has a
            // failure on record, and it is the one a hedge needs.
            let busy = |q: &PeerId| pathway.contains(q) || self.miners.get(q).is_none_or(|m| m.in_flight > 0);
            if p.iter().any(busy) {
                continue;
            }
            let next = (*attempt).max(*last_attempt) + 1;
            let overdue = self.overdue_ms(&p);
            for m in &p {
                out.push(Out { to: *m, cmd: Self::route_cmd(self.epoch, &r, next, &p, overdue) });
            }
            self.set_in_flight(&p, 1);
            self.counters.hedged += 1;
            tracing::debug!(epoch = self.epoch, seq, attempt = next, of = attempt, "hedged");
            if let MbStatus::InFlight { hedge, last_attempt, .. } = &mut self.mbs.get_mut(&seq).unwrap().status {
                *hedge = Some(Hedge {
                    attempt: next,
                    pathway: p,
                    deadline_ms: now + timeout,
                    loss: None,
                    backward_done: false,
                });
                *last_attempt = next;
            }
        }
    }

    /// Drops `seq`'s hedge: cancelled on its miners, which are free again.
    pub(super) fn drop_hedge(&mut self, seq: u64, out: &mut Vec<Out>) {
        let Some(r) = self.mbs.get_mut(&seq) else { return };
        let mb = r.mb;
        let MbStatus::InFlight { hedge, .. } = &mut r.status else { return };
        let Some(h) = hedge.take() else { return };
        tracing::debug!(epoch = self.epoch, seq, attempt = h.attempt, "hedge dropped");
        self.set_in_flight(&h.pathway, -1);
        self.cancel(mb, h.attempt, &h.pathway, out);
    }

    /// The micro-batches whose hedge goes through `peer`.
    pub(super) fn hedged_through(&self, peer: PeerId) -> Vec<u64> {
        self.mbs
            .values()
            .filter(|r| matches!(&r.status, MbStatus::InFlight { hedge: Some(h), .. } if h.pathway.contains(&peer)))
            .map(|r| r.seq)
            .collect()
    }
}
