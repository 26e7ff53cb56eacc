//! A deterministic swarm simulator over the pure orchestrator (issue 58):
//! simulated miners (who register, queue, subscribe, heartbeat, carry
//! micro-batches through their pathways, upload and merge as the protocol
//! says), a network that delays every message, churn, partitions and an
//! orchestrator that restarts from its saved state, all on a virtual
//! clock driven by one seeded generator. No thread, socket or wall clock:
//! the same configuration replays bit for bit (`SimReport::digest`), and a
//! run of thousands of miners takes seconds.
//!
//! What a run checks as it goes (`SimReport`): no queued miner's place
//! moves back while it keeps asking; no stretch without progress longer
//! than the phase timeout; no report of an honest, live miner refused
//! because a phase moved on. Validators and the adversary modes are not
//! simulated yet.

use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;

use iota_core::{Identity, PeerId, Rng};
use iota_wire::MbRef;
use iota_wire::pb;
use iota_wire::run_spec::{MergeSpec, RunSpec, ValidationSpec, ValidatorStake};

pub use self::adversary::SimAdversary;
use self::event_queue::EventQueue;
pub use self::report::SimReport;
use self::validator_state::{AuditAsk, PeerMap, PeerSet, SimValidator, validator_peer};
use crate::orchestrator::{Event, Ms, Orchestrator, Out, Refusal};
use crate::validation::round::{CheckJob, ValidatorCore};
use crate::validation::sample::SampleRate;
use crate::validation::shared_clasp::SharedClasp;

/// A simulated run's shape, its miners' behaviour and its faults.
#[derive(Clone, Debug)]
pub struct SimConfig {
    /// Identities that try to join at the start (more than the run's
    /// places queue).
    pub miners: usize,
    pub stages: u32,
    pub replicas: u32,
    /// Places per stage (0: the run's default, 4 x replicas).
    pub places_per_stage: u32,
    pub epochs: u64,
    pub micro_batches_per_epoch: u64,
    /// Micro-batches in flight at once.
    pub in_flight: u32,
    pub seed: u64,
    /// Share of the live miners that crash at each epoch's start, replaced
    /// by as many new identities.
    pub churn: f64,
    /// One-way message delay, uniform in [min, max] ms.
    pub delay_ms: (Ms, Ms),
    /// One stage's forward and backward of one micro-batch.
    pub stage_ms: Ms,
    /// An upload or a merge's store write (a slow store: more).
    pub store_ms: Ms,
    /// The orchestrator restarts (its state saved and loaded again) when
    /// this epoch starts.
    pub restart_at_epoch: Option<u64>,
    /// Miners cut off (nothing in or out) for `partition_ms` from the
    /// start of this epoch: this share of the live ones.
    pub partition: Option<(u64, f64)>,
    pub partition_ms: Ms,
    pub heartbeat_ms: Ms,
    pub tick_ms: Ms,
    /// Virtual time the run may take before it is called stuck.
    pub limit_ms: Ms,
    /// Validators of equal stake, each running the real validator round
    /// (`sim/validating.rs`).
    pub validators: usize,
    /// A validator's recompute of one evidence object, or its check of a
    /// merge.
    pub check_ms: Ms,
    /// Miners that cheat or fail on purpose, one identity each, among the
    /// first to register; churn spares them, so each is there to be named
    /// (`sim/adversary.rs`).
    pub adversaries: Vec<SimAdversary>,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            miners: 12,
            stages: 3,
            replicas: 4,
            places_per_stage: 0,
            epochs: 3,
            micro_batches_per_epoch: 64,
            in_flight: 8,
            seed: 1,
            churn: 0.0,
            delay_ms: (5, 50),
            stage_ms: 100,
            store_ms: 200,
            restart_at_epoch: None,
            partition: None,
            partition_ms: 5_000,
            // What a miner sends (`MinerOptions::heartbeat`).
            heartbeat_ms: 500,
            tick_ms: 200,
            limit_ms: 24 * 3_600_000,
            validators: 0,
            check_ms: 300,
            adversaries: Vec::new(),
        }
    }
}

/// Something that happens at a virtual time. Messages are boxed: the queue
/// moves every entry in and out, and inline messages made each entry
/// hundreds of bytes (5% of a 2,000-miner run was those moves).
#[derive(Clone, Debug)]
enum Happening {
    /// A message reaches the orchestrator.
    ToOrchestrator(Box<Event>),
    /// A command reaches a miner.
    ToMiner(usize, Box<pb::command::Kind>),
    /// A miner (re)tries to register.
    Register(usize),
    /// A head finished a micro-batch's pathway: the tail's loss and the
    /// head's backward are reported.
    Finished {
        head: usize,
        tail: usize,
        mb: MbRef,
        attempt: u32,
        path: Vec<usize>,
    },
    Heartbeats,
    Tick,
    /// Validator `j` (re)registers.
    ValidatorJoin(usize),
    /// A command reaches validator `j`.
    ToValidator(usize, Box<pb::command::Kind>),
    /// Validator `j`'s report reaches the orchestrator.
    FromValidator(usize, Box<Event>),
    /// Validator `j`'s recompute of an evidence object is done.
    Checked(usize, Box<CheckJob>, Result<(), String>),
    /// Validator `j` has read an audited partition's contributions.
    Audited(usize, Rc<AuditAsk>),
    /// A merge audit reaches validator `j`.
    AuditReaches(usize, Rc<AuditAsk>),
}

#[derive(Clone, Debug, PartialEq)]
enum Standing {
    Joining,
    Queued(usize),
    Registered,
    Crashed,
}

struct SimMiner {
    peer: PeerId,
    standing: Standing,
    /// Cut off from the network until then.
    cut_until: Ms,
    /// The merge it last heard verdicts of, and the partitions heard.
    verdicts: (u64, std::collections::BTreeSet<u32>),
    /// What it does wrong on purpose (None: honest).
    mode: Option<SimAdversary>,
    /// Its identity's seed (it signs what it sends).
    seed: [u8; 32],
}

/// The simulator's world: the orchestrator, the miners and the clock.
struct World {
    cfg: SimConfig,
    o: Orchestrator,
    rng: Rng,
    orch_rng: Rng,
    now: Ms,
    queue: EventQueue<Happening>,
    miners: Vec<SimMiner>,
    /// Who is who (looked up, never iterated: its order is no input).
    index: PeerMap<usize>,
    report: SimReport,
    digest: blake3::Hasher,
    last_progress: (Ms, u64, crate::orchestrator::Phase, u64),
    epoch_seen: u64,
    validators: Vec<SimValidator>,
    vindex: PeerMap<usize>,
    /// The simulated store's contributions, by (epoch, stage, partition):
    /// who stored theirs, and who stored another than it sent.
    contributions: HashMap<(u64, u32, u32), (PeerSet, Vec<PeerId>)>,
    /// (epoch, validator) of every weight vector a validator sent.
    weights_sent: Vec<(u64, PeerId)>,
    /// Miners a guilty verdict the orchestrator took names, with its check.
    guilty: BTreeMap<PeerId, crate::validation::quorum::Check>,
    /// The last audit read from a command (the same goes to every validator).
    last_audit: Option<Rc<AuditAsk>>,
    /// Per stage, the latest audit context's id and plan (the same goes to
    /// every validator, before the audits that name it).
    audit_plans: HashMap<u32, (Vec<u8>, Rc<iota_core::merge::MergePlan>)>,
    /// The last phase command's merge plan, as sent and parsed: each of a
    /// stage's participants is sent the same one, and parsing it again for
    /// each was 2% of a 2,000-miner run (a real miner parses its own once).
    phase_plan: Option<(pb::MergePlan, Rc<iota_core::merge::MergePlan>)>,
}

/// The run's spec for `cfg`: butterfly merges over small stages (the
/// simulator moves no weights), timeouts as a real run's (10 s of silence
/// for a heartbeat of 500 ms, 30 s for a route) but a phase timeout of
/// 60 s, not 300.
pub fn spec_for(cfg: &SimConfig) -> RunSpec {
    let mut merge = MergeSpec::butterfly();
    merge.stage_params = vec![1 << 16; cfg.stages as usize];
    RunSpec {
        run_id: 7,
        stages: cfg.stages,
        replicas: cfg.replicas,
        epochs: cfg.epochs,
        micro_batches_per_epoch: cfg.micro_batches_per_epoch,
        batch: 4,
        n_shards: 16,
        max_in_flight: cfg.in_flight,
        // The production defaults, but for a phase timeout a fifth as long
        // (the stall check holds the run to it).
        route_timeout_ms: 30_000.max(20 * cfg.stage_ms * u64::from(cfg.stages) + 4 * cfg.delay_ms.1),
        heartbeat_timeout_ms: 20 * cfg.heartbeat_ms,
        phase_timeout_ms: 60_000 + 4 * cfg.store_ms,
        miners_per_stage_cap: cfg.places_per_stage,
        merge,
        validation: ValidationSpec {
            validators: (0..cfg.validators)
                .map(|j| ValidatorStake { peer: validator_peer(cfg.seed, j), stake: 1_000 })
                .collect(),
            ..ValidationSpec::default()
        },
        ..RunSpec::default()
    }
}

/// Runs `cfg` to its end (or `limit_ms`); deterministic in `cfg`.
pub fn run(cfg: &SimConfig) -> Result<SimReport, String> {
    let spec = spec_for(cfg);
    let o = Orchestrator::new(spec.clone())?;
    let mut rng = Rng::new(cfg.seed);
    let mut miners = (0..cfg.miners).map(|_| new_miner(&mut rng)).collect::<Vec<_>>();
    if cfg.adversaries.len() > cfg.miners {
        return Err(format!("{} adversaries among {} miners", cfg.adversaries.len(), cfg.miners));
    }
    for (m, a) in miners.iter_mut().zip(&cfg.adversaries) {
        m.mode = Some(*a);
    }
    let index = miners.iter().enumerate().map(|(i, m)| (m.peer, i)).collect();
    // One process runs every validator: CLASP's finding over an epoch's
    // work is computed once (the work is the same for all of them).
    let clasp = std::sync::Arc::new(SharedClasp::default());
    let validators: Vec<SimValidator> = spec
        .validation
        .validators
        .iter()
        .enumerate()
        .map(|(j, v)| {
            let core = sim_validator_core(&spec, cfg.seed, j).with_shared_clasp(clasp.clone());
            SimValidator { peer: v.peer, core, joined: false, last_sent_ms: 0 }
        })
        .collect();
    let vindex = validators.iter().enumerate().map(|(j, v)| (v.peer, j)).collect();
    let mut w = World {
        cfg: cfg.clone(),
        o,
        orch_rng: Rng::new(cfg.seed ^ 0x5eed),
        rng,
        now: 0,
        queue: EventQueue::default(),
        miners,
        index,
        report: SimReport { phase_timeout_ms: spec.phase_timeout_ms, ..SimReport::default() },
        digest: blake3::Hasher::new(),
        last_progress: (0, 0, crate::orchestrator::Phase::Waiting, 0),
        epoch_seen: 0,
        validators,
        vindex,
        contributions: HashMap::new(),
        weights_sent: Vec::new(),
        guilty: BTreeMap::new(),
        last_audit: None,
        audit_plans: HashMap::new(),
        phase_plan: None,
    };
    // The adversaries first (each gets a place); the validators before
    // the run can start.
    for i in 0..cfg.miners {
        let at = if i < cfg.adversaries.len() { i as Ms } else { w.rng.below(1_000) };
        w.at(at, Happening::Register(i));
    }
    for j in 0..cfg.validators {
        let at = w.rng.below(500);
        w.at(at, Happening::ValidatorJoin(j));
    }
    w.at(cfg.heartbeat_ms, Happening::Heartbeats);
    w.at(cfg.tick_ms, Happening::Tick);
    while let Some((t, h)) = w.queue.pop() {
        w.now = t;
        w.report.deliveries += 1;
        w.happen(h);
        w.watch();
        if *w.o.phase() == crate::orchestrator::Phase::Done || w.now > cfg.limit_ms {
            break;
        }
    }
    w.account();
    w.report.sim_ms = w.now;
    w.report.epochs_done = w.o.history().len() as u64;
    w.report.completed = w.o.history().iter().map(|e| e.completed).sum();
    w.report.dropped = w.o.history().iter().map(|e| e.dropped).sum();
    // The whole state at the end, with the trace: two runs of one seed
    // agree on every field the orchestrator keeps.
    w.digest.update(serde_json::to_string(&w.o).map_err(|e| e.to_string())?.as_bytes());
    w.report.digest = w.digest.finalize().to_hex().to_string();
    if *w.o.phase() != crate::orchestrator::Phase::Done {
        return Err(format!(
            "the run did not end by {} ms of virtual time (epoch {}, {:?}; seed {})",
            w.now,
            w.o.epoch(),
            w.o.phase(),
            cfg.seed
        ));
    }
    Ok(w.report)
}

fn new_miner(rng: &mut Rng) -> SimMiner {
    let mut seed = [0u8; 32];
    for b in seed.chunks_mut(8) {
        b.copy_from_slice(&rng.next_u64().to_le_bytes());
    }
    SimMiner {
        peer: Identity::from_seed(seed).peer_id(),
        seed,
        standing: Standing::Joining,
        cut_until: 0,
        verdicts: Default::default(),
        mode: None,
    }
}

/// A validator's round as the validator daemon builds it for the run.
fn sim_validator_core(spec: &RunSpec, seed: u64, j: usize) -> ValidatorCore {
    let v = &spec.validation;
    let rate = SampleRate { rate: v.rate, min_per_miner: v.min_per_miner as usize };
    let params: Vec<usize> = spec.merge.stage_params.iter().map(|&p| p as usize).collect();
    ValidatorCore::new(spec.run_id, spec.stages, seed ^ (j as u64 + 1).wrapping_mul(0x9e37_79b9), rate, v.timeout_ms)
        .with_stage_params(&params, v.validators.len())
        .with_inner_steps(v.check_inner_steps)
}

impl World {
    fn at(&mut self, t: Ms, h: Happening) {
        self.queue.push(t, h);
    }

    fn delay(&mut self) -> Ms {
        let (lo, hi) = self.cfg.delay_ms;
        lo + self.rng.below(hi.saturating_sub(lo) + 1)
    }

    /// Miner `i` can send and receive now.
    fn reachable(&self, i: usize) -> bool {
        self.miners[i].standing != Standing::Crashed && self.now >= self.miners[i].cut_until
    }

    /// Sends `ev` from miner `i` to the orchestrator (lost while it is cut off).
    fn send(&mut self, i: usize, ev: Event) {
        if self.reachable(i) {
            let d = self.delay();
            self.at(self.now + d, Happening::ToOrchestrator(Box::new(ev)));
        }
    }

    /// Steps the orchestrator with `ev` now. The digest takes the time, the
    /// event's kind and who sent it (the whole state is hashed at the end).
    fn step(&mut self, ev: Event) -> Result<Vec<Out>, Refusal> {
        self.report.events += 1;
        self.digest.update(&self.now.to_le_bytes());
        self.digest.update(&[event_kind(&ev)]);
        if let Some(p) = event_peer(&ev) {
            self.digest.update(&p.0);
        }
        self.o.step(self.now, ev, &mut self.orch_rng)
    }

    fn deliver(&mut self, outs: Vec<Out>) {
        for Out { to, cmd } in outs {
            if let Some(&i) = self.index.get(&to) {
                let d = self.delay();
                // Drawn all the same: the run's draws stay as they were.
                if miner_commands::acts_on(&to, &cmd) {
                    self.at(self.now + d, Happening::ToMiner(i, Box::new(cmd)));
                }
            } else if let Some(&j) = self.vindex.get(&to) {
                // The plan, read once for every validator it goes to (the
                // audits after it on the validator's stream name it).
                if let pb::command::Kind::MergeAuditContext(c) = cmd {
                    self.audit_context(c);
                    continue;
                }
                let d = self.delay();
                let h = match cmd {
                    // What the audit is about.
                    pb::command::Kind::MergeAudit(a) => match self.audit_ask(&a) {
                        Some(ask) => Happening::AuditReaches(j, ask),
                        None => continue,
                    },
                    cmd => Happening::ToValidator(j, Box::new(cmd)),
                };
                self.at(self.now + d, h);
            }
        }
    }

    fn happen(&mut self, h: Happening) {
        match h {
            Happening::ToOrchestrator(ev) => self.reach_orchestrator(*ev),
            Happening::ToMiner(i, cmd) if self.reachable(i) => self.reach_miner(i, *cmd),
            Happening::ToMiner(..) => {}
            Happening::Register(i) => self.register(i),
            Happening::Finished { head, tail, mb, attempt, path } => {
                // Only a pathway whose members all lived through it finishes.
                if path.iter().all(|&p| self.reachable(p)) {
                    let (tail_peer, head_peer) = (self.miners[tail].peer, self.miners[head].peer);
                    self.send(tail, Event::Loss { peer: tail_peer, mb, attempt, loss: 2.0, tokens: 256 });
                    self.send(head, Event::BackwardDone { peer: head_peer, mb, attempt });
                }
            }
            Happening::Heartbeats => {
                for i in 0..self.miners.len() {
                    if self.miners[i].standing == Standing::Registered {
                        let peer = self.miners[i].peer;
                        let hb = Event::Heartbeat { peer, tokens_per_s: 1e4, in_flight: 0, commitments: Vec::new() };
                        self.send(i, hb);
                    }
                }
                self.validators_beat();
                self.at(self.now + self.cfg.heartbeat_ms, Happening::Heartbeats);
            }
            Happening::Tick => {
                if let Ok(outs) = self.step(Event::Tick) {
                    self.deliver(outs);
                }
                self.at(self.now + self.cfg.tick_ms, Happening::Tick);
            }
            Happening::ValidatorJoin(j) => self.validator_join(j),
            Happening::ToValidator(j, cmd) => self.reach_validator(j, *cmd),
            Happening::FromValidator(j, ev) => self.validator_report(j, *ev),
            Happening::Checked(j, job, result) => self.checked(j, &job, result),
            Happening::Audited(j, a) => self.answer_audit(j, &a),
            Happening::AuditReaches(j, a) => self.on_audit(j, a),
        }
    }

    fn register(&mut self, i: usize) {
        if !self.reachable(i) {
            if self.miners[i].standing != Standing::Crashed {
                let later = self.now + iota_wire::run_spec::QUEUE_RETRY_MS;
                self.at(later, Happening::Register(i));
            }
            return;
        }
        let peer = self.miners[i].peer;
        let ev = Event::Register {
            peer,
            addr: format!("198.18.{}.{}:7200", i / 250, i % 250 + 1),
            tokens_per_s: 1e4,
            device: "sim".into(),
            memory: Default::default(),
        };
        match self.step(ev) {
            Ok(outs) => {
                self.deliver(outs);
                self.miners[i].standing = Standing::Registered;
                let d = self.delay();
                self.at(self.now + d, Happening::ToOrchestrator(Box::new(Event::Subscribed { peer })));
            }
            Err(Refusal::Queued { position, length }) => {
                if let Standing::Queued(before) = self.miners[i].standing
                    && position > before
                {
                    self.report.queue_moved_back += 1;
                }
                self.miners[i].standing = Standing::Queued(position);
                self.report.queue_max = self.report.queue_max.max(length);
                let later = self.now + iota_wire::run_spec::QUEUE_RETRY_MS;
                self.at(later, Happening::Register(i));
            }
            Err(e) => {
                self.report.lost_reports.push(format!("miner {i} could not register: {e}"));
            }
        }
    }

    fn reach_orchestrator(&mut self, ev: Event) {
        let from = event_peer(&ev).and_then(|p| self.index.get(&p).copied());
        let kind = event_kind(&ev);
        match self.step(ev) {
            Ok(outs) => self.deliver(outs),
            // A report of a miner that is alive and reachable, refused:
            // work (or a merge's part) lost to the orchestrator's view.
            Err(e) if from.is_some_and(|i| self.reachable(i) && self.miners[i].standing == Standing::Registered) => {
                let who = from.unwrap_or_default();
                self.report.lost_reports.push(format!("at {} ms: miner {who}'s {}: {e}", self.now, kind_name(kind)));
            }
            Err(_) => {}
        }
    }

    fn send_after(&mut self, i: usize, after: Ms, ev: Event) {
        if self.reachable(i) {
            let d = self.delay();
            self.at(self.now + after + d, Happening::ToOrchestrator(Box::new(ev)));
        }
    }

    /// After each delivery: progress and stalls, and each new epoch's
    /// faults (churn, a partition, a restart).
    fn watch(&mut self) {
        let (epoch, completed) = (self.o.epoch(), self.o.counters().completed);
        let moved = self.last_progress.1 != epoch
            || self.last_progress.3 != completed
            || self.last_progress.2 != *self.o.phase();
        if moved {
            self.last_progress = (self.now, epoch, self.o.phase().clone(), completed);
        }
        self.report.longest_stall_ms = self.report.longest_stall_ms.max(self.now - self.last_progress.0);
        if epoch > self.epoch_seen {
            self.epoch_seen = epoch;
            self.new_epoch(epoch);
        }
    }

    fn new_epoch(&mut self, epoch: u64) {
        if self.cfg.restart_at_epoch == Some(epoch) {
            self.restart();
        }
        if let Some((at, share)) = self.cfg.partition
            && at == epoch
        {
            let until = self.now + self.cfg.partition_ms;
            for i in self.pick_live(share) {
                self.miners[i].cut_until = until;
                // Back on the network, it opens its command stream again.
                let peer = self.miners[i].peer;
                self.at(until + 1, Happening::ToOrchestrator(Box::new(Event::Subscribed { peer })));
            }
        }
        if self.cfg.churn > 0.0 {
            let leaving = self.pick_live(self.cfg.churn);
            for &i in &leaving {
                self.miners[i].standing = Standing::Crashed;
                self.report.crashed += 1;
            }
            for _ in 0..leaving.len() {
                let m = new_miner(&mut self.rng);
                let i = self.miners.len();
                self.index.insert(m.peer, i);
                self.miners.push(m);
                self.report.joined += 1;
                let d = self.delay();
                self.at(self.now + d, Happening::Register(i));
            }
        }
    }

    /// About `share` of the registered, reachable, honest miners, drawn by
    /// the seed.
    fn pick_live(&mut self, share: f64) -> Vec<usize> {
        let live: Vec<usize> = (0..self.miners.len())
            // The adversaries stay, to be named.
            .filter(|&i| self.miners[i].standing == Standing::Registered && self.reachable(i))
            .filter(|&i| self.miners[i].mode.is_none())
            .collect();
        let n = ((live.len() as f64) * share).round() as usize;
        let mut picked = live;
        for k in 0..picked.len() {
            let j = k + self.rng.below((picked.len() - k) as u64) as usize;
            picked.swap(k, j);
        }
        picked.truncate(n);
        picked.sort_unstable();
        picked
    }

    /// The orchestrator's process dies and starts again from its saved
    /// state: reports in flight reach the new one (a miner retries a report
    /// until it is acknowledged), and every miner re-opens its command
    /// stream.
    fn restart(&mut self) {
        let saved = serde_json::to_string(&self.o).expect("the state serializes");
        let mut o: Orchestrator = serde_json::from_str(&saved).expect("the state loads");
        o.resumed(self.now);
        self.o = o;
        for i in 0..self.miners.len() {
            if self.miners[i].standing == Standing::Registered {
                let peer = self.miners[i].peer;
                let d = 500 + self.delay();
                self.at(self.now + d, Happening::ToOrchestrator(Box::new(Event::Subscribed { peer })));
            }
        }
    }
}

fn kind_name(kind: u8) -> &'static str {
    [
        "event",
        "registration",
        "heartbeat",
        "subscription",
        "loss",
        "backward",
        "upload",
        "merge report",
        "stored slice",
        "slice report",
        "tick",
    ]
    .get(kind as usize)
    .copied()
    .unwrap_or("event")
}

/// A number per kind of event, for the run's digest.
fn event_kind(ev: &Event) -> u8 {
    match ev {
        Event::Register { .. } => 1,
        Event::Heartbeat { .. } => 2,
        Event::Subscribed { .. } => 3,
        Event::Loss { .. } => 4,
        Event::BackwardDone { .. } => 5,
        Event::UploadDone { .. } => 6,
        Event::MergeDone { .. } => 7,
        Event::Stored { .. } => 8,
        Event::SliceDone { .. } => 9,
        Event::Tick => 10,
        _ => 0,
    }
}

fn event_peer(ev: &Event) -> Option<PeerId> {
    Some(match ev {
        Event::Heartbeat { peer, .. }
        | Event::Subscribed { peer }
        | Event::Loss { peer, .. }
        | Event::BackwardDone { peer, .. }
        | Event::UploadDone { peer, .. }
        | Event::MergeDone { peer, .. }
        | Event::Stored { peer, .. }
        | Event::SliceDone { peer, .. } => *peer,
        _ => return None,
    })
}

mod accounting;
mod adversary;
mod cheating;
mod event_queue;
mod evidence;
mod miner_commands;
mod miners;
mod report;
#[cfg(test)]
mod tests;
mod validating;
mod validator_state;
