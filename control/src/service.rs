//! The gRPC shell around the orchestrator state machine.
//!
//! Every RPC: verify the signed envelope (`auth`), turn the body into an
//! `Event`, step the state machine, and deliver the resulting commands to the
//! miners' `Subscribe` streams (queued while a miner is not subscribed). A
//! background task feeds clock ticks. The state is saved to the `StateDb` when
//! the epoch or phase changes, and at most every `SAVE_EVERY_MS` otherwise.

use std::collections::{HashMap, HashSet, VecDeque};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use iota_core::{PeerId, Rng};
use parking_lot::Mutex;
use tokio::sync::mpsc;
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};
use tracing::{info, warn};

use iota_protocol::MbRef;
use iota_protocol::auth::{AuthPolicy, Verifier, now_ms};
use iota_protocol::pb::{self, orchestrator_server::Orchestrator as OrchestratorRpc};

use crate::orchestrator::{Event, Orchestrator, Out, Phase, Refusal};
use crate::state_db::StateDb;

const SAVE_EVERY_MS: u64 = 2_000;
/// Commands kept for a miner that is not listening (it catches up on subscribe).
const MAX_PENDING: usize = 100_000;
const STREAM_BUFFER: usize = 4096;

pub const TICK: Duration = Duration::from_millis(100);

struct Core {
    orch: Orchestrator,
    rng: Rng,
    subscribers: HashMap<PeerId, mpsc::Sender<Result<pb::Command, Status>>>,
    pending: HashMap<PeerId, VecDeque<pb::Command>>,
    store: Option<StateDb>,
    saved: (u64, Phase, u64),
    /// Miners of a run restored from saved state that have not subscribed
    /// since: each is told the current phase when it does.
    catch_up: HashSet<PeerId>,
}

impl Core {
    fn deliver(&mut self, outs: Vec<Out>) {
        for Out { to, cmd } in outs {
            let cmd = pb::Command { kind: Some(cmd) };
            let queue = self.pending.entry(to).or_default();
            if queue.is_empty()
                && let Some(tx) = self.subscribers.get(&to)
            {
                match tx.try_send(Ok(cmd)) {
                    Ok(()) => continue,
                    Err(mpsc::error::TrySendError::Full(Ok(c))) | Err(mpsc::error::TrySendError::Closed(Ok(c))) => {
                        queue.push_back(c);
                    }
                    Err(_) => {}
                }
            } else {
                queue.push_back(cmd);
            }
            if queue.len() > MAX_PENDING {
                queue.pop_front();
                warn!(peer = %to, "command queue overflow; dropping the oldest command");
            }
        }
        self.flush();
    }

    /// Moves queued commands into subscribers' streams while they have room.
    fn flush(&mut self) {
        for (peer, queue) in self.pending.iter_mut() {
            let Some(tx) = self.subscribers.get(peer) else {
                continue;
            };
            while let Some(c) = queue.pop_front() {
                match tx.try_send(Ok(c)) {
                    Ok(()) => {}
                    Err(mpsc::error::TrySendError::Full(Ok(c))) | Err(mpsc::error::TrySendError::Closed(Ok(c))) => {
                        queue.push_front(c);
                        break;
                    }
                    Err(_) => break,
                }
            }
        }
    }

    fn persist(&mut self, now: u64, force: bool) {
        let key = (self.orch.epoch(), self.orch.phase().clone());
        let changed = (key.0, key.1.clone()) != (self.saved.0, self.saved.1.clone());
        if !(force || changed || now.saturating_sub(self.saved.2) >= SAVE_EVERY_MS) {
            return;
        }
        if let Some(store) = self.store.as_mut() {
            match store.save(&self.orch, now) {
                Ok(()) => self.saved = (key.0, key.1, now),
                Err(e) => warn!(error = %e, "saving orchestrator state failed"),
            }
        }
    }
}

/// The orchestrator service (cheap to clone).
#[derive(Clone)]
pub struct OrchestratorService {
    core: Arc<Mutex<Core>>,
    verifier: Arc<Verifier>,
    run_config_json: Arc<String>,
}

impl OrchestratorService {
    /// `store`: where state is saved; a state already in it wins over `orch`
    /// (the run resumes).
    pub fn new(
        orch: Orchestrator,
        store: Option<StateDb>,
        run_config_json: String,
        policy: AuthPolicy,
    ) -> anyhow::Result<Self> {
        let mut catch_up = HashSet::new();
        let orch = match store.as_ref().map(|s| s.load()).transpose()?.flatten() {
            Some(saved) if saved.spec().run_id == orch.spec().run_id => {
                info!(epoch = saved.epoch(), phase = ?saved.phase(), "resuming run from saved state");
                catch_up = saved.miners().map(|m| m.peer).collect();
                saved
            }
            Some(saved) => {
                anyhow::bail!("the state database holds run {}, not run {}", saved.spec().run_id, orch.spec().run_id)
            }
            None => orch,
        };
        let rng = Rng::derived(orch.spec().run_id, &[orch.epoch(), now_ms()]);
        let core = Core {
            saved: (u64::MAX, Phase::Waiting, 0),
            orch,
            rng,
            subscribers: HashMap::new(),
            pending: HashMap::new(),
            store,
            catch_up,
        };
        Ok(OrchestratorService {
            core: Arc::new(Mutex::new(core)),
            verifier: Arc::new(Verifier::new(policy)),
            run_config_json: Arc::new(run_config_json),
        })
    }

    /// Steps the state machine with `ev` now and delivers the commands.
    pub fn apply(&self, ev: Event) -> Result<(), Status> {
        let now = now_ms();
        let mut core = self.core.lock();
        let Core { orch, rng, .. } = &mut *core;
        let outs = orch.step(now, ev, rng).map_err(|e| match e {
            Refusal::Unknown(p) => Status::failed_precondition(format!("peer {p} must register first")),
            Refusal::Invalid(m) => Status::invalid_argument(m),
        })?;
        core.deliver(outs);
        core.persist(now, false);
        Ok(())
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

    fn verify<M: prost::Message + Default>(
        &self,
        method: &str,
        req: Request<pb::Signed>,
    ) -> Result<(PeerId, M), Status> {
        self.verifier.verify(method, req.get_ref(), now_ms())
    }
}

fn mb(epoch: u64, shard: u32, first_sample: u64) -> MbRef {
    MbRef { epoch, shard, first_sample }
}

type CommandStream = Pin<Box<dyn Stream<Item = Result<pb::Command, Status>> + Send>>;

#[tonic::async_trait]
impl OrchestratorRpc for OrchestratorService {
    async fn register(&self, req: Request<pb::Signed>) -> Result<Response<pb::RegisterReply>, Status> {
        let (peer, body): (PeerId, pb::RegisterRequest) = self.verify("/iota.v1.Orchestrator/Register", req)?;
        if body.role != pb::Role::Miner as i32 {
            return Err(Status::invalid_argument("only miners register with the orchestrator for now"));
        }
        if !body.tokens_per_s.is_finite() || body.tokens_per_s < 0.0 {
            return Err(Status::invalid_argument("tokens_per_s must be a non-negative number"));
        }
        self.apply(Event::Register {
            peer,
            addr: body.data_addr,
            tokens_per_s: body.tokens_per_s,
            device: body.device,
        })?;
        let (index, run_id) = self.with_state(|o| (o.miner(&peer).map_or(0, |m| m.index), o.spec().run_id));
        info!(peer = %peer, index, "miner registered");
        Ok(Response::new(pb::RegisterReply {
            miner_index: index,
            run_id,
            run_config_json: (*self.run_config_json).clone(),
        }))
    }

    async fn heartbeat(&self, req: Request<pb::Signed>) -> Result<Response<pb::HeartbeatReply>, Status> {
        let (peer, body): (PeerId, pb::HeartbeatRequest) = self.verify("/iota.v1.Orchestrator/Heartbeat", req)?;
        let tps = if body.tokens_per_s.is_finite() { body.tokens_per_s.max(0.0) } else { 0.0 };
        self.apply(Event::Heartbeat { peer, tokens_per_s: tps, in_flight: body.in_flight })?;
        let (epoch, phase) = self.with_state(|o| (o.epoch(), o.phase().to_pb() as i32));
        Ok(Response::new(pb::HeartbeatReply { epoch, phase }))
    }

    type SubscribeStream = CommandStream;

    async fn subscribe(&self, req: Request<pb::Signed>) -> Result<Response<CommandStream>, Status> {
        let (peer, _): (PeerId, pb::SubscribeRequest) = self.verify("/iota.v1.Orchestrator/Subscribe", req)?;
        let (tx, rx) = mpsc::channel(STREAM_BUFFER);
        {
            let mut core = self.core.lock();
            if core.orch.miner(&peer).is_none() {
                return Err(Status::failed_precondition(format!("peer {peer} must register first")));
            }
            core.subscribers.insert(peer, tx);
            // First subscription after a restart from saved state: tell the
            // miner where the run stands (the miner ignores a repeat of the
            // training phase it is already in).
            if core.catch_up.remove(&peer)
                && let Some(cmd) = core.orch.phase_for(&peer)
            {
                core.deliver(vec![Out { to: peer, cmd }]);
            }
            core.flush();
        }
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn report(&self, req: Request<pb::Signed>) -> Result<Response<pb::Ack>, Status> {
        let (peer, body): (PeerId, pb::Report) = self.verify("/iota.v1.Orchestrator/Report", req)?;
        let ev = match body.kind.ok_or_else(|| Status::invalid_argument("empty report"))? {
            pb::report::Kind::Loss(l) => Event::Loss {
                peer,
                mb: mb(l.epoch, l.shard, l.first_sample),
                attempt: l.attempt,
                loss: l.loss,
                tokens: l.tokens,
            },
            pb::report::Kind::BackwardDone(b) => {
                Event::BackwardDone { peer, mb: mb(b.epoch, b.shard, b.first_sample), attempt: b.attempt }
            }
            pb::report::Kind::UploadDone(u) => {
                Event::UploadDone { peer, epoch: u.epoch, stage: u.stage, key: u.key, work: u.micro_batches }
            }
            pb::report::Kind::MergeDone(m) => {
                Event::MergeDone { peer, epoch: m.epoch, stage: m.stage, key: m.key, weights_hash: m.weights_hash }
            }
            pb::report::Kind::SliceDone(d) => Event::SliceDone {
                peer,
                epoch: d.epoch,
                stage: d.stage,
                partition: d.partition,
                generation: d.generation,
                hash: d.hash,
            },
        };
        self.apply(ev)?;
        Ok(Response::new(pb::Ack {}))
    }

    async fn status(&self, req: Request<pb::Signed>) -> Result<Response<pb::RunStatus>, Status> {
        let _: (PeerId, pb::StatusRequest) = self.verify("/iota.v1.Orchestrator/Status", req)?;
        Ok(Response::new(self.with_state(|o| o.status())))
    }
}
