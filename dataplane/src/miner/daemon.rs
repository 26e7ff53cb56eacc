//! The miner daemon's life, step by step: open the data plane, join the
//! run, start the async tasks (commands, ticks, frames in, heartbeats, the
//! pump that sends frames and reports out, metrics), run the stage worker
//! on its own thread, and wind down when it is done.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context, Result};
use iota_core::memory_plan::ComputeBackend;
use iota_core::{Identity, PeerId};
use iota_cuda::ComputeDevice;
use iota_cuda::backend::GemmPrecision;
use iota_model::Backend as _;
use iota_protocol::RunConfig;
use iota_protocol::client::ControlClient;
use iota_protocol::object_store::SharedStore;
use iota_protocol::pb::report::Kind as ReportKind;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tracing::{info, warn};

use super::compute_loop::{ComputeIo, MinerSummary, compute_loop};
use super::deliver::{self, PeerSenders};
use super::events::{Input, Output};
use super::worker::Worker;
use super::{Adversary, MinerOptions, connect, evidence_log, merge};
use crate::frame::{FrameLimits, RunContext};
use crate::miner_metrics::MinerMetrics;
use crate::pool::HostPool;
use crate::sent_frames::{SentFrames, TapLimits};
use crate::tls::PeerDirectory;
use crate::transport::{Endpoint, TransportConfig};

/// Joins the run at `opts.orchestrator` and works until it is done (or
/// `stop` is set).
pub async fn run(opts: MinerOptions, id: Identity, stop: Arc<AtomicBool>) -> Result<MinerSummary> {
    let net = open_data_plane(&opts, *id.seed())?;
    let gauges = Gauges::default();
    // Served from the start: a miner queued for a place says so at /status.
    let metrics_server = match opts.metrics {
        Some(at) => Some(serve_metrics(at, &net, &gauges).await?),
        None => None,
    };
    let joined = join_run(&opts, Arc::new(id), &net, &gauges.standing, &stop).await?;
    // `stop` is the caller's; `finished` ends this miner's own tasks.
    let finished = Arc::new(AtomicBool::new(false));
    let (in_tx, in_rx) = mpsc::channel::<Input>(1024);
    let (out_tx, out_rx) = mpsc::channel::<Output>(1024);
    let (report_tx, report_rx) = mpsc::unbounded_channel::<ReportKind>();
    let mut background = vec![
        follow_commands(&joined, &net, &gauges, &finished, &in_tx),
        spawn_ticks(in_tx.clone(), finished.clone()),
        spawn_frames_in(net.ep.clone(), in_tx.clone()),
        spawn_heartbeats(&joined.client, &net, &gauges, opts.heartbeat, &finished),
    ];
    let hostile_reporter = opts.adversary == Some(Adversary::HostileUnreachable);
    let pump = spawn_pump(net.ep.clone(), joined.store.clone(), out_rx, report_tx.clone(), hostile_reporter);
    let reports = spawn_reports(joined.client.clone(), report_rx);
    background.extend(metrics_server);
    let io = compute_io(&opts, &net, &joined.cfg, &gauges, (in_rx, out_tx), stop)?;
    let compute = spawn_compute(&opts, &net, joined, io)?;
    let mut summary = tokio::task::spawn_blocking(move || compute.join())
        .await?
        .map_err(|_| anyhow::anyhow!("stage worker panicked"))??;
    // Let the last frames and reports go out, then stop.
    drop(in_tx);
    let _ = tokio::time::timeout(Duration::from_secs(5), pump).await;
    drop(report_tx);
    let _ = tokio::time::timeout(Duration::from_secs(5), reports).await;
    summary.transport = net.ep.stats();
    finished.store(true, Ordering::SeqCst);
    for t in background {
        t.abort();
    }
    net.ep.close();
    drop(net.black_hole);
    Ok(summary)
}

/// The data plane, open before the miner registers (it registers the
/// address other miners dial).
struct DataPlane {
    gpu: Option<Arc<iota_cuda::gpu::Gpu>>,
    ep: Arc<Endpoint>,
    dir: Arc<PeerDirectory>,
    ctx: Arc<RunContext>,
    /// The frames this miner sends, as signed: its evidence for validators.
    sent: Arc<SentFrames>,
    /// The address other miners are told to dial.
    addr: String,
    /// The `silent` adversary's socket, held (never read) while it runs.
    black_hole: Option<std::net::UdpSocket>,
    /// The miner's key, for what the stage worker signs (its traces of
    /// inner steps).
    signer: Arc<Identity>,
}

fn open_data_plane(opts: &MinerOptions, seed: [u8; 32]) -> Result<DataPlane> {
    let ctx = Arc::new(RunContext::new(0, FrameLimits::default()));
    let dir = PeerDirectory::new();
    // On a GPU the receive pool is page-locked memory of its context, so a
    // payload goes from the socket to the device with one host copy.
    let (gpu, pool) = match opts.device {
        ComputeDevice::Cpu => (None, HostPool::new(opts.pool_bytes)),
        ComputeDevice::Cuda(i) => {
            let gpu = iota_cuda::open_gpu(i).with_context(|| format!("opening {}", opts.device))?;
            let heap = crate::pool::PinnedHeap(iota_cuda::pinned::PinnedAllocator::new(&gpu));
            (Some(gpu), HostPool::with_memory(opts.pool_bytes, Box::new(heap)))
        }
    };
    let ep = Arc::new(Endpoint::bind(
        opts.listen,
        Identity::from_seed(seed),
        dir.clone(),
        ctx.clone(),
        pool,
        TransportConfig { congestion: opts.congestion, ..TransportConfig::default() },
    )?);
    let local = ep.local_addr()?;
    let sent = ep.tap_sent_frames(TapLimits {
        max_frames: 4 * evidence_log::MAX_ATTEMPTS,
        max_bytes: opts.evidence_frame_bytes,
    });
    if opts.advertise.is_none() && local.ip().is_unspecified() {
        anyhow::bail!("listening on {local}: give --advertise HOST:PORT so other miners can reach this one");
    }
    // A silent adversary advertises a socket that never answers (held until
    // it returns); a closed one, a port nobody listens on.
    let black_hole = match opts.adversary {
        Some(Adversary::Silent | Adversary::Closed) => Some(std::net::UdpSocket::bind((local.ip(), 0))?),
        _ => None,
    };
    let addr = match &black_hole {
        // Closed: the socket is dropped below, so the port refuses.
        Some(sock) => sock.local_addr()?.to_string(),
        None => opts.advertise.clone().unwrap_or(local.to_string()),
    };
    let black_hole = black_hole.filter(|_| opts.adversary == Some(Adversary::Silent));
    Ok(DataPlane { gpu, ep, dir, ctx, sent, addr, black_hole, signer: Arc::new(Identity::from_seed(seed)) })
}

/// What joining the run gave.
struct Joined {
    client: ControlClient,
    cfg: RunConfig,
    store: SharedStore,
    /// What this miner says it computes on (re-stated when it rejoins).
    device: String,
    /// The memory it states (bytes; 0: none) and what it computes with.
    memory: (u64, ComputeBackend),
}

/// Connects to the orchestrator, registers (waiting in its queue while
/// the run is full, saying where), and opens the run's store.
async fn join_run(
    opts: &MinerOptions,
    id: Arc<Identity>,
    net: &DataPlane,
    standing: &parking_lot::Mutex<super::standing::StandingLog>,
    stop: &AtomicBool,
) -> Result<Joined> {
    if opts.orchestrator_key.is_none() {
        warn!("no --orchestrator-key given: trusting whichever orchestrator answers at {}", opts.orchestrator);
    }
    let mut client =
        connect(&opts.orchestrator, id, opts.orchestrator_key, opts.insecure_plaintext, opts.tls_ca.as_deref()).await?;
    info!(orchestrator = %client.audience().orchestrator.to_hex(), run = client.audience().run_id, "connected");
    let device = device_label(opts.device, opts.gemm, opts.cpu_bf16_gemm);
    let memory = stated_memory(opts, net.gpu.as_deref());
    if memory.0 > 0 {
        let gib = format!("{:.2}", memory.0 as f64 / (1u64 << 30) as f64);
        info!(gib, compute = memory.1.name(), "memory stated");
    }
    let stating = (memory.0, memory.1.name().to_string());
    let reply = loop {
        let reply =
            client.register_stating(net.addr.clone(), 0.0, device.clone(), stating.clone()).await.map_err(|s| {
                if s.code() == tonic::Code::ResourceExhausted {
                    anyhow::anyhow!("the orchestrator refused this miner: {}", s.message())
                } else {
                    anyhow::Error::new(s).context("registering with the orchestrator")
                }
            })?;
        let Some(queued) = &reply.queued else { break reply };
        if let Some(line) = standing.lock().observe(queued, 0.0) {
            info!("standing: {line}");
        }
        anyhow::ensure!(!stop.load(Ordering::SeqCst), "stopped while queued for a place in the run");
        tokio::time::sleep(Duration::from_millis(iota_protocol::run_spec::QUEUE_RETRY_MS)).await;
    };
    let cfg = RunConfig::from_json(&reply.run_config_json).context("the orchestrator's run config")?;
    net.ctx.set_run_id(reply.run_id);
    // A dead peer must be found (and reported) well within a route's
    // timeout, or the orchestrator's timeout fires first and blames nobody.
    let connect = Duration::from_millis((cfg.spec.route_timeout_ms / 4).clamp(200, 10_000));
    net.ep.set_connect_timeout(connect.min(TransportConfig::default().connect_timeout));
    info!(index = reply.miner_index, addr = net.addr, "registered");
    let store =
        crate::granted_store::open_run_store(cfg.store, opts.store.as_deref(), &client, opts.tls_ca.as_deref())?;
    Ok(Joined { client, cfg, store, device, memory })
}

/// What the compute thread counts and the async tasks read.
#[derive(Clone, Default)]
struct Gauges {
    epoch: Arc<AtomicU64>,
    tokens: Arc<AtomicU64>,
    in_flight: Arc<AtomicU32>,
    /// The last throughput measured (f64 bits), for re-registrations.
    measured_tps: Arc<AtomicU64>,
    metrics: MinerMetrics,
    /// Where this miner stands (heartbeat replies), for its log lines,
    /// `/status` and `/metrics`.
    standing: Arc<parking_lot::Mutex<super::standing::StandingLog>>,
}

/// The orchestrator's commands, re-subscribing (and re-registering if it
/// forgot this miner) when the stream drops.
fn follow_commands(
    joined: &Joined,
    net: &DataPlane,
    gauges: &Gauges,
    finished: &Arc<AtomicBool>,
    in_tx: &mpsc::Sender<Input>,
) -> JoinHandle<()> {
    let rejoin = iota_protocol::client::Rejoin::Miner {
        data_addr: net.addr.clone(),
        device: joined.device.clone(),
        tokens_per_s: gauges.measured_tps.clone(),
        memory: (joined.memory.0, joined.memory.1.name().to_string()),
    };
    iota_protocol::client::follow_commands(
        joined.client.clone(),
        finished.clone(),
        rejoin,
        in_tx.clone(),
        Input::Command,
    )
}

/// Ticks for overdue-input reports, the merge's retries and store
/// fallbacks. A report goes out at the first tick past its overdue time,
/// so the period adds to how long a silent neighbour stalls its
/// micro-batch (250 ms was half of a `tiny` epoch's detection time).
fn spawn_ticks(in_tx: mpsc::Sender<Input>, stop: Arc<AtomicBool>) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut iv = tokio::time::interval(Duration::from_millis(50));
        iv.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        while !stop.load(Ordering::SeqCst) {
            iv.tick().await;
            if in_tx.send(Input::Tick).await.is_err() {
                return;
            }
        }
    })
}

/// Frames from peers, to the compute thread.
fn spawn_frames_in(ep: Arc<Endpoint>, in_tx: mpsc::Sender<Input>) -> JoinHandle<()> {
    tokio::spawn(async move {
        while let Some(f) = ep.recv().await {
            if in_tx.send(Input::Frame(Box::new(f))).await.is_err() {
                return;
            }
        }
    })
}

/// Heartbeats, with the throughput since the last one (the orchestrator
/// balances stages by it) and the heads of this miner's commitments.
fn spawn_heartbeats(
    client: &ControlClient,
    net: &DataPlane,
    gauges: &Gauges,
    every: Duration,
    stop: &Arc<AtomicBool>,
) -> JoinHandle<()> {
    let (mut client, gauges, stop) = (client.clone(), gauges.clone(), stop.clone());
    let commitments = net.ep.commitments();
    tokio::spawn(async move {
        let mut iv = tokio::time::interval(every);
        let (mut last, mut at) = (0u64, std::time::Instant::now());
        while !stop.load(Ordering::SeqCst) {
            iv.tick().await;
            let (now_tokens, now) = (gauges.tokens.load(Ordering::Relaxed), std::time::Instant::now());
            let tps = (now_tokens - last) as f64 / now.duration_since(at).as_secs_f64().max(1e-3);
            (last, at) = (now_tokens, now);
            gauges.measured_tps.store(tps.to_bits(), Ordering::Relaxed);
            let busy = gauges.in_flight.load(Ordering::Relaxed);
            let heads = commitments.lock().heads();
            match client.heartbeat(gauges.epoch.load(Ordering::SeqCst), busy, tps, &heads).await {
                Ok(reply) => {
                    let changed = reply.standing.and_then(|st| gauges.standing.lock().observe(&st, tps));
                    if let Some(line) = changed {
                        info!("standing: {line}");
                    }
                }
                Err(e) => {
                    tracing::debug!(error = %e, "heartbeat failed");
                    if let Some(line) = gauges.standing.lock().unreachable(e.message(), every.as_secs_f64()) {
                        warn!("standing: {line}");
                    }
                }
            }
        }
    })
}

/// Frames out, one queue per peer (a dead peer delays only its own);
/// reports to the report task, in the order they were made; contributions
/// the merge was asked to store, stored.
fn spawn_pump(
    ep: Arc<Endpoint>,
    store: SharedStore,
    mut out_rx: mpsc::Receiver<Output>,
    report_tx: mpsc::UnboundedSender<ReportKind>,
    hostile_reporter: bool,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut senders = PeerSenders::new(ep.clone(), store.clone(), report_tx.clone());
        while let Some(o) = out_rx.recv().await {
            match o {
                // The `hostile-unreachable` test tool: its pipeline frames
                // never leave; it blames the neighbour instead. Its merge
                // frames go out: it merges honestly.
                Output::Frame { to, meta, .. }
                    if hostile_reporter
                        && matches!(
                            meta.direction,
                            iota_core::wire::Direction::Activation | iota_core::wire::Direction::ActivationGrad
                        ) =>
                {
                    deliver::report_unreachable(&report_tx, to, &meta);
                }
                Output::Frame { to, meta, payload, fallback } => senders.send(to, meta, payload, fallback, None),
                Output::FabricatedFrame { to, meta, wire, shown } => senders.send(to, meta, wire, None, Some(shown)),
                Output::Report(k) => {
                    let _ = report_tx.send(k);
                }
                Output::Store { key, meta, payload } => {
                    let (ep, store) = (ep.clone(), store.clone());
                    tokio::spawn(async move {
                        if let Err(e) = store.put(&key, ep.frame_bytes(&meta, &payload)).await {
                            tracing::warn!(key, error = %e, "storing a requested merge contribution failed");
                        }
                    });
                }
                Output::StoreRaw { key, bytes } => {
                    let store = store.clone();
                    tokio::spawn(async move {
                        if let Err(e) = store.put(&key, bytes.to_vec()).await {
                            tracing::warn!(key, error = %e, "storing a merge contribution's witness failed");
                        }
                    });
                }
            }
        }
    })
}

/// Reports to the orchestrator, in order, retried while it restarts (a
/// lost merge report would stall the stage until the phase timeout).
/// Reports are idempotent; stale ones are counted and ignored.
fn spawn_reports(mut client: ControlClient, mut report_rx: mpsc::UnboundedReceiver<ReportKind>) -> JoinHandle<()> {
    tokio::spawn(async move {
        while let Some(k) = report_rx.recv().await {
            let mut wait = Duration::from_millis(250);
            for attempt in 1.. {
                match client.report(k.clone()).await {
                    Ok(_) => break,
                    Err(e) if retryable(e.code()) && attempt < 40 => {
                        tracing::debug!(error = %e, attempt, "report failed; retrying");
                        tokio::time::sleep(wait).await;
                        wait = (wait * 2).min(Duration::from_secs(2));
                    }
                    Err(e) => {
                        warn!(error = %e, "report failed");
                        break;
                    }
                }
            }
        }
    })
}

/// The `/metrics` endpoint (OpenMetrics) at `at`.
async fn serve_metrics(at: std::net::SocketAddr, net: &DataPlane, gauges: &Gauges) -> Result<JoinHandle<()>> {
    let (ep, gauges) = (net.ep.clone(), gauges.clone());
    let router: iota_protocol::http_endpoint::Router = Arc::new(move |path: &str| {
        if path == "/status" {
            let line = gauges.standing.lock().now().to_string();
            return Some(iota_protocol::http_endpoint::Page {
                content_type: "text/plain; charset=utf-8",
                body: format!("{line}\n").into_bytes(),
            });
        }
        (path == "/metrics").then(|| {
            let transport = ep.stats();
            let text = gauges.metrics.encode(&crate::miner_metrics::Scrape {
                transport: &transport,
                tokens: gauges.tokens.load(Ordering::Relaxed),
                in_flight: gauges.in_flight.load(Ordering::Relaxed),
                store_retries: crate::granted_store::store_retries(),
                epoch: gauges.epoch.load(Ordering::Relaxed),
                standing: gauges.standing.lock().standing_metrics(),
            });
            iota_protocol::http_endpoint::Page {
                content_type: iota_protocol::http_endpoint::OPENMETRICS,
                body: text.into_bytes(),
            }
        })
    });
    let (bound, task) = iota_protocol::http_endpoint::serve(at, router).await?;
    info!(at = %format!("http://{bound}/metrics"), status = %format!("http://{bound}/status"), "metrics");
    Ok(task)
}

/// What the compute thread is fed and reports through.
fn compute_io(
    opts: &MinerOptions,
    net: &DataPlane,
    cfg: &RunConfig,
    gauges: &Gauges,
    (in_rx, out_tx): (mpsc::Receiver<Input>, mpsc::Sender<Output>),
    stop: Arc<AtomicBool>,
) -> Result<ComputeIo> {
    Ok(ComputeIo {
        in_rx,
        out_tx,
        stop,
        crash_at: opts.crash_at,
        tokens: gauges.tokens.clone(),
        in_flight: gauges.in_flight.clone(),
        epoch: gauges.epoch.clone(),
        fault_merge: None,
        adversary: opts.adversary,
        commitments: net.ep.commitments(),
        sent: net.sent.clone(),
        evidence_bytes: opts.evidence_bytes,
        evidence_frame_bytes: opts.evidence_frame_bytes,
        evidence_spill: evidence_spill(opts, cfg, net.ep.peer_id())?,
        slowdown: opts.slowdown.max(1),
        min_frame: Duration::from_millis(opts.min_frame_ms),
        metrics: gauges.metrics.clone(),
        device_memory: None,
        device_high_water: None,
    })
}

/// Where weights snapshots past the memory budget go (validated runs with
/// `--evidence-dir` only): a directory of this miner's own, since miners on
/// one machine may share the parent.
fn evidence_spill(opts: &MinerOptions, cfg: &RunConfig, me: PeerId) -> Result<Option<evidence_log::SpillDir>> {
    let (Some(parent), false) = (&opts.evidence_dir, cfg.spec.validation.validators.is_empty()) else {
        return Ok(None);
    };
    let dir = parent.join(&me.to_hex()[..16]);
    let spill = evidence_log::SpillDir::open(dir.clone(), opts.evidence_disk_bytes)
        .with_context(|| format!("opening the evidence directory {}", dir.display()))?;
    info!(dir = %dir.display(), "weights snapshots past the memory budget are kept on disk for validators");
    Ok(Some(spill))
}

/// The stage worker on a thread of its own (`iota-stage`), its backend made
/// there (a GPU's context is bound to that thread).
fn spawn_compute(
    opts: &MinerOptions,
    net: &DataPlane,
    joined: Joined,
    mut io: ComputeIo,
) -> Result<std::thread::JoinHandle<Result<MinerSummary>>> {
    let rt = tokio::runtime::Handle::current();
    let me = net.ep.peer_id();
    let Joined { cfg, store, memory, .. } = joined;
    // A fault-injecting merge (a test tool) in place of the run's.
    let fault = opts.merge_fault.or_else(|| opts.adversary.and_then(Adversary::merge_fault));
    if cfg.spec.merge.method == iota_protocol::MergeMethod::Butterfly && fault.is_some() {
        let mut b = merge::Butterfly::new(me, cfg.spec.merge.clone(), store.clone(), rt.clone(), net.ctx.clone());
        b.fault = fault;
        b.accomplices = opts.accomplices.clone();
        io.fault_merge = Some(Box::new(b));
    }
    let gpu = net.gpu.clone();
    let (gemm, cpu_bf16_gemm) = (opts.gemm, opts.cpu_bf16_gemm);
    let parts = WorkerParts {
        me,
        cfg,
        data: opts.data.clone(),
        store,
        rt,
        dir: net.dir.clone(),
        ctx: net.ctx.clone(),
        corpus_cache: opts.corpus_cache.clone(),
        memory,
        recompute: opts.recompute,
        signer: net.signer.clone(),
    };
    Ok(std::thread::Builder::new().name("iota-stage".into()).spawn(move || -> Result<MinerSummary> {
        let Some(gpu) = gpu else {
            let be =
                if cpu_bf16_gemm { iota_model::CpuBackend::with_bf16_gemm() } else { iota_model::CpuBackend::new() };
            return compute_loop(parts.worker(Arc::new(be)), io);
        };
        gpu.ctx.bind_to_thread().map_err(|e| anyhow::anyhow!("binding the CUDA context: {e:?}"))?;
        let (ctx, pool) = (gpu.ctx.clone(), gpu.clone());
        let be = Arc::new(iota_cuda::backend::CudaBackend::with_precision(gpu, gemm)?);
        info!(backend = %be.name(), "stage computes on the GPU");
        let io = ComputeIo {
            device_memory: Some(Box::new(move || {
                ctx.mem_get_info().ok().map(|(free, total)| ((total - free) as u64, total as u64))
            })),
            device_high_water: Some(Box::new(move || pool.pool_high_water())),
            ..io
        };
        compute_loop(parts.worker(be), io)
    })?)
}

/// What the stage worker is made of, whichever backend it computes on.
struct WorkerParts {
    me: PeerId,
    cfg: RunConfig,
    data: Option<std::path::PathBuf>,
    store: SharedStore,
    rt: tokio::runtime::Handle,
    dir: Arc<PeerDirectory>,
    ctx: Arc<RunContext>,
    corpus_cache: Option<std::path::PathBuf>,
    memory: (u64, ComputeBackend),
    recompute: iota_core::memory_fit::Recompute,
    signer: Arc<Identity>,
}

impl WorkerParts {
    fn worker<B: iota_model::Backend + 'static>(self, be: Arc<B>) -> Worker<B> {
        let mut w = Worker::new(be, self.me, self.cfg, self.data, self.store, self.rt, self.dir, self.ctx)
            .with_corpus_cache(self.corpus_cache)
            .with_memory(Some(self.memory))
            .with_recompute(self.recompute);
        w.set_signer(self.signer);
        w
    }
}

/// The memory this miner states (bytes; 0: none) and what it computes with.
fn stated_memory(opts: &MinerOptions, gpu: Option<&iota_cuda::gpu::Gpu>) -> (u64, ComputeBackend) {
    let compute = match (opts.device, opts.gemm) {
        (ComputeDevice::Cpu, _) => ComputeBackend::Cpu,
        (ComputeDevice::Cuda(_), GemmPrecision::Bf16) => ComputeBackend::CudaBf16Gemm,
        (ComputeDevice::Cuda(_), GemmPrecision::F32) => ComputeBackend::CudaF32Gemm,
    };
    let free = gpu.and_then(|g| g.ctx.mem_get_info().ok()).map(|(free, _)| free as u64);
    let bytes = match (opts.memory_limit, free) {
        (Some(limit), Some(free)) => limit.min(free),
        (Some(limit), None) => limit,
        (None, Some(free)) => free,
        (None, None) => 0,
    };
    (bytes, compute)
}

/// What a miner tells the orchestrator it computes on.
fn device_label(device: ComputeDevice, gemm: GemmPrecision, cpu_bf16_gemm: bool) -> String {
    match device {
        ComputeDevice::Cpu if cpu_bf16_gemm => "cpu (bf16 gemms)".into(),
        ComputeDevice::Cpu => "cpu".into(),
        ComputeDevice::Cuda(_) => format!("{device} ({gemm:?} GEMMs)").to_lowercase(),
    }
}

/// Errors that say the orchestrator was unreachable, not that it refused.
fn retryable(code: tonic::Code) -> bool {
    matches!(
        code,
        tonic::Code::Unavailable | tonic::Code::Unknown | tonic::Code::DeadlineExceeded | tonic::Code::Cancelled
    )
}
