//! Liveness: pinning a failed micro-batch on the miner that failed it,
//! benching miners that keep failing, probation, and choosing pathways by
//! measured speed (PROTOCOL.md, "Liveness").
//!
//! Heartbeats say a miner is alive, not that it works. What the
//! orchestrator trusts is delivered work: every completion resets a
//! miner's failure streak and updates its measured latency; a failure is
//! pinned on a miner when neighbours on its pathways could not reach it
//! (`UNREACHABLE`: at once, but only once two distinct neighbours said so
//! since its last delivery; one neighbour's word re-routes the micro-batch
//! and pins nothing, and a reporter whose target then delivers loses its
//! standing) or, at the route's timeout, when a neighbour
//! waited on it for its input (`NO_INPUT`) and it was not itself waiting on
//! anyone. `bench_after_failures` failures in a row bench it for the rest of
//! the epoch (the streak carries over epochs: only a delivery ends it);
//! benched in `REMOVE_AFTER_BENCHED_EPOCHS` epochs, it is removed.

use iota_core::{PeerId, Rng};
use iota_wire::{MbRef, pb};

use super::{MbStatus, MinerState, Ms, Orchestrator, Out, Phase, Refusal};

/// Epochs benched before a miner is removed from the run.
pub const REMOVE_AFTER_BENCHED_EPOCHS: u32 = 3;

/// Miners accused of a stall per epoch that are remembered (the rest are
/// judged on the pathway's reports alone).
const MAX_ACCUSED: usize = 4_096;

/// Distinct neighbours that must report a miner UNREACHABLE (since its
/// last delivery, this epoch) before a failure is pinned on it: one
/// hostile neighbour's word alone benches nobody.
pub const CORROBORATING_REPORTERS: usize = 2;

/// A miner whose UNREACHABLE reports were contradicted this many times
/// this epoch (their target delivered) corroborates nothing more in it.
pub const FALSE_REPORTS_DISCOUNTED: u32 = 3;

/// Routing draws among the replicas whose cost is within this factor of
/// the cheapest one's (see `pathway`).
const DRAW_SPREAD: f64 = 4.0;

/// A peer failure is a report by one miner of an attempt's pathway about
/// its neighbour on it.
fn neighbours_on(pathway: &[PeerId], reporter: PeerId, named: PeerId) -> Result<(), Refusal> {
    let at = |p: &PeerId| pathway.iter().position(|q| q == p);
    let (Some(i), Some(j)) = (at(&reporter), at(&named)) else {
        return Err(Refusal::Invalid("a peer failure names miners of the micro-batch's pathway".into()));
    };
    if i.abs_diff(j) != 1 {
        return Err(Refusal::Invalid("a peer failure names a neighbour on the pathway".into()));
    }
    Ok(())
}

impl Orchestrator {
    /// A `PeerFailed` report from `reporter` about its neighbour `named` on
    /// the pathway of `mb`'s `attempt` (which must be the current one).
    pub(super) fn on_peer_failed(
        &mut self,
        now: Ms,
        reporter: PeerId,
        (mb, attempt): (MbRef, u32),
        named: PeerId,
        failure: pb::Failure,
        out: &mut Vec<Out>,
    ) -> Result<(), Refusal> {
        let stages = self.spec.stages as usize;
        let Some(r) = self.mbs.values_mut().find(|r| r.mb == mb) else {
            self.counters.stale_reports += 1;
            return Ok(());
        };
        let seq = r.seq;
        let MbStatus::InFlight { attempt: a, pathway, waiting, waiting_since, deadline_ms, hedge, .. } = &mut r.status
        else {
            self.counters.stale_reports += 1;
            return Ok(());
        };
        if let Some(h) = hedge.as_ref().filter(|h| h.attempt == attempt) {
            // A hedge that stalls is dropped (the first attempt is still
            // out); only an unreachable miner is blamed for it.
            neighbours_on(&h.pathway, reporter, named)?;
            match failure {
                pb::Failure::Unspecified => {
                    return Err(Refusal::Invalid("a peer failure says what failed".into()));
                }
                pb::Failure::Unreachable => {
                    self.drop_hedge(seq, out);
                    self.unreachable_reported(now, reporter, named, out);
                }
                pb::Failure::NoInput => self.drop_hedge(seq, out),
            }
            return Ok(());
        }
        if *a != attempt {
            self.counters.stale_reports += 1;
            return Ok(());
        }
        neighbours_on(pathway, reporter, named)?;
        let age = now.saturating_sub(deadline_ms.saturating_sub(self.spec.route_timeout_ms));
        tracing::debug!(seq, attempt, reporter = %reporter, named = %named, ?failure, age_ms = age, "peer failed");
        match failure {
            pb::Failure::Unreachable => {
                self.unreachable_reported(now, reporter, named, out);
                // Unless benching just re-routed it, this micro-batch goes
                // to another replica now rather than at its timeout.
                if self.in_flight_through(named).contains(&seq) {
                    self.reroute_all(now, vec![seq], Some(named), true, out);
                }
            }
            pb::Failure::NoInput => {
                if waiting.len() < 2 * stages && !waiting.contains(&(reporter, named)) {
                    waiting.push((reporter, named));
                    waiting_since.get_or_insert(now);
                }
            }
            pb::Failure::Unspecified => return Err(Refusal::Invalid("a peer failure says what failed".into())),
        }
        Ok(())
    }

    /// `reporter` could not reach `named`: a failure is pinned on `named`
    /// once `CORROBORATING_REPORTERS` distinct neighbours in good standing
    /// have said so since its last delivery. Until then the report only
    /// moves the micro-batch (the caller re-routes it).
    pub(super) fn unreachable_reported(&mut self, now: Ms, reporter: PeerId, named: PeerId, out: &mut Vec<Out>) {
        let standing = self.miners.get(&reporter).is_some_and(|m| m.false_reports < FALSE_REPORTS_DISCOUNTED);
        let Some(m) = self.miners.get_mut(&named) else { return };
        if standing && !m.unreachable_by.contains(&reporter) && m.unreachable_by.len() < CORROBORATING_REPORTERS {
            m.unreachable_by.push(reporter);
        }
        if standing && m.unreachable_by.len() >= CORROBORATING_REPORTERS {
            self.blame(now, named, out);
        } else {
            self.counters.uncorroborated_reports += 1;
            tracing::debug!(reporter = %reporter, named = %named, standing, "an UNREACHABLE report not (yet) borne out");
            // One word against another's: the micro-batch failed on the
            // link between them, and routing steers away from both (the
            // re-route penalises the named one). The reporter's failure
            // counts for routing this epoch, not toward benching: a miner
            // that reports every neighbour it is routed to stops being
            // routed to, and so stops costing the swarm its attempts.
            let penalty = self.spec.route_timeout_ms as f64;
            if let Some(r) = self.miners.get_mut(&reporter) {
                r.failures = r.failures.saturating_add(1);
                r.latency_ms = if r.latency_ms > 0.0 { 0.7 * r.latency_ms + 0.3 * penalty } else { penalty };
            }
        }
    }

    /// Whom a timed-out attempt is pinned on: the first miner (from the
    /// head) a neighbour waited on that was not itself waiting on anyone.
    /// A miner that stalls its pathway is waited on and waits on nobody;
    /// the honest miners between it and the ends wait on their neighbour
    /// and are cleared by their own reports.
    pub(super) fn blame_for_timeout(pathway: &[PeerId], waiting: &[(PeerId, PeerId)]) -> Option<PeerId> {
        pathway
            .iter()
            .copied()
            .find(|p| waiting.iter().any(|(_, named)| named == p) && !waiting.iter().any(|(rep, _)| rep == p))
    }

    /// Whom a stalled attempt is pinned on, from its `NO_INPUT` reports
    /// (`waiting`: reporter, the neighbour it waited on) and this epoch's
    /// earlier stalls. A report is one miner's word against another's:
    /// a miner that drops the frames it receives (or lies) reports its
    /// honest neighbour, which waits on nobody and would take the blame.
    /// What tells them apart is who keeps turning up. So:
    /// - the stall's miner (`blame_for_timeout`) is pinned when another
    ///   reporter also accused it this epoch, or when its accuser accused
    ///   nobody else that was not corroborated;
    /// - otherwise the accuser is pinned: it has accused another miner this
    ///   epoch that nobody else accused, so it is the one in common;
    /// - two miners waiting on each other (a frame lost between them, or one
    ///   of them dropping it) are pinned on the one that was in another such
    ///   dispute this epoch, if only one of them was; else on nobody.
    pub(super) fn pin_stall(&mut self, pathway: &[PeerId], waiting: &[(PeerId, PeerId)]) -> Option<PeerId> {
        for (reporter, named) in waiting {
            if self.accusations.len() < MAX_ACCUSED || self.accusations.contains_key(named) {
                let by = self.accusations.entry(*named).or_default();
                if by.len() < 2 * self.spec.stages as usize + 2 {
                    by.insert(*reporter);
                }
            }
        }
        let accusers = |p: &PeerId| self.accusations.get(p).map_or(0, |by| by.len());
        // Accused by `r` other than `except`, by nobody but `r`.
        let lone_accusations = |r: &PeerId, except: &[PeerId]| {
            self.accusations.iter().any(|(named, by)| !except.contains(named) && by.len() == 1 && by.contains(r))
        };
        match Self::blame_for_timeout(pathway, waiting) {
            Some(stalled) => {
                let mut reporters = waiting.iter().filter(|(_, n)| *n == stalled).map(|(r, _)| *r);
                let (Some(reporter), None) = (reporters.next(), reporters.next()) else { return Some(stalled) };
                if accusers(&stalled) >= 2 || !lone_accusations(&reporter, &[stalled]) {
                    Some(stalled)
                } else {
                    Some(reporter)
                }
            }
            None => {
                // A pair waiting on each other, and nobody else stalled.
                let [(a, b), (c, d)] = waiting else { return None };
                if (a, b) != (d, c) {
                    return None;
                }
                let elsewhere = |p: &PeerId, other: &PeerId| {
                    self.accusations.iter().any(|(named, by)| {
                        (named == p && by.iter().any(|r| r != other))
                            || (named != other && named != p && by.contains(p))
                    })
                };
                match (elsewhere(a, b), elsewhere(b, a)) {
                    (true, false) => Some(*a),
                    (false, true) => Some(*b),
                    _ => None,
                }
            }
        }
    }

    /// After how long a miner on `pathway` reports its neighbour's input as
    /// overdue (`Route.overdue_ms`): four times the slowest measured delivery
    /// time of a live miner (a whole micro-batch's, so generous for one
    /// hop), at least 300 ms, at most half the route timeout (also the value
    /// before anything was measured). Delivery times leave failed attempts'
    /// penalties out: one failure of a flaky miner used to raise everyone's
    /// overdue time to the ceiling, and every later failure took that long
    /// to be noticed.
    pub(super) fn overdue_ms(&self, pathway: &[PeerId]) -> Ms {
        self.overdue_ms_given(pathway, self.slowest_live_delivery_ms())
    }

    /// The slowest delivery time of the live miners (a scan of every
    /// miner: loops over micro-batches take it once, `overdue_ms_given`).
    pub(super) fn slowest_live_delivery_ms(&self) -> f64 {
        self.miners.values().filter(|m| m.live()).map(|m| m.delivery_ms).fold(0.0, f64::max)
    }

    /// `overdue_ms`, with the live miners' slowest delivery already known.
    pub(super) fn overdue_ms_given(&self, pathway: &[PeerId], slowest_live: f64) -> Ms {
        let ceiling = self.spec.route_timeout_ms / 2;
        // An unmeasured miner (a newcomer on probation) is taken to be as
        // slow as the slowest measured one: its first micro-batch must not
        // buy it the whole ceiling.
        let slowest =
            pathway.iter().filter_map(|p| self.miners.get(p)).map(|m| m.delivery_ms).fold(slowest_live, f64::max);
        if slowest <= 0.0 {
            return ceiling;
        }
        ((slowest * 4.0) as Ms).clamp(300.min(ceiling), ceiling)
    }

    /// Whether no live miner has delivered yet: routes then carry the
    /// ceiling overdue time.
    pub(super) fn nothing_measured(&self) -> bool {
        self.miners.values().filter(|m| m.live()).all(|m| m.delivery_ms <= 0.0)
    }

    /// How long after the first `NO_INPUT` report of an attempt the
    /// orchestrator acts on the reports it has (the others waiting on the
    /// same stall report within about the same time): half the attempt's
    /// overdue time, 100 ms to 2 s.
    pub(super) fn waiting_grace_ms_given(&self, pathway: &[PeerId], slowest_live: f64) -> Ms {
        (self.overdue_ms_given(pathway, slowest_live) / 2).clamp(100, 2_000)
    }

    /// Pins one failure on `peer`; benches it after enough in a row.
    pub(super) fn blame(&mut self, now: Ms, peer: PeerId, out: &mut Vec<Out>) {
        let threshold = self.spec.bench_after_failures.max(1);
        let Some(m) = self.miners.get_mut(&peer) else { return };
        tracing::debug!(epoch = self.epoch, miner = %peer, in_a_row = m.failures_in_a_row + 1, "failure pinned");
        m.failures += 1;
        m.failures_in_a_row += 1;
        self.counters.failures_pinned += 1;
        // On probation there is no delivery to weigh a failure against.
        if (m.failures_in_a_row >= threshold || m.probation) && !m.benched {
            m.benched = true;
            self.counters.benched += 1;
            for seq in self.hedged_through(peer) {
                self.drop_hedge(seq, out);
            }
            let lost = self.in_flight_through(peer);
            self.reroute_all(now, lost, Some(peer), true, out);
        }
    }

    /// A micro-batch completed through `pathway`, `latency_ms` after issue.
    pub(super) fn delivered(&mut self, pathway: &[PeerId], latency_ms: f64) {
        for p in pathway {
            // It was reachable after all: whoever reported it UNREACHABLE
            // since its last delivery was not borne out.
            // (Reports a second miner bore out are not held against theirs.)
            let reporters = self.miners.get_mut(p).map(|m| std::mem::take(&mut m.unreachable_by)).unwrap_or_default();
            let lone = reporters.len() < CORROBORATING_REPORTERS;
            for r in reporters.into_iter().filter(|_| lone) {
                if let Some(rm) = self.miners.get_mut(&r) {
                    rm.false_reports = rm.false_reports.saturating_add(1);
                    self.counters.false_reports += 1;
                }
            }
            if let Some(m) = self.miners.get_mut(p) {
                m.failures_in_a_row = 0;
                m.probation = false;
                m.delivered += 1;
                m.latency_ms = if m.latency_ms > 0.0 { 0.7 * m.latency_ms + 0.3 * latency_ms } else { latency_ms };
                m.delivery_ms = if m.delivery_ms > 0.0 { 0.7 * m.delivery_ms + 0.3 * latency_ms } else { latency_ms };
            }
        }
    }

    /// Counts a failed attempt as one that took `ms` (see `delivered`).
    pub(super) fn penalize(&mut self, peer: PeerId, ms: f64) {
        if let Some(m) = self.miners.get_mut(&peer)
            && m.latency_ms > 0.0
        {
            m.latency_ms = 0.7 * m.latency_ms + 0.3 * ms;
        }
    }

    /// A new epoch: benched miners come back on probation (or are removed
    /// after too many benched epochs). The failure streak carries over (only
    /// a delivery ends it), so one that comes back and fails again is
    /// benched at once.
    pub(super) fn liveness_new_epoch(&mut self) {
        for m in self.miners.values_mut() {
            if m.benched {
                m.benched = false;
                m.benched_epochs += 1;
                m.probation = true;
                if m.benched_epochs >= REMOVE_AFTER_BENCHED_EPOCHS {
                    m.removed = true;
                    self.counters.removed += 1;
                }
            }
            m.failures = 0;
            m.unreachable_by.clear();
            m.false_reports = 0;
        }
        self.accusations.clear();
    }

    /// Chooses one miner per stage for a micro-batch, avoiding `avoid` where
    /// a stage has anyone else. Benched and removed miners are never chosen;
    /// a miner on probation carries one micro-batch at a time, except for a
    /// re-route (`fresh == false`) with nowhere else to go. Among the rest,
    /// one drawn in proportion to the rate its queue clears at (1 / ((in
    /// flight + 1) x measured latency)).
    pub(super) fn pathway(&self, rng: &mut Rng, avoid: &[PeerId], fresh: bool) -> Option<Vec<PeerId>> {
        let usable = |m: &MinerState| !m.benched && !m.excluded(self.epoch);
        // Every stage's usable active miners in one pass over the miners,
        // in the map's order (as `active_in` gives them): a pass per stage
        // was 5% of a 2,000-miner simulation.
        let mut active: Vec<Vec<&MinerState>> = vec![Vec::new(); self.spec.stages as usize];
        for m in self.miners.values() {
            if m.live()
                && !m.joining
                && usable(m)
                && let Some(of_stage) = active.get_mut(m.stage as usize)
            {
                of_stage.push(m);
            }
        }
        let mut active = active.into_iter();
        (0..self.spec.stages)
            .map(|s| {
                // Miners holding this epoch's weights first; if a stage has
                // none (e.g. all restarted), joining ones carry the work from
                // the epoch's starting weights rather than stall the run.
                let mut cands: Vec<&MinerState> = active.next().unwrap_or_default();
                if cands.is_empty() {
                    cands = self.healthy_in(s).filter(|m| usable(m)).collect();
                }
                if cands.is_empty() {
                    // Every replica of the stage is serving a suspension:
                    // the run goes on through them rather than stall (their
                    // work is checked again; a second conviction ejects).
                    cands = self.active_in(s).filter(|m| !m.benched && !m.convicted).collect();
                }
                if cands.is_empty() {
                    // Every replica of the stage is benched, yet some still
                    // heartbeat: try them rather than stall the epoch (a
                    // dead one stops heartbeating and drops out of
                    // `healthy_in`; a stage with nobody left drops its
                    // micro-batches instead).
                    cands = self.healthy_in(s).filter(|m| !m.convicted && !m.removed).collect();
                }
                // Room by its stated memory: never more micro-batches than
                // its own plan says it holds.
                let roomy = |m: &&MinerState| (m.in_flight as usize) < self.held_cap(m);
                let open = |m: &&MinerState| !(m.probation && m.in_flight >= 1) && roomy(m);
                let preferred: Vec<&MinerState> = cands.iter().copied().filter(|m| !avoid.contains(&m.peer)).collect();
                let open_preferred: Vec<&MinerState> = preferred.iter().copied().filter(open).collect();
                let roomy_preferred: Vec<&MinerState> = preferred.iter().copied().filter(roomy).collect();
                let pool = if !open_preferred.is_empty() {
                    open_preferred
                } else if fresh {
                    return None; // wait for room rather than overload a newcomer
                } else if !roomy_preferred.is_empty() {
                    roomy_preferred
                } else if !preferred.is_empty() {
                    // A re-route with every replica at its memory's limit
                    // goes to one anyway rather than drop the micro-batch.
                    preferred
                } else {
                    cands
                };
                // Unmeasured miners count as fast as the stage's (lower)
                // median, so a newcomer is tried (on probation) rather than
                // starved.
                let mut measured: Vec<f64> = pool.iter().map(|m| m.latency_ms).filter(|l| *l > 0.0).collect();
                measured.sort_by(f64::total_cmp);
                let typical = measured.get(measured.len().saturating_sub(1) / 2).copied().unwrap_or(1.0);
                // A latency is only measured again by a delivery, so an idle
                // miner's counts as at most twice the typical one: one slow
                // first micro-batch must not keep a replica idle (and
                // unpaid) for the rest of the run. It gets one micro-batch
                // once its peers are queued two deep; if it really is slow,
                // its cost with that one in flight is its own again. Not for
                // a miner whose work failed this epoch: its penalised
                // latency stands (retrying a flaky miner each time it falls
                // idle made a flaky head's run 12x the honest one's).
                let cost = |m: &MinerState| {
                    let latency = if m.latency_ms > 0.0 { m.latency_ms } else { typical };
                    let capped = m.in_flight == 0 && m.failures == 0;
                    let latency = if capped { latency.min(2.0 * typical) } else { latency };
                    (m.in_flight as f64 + 1.0) * latency
                };
                // Drawn in proportion to that rate among the replicas within
                // DRAW_SPREAD of the cheapest, not the cheapest outright: the
                // cheapest-first rule paid a twice-as-fast head 3.4 times its
                // peer (latencies are end to end, queue waits included, so a
                // slower replica looks slower still), where the draw pays
                // 1.8-2.4 times; and stage by stage the draws mix replicas
                // across stages rather than pair the cheapest head with the
                // cheapest tail in lockstep, which CLASP needs to tell one
                // stage's miner from another's. Replicas far costlier than
                // the cheapest (failing ones) are not drawn.
                let least = pool.iter().map(|m| cost(m)).min_by(f64::total_cmp)?;
                let drawn: Vec<(&MinerState, f64)> = pool
                    .iter()
                    .map(|m| (*m, cost(m)))
                    .filter(|(_, c)| *c <= least * DRAW_SPREAD)
                    .map(|(m, c)| (m, 1.0 / c.max(1e-9)))
                    .collect();
                let mut ticket = rng.next_f64() * drawn.iter().map(|(_, r)| r).sum::<f64>();
                for (m, r) in &drawn {
                    if ticket < *r {
                        return Some(m.peer);
                    }
                    ticket -= r;
                }
                drawn.last().map(|(m, _)| m.peer)
            })
            .collect()
    }
}

impl Orchestrator {
    /// A miner's heartbeat with its commitment heads. True when it changes
    /// nothing the run must act on now: in training, a heartbeat that
    /// brings nobody back changes only the time, which ticks attend to, so
    /// the scan of every micro-batch in flight is skipped (each miner sends
    /// two a second; at thousands of miners that scan was most of the
    /// orchestrator's work, `iota-bench sim`).
    pub(super) fn heartbeat_changes_nothing(
        &mut self,
        now: Ms,
        peer: PeerId,
        (tokens_per_s, in_flight): (f64, u32),
        commitments: Vec<iota_core::commitment::EpochHeads>,
    ) -> Result<bool, Refusal> {
        self.on_commitments(peer, commitments)?;
        let revived = self.on_heartbeat(now, peer, tokens_per_s, in_flight)?;
        Ok(!revived && self.phase == Phase::Training)
    }

    /// A miner's heartbeat: it is heard from now, at this throughput.
    /// True when it brought the miner back from a silence.
    pub(super) fn on_heartbeat(
        &mut self,
        now: Ms,
        peer: PeerId,
        tokens_per_s: f64,
        in_flight: u32,
    ) -> Result<bool, Refusal> {
        let phase_waiting = self.phase == Phase::Waiting;
        let m = self.miners.get_mut(&peer).ok_or(Refusal::Unknown(peer))?;
        m.last_seen_ms = now;
        m.tokens_per_s = tokens_per_s;
        m.reported_in_flight = in_flight;
        if !m.healthy {
            // Back from a silence: it lost its in-flight work; it
            // rejoins by download at the next epoch.
            m.healthy = true;
            m.joining = !phase_waiting;
            self.fitness_changes += 1;
            return Ok(true);
        }
        Ok(false)
    }
}
