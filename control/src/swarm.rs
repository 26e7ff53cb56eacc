//! The local swarm: an orchestrator in this process and S x R `iota-miner`
//! processes on loopback, with one progress bar and a summary at the end.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use indicatif::{ProgressBar, ProgressStyle};
use tokio::process::{Child, Command};
use tokio_stream::wrappers::TcpListenerStream;

use iota_core::PeerId;
use iota_protocol::RunConfig;
use iota_protocol::auth::AuthPolicy;
use iota_protocol::pb::orchestrator_server::OrchestratorServer;

use crate::orchestrator::{EpochSummary, Orchestrator, PayoutRow, Phase};
use crate::service::OrchestratorService;
use crate::state_db::StateDb;
pub use crate::swarm_summary::{print_payouts, print_summary, stage_compute_seconds, wire_bytes_per_token};

pub struct SwarmOptions {
    pub cfg: RunConfig,
    /// Where the miners read the corpus (None: the generated toy corpus).
    pub data: Option<PathBuf>,
    /// The object store directory every miner shares (None: the bucket).
    pub store: Option<PathBuf>,
    /// The run's bucket, when its objects live in one.
    pub bucket: Option<std::sync::Arc<crate::s3_store::S3Store>>,
    pub run_dir: PathBuf,
    /// Where the orchestrator's gRPC listens.
    pub listen: SocketAddr,
    /// Where to serve Prometheus metrics (None: nowhere).
    pub metrics: Option<SocketAddr>,
    /// Where to serve the web dashboard (None: nowhere).
    pub dashboard: Option<SocketAddr>,
    /// How the miners write their logs (RUN_DIR/logs/miner-K.log).
    pub log_format: iota_dataplane::LogFormat,
    pub miner_bin: PathBuf,
    pub threads_per_miner: usize,
    /// `--device` of every miner process (cpu, cuda, cuda:N); the miner validates it.
    pub miner_device: String,
    /// Validators to run in this process (the run lists them).
    pub validators: Vec<iota_core::Identity>,
    /// Test tool: (miner index, adversary mode) pairs.
    pub adversaries: Vec<(u32, String)>,
    /// More `iota-miner run` arguments for every miner (a benchmark's
    /// `--memory-gib 16`, say, to run as on a 16 GB card).
    pub extra_miner_args: Vec<String>,
}

impl SwarmOptions {
    /// A swarm on this machine, as the benchmarks run it: orchestrator on
    /// loopback, one thread per miner process on `miner_device`, no
    /// operator pages, validators or adversaries, objects in `store`.
    pub fn on_this_machine(
        cfg: RunConfig,
        data: Option<PathBuf>,
        store: PathBuf,
        run_dir: PathBuf,
        miner_bin: PathBuf,
        miner_device: &str,
    ) -> SwarmOptions {
        let miners = (cfg.spec.stages * cfg.spec.replicas) as usize;
        SwarmOptions {
            cfg,
            data,
            store: Some(store),
            bucket: None,
            run_dir,
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            metrics: None,
            dashboard: None,
            log_format: Default::default(),
            threads_per_miner: default_threads_per_miner(miner_device, miners),
            miner_bin,
            miner_device: miner_device.to_string(),
            validators: Vec::new(),
            adversaries: Vec::new(),
            extra_miner_args: Vec::new(),
        }
    }
}

pub struct SwarmReport {
    pub history: Vec<EpochSummary>,
    pub completed: u64,
    pub rerouted: u64,
    pub dropped: u64,
    pub tokens: u64,
    pub elapsed: Duration,
    pub interrupted: bool,
    pub validators: usize,
    pub convictions: u64,
    pub ejected: u64,
    pub guilty_votes: u64,
    /// Every miner's work and pay, most paid first.
    pub payouts: Vec<PayoutRow>,
    /// What the validators (or the operator) were paid: (identity, emission).
    pub validator_pay: Vec<(PeerId, f64)>,
    /// Epochs settled (each one a ledger entry).
    pub settled_epochs: u64,
    /// The finished model's folder, or why there is none.
    pub model: std::result::Result<PathBuf, String>,
    /// Every miner: (peer, stage, device, micro-batches delivered, mean
    /// tokens/s over the run's training time, as the orchestrator counted).
    pub miners: Vec<(PeerId, u32, String, u64, f64)>,
    /// Bytes the miners' transports sent across stage boundaries
    /// (activations and their gradients, framing included), counted on the
    /// wire; None when a miner left no totals.
    pub boundary_bytes: Option<u64>,
    /// Butterfly slices read from the object store instead of the data
    /// plane: (contributions, merged updates).
    pub merge_from_store: (u64, u64),
    /// The orchestrator's counters at the end (phase times among them).
    pub counters: crate::orchestrator::Counters,
    /// Every miner process's wire totals and peaks, by launch index (None:
    /// it left none).
    pub miner_totals: Vec<Option<iota_dataplane::stats::WireTotals>>,
}

/// Starts the orchestrator's gRPC server; returns its URL: `https://` with
/// the orchestrator's identity certificate, or `http://` when `plaintext`
/// (`--insecure-plaintext`, local tests).
pub async fn serve(
    svc: OrchestratorService,
    listen: SocketAddr,
    plaintext: bool,
) -> Result<(String, tokio::task::JoinHandle<()>)> {
    let tls = if plaintext { None } else { Some(iota_protocol::tls_identity::server_config(svc.identity())?) };
    serve_with(svc, listen, tls).await
}

/// Serves `svc` on `listen` with `tls` (an operator's CA-issued
/// certificate, say), or plaintext when None; its URL and the server task.
pub async fn serve_with(
    svc: OrchestratorService,
    listen: SocketAddr,
    tls: Option<rustls::ServerConfig>,
) -> Result<(String, tokio::task::JoinHandle<()>)> {
    let listener =
        tokio::net::TcpListener::bind(listen).await.with_context(|| format!("binding the orchestrator on {listen}"))?;
    let addr = listener.local_addr()?;
    let server = tonic::transport::Server::builder()
        // Pings find subscribers that vanished without closing, so their
        // streams (and the commands queued on them) do not linger.
        .http2_keepalive_interval(Some(iota_protocol::client::KEEPALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(iota_protocol::client::KEEPALIVE_TIMEOUT))
        .add_service(OrchestratorServer::new(svc.clone()));
    let (url, task) = if let Some(tls) = tls {
        let incoming = crate::tls_server::incoming(listener, std::sync::Arc::new(tls));
        (format!("https://{addr}"), tokio::spawn(async move { report(server.serve_with_incoming(incoming).await) }))
    } else {
        let incoming = TcpListenerStream::new(listener);
        (format!("http://{addr}"), tokio::spawn(async move { report(server.serve_with_incoming(incoming).await) }))
    };
    Ok((url, task))
}

fn report(r: Result<(), tonic::transport::Error>) {
    if let Err(e) = r {
        tracing::error!(error = %e, "orchestrator server stopped");
    }
}

/// Opens (or resumes) the run's orchestrator state in `run_dir`, with the
/// orchestrator identity kept in `run_dir/keys/orchestrator.key` (made on
/// first use; miners pin its public half).
pub fn orchestrator(cfg: &RunConfig, run_dir: &std::path::Path, policy: AuthPolicy) -> Result<OrchestratorService> {
    orchestrator_at(cfg, run_dir, &crate::state_db::StateLocation::Sqlite(run_dir.join("state.sqlite")), policy)
}

/// `orchestrator` with its state at `state` (SQLite or PostgreSQL).
pub fn orchestrator_at(
    cfg: &RunConfig,
    run_dir: &std::path::Path,
    state: &crate::state_db::StateLocation,
    policy: AuthPolicy,
) -> Result<OrchestratorService> {
    let store = StateDb::open_at(state, cfg.spec.run_id)?;
    let id = iota_dataplane::identity_file::load_or_create(&run_dir.join("keys").join("orchestrator.key"))?;
    OrchestratorService::new(
        Orchestrator::new(cfg.spec.clone()).map_err(anyhow::Error::msg)?,
        Some(store),
        cfg.to_json(),
        policy,
        std::sync::Arc::new(id),
    )
}

fn wire_totals_path(run_dir: &std::path::Path, i: u32) -> PathBuf {
    run_dir.join("logs").join(format!("miner-{i}.wire.json"))
}

/// Bytes the miners sent across stage boundaries, summed from the wire
/// totals each left as it exited (None if any miner left none).
fn measured_boundary_bytes(totals: &[Option<iota_dataplane::stats::WireTotals>]) -> Option<u64> {
    totals.iter().map(|t| t.as_ref().map(|t| t.boundary_bytes_sent())).sum()
}

/// The wire totals each miner process left as it exited.
fn miner_totals(run_dir: &std::path::Path, miners: u32) -> Vec<Option<iota_dataplane::stats::WireTotals>> {
    (0..miners)
        .map(|i| {
            let text = std::fs::read(wire_totals_path(run_dir, i)).ok()?;
            serde_json::from_slice(&text).ok()
        })
        .collect()
}

/// Compute threads per miner process when none are asked for: one on the
/// CPU, where the miners' compute shares the machine's cores; on a GPU the
/// cores shared out among the miners, whose CPU work (the merge's reduce
/// and codecs, hashing, drawing initial weights) otherwise ran on one
/// thread each beside idle cores (a `1.5b` merge's reduce took ~19 s so).
pub fn default_threads_per_miner(device: &str, miners: usize) -> usize {
    if device.starts_with("cuda") {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        (cores / miners.max(1)).max(1)
    } else {
        1
    }
}

/// `iota-miner run` arguments for the memory each miner states and when it
/// recomputes activations (the miner validates them).
pub fn miner_memory_args(memory_gib: Option<f64>, recompute: Option<&str>) -> Vec<String> {
    let mut v = Vec::new();
    if let Some(g) = memory_gib {
        v.extend(["--memory-gib".to_string(), g.to_string()]);
    }
    if let Some(r) = recompute {
        v.extend(["--recompute".to_string(), r.to_string()]);
    }
    v
}

fn spawn_miner(o: &SwarmOptions, url: &str, orchestrator_key: &str, i: u32) -> Result<Child> {
    let logs = o.run_dir.join("logs");
    std::fs::create_dir_all(&logs)?;
    let log = std::fs::File::create(logs.join(format!("miner-{i}.log")))?;
    let key = o.run_dir.join("keys").join(format!("miner-{i}.key"));
    // Its wire totals of this session, written as it exits (an earlier
    // session's are not this one's).
    let _ = std::fs::remove_file(wire_totals_path(&o.run_dir, i));
    Command::new(&o.miner_bin)
        .args(["run", "--orchestrator", url, "--listen", "127.0.0.1:0", "--threads"])
        .arg(o.threads_per_miner.to_string())
        .arg("--identity")
        .arg(&key)
        .args(match o.log_format {
            iota_dataplane::LogFormat::Json => &["--log-format", "json"][..],
            iota_dataplane::LogFormat::Text => &[][..],
        })
        .arg("--stats-out")
        .arg(wire_totals_path(&o.run_dir, i))
        .args(["--device", &o.miner_device])
        .args(["--orchestrator-key", orchestrator_key])
        .args(o.adversaries.iter().filter(|(k, _)| *k == i).flat_map(|(_, m)| ["--adversary", m.as_str()]))
        .args(o.store.iter().flat_map(|d| [std::ffi::OsStr::new("--store"), d.as_os_str()]))
        .args(o.data.iter().flat_map(|d| [std::ffi::OsStr::new("--data"), d.as_os_str()]))
        // Every miner of a local swarm shares this machine's memory: its
        // evidence keeps a few weights snapshots in memory, the rest in the
        // run directory.
        .arg("--evidence-dir")
        .arg(o.run_dir.join("evidence"))
        .args(["--evidence-memory-mib", "256"])
        .args(&o.extra_miner_args)
        .env("RUST_LOG", std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()))
        .stdout(Stdio::null())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {}", o.miner_bin.display()))
}

/// The run's object store as the orchestrator reads it (its bucket, or
/// the directory the run keeps its objects in): where validators store
/// their proofs of failed inner steps for the orchestrator to re-check.
pub fn referee_store(
    bucket: Option<&std::sync::Arc<crate::s3_store::S3Store>>,
    dir: Option<&std::path::Path>,
) -> Result<Option<iota_protocol::SharedStore>> {
    Ok(match (bucket, dir) {
        (Some(b), _) => Some(b.clone() as iota_protocol::SharedStore),
        (None, Some(d)) => {
            Some(iota_dataplane::local_store::LocalDirStore::shared(d, iota_dataplane::fileio::FileIo::start(false))?)
        }
        (None, None) => None,
    })
}

/// Runs the swarm to the end of its epochs (or Ctrl-C).
pub async fn run(o: SwarmOptions) -> Result<SwarmReport> {
    let mut svc = orchestrator(&o.cfg, &o.run_dir, AuthPolicy::default())?;
    if let Some(b) = &o.bucket {
        svc = svc.with_s3(b.clone());
    }
    if let Some(store) = referee_store(o.bucket.as_ref(), o.store.as_deref())? {
        svc = svc.with_referee(crate::step_referee::StepReferee::new(store, o.cfg.clone(), o.data.clone()));
    }
    let (url, server) = serve(svc.clone(), o.listen, false).await?;
    let ticker = svc.spawn_ticker();
    let page_servers =
        crate::http_endpoint::serve_operator_pages(&svc, o.metrics, o.dashboard, |m| eprintln!("swarm: {m}")).await?;
    let spec = &o.cfg.spec;
    let n = spec.stages * spec.replicas;
    let (stop_validators, validators) = spawn_validators(&o, &url, &svc);
    let mut children = Vec::new();
    for i in 0..n {
        children.push(spawn_miner(&o, &url, &svc.identity().peer_id().to_hex(), i)?);
    }
    eprintln!(
        "swarm: orchestrator at {url}, {n} miners ({} stages x {} replicas), logs in {}",
        spec.stages,
        spec.replicas,
        o.run_dir.join("logs").display()
    );
    let start = Instant::now();
    let tokens0 = svc.with_state(|o| o.counters().tokens);
    let interrupted = follow_with_progress(&o, &svc, &mut children, tokens0).await?;
    // Let miners see Done and exit; then make sure none is left behind.
    let deadline = Instant::now() + Duration::from_secs(if interrupted { 0 } else { 20 });
    for ch in children.iter_mut() {
        let left = deadline.saturating_duration_since(Instant::now());
        if tokio::time::timeout(left, ch.wait()).await.is_err() {
            let _ = ch.kill().await;
        }
    }
    stop_validators.store(true, std::sync::atomic::Ordering::SeqCst);
    for v in validators {
        let _ = tokio::time::timeout(Duration::from_secs(5), v).await;
    }
    svc.save();
    ticker.abort();
    server.abort();
    for t in page_servers {
        t.abort();
    }
    let model = if svc.with_state(|o| o.phase() == &Phase::Done) {
        crate::final_model::export_for_run(&svc, &o.cfg, o.bucket.clone(), o.store.as_deref(), &o.run_dir).await
    } else {
        Err("the run did not finish".into())
    };
    let ran = Ran { tokens0, elapsed: start.elapsed(), interrupted, model };
    Ok(swarm_report(&o, &svc, ran))
}

/// The swarm's validators, each a task on this runtime, stopped by the
/// flag returned.
fn spawn_validators(
    o: &SwarmOptions,
    url: &str,
    svc: &OrchestratorService,
) -> (std::sync::Arc<std::sync::atomic::AtomicBool>, Vec<tokio::task::JoinHandle<()>>) {
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut tasks = Vec::new();
    for (i, id) in o.validators.iter().enumerate() {
        let mut vo = crate::validator::ValidatorOptions::local(url.to_string(), crate::validator::random_seed());
        vo.orchestrator_key = Some(svc.identity().peer_id());
        vo.store = o.store.clone();
        vo.data = o.data.clone();
        let id = iota_core::Identity::from_seed(*id.seed());
        let stop = stop.clone();
        tasks.push(tokio::spawn(async move {
            if let Err(e) = crate::validator::run(vo, id, stop).await {
                tracing::warn!(validator = i, error = %e, "validator stopped");
            }
        }));
    }
    (stop, tasks)
}

/// Follows the run with a progress bar until it is done; whether Ctrl-C
/// ended it first. Fails when every miner has exited before the end.
async fn follow_with_progress(
    o: &SwarmOptions,
    svc: &OrchestratorService,
    children: &mut [Child],
    tokens0: u64,
) -> Result<bool> {
    let spec = &o.cfg.spec;
    let bar = ProgressBar::new(spec.total_micro_batches());
    bar.set_style(
        ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} micro-batches | {msg}")?
            .progress_chars("=> "),
    );
    let (mut last_tokens, mut last_t, mut tps) = (0u64, Instant::now(), 0.0);
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    loop {
        tokio::select! {
            _ = &mut ctrl_c => { bar.finish_and_clear(); return Ok(true); }
            _ = tokio::time::sleep(Duration::from_millis(250)) => {}
        }
        let (phase, epoch, c, healthy, history_done, in_epoch) = svc.with_state(|o| {
            let healthy: Vec<usize> =
                (0..spec.stages).map(|s| o.miners().filter(|m| m.stage == s && m.healthy).count()).collect();
            let done: u64 = o.history().iter().map(|e| e.completed + e.dropped).sum();
            let in_epoch =
                o.micro_batches().filter(|(_, s)| !matches!(s, crate::orchestrator::MbStatus::InFlight { .. })).count()
                    as u64;
            (o.phase().clone(), o.epoch(), o.counters().clone(), healthy, done, in_epoch)
        });
        let now = Instant::now();
        let dt = now.duration_since(last_t).as_secs_f64();
        if dt >= 1.0 {
            tps = (c.tokens.saturating_sub(tokens0) - last_tokens) as f64 / dt;
            last_tokens = c.tokens.saturating_sub(tokens0);
            last_t = now;
        }
        bar.set_position(history_done + if matches!(phase, Phase::Done) { 0 } else { in_epoch });
        bar.set_message(format!(
            "epoch {}/{} {:?} | loss {:.3} | {:.0} tok/s | miners/stage {:?} | re-routed {} dropped {} | convicted {}",
            (epoch + 1).min(spec.epoch_count()),
            spec.epoch_count(),
            phase,
            c.last_loss,
            tps,
            healthy,
            c.rerouted,
            c.dropped,
            c.convictions
        ));
        if phase == Phase::Done {
            bar.finish_and_clear();
            return Ok(false);
        }
        // A miner that exits early is reported; the swarm carries on without it.
        for (i, ch) in children.iter_mut().enumerate() {
            if let Ok(Some(status)) = ch.try_wait()
                && !status.success()
            {
                bar.println(format!("miner {i} exited with {status}; see logs/miner-{i}.log"));
            }
        }
        if children.iter_mut().all(|c| matches!(c.try_wait(), Ok(Some(_)))) {
            bar.abandon_with_message("every miner exited before the run finished");
            bail!("every miner exited before the run finished; see {}", o.run_dir.join("logs").display());
        }
    }
}

/// How the swarm's run went, as its shell saw it.
struct Ran {
    /// Tokens counted when this process's part of the run began.
    tokens0: u64,
    elapsed: Duration,
    interrupted: bool,
    model: std::result::Result<PathBuf, String>,
}

/// The swarm's report, from the orchestrator's state and the miners' logs.
fn swarm_report(o: &SwarmOptions, svc: &OrchestratorService, ran: Ran) -> SwarmReport {
    let (history, c) = svc.with_state(|o| (o.history().to_vec(), o.counters().clone()));
    let guilty = svc.with_state(|o| o.verdicts().iter().filter(|v| v.guilty).count() as u64);
    let (payouts, validator_pay, settled_epochs) = svc.with_state(|o| {
        let rows = o.payout_table();
        let miners: std::collections::BTreeSet<PeerId> = rows.iter().map(|r| r.peer).collect();
        let others = o.balances().iter().filter(|(p, _)| !miners.contains(p)).map(|(p, x)| (*p, *x)).collect();
        let settled = o.settlements().last().map_or(0, |s| s.epoch + 1);
        (rows, others, settled)
    });
    let totals = miner_totals(&o.run_dir, o.cfg.spec.stages * o.cfg.spec.replicas);
    SwarmReport {
        history,
        completed: c.completed,
        rerouted: c.rerouted,
        dropped: c.dropped,
        tokens: c.tokens.saturating_sub(ran.tokens0),
        elapsed: ran.elapsed,
        interrupted: ran.interrupted,
        validators: o.validators.len(),
        convictions: c.convictions,
        ejected: c.ejected,
        guilty_votes: guilty,
        payouts,
        validator_pay,
        settled_epochs,
        model: ran.model,
        boundary_bytes: measured_boundary_bytes(&totals),
        merge_from_store: (c.merge_contributions_from_store, c.merge_updates_from_store),
        counters: c.clone(),
        miner_totals: totals,
        miners: svc.with_state(miner_rows),
    }
}

/// Each subscribed miner: peer, stage, device, micro-batches delivered and
/// tokens per second over the training time, by stage.
fn miner_rows(o: &Orchestrator) -> Vec<(PeerId, u32, String, u64, f64)> {
    let (per_mb, secs) = (o.tokens_per_micro_batch(), o.training_ms(iota_protocol::auth::now_ms()) as f64 / 1e3);
    let mut v: Vec<_> = o
        .miners()
        .filter(|m| m.subscribed)
        .map(|m| {
            let tps = if secs > 0.0 { m.delivered as f64 * per_mb / secs } else { 0.0 };
            (m.peer, m.stage, m.device.clone(), m.delivered, tps)
        })
        .collect();
    v.sort_by_key(|m| (m.1, m.0));
    v
}

#[cfg(test)]
mod tests {
    use super::default_threads_per_miner;

    #[test]
    fn gpu_miners_share_the_cores_and_cpu_miners_take_one() {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        assert_eq!(default_threads_per_miner("cpu", 6), 1);
        assert_eq!(default_threads_per_miner("cuda", 1), cores);
        assert_eq!(default_threads_per_miner("cuda:1", 6), (cores / 6).max(1));
        assert_eq!(default_threads_per_miner("cuda", 10_000), 1, "never none");
    }
}
