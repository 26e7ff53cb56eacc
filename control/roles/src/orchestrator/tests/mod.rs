//! The state machine driven by simulated miners.

use std::collections::{BTreeSet, VecDeque};

use iota_core::merge::MergePlan;
use iota_core::{Identity, PeerId, Rng};

use super::*;
use iota_wire::store_keys::{merged_key, momentum_parts_prefix, part_name, weights_parts_prefix};
use iota_wire::{StoredObject, plan_from_pb};

fn spec(stages: u32, replicas: u32, epochs: u64, per_epoch: u64, in_flight: u32) -> RunSpec {
    RunSpec {
        run_id: 1,
        stages,
        replicas,
        epochs,
        micro_batches_per_epoch: per_epoch,
        batch: 4,
        n_shards: 3,
        max_in_flight: in_flight,
        route_timeout_ms: 1_000,
        heartbeat_timeout_ms: 3_000,
        phase_timeout_ms: 10_000,
        merge: Default::default(),
        ..RunSpec::default()
    }
}

fn peer(i: u8) -> PeerId {
    Identity::from_seed([i; 32]).peer_id()
}

/// Miner `i` registering from `addr`, stating no memory.
fn register(i: u8, addr: String) -> Event {
    Event::Register { peer: peer(i), addr, tokens_per_s: 1.0, device: "cpu".into(), memory: Default::default() }
}

/// Miners that do what they are told at once, except the `dead` ones.
struct Sim {
    o: Orchestrator,
    now: Ms,
    rng: Rng,
    dead: BTreeSet<PeerId>,
    inbox: VecDeque<Out>,
    routes_seen: u64,
    cancels_seen: u64,
    /// Butterfly: owners that publish a wrong hash, and the verdicts each
    /// miner has heard this epoch.
    liars: BTreeSet<PeerId>,
    /// Butterfly: what each replica says it read from the store in every
    /// merge (contributions, updates).
    from_store: std::collections::BTreeMap<PeerId, (u32, u32)>,
    /// Butterfly: participants whose contribution to each partition's
    /// second owner differs from the one its first owner got (owners then
    /// report the signed headers of what they reduced).
    equivocators: BTreeSet<PeerId>,
    verdicts: std::collections::BTreeMap<PeerId, BTreeSet<u32>>,
    /// Every slice verdict's hash the miners heard.
    verdict_hashes: Vec<Vec<u8>>,
    die_on_plan: Option<PeerId>,
    /// Miners that heartbeat but sit on their merge commands until released.
    stalled: BTreeSet<PeerId>,
    held: Vec<Out>,
    /// Parameter server: the uploads each stage's aggregator was handed.
    aggregated: std::collections::BTreeMap<u32, Vec<pb::StoredObject>>,
    /// `Stored` commands each miner received.
    stored_heard: Vec<(PeerId, pb::Stored)>,
    phases_heard: Vec<(PeerId, pb::PhaseChange)>,
    /// Miners do not upload (a test announces uploads itself).
    skip_uploads: bool,
    /// Registered and heartbeating, never working (the `silent` adversary).
    silent: BTreeSet<PeerId>,
    /// `stalled` miners sit on merge commands of this epoch and later.
    stall_from: u64,
    /// ... on their verdicts only (they do act on the plan).
    stall_verdicts_only: bool,
    /// Neighbours of a silent miner report it UNREACHABLE (else NO_INPUT).
    report_unreachable: bool,
    /// A hostile miner: on every pathway it is on, it reports its
    /// downstream neighbour (its upstream one at the tail) UNREACHABLE
    /// and does no work.
    hostile_reporter: Option<PeerId>,
    /// The commitment heads each miner's heartbeats carry.
    heads: std::collections::BTreeMap<PeerId, Vec<iota_core::commitment::EpochHeads>>,
    /// Validation commands (EpochWork to validators, EvidenceRequest to
    /// miners), as delivered.
    validation_heard: Vec<Out>,
    /// Validators that have stopped heartbeating.
    quiet_validators: BTreeSet<PeerId>,
    /// Owners that publish a wrong result ([0xcc; 32]) where every owner
    /// of the partition is one of them: they agree.
    colluders: BTreeSet<PeerId>,
    /// With colluders: instead of a wrong result, they flag this sender
    /// in every partition they own together (framing it).
    frame: Option<PeerId>,
    /// Merge audits the validators were sent.
    audits_heard: usize,
    /// Each audit context's epoch and where it says the audited epoch and
    /// the one before started from the seed (`seed_start`, `seed_start_before`).
    context_seeds: BTreeSet<(u64, bool, bool)>,
    /// How the (non-quiet) validators judge merged models: each (epoch,
    /// validator) here votes to roll that epoch's merge back; the others
    /// keep it.
    rollback_votes: BTreeSet<(u64, PeerId)>,
    /// Butterfly participants that report [0xff; 32] as their merged
    /// weights' hash (the honest one is [7; 32]).
    merge_liars: BTreeSet<PeerId>,
    /// Butterfly: owners that report every partition they own but their
    /// last one, never.
    sit_on: BTreeSet<PeerId>,
    /// Validators that answer every merge audit with a made-up result.
    audit_liars: BTreeSet<PeerId>,
    /// What a validator says it loaded with its merge votes (None: no
    /// hashes); those not here say the honest [7; 32].
    vote_hashes: std::collections::BTreeMap<PeerId, Option<[u8; 32]>>,
    /// Routes (seq, attempt) miners sit on: recorded in `held_routes`, not
    /// worked (a test completes or fails them itself).
    hold: BTreeSet<(u64, u32)>,
    held_routes: Vec<(PeerId, pb::Route)>,
    /// Butterfly: participants whose contribution to one partition (one
    /// they are a third party to, else the first) never reaches its other
    /// owners, who report it missing instead of reducing; they never store
    /// it, and the validators' audit names them missing.
    withholders: BTreeSet<PeerId>,
    /// Butterfly: owners that claim every other participant's contribution
    /// to their first partition missing though it came (and is stored).
    false_claimants: BTreeSet<PeerId>,
    /// Validators answer an audit that finds a contribution missing only at
    /// the next tick (as real ones, which wait seconds for it), not at once.
    slow_audits: bool,
    late_audits: Vec<Out>,
    /// The plans of the audit contexts each validator was sent, by
    /// (validator, id), and how many contexts went out (repeats included).
    audit_plans: std::collections::BTreeMap<(PeerId, Vec<u8>), MergePlan>,
    contexts_heard: usize,
}

/// The partition a withholder keeps its contribution from (see
/// `Sim::withholders`, and `MergeFault::Withhold`, which does the same).
fn withheld_partition(plan: &MergePlan, w: &PeerId) -> usize {
    (0..plan.partitions.len()).find(|k| !plan.partitions[*k].owners.contains(w)).unwrap_or(0)
}

impl Sim {
    fn new(spec: RunSpec) -> Sim {
        Sim {
            o: Orchestrator::new(spec).unwrap(),
            now: 0,
            rng: Rng::new(5),
            dead: BTreeSet::new(),
            inbox: VecDeque::new(),
            routes_seen: 0,
            cancels_seen: 0,
            liars: BTreeSet::new(),
            from_store: Default::default(),
            equivocators: BTreeSet::new(),
            verdicts: Default::default(),
            verdict_hashes: Vec::new(),
            die_on_plan: None,
            stalled: BTreeSet::new(),
            held: Vec::new(),
            aggregated: Default::default(),
            stored_heard: Vec::new(),
            phases_heard: Vec::new(),
            skip_uploads: false,
            silent: BTreeSet::new(),
            stall_from: 0,
            stall_verdicts_only: false,
            report_unreachable: false,
            hostile_reporter: None,
            heads: Default::default(),
            validation_heard: Vec::new(),
            quiet_validators: BTreeSet::new(),
            colluders: BTreeSet::new(),
            frame: None,
            audits_heard: 0,
            context_seeds: BTreeSet::new(),
            rollback_votes: BTreeSet::new(),
            merge_liars: BTreeSet::new(),
            vote_hashes: Default::default(),
            audit_liars: BTreeSet::new(),
            sit_on: BTreeSet::new(),
            hold: BTreeSet::new(),
            held_routes: Vec::new(),
            withholders: BTreeSet::new(),
            false_claimants: BTreeSet::new(),
            slow_audits: false,
            late_audits: Vec::new(),
            audit_plans: Default::default(),
            contexts_heard: 0,
        }
    }

    /// Applies an event; a registering miner subscribes at once, as an
    /// honest one does.
    fn ev(&mut self, e: Event) {
        let registered = if let Event::Register { peer, .. } = &e { Some(*peer) } else { None };
        let out = self.o.step(self.now, e, &mut self.rng).unwrap();
        self.inbox.extend(out);
        if let Some(peer) = registered {
            let out = self.o.step(self.now, Event::Subscribed { peer }, &mut self.rng).unwrap();
            self.inbox.extend(out);
        }
    }

    /// Lets time pass: alive miners heartbeat, then a tick.
    fn tick(&mut self, ms: Ms) {
        self.now += ms;
        // Audits held back answer now.
        let late = std::mem::take(&mut self.late_audits);
        if !late.is_empty() {
            let slow = std::mem::replace(&mut self.slow_audits, false);
            self.inbox.extend(late);
            self.drain();
            self.slow_audits = slow;
        }
        let alive: Vec<PeerId> = self.o.miners().map(|m| m.peer).filter(|p| !self.dead.contains(p)).collect();
        for p in alive {
            let commitments = self.heads.get(&p).cloned().unwrap_or_default();
            self.ev(Event::Heartbeat { peer: p, tokens_per_s: 1.0, in_flight: 0, commitments });
        }
        let validators: Vec<PeerId> =
            self.o.validators().map(|v| v.peer).filter(|p| !self.quiet_validators.contains(p)).collect();
        for p in validators {
            self.ev(Event::Heartbeat { peer: p, tokens_per_s: 0.0, in_flight: 0, commitments: Vec::new() });
        }
        self.ev(Event::Tick);
    }

    /// Alive miners act on their commands until nothing is left.
    fn drain(&mut self) {
        self.drain_at_most(usize::MAX);
    }

    /// Acts on at most `n` commands (a crash can come between any two).
    fn drain_at_most(&mut self, n: usize) {
        for _ in 0..n {
            let Some(Out { to, cmd }) = self.inbox.pop_front() else { return };
            if self.dead.contains(&to) {
                continue;
            }
            let merge_work = matches!(&cmd, pb::command::Kind::Verdict(v) if v.epoch >= self.stall_from)
                || matches!(&cmd, pb::command::Kind::Phase(p) if p.merge_plan.is_some() && p.epoch >= self.stall_from && !self.stall_verdicts_only);
            if merge_work && self.stalled.contains(&to) {
                self.held.push(Out { to, cmd });
                continue;
            }
            match cmd {
                pb::command::Kind::Route(r) => {
                    self.routes_seen += 1;
                    if self.hold.contains(&(r.seq, r.attempt)) {
                        // Recorded once, as its head heard it.
                        if r.pathway.first() == Some(&to.0.to_vec()) {
                            self.held_routes.push((to, r));
                        }
                        continue;
                    }
                    let path: Vec<PeerId> =
                        r.pathway.iter().map(|b| PeerId(b.as_slice().try_into().unwrap())).collect();
                    let mb = MbRef { epoch: r.epoch, shard: r.shard, first_sample: r.first_sample };
                    if path[0] == to
                        && let Some((i, h)) = path.iter().enumerate().find(|(_, p)| Some(**p) == self.hostile_reporter)
                    {
                        let named = path.get(i + 1).or(i.checked_sub(1).and_then(|j| path.get(j)));
                        if let Some(n) = named.copied() {
                            let failure = pb::Failure::Unreachable;
                            self.ev(Event::PeerFailed { peer: *h, mb, attempt: r.attempt, named: n, failure });
                        }
                        continue;
                    }
                    // A silent miner stalls the pathway: its honest
                    // neighbours report it overdue (or unreachable).
                    if path[0] == to && path.iter().any(|p| self.silent.contains(p)) {
                        for (i, p) in path.iter().enumerate() {
                            if self.silent.contains(p) || self.dead.contains(p) {
                                continue;
                            }
                            for j in [i.wrapping_sub(1), i + 1] {
                                let Some(n) = path.get(j).filter(|n| self.silent.contains(n)) else { continue };
                                let failure = if self.report_unreachable {
                                    pb::Failure::Unreachable
                                } else {
                                    pb::Failure::NoInput
                                };
                                let ev = Event::PeerFailed { peer: *p, mb, attempt: r.attempt, named: *n, failure };
                                self.ev(ev);
                            }
                        }
                        continue;
                    }
                    // Only the head drives a micro-batch, and only if the whole pathway is alive.
                    if path[0] != to || path.iter().any(|p| self.dead.contains(p)) {
                        continue;
                    }
                    // Head reports first sometimes: the order must not matter.
                    let tail =
                        Event::Loss { peer: *path.last().unwrap(), mb, attempt: r.attempt, loss: 2.0, tokens: 8 };
                    let head = Event::BackwardDone { peer: path[0], mb, attempt: r.attempt };
                    if r.seq % 2 == 0 {
                        self.ev(tail);
                        self.ev(head);
                    } else {
                        self.ev(head);
                        self.ev(tail);
                    }
                }
                pb::command::Kind::Cancel(_) => self.cancels_seen += 1,
                pb::command::Kind::Phase(_) if self.silent.contains(&to) => {}
                pb::command::Kind::Phase(p) => {
                    self.phases_heard.push((to, p.clone()));
                    let m = self.o.miner(&to).unwrap().clone();
                    if p.phase == pb::Phase::Training as i32 {
                        self.verdicts.remove(&to);
                    }
                    if p.phase == pb::Phase::Uploading as i32 && !self.skip_uploads {
                        let key = format!("{}stage-{:03}/{}.safetensors", p.upload_prefix, m.stage, to.to_hex());
                        // A parameter-server replica announces its upload; it
                        // claims far more work than it did (the merge must not care).
                        let object = (self.o.spec().merge.method == MergeMethod::ParameterServer)
                            .then(|| StoredObject::of(&key, to.0.as_slice(), to));
                        let work = m.work * 1000 + 1;
                        // Its final heads for the epoch, as a miner's UploadDone carries them.
                        let commitments = self.heads.get(&to).cloned().unwrap_or_default();
                        self.ev(Event::UploadDone {
                            peer: to,
                            epoch: p.epoch,
                            stage: m.stage,
                            key,
                            work,
                            object,
                            commitments,
                        });
                    } else if let Some(plan) = p.merge_plan.as_ref() {
                        let plan = plan_from_pb(plan).unwrap();
                        if self.die_on_plan == Some(to) {
                            self.dead.insert(to);
                            continue;
                        }
                        for k in plan.owned_by(&to) {
                            // A participant sitting on one partition it owns
                            // (while it reports its others).
                            if self.sit_on.contains(&to) && plan.owned_by(&to).max() == Some(k) {
                                continue;
                            }
                            let missing: Vec<PeerId> =
                                if self.false_claimants.contains(&to) && plan.owned_by(&to).min() == Some(k) {
                                    plan.participants.iter().map(|q| q.peer).filter(|q| *q != to).collect()
                                } else {
                                    plan.participants
                                        .iter()
                                        .map(|q| q.peer)
                                        .filter(|w| *w != to && self.withholders.contains(w))
                                        .filter(|w| withheld_partition(&plan, w) == k)
                                        .collect()
                                };
                            if !missing.is_empty() {
                                self.ev(Event::ContributionsMissing {
                                    peer: to,
                                    epoch: plan.epoch,
                                    stage: m.stage,
                                    partition: k as u32,
                                    generation: plan.partitions[k].generation,
                                    senders: missing,
                                });
                                continue;
                            }
                            let honest = [k as u8 + 1; 32];
                            let lied_to = plan.partitions[k].owners.first() != Some(&to);
                            let others: Vec<PeerId> =
                                plan.participants.iter().map(|q| q.peer).filter(|q| *q != to).collect();
                            let fooled = lied_to && others.iter().any(|q| self.equivocators.contains(q));
                            let colluding = plan.partitions[k].owners.iter().all(|o| self.colluders.contains(o));
                            let hash = if self.liars.contains(&to) {
                                [0xee; 32]
                            } else if colluding && self.frame.is_none() {
                                [0xcc; 32]
                            } else if fooled {
                                [0xdd; 32]
                            } else {
                                honest
                            };
                            // Headers only where a test watches for equivocation
                            // (signing costs a key derivation per header).
                            let contributions = if self.equivocators.is_empty() {
                                Vec::new()
                            } else {
                                let run_id = self.o.spec().run_id;
                                others
                                    .iter()
                                    .map(|q| {
                                        let lie = lied_to && self.equivocators.contains(q);
                                        contribution_header(*q, run_id, &plan, k, if lie { [0xbb; 32] } else { honest })
                                    })
                                    .collect()
                            };
                            self.ev(Event::SliceDone {
                                peer: to,
                                // The plan's: a merge behind compute comes
                                // with the next epoch's Training phase.
                                epoch: plan.epoch,
                                stage: m.stage,
                                partition: k as u32,
                                generation: plan.partitions[k].generation,
                                hash: hash.to_vec(),
                                contributions,
                                flagged: if colluding { self.frame.iter().copied().collect() } else { Vec::new() },
                            });
                        }
                    } else if p.phase == pb::Phase::Merging as i32 && p.aggregator == to.0.to_vec() {
                        self.aggregated.insert(m.stage, p.uploads.clone());
                        let key = merged_key(p.epoch, m.stage);
                        self.ev(Event::MergeDone {
                            peer: to,
                            epoch: p.epoch,
                            stage: m.stage,
                            object: Some(StoredObject::of(&key, b"merged", to)),
                            key,
                            weights_hash: Vec::new(),
                            from_store: (0, 0),
                        });
                    }
                }
                pb::command::Kind::Verdict(v) => {
                    // The partition's writer stores and announces its slice
                    // and momentum before it reports the merge done.
                    // (A verdict queued before its writer was planned out
                    // is stale: the writer moved.)
                    let participant = self.o.merge_plan(v.stage).is_some_and(|p| p.is_participant(&to));
                    if v.writer == to.0.to_vec() && participant {
                        let part = self.o.merge_plan(v.stage).unwrap().partitions[v.partition as usize].clone();
                        let name = part_name(part.offset, part.len);
                        let bytes = vec![v.partition as u8; part.len as usize * 4];
                        for prefix in [weights_parts_prefix(v.epoch, v.stage), momentum_parts_prefix(v.epoch, v.stage)]
                        {
                            let object = StoredObject::part(&format!("{prefix}{name}"), &bytes, part.offset, to);
                            self.ev(Event::Stored { peer: to, epoch: v.epoch, stage: v.stage, object });
                        }
                    }
                    self.verdict_hashes.push(v.hash.clone());
                    let heard = self.verdicts.entry(to).or_default();
                    heard.insert(v.partition);
                    let n = self.o.merge_plan(v.stage).map_or(0, |p| p.partitions.len());
                    if heard.len() == n {
                        self.ev(Event::MergeDone {
                            peer: to,
                            epoch: v.epoch,
                            stage: v.stage,
                            key: String::new(),
                            weights_hash: vec![if self.merge_liars.contains(&to) { 0xff } else { 7 }; 32],
                            object: None,
                            from_store: self.from_store.get(&to).copied().unwrap_or_default(),
                        });
                    }
                }
                pb::command::Kind::Stored(st) => self.stored_heard.push((to, st)),
                cmd @ (pb::command::Kind::EpochWork(_) | pb::command::Kind::EvidenceRequest(_)) => {
                    self.validation_heard.push(Out { to, cmd })
                }
                pb::command::Kind::ContributionRequest(_) => {}
                pb::command::Kind::MergeAuditContext(c) => {
                    self.contexts_heard += 1;
                    let epoch = c.plan.as_ref().map_or(0, |p| p.epoch);
                    self.context_seeds.insert((epoch, c.seed_start, c.seed_start_before));
                    self.audit_plans.insert((to, c.id), plan_from_pb(c.plan.as_ref().unwrap()).unwrap());
                }
                pb::command::Kind::MergeAudit(a) => {
                    let plan = (self.audit_plans.get(&(to, a.context.clone())))
                        .expect("the audit's context came to its validator before it")
                        .clone();
                    assert_eq!((plan.epoch, plan.stage), (a.epoch, a.stage), "the context is the audit's merge's");
                    // A validator recomputes the honest result ([k + 1; 32]
                    // here, as the simulated owners publish it).
                    if !self.quiet_validators.contains(&to) {
                        let k = a.partition;
                        let missing: Vec<PeerId> = plan
                            .participants
                            .iter()
                            .map(|q| q.peer)
                            .filter(|w| self.withholders.contains(w) && withheld_partition(&plan, w) == k as usize)
                            .collect();
                        if self.slow_audits && !missing.is_empty() {
                            // A real validator waits seconds for a
                            // contribution that is never stored.
                            self.late_audits.push(Out { to, cmd: pb::command::Kind::MergeAudit(a) });
                            continue;
                        }
                        let honest = if self.audit_liars.contains(&to) { [0xdd; 32] } else { [k as u8 + 1; 32] };
                        self.ev(Event::MergeAudit {
                            validator: to,
                            epoch: plan.epoch,
                            stage: plan.stage,
                            partition: k,
                            generation: plan.partitions[k as usize].generation,
                            hash: missing.is_empty().then_some(honest),
                            missing,
                            flagged: Vec::new(),
                            contradicting: Vec::new(),
                            unbound: Vec::new(),
                            reason: String::new(),
                        });
                    }
                    self.audits_heard += 1;
                }
                pb::command::Kind::MergeCheck(mc) => {
                    if !self.quiet_validators.contains(&to) {
                        let rollback = self.rollback_votes.contains(&(mc.epoch, to));
                        let loss = if rollback { 99.0 } else { 2.0 };
                        let reason = String::new();
                        // What the stored merge hashes to: the honest [7; 32].
                        let merged = match self.vote_hashes.get(&to).copied().unwrap_or(Some([7; 32])) {
                            Some(h) => mc.stages.iter().map(|st| (st.stage, h)).collect(),
                            None => Vec::new(),
                        };
                        self.ev(Event::MergeVote { validator: to, epoch: mc.epoch, rollback, loss, reason, merged });
                    }
                    self.validation_heard.push(Out { to, cmd: pb::command::Kind::MergeCheck(mc) });
                }
                pb::command::Kind::Assign(_) | pb::command::Kind::Peers(_) => {}
            }
        }
    }

    /// Runs until the merge phase with `held` miners sitting on their merge
    /// commands (which it holds back), so a test can act mid-merge.
    fn until_merging_held(&mut self, held: &[PeerId]) {
        self.stalled.extend(held.iter().copied());
        for _ in 0..100 {
            self.drain();
            if *self.o.phase() == Phase::Merging && !self.held.is_empty() {
                return;
            }
            self.tick(500);
        }
        panic!("the merge phase never came: {:?}", self.o.phase());
    }

    fn run_until_done(&mut self, max_ticks: u32) {
        for _ in 0..max_ticks {
            self.drain();
            if *self.o.phase() == Phase::Done {
                return;
            }
            self.tick(500);
        }
        panic!("run did not finish: phase {:?}, epoch {}, {:?}", self.o.phase(), self.o.epoch(), self.o.counters());
    }
}

fn contribution_header(sender: PeerId, run_id: u64, plan: &MergePlan, k: usize, payload_hash: [u8; 32]) -> Vec<u8> {
    use iota_core::wire::{Direction, FrameHeader, PROTOCOL_VERSION, header_bytes};
    let id = (0..=u8::MAX).map(|i| Identity::from_seed([i; 32])).find(|id| id.peer_id() == sender).unwrap();
    let mut h = FrameHeader {
        version: PROTOCOL_VERSION,
        direction: Direction::WeightSlice,
        codec: iota_core::WireCodec::Int8Row.id(),
        ndim: 2,
        stage: plan.stage as u16,
        run_id,
        epoch: plan.epoch as u32,
        shard: k as u32,
        first_sample: plan.partitions[k].offset,
        samples: 0,
        attempt: 0,
        seq_no: 1,
        shape: [1, 256, 0, 0],
        payload_len: 260,
        payload_hash,
        answers: [0; 32],
        sender: [0; 32],
        signature: [0; 64],
    };
    h.sign(&id);
    header_bytes(&h)
}

fn butterfly_spec(stages: u32, replicas: u32) -> RunSpec {
    let mut s = spec(stages, replicas, 2, 6, 2);
    s.merge.method = MergeMethod::Butterfly;
    s.merge.stage_params = vec![10_000; stages as usize];
    s
}

/// Registers `n` miners and returns the one in `stage` registered last.
fn register_all(sim: &mut Sim, n: u8) {
    for i in 0..n {
        sim.ev(register(i, format!("a{i}")));
    }
}

mod butterfly;
mod deadlines;
mod epochs;
mod evidence_asks;
mod frame_proofs;
mod hedging;
mod liveness;
mod membership;
mod memory;
mod merge_audits;
mod objects;
mod overlap;
mod restarts;
mod settlements;
mod standing;
mod validated_pay;
mod validation;
mod withholding;
