//! The gRPC shell around the orchestrator state machine.
//!
//! Every RPC: verify the signed envelope (`auth`), check the body's fields
//! (`fields`), turn it into an `Event`, step the state machine, and deliver
//! the resulting commands to the miners' `Subscribe` streams, each signed by
//! the orchestrator for that stream and numbered (queued, up to a bound,
//! while a miner is not subscribed). Replies that change what a miner does
//! are signed too. Every refusal is counted and logged (`audit`). A
//! background task feeds clock ticks. The state is saved to the `StateDb`
//! when the epoch or phase changes, and at most every `SAVE_EVERY_MS`
//! otherwise.

use std::collections::{HashMap, HashSet, VecDeque};
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use iota_core::{Identity, PeerId, Rng};
use parking_lot::Mutex;
use tokio::sync::mpsc;
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};
use tracing::{info, warn};

use iota_protocol::auth::{Audience, AuthPolicy, Verifier, now_ms, sign_hello, sign_server};
use iota_protocol::client::{GRANT, HEARTBEAT, HELLO, REGISTER, REPORT, STATUS, SUBSCRIBE, VALIDATE};
use iota_protocol::fields;
use iota_protocol::pb::{self, orchestrator_server::Orchestrator as OrchestratorRpc};
use iota_protocol::refusal::{Reason, Rejected};
use iota_protocol::source_limits::{SourceLimits, SourcePolicy};
use iota_protocol::{MbRef, StoredObject};

#[path = "service_reports.rs"]
mod reports;
use self::reports::validator_report_event;
use crate::audit::Audit;
use crate::orchestrator::{Event, MemoryStated, Orchestrator, Out, Phase, Refusal};
use crate::s3_store::S3Store;
use crate::state_db::StateDb;
use iota_core::memory_plan::ComputeBackend;

use crate::service_subscriber::Subscriber;

const SAVE_EVERY_MS: u64 = 2_000;
/// Commands kept for a miner that is not listening; past this the oldest go.
pub const MAX_PENDING: usize = 4_096;
/// Commands buffered in a subscriber's stream.
const STREAM_BUFFER: usize = 1_024;

pub const TICK: Duration = Duration::from_millis(100);

struct Core {
    orch: Orchestrator,
    rng: Rng,
    /// Signs what goes to miners.
    id: Arc<Identity>,
    aud: Audience,
    subscribers: HashMap<PeerId, Subscriber>,
    pending: HashMap<PeerId, VecDeque<pb::Command>>,
    store: Option<StateDb>,
    saved: (u64, Phase, u64),
    /// Miners of a run restored from saved state that have not subscribed
    /// since: each is told the current phase when it does.
    catch_up: HashSet<PeerId>,
    /// `OrchestratorService::halt` was called: nothing changes, is saved or
    /// is sent any more, as after a crash.
    halted: bool,
}

impl Core {
    fn deliver(&mut self, outs: Vec<Out>) {
        // A merge verdict names the partition's writer, who stores the slice
        // as soon as it hears. An orchestrator restarted from a state saved
        // before the verdict refuses that store ("not the writer") for as
        // long as the writer retries, and the merge never ends: save first.
        if outs.iter().any(|o| matches!(o.cmd, pb::command::Kind::Verdict(_))) {
            self.persist(now_ms(), true);
        }
        for Out { to, cmd } in outs {
            let cmd = pb::Command { kind: Some(cmd) };
            let queue = self.pending.entry(to).or_default();
            let cmd = match self.subscribers.get_mut(&to) {
                Some(sub) if queue.is_empty() => match sub.send(&self.id, &self.aud, &to, cmd) {
                    Ok(()) => continue,
                    Err(c) => c,
                },
                _ => cmd,
            };
            queue.push_back(cmd);
            if queue.len() > MAX_PENDING {
                queue.pop_front();
                warn!(peer = %to, "command queue overflow; dropping the oldest command");
            }
        }
        self.flush();
    }

    /// Moves queued commands into subscribers' streams while they have room.
    fn flush(&mut self) {
        let Core { pending, subscribers, id, aud, .. } = self;
        for (peer, queue) in pending.iter_mut() {
            let Some(sub) = subscribers.get_mut(peer) else { continue };
            while let Some(c) = queue.pop_front() {
                if let Err(c) = sub.send(id, aud, peer, c) {
                    queue.push_front(c);
                    break;
                }
            }
        }
        pending.retain(|_, q| !q.is_empty());
    }

    fn persist(&mut self, now: u64, force: bool) {
        let key = (self.orch.epoch(), self.orch.phase().clone());
        let changed = (key.0, key.1.clone()) != (self.saved.0, self.saved.1.clone());
        if !(force || changed || now.saturating_sub(self.saved.2) >= SAVE_EVERY_MS) {
            return;
        }
        if let Some(store) = self.store.as_mut() {
            match store.save(&self.orch, now, &self.id) {
                Ok(()) => {
                    self.saved = (key.0, key.1, now);
                    // Every settlement it held is in the ledger now.
                    if let Some(last) = self.orch.settlements().last().map(|s| s.epoch) {
                        self.orch.settlements_written(last);
                    }
                }
                Err(e) => {
                    // Try again after the usual interval, not on every
                    // event: a save that fails once tends to fail again,
                    // and serializing the state per event is costly.
                    self.saved.2 = now;
                    warn!(error = %e, "saving orchestrator state failed");
                }
            }
        }
    }
}

/// The orchestrator service (cheap to clone).
#[derive(Clone)]
pub struct OrchestratorService {
    core: Arc<Mutex<Core>>,
    verifier: Arc<Verifier>,
    /// Budgets per source address and for the whole server, checked before
    /// a signature is.
    limits: Arc<SourceLimits>,
    audit: Arc<Audit>,
    id: Arc<Identity>,
    run_config_json: Arc<String>,
    /// Where the Grant RPC presigns: the run's bucket, or the store the
    /// orchestrator serves itself (None: a directory miners open).
    presigner: Option<crate::served_store::Presigner>,
    /// What re-checks validators' proofs of failed inner steps (None: such
    /// a verdict counts as a vote without its proof).
    referee: Option<Arc<crate::step_referee::StepReferee>>,
}

impl OrchestratorService {
    /// `store`: where state is saved; a state already in it wins over `orch`
    /// (the run resumes). `id`: the orchestrator's identity, which signs
    /// what it sends and which miners pin.
    pub fn new(
        orch: Orchestrator,
        store: Option<StateDb>,
        run_config_json: String,
        policy: AuthPolicy,
        id: Arc<Identity>,
    ) -> anyhow::Result<Self> {
        let mut catch_up = HashSet::new();
        let mut resumed = false;
        let orch = match store.as_ref().map(|s| s.load()).transpose()?.flatten() {
            Some(mut saved) if saved.spec().run_id == orch.spec().run_id => {
                info!(epoch = saved.epoch(), phase = ?saved.phase(), "resuming run from saved state");
                resumed = true;
                catch_up = saved.miners().map(|m| m.peer).collect();
                // Its clocks (heartbeats, rounds, phase) start again when it
                // takes envelopes again: after `max_ahead` (see below), so
                // no miner looks silent for the refusals of that window.
                saved.resumed(now_ms().saturating_add(policy.max_ahead.as_millis() as u64));
                saved
            }
            Some(saved) => {
                anyhow::bail!("the state database holds run {}, not run {}", saved.spec().run_id, orch.spec().run_id)
            }
            None => orch,
        };
        let mut orch = orch;
        orch.set_operator(id.peer_id());
        // Each stage's memory plan, so registrations and routing follow what
        // miners state (a configuration that does not parse states nothing).
        if let Ok(cfg) = iota_protocol::RunConfig::from_json(&run_config_json) {
            let t = &cfg.train;
            let held = cfg.spec.max_in_flight.clamp(1, 256) as usize;
            match iota_core::memory_fit::RunMemoryNeeds::new(
                &t.model,
                t.stages,
                t.batch,
                t.seq,
                held,
                iota_core::memory_plan::InnerOptimizer::AdamW,
            ) {
                Ok(needs) => orch.set_memory_needs(needs),
                Err(e) => warn!(error = %e, "no memory plan for this run; miners' stated memory is not checked"),
            }
        }
        let started = now_ms();
        // Resuming, the process before this one may have taken envelopes
        // dated up to `max_ahead` past its last moment; their nonces died
        // with it, so until then nothing is taken (clients sign again).
        let not_before = if resumed { started.saturating_add(policy.max_ahead.as_millis() as u64) } else { started };
        let rng = Rng::derived(orch.spec().run_id, &[orch.epoch(), started]);
        let aud = Audience { run_id: orch.spec().run_id, orchestrator: id.peer_id() };
        let core = Core {
            saved: (u64::MAX, Phase::Waiting, 0),
            orch,
            rng,
            id: id.clone(),
            aud,
            subscribers: HashMap::new(),
            pending: HashMap::new(),
            store,
            catch_up,
            halted: false,
        };
        Ok(OrchestratorService {
            core: Arc::new(Mutex::new(core)),
            verifier: Arc::new(Verifier::new(policy, aud, not_before)),
            limits: Arc::new(SourceLimits::new(SourcePolicy::default())),
            audit: Arc::new(Audit::default()),
            id,
            run_config_json: Arc::new(run_config_json),
            presigner: None,
            referee: None,
        })
    }

    /// Limits sources by `policy` instead of the default one.
    pub fn with_source_policy(mut self, policy: SourcePolicy) -> Self {
        self.limits = Arc::new(SourceLimits::new(policy));
        self
    }

    /// Re-checks validators' step proofs with `referee` before their verdicts count.
    pub fn with_referee(mut self, referee: crate::step_referee::StepReferee) -> Self {
        self.referee = Some(Arc::new(referee));
        self
    }

    /// Serves presigned URLs on `store` to the run's miners (Grant).
    pub fn with_s3(mut self, store: Arc<S3Store>) -> Self {
        self.presigner = Some(crate::served_store::Presigner::S3(store));
        self
    }

    /// Serves grants on the store this orchestrator serves itself.
    pub fn with_served_store(mut self, store: Arc<crate::served_store::ServedStore>) -> Self {
        self.presigner = Some(crate::served_store::Presigner::Served(store));
        self
    }

    /// Steps the state machine with `ev` now and delivers the commands.
    /// Once halted, does nothing and says so (`Ok(false)`).
    pub fn apply(&self, ev: Event) -> Result<bool, Rejected> {
        let now = now_ms();
        // The merge's reports are sent once: one acknowledged but not yet
        // saved would be lost to a restart, and the resumed merge would wait
        // for it forever. They are saved before the acknowledgement.
        let sent_once = matches!(
            ev,
            Event::UploadDone { .. }
                | Event::MergeDone { .. }
                | Event::Stored { .. }
                | Event::SliceDone { .. }
                | Event::ContributionsMissing { .. }
        );
        let mut core = self.core.lock();
        if core.halted {
            return Ok(false);
        }
        let Core { orch, rng, .. } = &mut *core;
        let outs = orch.step(now, ev, rng).map_err(rejected)?;
        core.deliver(outs);
        core.persist(now, sent_once);
        Ok(true)
    }

    /// Stops this service as a crash would, for tests that restart an
    /// orchestrator in the same process: from now on it changes nothing,
    /// saves nothing, sends nothing and answers every call that would
    /// change the run with UNAVAILABLE (callers retry, as they do while a
    /// crashed orchestrator is down); its command streams end. Without
    /// this, a call already being served when the test "crashed" the old
    /// server could still save and send after the new one had loaded the
    /// state: a split brain no real crash makes.
    pub fn halt(&self) {
        let mut core = self.core.lock();
        core.halted = true;
        core.subscribers.clear();
        core.pending.clear();
    }

    /// Clock ticks until the returned handle is aborted.
    pub fn spawn_ticker(&self) -> tokio::task::JoinHandle<()> {
        let svc = self.clone();
        tokio::spawn(async move {
            let mut iv = tokio::time::interval(TICK);
            loop {
                iv.tick().await;
                let _ = svc.apply(Event::Tick);
            }
        })
    }

    /// A read-only look at the state machine.
    pub fn with_state<R>(&self, f: impl FnOnce(&Orchestrator) -> R) -> R {
        f(&self.core.lock().orch)
    }

    /// Saves now (on shutdown).
    pub fn save(&self) {
        self.core.lock().persist(now_ms(), true);
    }

    /// The orchestrator's identity (miners pin it).
    pub fn identity(&self) -> &Arc<Identity> {
        &self.id
    }

    /// Refused requests so far, by reason.
    pub fn refusals(&self) -> std::collections::BTreeMap<String, u64> {
        self.audit.counts()
    }

    /// Counts and logs a refusal; the status the caller gets.
    fn refuse(&self, method: &str, r: Rejected) -> Status {
        self.audit.refused(method, &r, now_ms());
        iota_protocol::refusal_status(&r)
    }

    /// Admits a request from `source` within its address's budget and the
    /// server's, then verifies its envelope: who signed it and its body.
    fn verify<M: prost::Message + Default>(
        &self,
        method: &str,
        source: Option<IpAddr>,
        s: &pb::Signed,
    ) -> Result<(PeerId, M), Status> {
        let now = now_ms();
        self.limits.admit_request(source, now).map_err(|r| self.refuse(method, r))?;
        self.verifier.verify(method, s, now).map_err(|r| self.refuse(method, r))
    }

    /// An object announced in `peer`'s report (the signer is its writer).
    fn announced(&self, peer: PeerId, o: &pb::StoredObject) -> Result<StoredObject, Status> {
        StoredObject::from_pb(o, Some(peer))
            .map_err(|e| self.refuse(REPORT, Rejected::new(Reason::InvalidField, format!("object: {e}")).from(peer)))
    }

    /// Applies an event a request carried; a refusal is counted against it.
    fn apply_for(&self, method: &str, peer: PeerId, ev: Event) -> Result<(), Status> {
        match self.apply(ev) {
            Ok(true) => Ok(()),
            Ok(false) => Err(Status::unavailable("the orchestrator is stopping")),
            Err(r) => Err(self.refuse(method, r.from(peer))),
        }
    }

    /// Identities that left (no miner, validator or queued newcomer) free
    /// their address's places, once the record has grown past those there are.
    fn prune_identities(&self) {
        let present = self.with_state(|o| o.miners().count() + o.waitlist().len());
        if self.limits.identities_recorded() > 2 * present + 64 {
            self.with_state(|o| {
                let validators: HashSet<PeerId> = o.validators().map(|v| v.peer).collect();
                let waiting: HashSet<PeerId> = o.waitlist().peers().collect();
                self.limits.prune_identities(|p| o.miner(p).is_some() || validators.contains(p) || waiting.contains(p))
            });
        }
    }

    /// Signs a reply to `peer`'s request (its nonce binds the reply to it).
    fn signed<M: prost::Message>(&self, peer: &PeerId, method: &str, req: &pb::Signed, reply: &M) -> pb::ServerSigned {
        sign_server(&self.id, self.verifier.audience(), peer, method, &req.nonce, 0, reply)
    }
}

/// The state machine's refusal as the caller hears it.
fn rejected(e: Refusal) -> Rejected {
    match e {
        Refusal::Unknown(p) => Rejected::new(Reason::NotRegistered, format!("peer {p} must register first")),
        Refusal::Invalid(m) => Rejected::new(Reason::Refused, m),
        Refusal::NotYours(m) => Rejected::new(Reason::NotYours, m),
        Refusal::Full(n) => Rejected::new(Reason::RunFull, format!("the run holds {n} miners, as many as it takes")),
        Refusal::DoesNotFit(m) => Rejected::new(Reason::DoesNotFit, m),
        // Answered as a reply, not a refusal (see `register`).
        q @ Refusal::Queued { .. } => Rejected::new(Reason::RunFull, q.to_string()),
    }
}

/// How long a presigned URL lives: long enough for a slow upload of a
/// large object, short enough that a leaked one is soon worthless.
pub const GRANT_TTL: std::time::Duration = std::time::Duration::from_secs(15 * 60);

fn mb(epoch: u64, shard: u32, first_sample: u64) -> MbRef {
    MbRef { epoch, shard, first_sample }
}

type CommandStream = Pin<Box<dyn Stream<Item = Result<pb::ServerSigned, Status>> + Send>>;

#[tonic::async_trait]
impl OrchestratorRpc for OrchestratorService {
    async fn hello(&self, req: Request<pb::HelloRequest>) -> Result<Response<pb::HelloReply>, Status> {
        // Unsigned, yet it costs a signature: within the source's budget.
        let source = req.remote_addr().map(|a| a.ip());
        self.limits.admit_request(source, now_ms()).map_err(|r| self.refuse(HELLO, r))?;
        Ok(Response::new(sign_hello(&self.id, self.verifier.audience().run_id, now_ms())))
    }

    async fn register(&self, req: Request<pb::Signed>) -> Result<Response<pb::ServerSigned>, Status> {
        let (source, env) = (req.remote_addr().map(|a| a.ip()), req.into_inner());
        let (peer, body): (PeerId, pb::RegisterRequest) = self.verify(REGISTER, source, &env)?;
        fields::register(&body).map_err(|r| self.refuse(REGISTER, r.from(peer)))?;
        self.limits.admit_identity(source, peer).map_err(|r| self.refuse(REGISTER, r.from(peer)))?;
        let validator = body.role() == pb::Role::Validator;
        let ev = if validator {
            Event::RegisterValidator { peer, device: body.device }
        } else {
            Event::Register {
                peer,
                addr: body.data_addr,
                tokens_per_s: body.tokens_per_s,
                device: body.device,
                memory: MemoryStated {
                    bytes: body.memory_bytes,
                    // Checked by `fields::register`.
                    compute: ComputeBackend::parse(&body.compute).unwrap_or_default(),
                },
            }
        };
        match self.apply(ev) {
            Ok(true) => {}
            Ok(false) => return Err(Status::unavailable("the orchestrator is stopping")),
            Err(r) => {
                // A full run queues the newcomer: a reply saying where, not a refusal.
                let queued = self.with_state(|o| {
                    let place = o.waitlist().position(&peer).filter(|_| r.reason == Reason::RunFull)?;
                    Some((o.queued_standing(place + 1, o.waitlist().len()), o.spec().run_id))
                });
                let Some((standing, run_id)) = queued else { return Err(self.refuse(REGISTER, r.from(peer))) };
                // Counted under its address's cap: one host fills no more of
                // the queue than of the run.
                self.limits.registered(source, peer);
                let reply = pb::RegisterReply { run_id, queued: Some(standing), ..Default::default() };
                return Ok(Response::new(self.signed(&peer, REGISTER, &env, &reply)));
            }
        }
        self.limits.registered(source, peer);
        self.prune_identities();
        let (index, run_id) = self.with_state(|o| (o.miner(&peer).map_or(0, |m| m.index), o.spec().run_id));
        if validator {
            info!(peer = %peer, "validator registered");
        } else {
            info!(peer = %peer, index, "miner registered");
        }
        let reply = pb::RegisterReply {
            miner_index: index,
            run_id,
            run_config_json: (*self.run_config_json).clone(),
            queued: None,
        };
        Ok(Response::new(self.signed(&peer, REGISTER, &env, &reply)))
    }

    async fn heartbeat(&self, req: Request<pb::Signed>) -> Result<Response<pb::ServerSigned>, Status> {
        let (source, env) = (req.remote_addr().map(|a| a.ip()), req.into_inner());
        let (peer, body): (PeerId, pb::HeartbeatRequest) = self.verify(HEARTBEAT, source, &env)?;
        fields::heartbeat(&body).map_err(|r| self.refuse(HEARTBEAT, r.from(peer)))?;
        let current = self.with_state(|o| o.epoch());
        fields::heartbeat_epoch(body.epoch, current).map_err(|r| self.refuse(HEARTBEAT, r.from(peer)))?;
        // `fields::heartbeat` checked the heads: this cannot fail.
        let commitments = iota_protocol::commitments_pb::from_pb(&body.commitments).unwrap_or_default();
        let ev = Event::Heartbeat { peer, tokens_per_s: body.tokens_per_s, in_flight: body.in_flight, commitments };
        self.apply_for(HEARTBEAT, peer, ev)?;
        let (epoch, phase, standing) = self.with_state(|o| (o.epoch(), o.phase().to_pb() as i32, o.standing(&peer)));
        Ok(Response::new(self.signed(&peer, HEARTBEAT, &env, &pb::HeartbeatReply { epoch, phase, standing })))
    }

    type SubscribeStream = CommandStream;

    async fn subscribe(&self, req: Request<pb::Signed>) -> Result<Response<CommandStream>, Status> {
        let (source, env) = (req.remote_addr().map(|a| a.ip()), req.into_inner());
        let (peer, _): (PeerId, pb::SubscribeRequest) = self.verify(SUBSCRIBE, source, &env)?;
        let (tx, rx) = mpsc::channel(STREAM_BUFFER);
        {
            let mut core = self.core.lock();
            if core.halted {
                return Err(Status::unavailable("the orchestrator is stopping"));
            }
            if core.orch.miner(&peer).is_none() && !core.orch.is_validator(&peer) {
                drop(core);
                let r = Rejected::new(Reason::NotRegistered, format!("peer {peer} must register first")).from(peer);
                return Err(self.refuse(SUBSCRIBE, r));
            }
            core.subscribers.insert(peer, Subscriber { tx, nonce: env.nonce, next_seq: 0 });
            // Whatever was queued for an earlier stream is superseded by
            // what the subscription itself brings (its assignment first).
            let queued = core.pending.remove(&peer).unwrap_or_default();
            let now = now_ms();
            let Core { orch, rng, .. } = &mut *core;
            let mut outs = orch.step(now, Event::Subscribed { peer }, rng).unwrap_or_default();
            // First subscription after a restart from saved state: tell the
            // miner where the run stands (the miner ignores a repeat of the
            // training phase it is already in).
            if core.catch_up.remove(&peer)
                && let Some(cmd) = core.orch.phase_for(&peer)
            {
                outs.push(Out { to: peer, cmd });
                // The merge's verdicts and stored slices sent before the
                // crash may have died in its buffers.
                outs.extend(core.orch.butterfly_catch_up(&peer));
            }
            core.deliver(outs);
            // A miner waiting for the next epoch (it restarted) takes no
            // routes: those queued for its last life were re-routed.
            let joining = core.orch.miner(&peer).is_some_and(|m| m.joining);
            for cmd in queued {
                if let Some(kind) = cmd.kind
                    && !matches!(kind, pb::command::Kind::Assign(_) | pb::command::Kind::Peers(_))
                    && !(joining && matches!(kind, pb::command::Kind::Route(_) | pb::command::Kind::Cancel(_)))
                {
                    core.deliver(vec![Out { to: peer, cmd: kind }]);
                }
            }
            core.persist(now, false);
        }
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn report(&self, req: Request<pb::Signed>) -> Result<Response<pb::Ack>, Status> {
        let (source, env) = (req.remote_addr().map(|a| a.ip()), req.into_inner());
        let (peer, body): (PeerId, pb::Report) = self.verify(REPORT, source, &env)?;
        fields::report(&body).map_err(|r| self.refuse(REPORT, r.from(peer)))?;
        let Some(kind) = body.kind else { unreachable!("fields::report refuses an empty report") };
        let ev = match kind {
            pb::report::Kind::Loss(l) => Event::Loss {
                peer,
                mb: mb(l.epoch, l.shard, l.first_sample),
                attempt: l.attempt,
                loss: l.loss,
                tokens: l.tokens,
            },
            pb::report::Kind::PeerFailed(f) => Event::PeerFailed {
                peer,
                mb: mb(f.epoch, f.shard, f.first_sample),
                attempt: f.attempt,
                named: PeerId(f.peer.as_slice().try_into().expect("fields::report checks 32 bytes")),
                failure: f.failure(),
            },
            pb::report::Kind::BackwardDone(b) => {
                Event::BackwardDone { peer, mb: mb(b.epoch, b.shard, b.first_sample), attempt: b.attempt }
            }
            pb::report::Kind::UploadDone(u) => Event::UploadDone {
                peer,
                epoch: u.epoch,
                stage: u.stage,
                key: u.key,
                work: u.micro_batches,
                object: u.object.map(|o| self.announced(peer, &o)).transpose()?,
                // Checked by `fields::report`.
                commitments: iota_protocol::commitments_pb::from_pb(&u.commitments).unwrap_or_default(),
            },
            pb::report::Kind::MergeDone(m) => Event::MergeDone {
                peer,
                epoch: m.epoch,
                stage: m.stage,
                key: m.key,
                weights_hash: m.weights_hash,
                object: m.object.map(|o| self.announced(peer, &o)).transpose()?,
                from_store: (m.contributions_from_store, m.updates_from_store),
            },
            pb::report::Kind::Stored(st) => Event::Stored {
                peer,
                epoch: st.epoch,
                stage: st.stage,
                object: self.announced(peer, &st.object.unwrap_or_default())?,
            },
            pb::report::Kind::BadObject(b) => {
                let object = StoredObject::from_pb(&b.object.unwrap_or_default(), None)
                    .map_err(|e| self.refuse(REPORT, Rejected::new(Reason::InvalidField, e).from(peer)))?;
                warn!(
                    key = %object.key,
                    writer = %object.writer,
                    reporter = %peer,
                    reason = %b.reason,
                    "a reader found a store object that does not match its announcement"
                );
                Event::BadObject { peer, epoch: b.epoch, stage: b.stage, object, reason: b.reason }
            }
            pb::report::Kind::SliceDone(d) => Event::SliceDone {
                peer,
                epoch: d.epoch,
                stage: d.stage,
                partition: d.partition,
                generation: d.generation,
                hash: d.hash,
                contributions: d.contributions,
                // 32 bytes each: `fields::report` checked.
                flagged: d.flagged.iter().filter_map(|f| <[u8; 32]>::try_from(f.as_slice()).ok().map(PeerId)).collect(),
            },
            pb::report::Kind::ContributionsMissing(m) => Event::ContributionsMissing {
                peer,
                epoch: m.epoch,
                stage: m.stage,
                partition: m.partition,
                generation: m.generation,
                // 32 bytes each: `fields::report` checked.
                senders: m.senders.iter().filter_map(|s| <[u8; 32]>::try_from(s.as_slice()).ok().map(PeerId)).collect(),
            },
        };
        self.apply_for(REPORT, peer, ev)?;
        Ok(Response::new(pb::Ack {}))
    }

    async fn grant(&self, req: Request<pb::Signed>) -> Result<Response<pb::ServerSigned>, Status> {
        let (source, env) = (req.remote_addr().map(|a| a.ip()), req.into_inner());
        let (peer, body): (PeerId, pb::GrantRequest) = self.verify(GRANT, source, &env)?;
        fields::grant(&body).map_err(|r| self.refuse(GRANT, r.from(peer)))?;
        let Some(store) = self.presigner.clone() else {
            let r = Rejected::new(
                Reason::Refused,
                "this run's object store is a directory on the orchestrator's machine: miners open it with --store",
            );
            return Err(self.refuse(GRANT, r.from(peer)));
        };
        // Every ask is checked before anything is signed: one that is not
        // the caller's refuses the whole request.
        self.with_state(|o| {
            body.asks.iter().try_for_each(|a| match a.access() {
                pb::Access::Put => o.may_write(peer, &a.key),
                pb::Access::List => o.may_list(peer, &a.key),
                _ => o.may_read(peer, &a.key),
            })
        })
        .map_err(|e| self.refuse(GRANT, rejected(e).from(peer)))?;
        let grants = store
            .grants(body.asks, GRANT_TTL)
            .await
            .map_err(|e| Status::unavailable(format!("the object store: {e}")))?;
        Ok(Response::new(self.signed(&peer, GRANT, &env, &pb::GrantReply { grants })))
    }

    async fn validate(&self, req: Request<pb::Signed>) -> Result<Response<pb::Ack>, Status> {
        let (source, env) = (req.remote_addr().map(|a| a.ip()), req.into_inner());
        let (peer, body): (PeerId, pb::ValidatorReport) = self.verify(VALIDATE, source, &env)?;
        fields::validator_report(&body).map_err(|r| self.refuse(VALIDATE, r.from(peer)))?;
        if !self.with_state(|o| o.is_validator(&peer)) {
            let r = Rejected::new(Reason::WrongRole, format!("peer {peer} is not a registered validator of this run"));
            return Err(self.refuse(VALIDATE, r.from(peer)));
        }
        let Some(kind) = body.kind else { unreachable!("fields::validator_report refuses an empty report") };
        let step_proof = crate::step_referee::named_proof(&kind);
        // The whole signed request rides along: verdicts and weights stay
        // checkable against the validator's key.
        let mut ev = validator_report_event(peer, kind, prost::Message::encode_to_vec(&env));
        if let Some((epoch, miner, hash)) = step_proof {
            let inputs = self.with_state(|o| o.step_referee_inputs(epoch, &miner));
            let held = crate::step_referee::recheck(self.referee.clone(), inputs, (epoch, peer, miner), hash);
            let held = held.await.map_err(|why| {
                let r = Rejected::new(Reason::Refused, format!("the verdict's step proof does not hold: {why}"));
                self.refuse(VALIDATE, r.from(peer))
            })?;
            if let (true, Event::Verdict(v)) = (held, &mut ev) {
                v.step_proven = Some(hash);
            }
        }
        self.apply_for(VALIDATE, peer, ev)?;
        Ok(Response::new(pb::Ack {}))
    }

    async fn status(&self, req: Request<pb::Signed>) -> Result<Response<pb::RunStatus>, Status> {
        let _: (PeerId, pb::StatusRequest) = self.verify(STATUS, req.remote_addr().map(|a| a.ip()), req.get_ref())?;
        let now = now_ms();
        let mut st = self.with_state(|o| {
            let mut st = o.status();
            st.validators = o.validators_live(now) as u32;
            st
        });
        st.refusals = self.audit.counts().into_iter().collect();
        Ok(Response::new(st))
    }
}
