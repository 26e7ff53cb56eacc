//! Helpers for the workspace integration tests: an in-process swarm (an
//! orchestrator served over gRPC on 127.0.0.1 and miners as tasks, talking
//! QUIC to each other).

pub mod fuzz_bodies;
pub mod fuzz_config;
pub mod fuzz_input;
pub mod fuzz_orchestrator;
pub mod fuzz_sparse;
pub mod liveness;
pub mod netns;
pub mod postgres;
pub mod s3;
pub mod udp_relay;
pub mod validation;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use iota_control::orchestrator::Orchestrator;
use iota_control::service::OrchestratorService;
use iota_control::state_db::{StateDb, StateLocation};
use iota_core::{Identity, ModelConfig, ParamLayout, StageSpec, WireCodec};
use iota_dataplane::miner::{self, MinerOptions, MinerSummary};
use iota_model::data::TokenizerKind;
use iota_model::optim::{AdamWConfig, LrSchedule};
use iota_model::train::TrainConfig;
use iota_protocol::auth::AuthPolicy;
use iota_protocol::pb::orchestrator_server::OrchestratorServer;
use iota_protocol::{MergeSpec, RunConfig, RunSpec};

/// A `tiny` run on the generated corpus.
pub fn tiny_run(stages: u32, replicas: u32, epochs: u64, per_epoch: u64, codec: WireCodec) -> RunConfig {
    tiny_run_batch(stages, replicas, epochs, per_epoch, codec, 4)
}

/// `tiny_run` with `batch` sequences of 64 tokens per micro-batch.
pub fn tiny_run_batch(
    stages: u32,
    replicas: u32,
    epochs: u64,
    per_epoch: u64,
    codec: WireCodec,
    batch: usize,
) -> RunConfig {
    let mut model = ModelConfig::preset("tiny").unwrap();
    if codec == WireCodec::F32 {
        model.bottleneck = 0;
    }
    let (seq, accum) = (64usize, 1usize);
    let steps = epochs * per_epoch / (replicas as u64 * accum as u64);
    let train = TrainConfig {
        model,
        tokenizer: TokenizerKind::Byte,
        stages: stages as usize,
        batch,
        seq,
        grad_accum: accum,
        steps,
        schedule: LrSchedule { peak: 3e-3, warmup: 5, total: steps, min_ratio: 0.1 },
        adamw: AdamWConfig::default(),
        codec,
        seed: 11,
    };
    let spec = RunSpec {
        run_id: 99,
        stages,
        replicas,
        epochs,
        micro_batches_per_epoch: per_epoch,
        batch: batch as u32,
        n_shards: 0,
        max_in_flight: 2 * replicas,
        route_timeout_ms: 5_000,
        heartbeat_timeout_ms: 3_000,
        max_attempts: 4,
        phase_timeout_ms: 20_000,
        // The swarm's default: butterfly, bf16 slices, centered clipping, plain averaging.
        merge: MergeSpec::butterfly(),
        ..RunSpec::default()
    };
    let mut cfg = RunConfig { max_shards: 16, ..RunConfig::new(spec, train) };
    cfg.spec.merge.stage_params = StageSpec::split(&cfg.train.model, stages as usize)
        .unwrap()
        .iter()
        .map(|s| ParamLayout::for_stage(&cfg.train.model, s).total() as u64)
        .collect();
    iota_dataplane::corpus::fix_shards(&mut cfg, None).unwrap();
    cfg
}

pub struct Swarm {
    pub service: OrchestratorService,
    pub url: String,
    /// The orchestrator runs on its own runtime, so "crashing" it (dropping
    /// the runtime) ends every task it had, connections included.
    rt: Option<tokio::runtime::Runtime>,
    pub db: PathBuf,
    /// Where the state is kept: `db` (SQLite), or a PostgreSQL URL.
    state: StateLocation,
}

impl Drop for Swarm {
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

/// The test orchestrator's identity (the same across a restart, as a real
/// orchestrator keeps its key file).
pub fn orchestrator_identity() -> Arc<Identity> {
    Arc::new(Identity::from_seed([0x0c; 32]))
}

/// What re-checks step proofs for a swarm whose store is beside its state
/// database `db` (as the miners' and validators' is).
fn local_referee(cfg: &RunConfig, db: &std::path::Path) -> iota_control::step_referee::StepReferee {
    let dir = db.with_file_name("store");
    std::fs::create_dir_all(&dir).unwrap();
    let store =
        iota_dataplane::local_store::LocalDirStore::shared(&dir, iota_dataplane::fileio::FileIo::start(false)).unwrap();
    iota_control::step_referee::StepReferee::new(store, cfg.clone(), None)
}

impl Swarm {
    /// Starts an orchestrator for `cfg` (state in `db`), re-checking
    /// validators' step proofs from the store beside it.
    pub async fn start(cfg: &RunConfig, db: PathBuf) -> Swarm {
        let referee = local_referee(cfg, &db);
        Self::start_with(cfg, db, move |s| s.with_referee(referee)).await
    }

    /// Starts an orchestrator that grants miners presigned URLs on `bucket`.
    pub async fn start_on_bucket(cfg: &RunConfig, db: PathBuf, bucket: Arc<iota_control::s3_store::S3Store>) -> Swarm {
        Self::start_with(cfg, db, move |s| s.with_s3(bucket)).await
    }

    /// Starts an orchestrator that serves its store (the directory beside
    /// `db`) itself, over TLS with its identity certificate, as
    /// `iota-control orchestrator` does for a run with no bucket.
    pub async fn start_served(cfg: &RunConfig, db: PathBuf) -> Swarm {
        use iota_control::served_store::{ServedStore, serve};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let base = format!("https://{}", listener.local_addr().unwrap());
        let id = orchestrator_identity();
        let store = Arc::new(ServedStore::new(&db.with_file_name("store"), &id, base).unwrap());
        let referee = local_referee(cfg, &db);
        let served = store.clone();
        let swarm = Self::start_with(cfg, db, move |s| s.with_referee(referee).with_served_store(served)).await;
        let tls = Arc::new(iota_protocol::store_tls::server_config(&id).unwrap());
        swarm.rt.as_ref().expect("a running swarm").spawn(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            serve(listener, Some(tls), store, iota_control::service::GRANT_TTL);
        });
        swarm
    }

    /// Starts an orchestrator whose service `change` adjusts first (an S3
    /// store for grants, say).
    pub async fn start_with(
        cfg: &RunConfig,
        db: PathBuf,
        change: impl FnOnce(OrchestratorService) -> OrchestratorService,
    ) -> Swarm {
        let state = StateLocation::Sqlite(db.clone());
        Self::start_at(cfg, db, state, change).await
    }

    /// Starts an orchestrator whose state is in the PostgreSQL database at
    /// `url` (`dir` holds the object store).
    pub async fn start_on_postgres(cfg: &RunConfig, dir: &std::path::Path, url: &str) -> Swarm {
        let state = StateLocation::Postgres(url.to_string());
        let referee = local_referee(cfg, &dir.join("state.sqlite"));
        Self::start_at(cfg, dir.join("state.sqlite"), state, move |s| s.with_referee(referee)).await
    }

    async fn start_at(
        cfg: &RunConfig,
        db: PathBuf,
        state: StateLocation,
        change: impl FnOnce(OrchestratorService) -> OrchestratorService,
    ) -> Swarm {
        // IOTA_TEST_LOG=1 (with RUST_LOG as usual) shows the miners' and
        // orchestrator's logs, for chasing a failure.
        if std::env::var_os("IOTA_TEST_LOG").is_some() {
            iota_dataplane::init_logging();
        }
        let service = OrchestratorService::new(
            Orchestrator::new(cfg.spec.clone()).unwrap(),
            Some(StateDb::open_at(&state, cfg.spec.run_id).unwrap()),
            cfg.to_json(),
            AuthPolicy::default(),
            orchestrator_identity(),
        )
        .unwrap();
        Self::serve(change(service), db, state, None).await
    }

    async fn serve(
        service: OrchestratorService,
        db: PathBuf,
        state: StateLocation,
        addr: Option<std::net::SocketAddr>,
    ) -> Swarm {
        let listener = std::net::TcpListener::bind(addr.unwrap_or("127.0.0.1:0".parse().unwrap())).unwrap();
        listener.set_nonblocking(true).unwrap();
        // TLS with the orchestrator's identity certificate, as in production.
        let url = format!("https://{}", listener.local_addr().unwrap());
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let svc = service.clone();
        let tls = Arc::new(iota_protocol::tls_identity::server_config(service.identity()).unwrap());
        rt.spawn(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            let _ = tonic::transport::Server::builder()
                .http2_keepalive_interval(Some(iota_protocol::client::KEEPALIVE_INTERVAL))
                .http2_keepalive_timeout(Some(iota_protocol::client::KEEPALIVE_TIMEOUT))
                .add_service(OrchestratorServer::new(svc))
                .serve_with_incoming(iota_control::tls_server::incoming(listener, tls))
                .await;
        });
        let ticker_svc = service.clone();
        rt.spawn(async move {
            ticker_svc.spawn_ticker().await.ok();
        });
        Swarm { service, url, rt: Some(rt), db, state }
    }

    /// Kills the orchestrator (no clean shutdown) and starts a new one from
    /// its database on the same address.
    pub async fn restart(mut self, cfg: &RunConfig) -> Swarm {
        let addr: std::net::SocketAddr = self.url.trim_start_matches("https://").parse().unwrap();
        // As a killed process would: nothing it was serving saves or sends
        // once the new one may have loaded the state.
        self.service.halt();
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
        let (db, state) = (self.db.clone(), self.state.clone());
        drop(self);
        let service = OrchestratorService::new(
            Orchestrator::new(cfg.spec.clone()).unwrap(),
            Some(StateDb::open_at(&state, cfg.spec.run_id).unwrap()),
            cfg.to_json(),
            AuthPolicy::default(),
            orchestrator_identity(),
        )
        .unwrap();
        // The port may take a moment to be free again.
        for _ in 0..50 {
            if std::net::TcpListener::bind(addr).is_ok() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        Self::serve(service, db, state, Some(addr)).await
    }

    /// The first miner to register, once one has (a test starts its
    /// adversary first and waits for it here, so it knows who that is).
    pub async fn first_registered(&self) -> iota_core::PeerId {
        for _ in 0..1000 {
            if let Some(p) = self.service.with_state(|o| o.miners().next().map(|m| m.peer)) {
                return p;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        panic!("no miner registered within 10 s");
    }

    /// Starts a miner task.
    pub fn miner(&self, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<anyhow::Result<MinerSummary>> {
        self.miner_with(|_| {}, stop)
    }

    /// Starts a miner task with changed options (fault injection).
    pub fn miner_with(
        &self,
        change: impl FnOnce(&mut MinerOptions),
        stop: Arc<AtomicBool>,
    ) -> tokio::task::JoinHandle<anyhow::Result<MinerSummary>> {
        self.miner_as(Identity::generate(), change, stop)
    }

    /// `miner_with`, under identity `id` (a test that must know a miner's
    /// peer id before it runs: an accomplice's, say).
    pub fn miner_as(
        &self,
        id: Identity,
        change: impl FnOnce(&mut MinerOptions),
        stop: Arc<AtomicBool>,
    ) -> tokio::task::JoinHandle<anyhow::Result<MinerSummary>> {
        let mut opts = MinerOptions::local(self.url.clone());
        opts.orchestrator_key = Some(self.service.identity().peer_id());
        // The store beside the state database, as a run directory holds it.
        opts.store = Some(self.db.with_file_name("store"));
        change(&mut opts);
        tokio::spawn(miner::run(opts, id, stop))
    }

    /// Waits until `n` miners have registered (10 s at most).
    pub async fn registered(&self, n: usize) {
        for _ in 0..1000 {
            if self.service.with_state(|o| o.miners().count() >= n) {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        panic!("{n} miners never registered within 10 s");
    }

    /// Starts a validator task with identity `id` (which `cfg` must list
    /// with a stake: see [`with_validators`]).
    pub fn validator(
        &self,
        id: Identity,
        seed: u64,
        stop: Arc<AtomicBool>,
    ) -> tokio::task::JoinHandle<anyhow::Result<iota_control::validator::ValidatorSummary>> {
        self.validator_with(id, seed, |_| {}, stop)
    }

    /// Starts a validator task with changed options (a dishonest one).
    pub fn validator_with(
        &self,
        id: Identity,
        seed: u64,
        change: impl FnOnce(&mut iota_control::validator::ValidatorOptions),
        stop: Arc<AtomicBool>,
    ) -> tokio::task::JoinHandle<anyhow::Result<iota_control::validator::ValidatorSummary>> {
        let mut opts = iota_control::validator::ValidatorOptions::local(self.url.clone(), seed);
        opts.orchestrator_key = Some(self.service.identity().peer_id());
        opts.store = Some(self.db.with_file_name("store"));
        change(&mut opts);
        tokio::spawn(iota_control::validator::run(opts, id, stop))
    }
}

/// `n` validator identities, listed in `cfg` with equal stakes.
pub fn with_validators(cfg: &mut RunConfig, n: u8) -> Vec<Identity> {
    let ids: Vec<Identity> = (0..n).map(|i| Identity::from_seed([0xa0 + i; 32])).collect();
    cfg.spec.validation.validators =
        ids.iter().map(|id| iota_protocol::ValidatorStake { peer: id.peer_id(), stake: 100 }).collect();
    ids
}
