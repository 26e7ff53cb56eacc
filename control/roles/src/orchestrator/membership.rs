//! Who takes part in the run: registration (a claim until the miner
//! subscribes; capped per stage; expired if it never does), subscription
//! (the assignment, and telling the others), and health as time passes.

use iota_core::PeerId;
use iota_wire::pb;

use super::{MemoryStated, MinerState, Ms, Orchestrator, Out, Phase, Refusal};

impl Orchestrator {
    pub(super) fn known(&self, p: &PeerId) -> Result<(), Refusal> {
        if self.miners.contains_key(p) { Ok(()) } else { Err(Refusal::Unknown(*p)) }
    }

    pub(super) fn healthy_in(&self, stage: u32) -> impl Iterator<Item = &MinerState> {
        self.miners.values().filter(move |m| m.stage == stage && m.live())
    }

    /// Miners that may carry micro-batches (healthy, holding this epoch's weights).
    pub(super) fn active_in(&self, stage: u32) -> impl Iterator<Item = &MinerState> {
        self.healthy_in(stage).filter(|m| !m.joining)
    }

    /// Whether a miner (re)starting now must wait for the next epoch's
    /// merged weights. In the first epoch it need not: everyone started
    /// from the weights the run seed gives, which it can make itself.
    pub(super) fn joins_late(&self) -> bool {
        self.phase != Phase::Waiting && !(self.epoch == 0 && self.phase == Phase::Training)
    }

    /// The run's memory needs, from its configuration: registrations and
    /// routing follow each miner's stated memory from then on.
    pub fn set_memory_needs(&mut self, needs: iota_core::memory_fit::RunMemoryNeeds) {
        self.memory_needs = Some(std::sync::Arc::new(needs));
    }

    /// Micro-batches `m` may hold at once by the memory it stated (0: its
    /// stage does not fit; `usize::MAX` when it stated none).
    pub(super) fn held_cap(&self, m: &MinerState) -> usize {
        match &self.memory_needs {
            Some(n) if m.memory.bytes > 0 => n.max_held(m.memory.compute, m.stage as usize, m.memory.bytes),
            _ => usize::MAX,
        }
    }

    /// Whether `stage` fits the stated `memory` (always, when nothing is
    /// stated or the run has no needs set); the refusal says why not.
    pub(super) fn fits(&self, stage: u32, memory: &MemoryStated) -> Result<(), Refusal> {
        match &self.memory_needs {
            Some(n) if memory.bytes > 0 => {
                n.check(memory.compute, stage as usize, memory.bytes).map(|_| ()).map_err(|e| {
                    let (b, t) = n.shape();
                    Refusal::DoesNotFit(format!("{e} (micro-batches of {b} x {t} tokens, {})", memory.compute.name()))
                })
            }
            _ => Ok(()),
        }
    }

    /// Registers `peer`; true when it is a new claim (not yet subscribed).
    pub(super) fn register(
        &mut self,
        now: Ms,
        peer: PeerId,
        (addr, tokens_per_s, device, memory): (String, f64, String, MemoryStated),
        out: &mut Vec<Out>,
    ) -> Result<bool, Refusal> {
        self.may_register(&peer)?;
        if let Some(stage) = self.miners.get(&peer).map(|m| m.stage) {
            // It keeps its stage: which must still fit what it states now.
            self.fits(stage, &memory)?;
            self.registered_again(now, peer, (addr, tokens_per_s, device, memory), out);
            return Ok(false);
        }
        let stage = self.admit_or_queue(now, peer, memory)?;
        let index = self.next_index;
        self.next_index += 1;
        let joining = self.joins_late();
        let m = MinerState::newcomer(peer, index, (addr, stage), now, joining, (tokens_per_s, device, memory));
        self.miners.insert(peer, m);
        Ok(true)
    }

    /// Refuses a validator's identity, and miners its validators ejected or
    /// the run removed.
    fn may_register(&self, peer: &PeerId) -> Result<(), Refusal> {
        if self.is_validator(peer) {
            return Err(Refusal::Invalid(format!("peer {peer} is registered as a validator")));
        }
        if self.miners.get(peer).is_some_and(|m| m.ejected) {
            return Err(Refusal::Invalid(format!("peer {peer} was ejected from the run by its validators")));
        }
        if self.miners.get(peer).is_some_and(|m| m.removed) {
            return Err(Refusal::Invalid(format!(
                "peer {peer} was removed from the run (benched in {} epochs)",
                super::liveness::REMOVE_AFTER_BENCHED_EPOCHS
            )));
        }
        Ok(())
    }

    /// A restart of a known miner: same stage; its in-flight work is lost
    /// (re-routed) and it reloads weights; a new address is announced.
    fn registered_again(
        &mut self,
        now: Ms,
        peer: PeerId,
        (addr, tokens_per_s, device, memory): (String, f64, String, MemoryStated),
        out: &mut Vec<Out>,
    ) {
        let lost: Vec<u64> = self.in_flight_through(peer);
        let late = self.joins_late();
        let Some(m) = self.miners.get_mut(&peer) else { return };
        let moved = m.addr != addr;
        m.memory = memory;
        m.addr = addr;
        m.device = device;
        m.tokens_per_s = tokens_per_s;
        m.last_seen_ms = now;
        m.healthy = true;
        m.joining = late;
        let announce = moved && m.subscribed;
        self.fitness_changes += 1;
        self.reroute_all(now, lost, Some(peer), true, out);
        if announce {
            self.announce(peer, out);
        }
    }

    /// How long a silent miner keeps its place in its stage (a restart
    /// keeps it; a miner gone longer leaves it to the queue, and takes its
    /// stage again if it comes back).
    pub(super) fn place_hold_ms(&self) -> Ms {
        self.spec.heartbeat_timeout_ms.saturating_mul(4)
    }

    /// Places taken in each stage (`MinerState::holds_place`).
    fn places_taken(&self, now: Ms) -> Vec<usize> {
        let mut taken = vec![0usize; self.spec.stages as usize];
        let hold = self.place_hold_ms();
        for m in self.miners.values().filter(|m| m.holds_place(now, hold)) {
            taken[m.stage as usize] += 1;
        }
        taken
    }

    /// The stages with room, and how many places each has free.
    pub(super) fn free_places(&self, now: Ms) -> Vec<(u32, usize)> {
        let per_stage = self.spec.max_miners_per_stage() as usize;
        let taken = self.places_taken(now);
        (0..self.spec.stages)
            .filter_map(|s| per_stage.checked_sub(taken[s as usize]).filter(|&n| n > 0).map(|n| (s, n)))
            .collect()
    }

    /// The stage a newcomer stating `memory` joins: among the stages with
    /// room and that its memory holds, the fewest counted miners (live, or
    /// a claim not yet subscribed, so a burst of registrations spreads),
    /// then the least throughput.
    pub(super) fn stage_for_newcomer(&self, now: Ms, memory: &MemoryStated) -> Result<u32, Refusal> {
        let stages = self.spec.stages as usize;
        let (mut counted, mut tps) = (vec![0usize; stages], vec![0f64; stages]);
        for m in self.miners.values() {
            let s = m.stage as usize;
            if m.live() || !m.subscribed {
                counted[s] += 1;
            }
            if m.live() {
                tps[s] += m.tokens_per_s;
            }
        }
        let open: Vec<usize> = self.free_places(now).into_iter().map(|(s, _)| s as usize).collect();
        if open.is_empty() {
            return Err(Refusal::Full(self.miners.len()));
        }
        let fitting: Vec<usize> = open.iter().copied().filter(|&s| self.fits(s as u32, memory).is_ok()).collect();
        let Some(stage) = fitting
            .into_iter()
            .min_by(|&a, &b| counted[a].cmp(&counted[b]).then(tps[a].total_cmp(&tps[b])).then(a.cmp(&b)))
        else {
            // None fits: say so for the smallest of the open stages.
            let least = open
                .iter()
                .copied()
                .min_by_key(|&s| self.memory_needs.as_ref().map_or(0, |n| n.least(memory.compute, s)));
            return Err(self.fits(least.unwrap_or(0) as u32, memory).err().unwrap_or(Refusal::Full(self.miners.len())));
        };
        Ok(stage as u32)
    }

    /// A miner opened its command stream: it gets its assignment (the whole
    /// peer list, as it may have missed changes), and the first time, the
    /// others learn of it and it hears the phase.
    pub(super) fn subscribed(&mut self, now: Ms, peer: PeerId, out: &mut Vec<Out>) -> Result<(), Refusal> {
        let m = self.miners.get_mut(&peer).ok_or(Refusal::Unknown(peer))?;
        let first = !m.subscribed;
        m.subscribed = true;
        m.last_seen_ms = now;
        let m = m.clone();
        out.push(Out { to: peer, cmd: self.assignment(&m) });
        if first {
            self.announce(peer, out);
            if self.phase != Phase::Waiting {
                // A newcomer mid-run waits for the next epoch.
                out.push(Out { to: peer, cmd: self.phase_cmd_for(&m) });
            }
        }
        Ok(())
    }

    /// Tells every other subscribed miner where `peer` is.
    pub(super) fn announce(&self, peer: PeerId, out: &mut Vec<Out>) {
        let m = &self.miners[&peer];
        let info = pb::PeerInfo { peer_id: m.peer.0.to_vec(), data_addr: m.addr.clone(), stage: m.stage };
        for other in self.miners.values().filter(|o| o.subscribed && o.peer != peer) {
            out.push(Out { to: other.peer, cmd: pb::command::Kind::Peers(pb::Peers { peers: vec![info.clone()] }) });
        }
    }

    /// `m`'s stage and every subscribed miner it may exchange frames with.
    pub(super) fn assignment(&self, m: &MinerState) -> pb::command::Kind {
        let peers = self
            .miners
            .values()
            .filter(|o| o.subscribed)
            .map(|o| pb::PeerInfo { peer_id: o.peer.0.to_vec(), data_addr: o.addr.clone(), stage: o.stage })
            .collect();
        pb::command::Kind::Assign(pb::Assignment {
            stage: m.stage,
            num_stages: self.spec.stages,
            weights_key: self.weights_key(m.stage),
            peers,
            weights: self.weights_manifest(m.stage),
        })
    }

    /// Registrations that never subscribed within the timeout are forgotten
    /// (they were never counted, routed or announced).
    pub(super) fn expire_registrations(&mut self, now: Ms) {
        let timeout = self.spec.registration_timeout_ms;
        self.miners.retain(|_, m| m.subscribed || now.saturating_sub(m.registered_ms) <= timeout);
    }

    /// Called once when a run is restored from saved state at `now`: the
    /// time the orchestrator was down is nobody's silence. Every miner's
    /// and validator's heartbeat clock, the current phase's timer and the
    /// validation timers (the round, the merge check, open merge audits)
    /// start again from now (reports made during the downtime are still
    /// being retried): else the first tick after a long downtime finds no
    /// validator live and every wait over, and the merge goes on unchecked.
    pub fn resumed(&mut self, now: Ms) {
        for m in self.miners.values_mut() {
            m.last_seen_ms = now;
        }
        self.waitlist.resumed(now);
        for v in self.validation.validators.values_mut() {
            v.last_seen_ms = now;
        }
        if let Some(r) = self.validation.round.as_mut() {
            r.started_ms = now;
        }
        if let Some(r) = self.validation.merge_round.as_mut() {
            r.started_ms = now;
        }
        for a in &mut self.validation.merge_audits {
            if a.since.is_some() {
                a.since = Some(now);
            }
        }
        self.phase_since = now;
    }

    /// Health, as time passes: silent miners are unhealthy; their work is
    /// re-routed.
    pub(super) fn check_health(&mut self, now: Ms, out: &mut Vec<Out>) {
        let silent: Vec<PeerId> = self
            .miners
            .values()
            .filter(|m| m.live() && now.saturating_sub(m.last_seen_ms) > self.spec.heartbeat_timeout_ms)
            .map(|m| m.peer)
            .collect();
        for p in silent {
            self.miners.get_mut(&p).unwrap().healthy = false;
            self.fitness_changes += 1;
            let lost = self.in_flight_through(p);
            self.reroute_all(now, lost, Some(p), true, out);
        }
    }
}
