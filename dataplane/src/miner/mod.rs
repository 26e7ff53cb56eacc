//! The miner daemon: joins a run, then runs its stage worker.
//!
//! Async side (tokio): the QUIC endpoint, the orchestrator's command stream
//! (re-subscribing if it drops, e.g. across an orchestrator restart),
//! heartbeats, and a pump that sends the worker's frames and reports. Compute
//! side: the `Worker` on its own thread, fed through a channel, so model math
//! never blocks the network.

mod adversary;
mod compute_loop;
mod deliver;
pub mod events;
pub mod evidence_log;
use iota_checks::hashes;
pub mod merge;
mod waits;
pub mod worker;

pub use self::adversary::Adversary;
pub use self::compute_loop::{CrashPoint, MinerSummary};

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context, Result};
use iota_core::Identity;
use iota_core::memory_plan::ComputeBackend;
use iota_cuda::ComputeDevice;
use iota_cuda::backend::GemmPrecision;
use iota_model::Backend as _;
use iota_protocol::RunConfig;
use iota_protocol::client::ControlClient;
use tokio::sync::mpsc;
use tracing::{info, warn};

use self::compute_loop::{ComputeIo, compute_loop};
use self::deliver::PeerSenders;
use self::events::{Input, Output};
use self::worker::Worker;
use crate::fileio::FileIo;
use crate::frame::{FrameLimits, RunContext};
use crate::granted_store::GrantedStore;
use crate::local_store::LocalDirStore;
use crate::pool::HostPool;
use crate::sent_frames::TapLimits;
use crate::tls::PeerDirectory;
use crate::transport::{Endpoint, TransportConfig};
use iota_protocol::object_store::SharedStore;
use iota_protocol::run_config::StoreAccess;

#[derive(Clone, Debug)]
pub struct MinerOptions {
    /// Orchestrator URL, e.g. `https://127.0.0.1:7100`.
    pub orchestrator: String,
    /// UDP address the data plane binds.
    pub listen: SocketAddr,
    /// Address other miners should dial (default: the bound address).
    pub advertise: Option<String>,
    /// Receive pool budget (bytes).
    pub pool_bytes: usize,
    pub heartbeat: Duration,
    /// Fault injection for tests and chaos runs (never set by `iota-miner run`).
    pub merge_fault: Option<merge::MergeFault>,
    /// Fault injection: stop dead (no goodbye) at this point of an epoch.
    pub crash_at: Option<CrashPoint>,
    /// An unreliable or dishonest miner, for tests and chaos runs (off
    /// unless `iota-miner run` is given the hidden `--adversary`).
    pub adversary: Option<Adversary>,
    /// The `collude` adversary's accomplices (their peer ids).
    pub accomplices: Vec<iota_core::PeerId>,
    /// Where the stage computes.
    pub device: ComputeDevice,
    /// GEMM precision on CUDA.
    pub gemm: GemmPrecision,
    /// The orchestrator's identity, pinned: the miner refuses a server with
    /// another key, and every reply and command not signed by it. None:
    /// trust the first orchestrator answering (warned about).
    pub orchestrator_key: Option<iota_core::PeerId>,
    /// The run's corpus on this machine (None: the generated toy corpus);
    /// checked against the run's corpus hash.
    pub data: Option<PathBuf>,
    /// Where chunks of a corpus fetched from the run's store are kept
    /// between runs (None: fetched again each time).
    pub corpus_cache: Option<PathBuf>,
    /// The object store directory the orchestrator and every miner share
    /// on one machine (a run on a bucket needs none).
    pub store: Option<PathBuf>,
    /// Accept a plaintext `http://` orchestrator URL (local tests only).
    pub insecure_plaintext: bool,
    /// CA certificates (PEM) for an orchestrator with a CA-issued
    /// certificate (None: its identity certificate, key pinned).
    pub tls_ca: Option<PathBuf>,
    /// Bytes of weights snapshots kept in memory per epoch as evidence for
    /// validators (see `evidence_log`).
    pub evidence_bytes: usize,
    /// Bytes of received frames (inputs, gradients) kept per epoch as
    /// evidence, and as much again of the frames sent.
    pub evidence_frame_bytes: usize,
    /// Where weights snapshots past `evidence_bytes` are kept (in a
    /// directory of this miner's own below it) until the epoch's evidence
    /// is freed. None: in memory only, and later work of a long epoch
    /// cannot be shown.
    pub evidence_dir: Option<PathBuf>,
    /// Most bytes of snapshots kept in `evidence_dir` per epoch (u64::MAX:
    /// as much as its filesystem holds with 1 GiB left free).
    pub evidence_disk_bytes: u64,
    /// Test tool: the stage worker takes this many times its compute time
    /// per frame (it sleeps the rest), so tests can give honest miners
    /// different throughputs. 1 (the default): full speed.
    pub slowdown: u32,
    /// Test tool: each frame of work takes at least this long (the worker
    /// sleeps the rest), so a chaos test's run lasts a known least time on
    /// any machine. 0 (the default): no floor.
    pub min_frame_ms: u64,
    /// The data plane's congestion controller.
    pub congestion: crate::transport::Congestion,
    /// Test tool: on the CPU, GEMM operands rounded to bf16 (a GPU's
    /// `--gemm bf16` arithmetic), so cross-backend validation is tested
    /// without a GPU. The miner says so in its device label.
    pub cpu_bf16_gemm: bool,
    /// Where to serve this miner's Prometheus metrics (None: nowhere).
    pub metrics: Option<SocketAddr>,
    /// The memory this miner's stage may use, in bytes (None: on a GPU its
    /// free memory at start; on the CPU nothing is stated). Stated to the
    /// orchestrator, which assigns a stage and routes micro-batches within it.
    pub memory_limit: Option<u64>,
    /// When the stage recomputes activations in the backward instead of
    /// keeping them (the same gradients, less memory, more compute).
    pub recompute: iota_core::memory_fit::Recompute,
}

impl MinerOptions {
    pub fn local(orchestrator: String) -> Self {
        MinerOptions {
            orchestrator,
            listen: "127.0.0.1:0".parse().unwrap(),
            advertise: None,
            pool_bytes: 256 << 20,
            heartbeat: Duration::from_millis(500),
            merge_fault: None,
            accomplices: Vec::new(),
            crash_at: None,
            adversary: None,
            device: ComputeDevice::Cpu,
            gemm: GemmPrecision::Bf16,
            orchestrator_key: None,
            congestion: TransportConfig::default().congestion,
            cpu_bf16_gemm: false,
            data: None,
            corpus_cache: None,
            store: None,
            insecure_plaintext: false,
            tls_ca: None,
            evidence_bytes: evidence_log::DEFAULT_EVIDENCE_BYTES,
            evidence_frame_bytes: evidence_log::DEFAULT_EVIDENCE_BYTES / 4,
            evidence_dir: None,
            evidence_disk_bytes: u64::MAX,
            slowdown: 1,
            min_frame_ms: 0,
            metrics: None,
            memory_limit: None,
            recompute: iota_core::memory_fit::Recompute::Auto,
        }
    }
}

/// Joins the run at `opts.orchestrator` and works until it is done (or
/// `stop` is set).
pub async fn run(opts: MinerOptions, id: Identity, stop: Arc<AtomicBool>) -> Result<MinerSummary> {
    let seed = *id.seed();
    let id = Arc::new(id);
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
    // The frames this miner sends, as signed: its evidence for validators.
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
    let addr = match (&black_hole, opts.adversary) {
        (Some(sock), Some(Adversary::Silent)) => sock.local_addr()?.to_string(),
        // Closed: the socket is dropped below, so the port refuses.
        (Some(sock), _) => sock.local_addr()?.to_string(),
        _ => opts.advertise.clone().unwrap_or(local.to_string()),
    };
    let black_hole = black_hole.filter(|_| opts.adversary == Some(Adversary::Silent));
    if opts.orchestrator_key.is_none() {
        warn!("no --orchestrator-key given: trusting whichever orchestrator answers at {}", opts.orchestrator);
    }
    let mut client =
        connect(&opts.orchestrator, id.clone(), opts.orchestrator_key, opts.insecure_plaintext, opts.tls_ca.as_deref())
            .await?;
    info!(orchestrator = %client.audience().orchestrator.to_hex(), run = client.audience().run_id, "connected");
    let device = device_label(opts.device, opts.gemm, opts.cpu_bf16_gemm);
    let memory = stated_memory(&opts, gpu.as_deref());
    if memory.0 > 0 {
        info!(
            gib = format!("{:.2}", memory.0 as f64 / (1u64 << 30) as f64),
            compute = memory.1.name(),
            "memory stated"
        );
    }
    let stating = (memory.0, memory.1.name().to_string());
    let reply = client.register_stating(addr.clone(), 0.0, device.clone(), stating.clone()).await.map_err(|s| {
        if s.code() == tonic::Code::ResourceExhausted {
            anyhow::anyhow!("the orchestrator refused this miner: {}", s.message())
        } else {
            anyhow::Error::new(s).context("registering with the orchestrator")
        }
    })?;
    let cfg = RunConfig::from_json(&reply.run_config_json).context("the orchestrator's run config")?;
    ctx.set_run_id(reply.run_id);
    // A dead peer must be found (and reported) well within a route's
    // timeout, or the orchestrator's timeout fires first and blames nobody.
    let connect = Duration::from_millis((cfg.spec.route_timeout_ms / 4).clamp(200, 10_000));
    ep.set_connect_timeout(connect.min(TransportConfig::default().connect_timeout));
    info!(index = reply.miner_index, addr, "registered");
    let store: SharedStore = match (cfg.store, &opts.store) {
        (StoreAccess::Granted, dir) => {
            if let Some(dir) = dir {
                warn!(dir = %dir.display(), "this run's store is a bucket reached through grants; --store is ignored");
            }
            Arc::new(GrantedStore::new(client.clone()).context("the HTTPS client for the run's bucket")?)
        }
        (StoreAccess::Directory, Some(dir)) => LocalDirStore::shared(dir, FileIo::start(false))
            .with_context(|| format!("opening the object store {}", dir.display()))?,
        (StoreAccess::Directory, None) => anyhow::bail!(
            "no object store: this run keeps its objects in a directory on the orchestrator's machine; give \
             --store DIR (iota-control orchestrator prints it)"
        ),
    };
    let data = opts.data.clone();
    let corpus_cache = opts.corpus_cache.clone();

    // `stop` is the caller's; `finished` ends this miner's own tasks.
    let finished = Arc::new(AtomicBool::new(false));
    let (in_tx, in_rx) = mpsc::channel::<Input>(1024);
    let (out_tx, mut out_rx) = mpsc::channel::<Output>(1024);
    let epoch = Arc::new(AtomicU64::new(0));
    let tokens = Arc::new(AtomicU64::new(0));
    let metrics = crate::miner_metrics::MinerMetrics::default();
    let in_flight = Arc::new(AtomicU32::new(0));
    // The last throughput measured (f64 bits), for re-registrations.
    let measured_tps = Arc::new(AtomicU64::new(0));

    // Orchestrator commands, re-subscribing when the stream drops.
    let cmd_task = {
        let rejoin = iota_protocol::client::Rejoin::Miner {
            data_addr: addr.clone(),
            device: device.clone(),
            tokens_per_s: measured_tps.clone(),
            memory: stating,
        };
        iota_protocol::client::follow_commands(client.clone(), finished.clone(), rejoin, in_tx.clone(), Input::Command)
    };
    // Ticks for overdue-input reports, the merge's retries and store
    // fallbacks. A report goes out at the first tick past its overdue time,
    // so the period adds to how long a silent neighbour stalls its
    // micro-batch (250 ms was half of a `tiny` epoch's detection time).
    let tick_task = {
        let (in_tx, stop) = (in_tx.clone(), finished.clone());
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
    };
    // Frames from peers.
    let frame_task = {
        let (ep, in_tx) = (ep.clone(), in_tx.clone());
        tokio::spawn(async move {
            while let Some(f) = ep.recv().await {
                if in_tx.send(Input::Frame(Box::new(f))).await.is_err() {
                    return;
                }
            }
        })
    };
    // Heartbeats.
    let hb_task = {
        let (mut client, epoch, every, stop, tokens) =
            (client.clone(), epoch.clone(), opts.heartbeat, finished.clone(), tokens.clone());
        let (in_flight, measured_tps) = (in_flight.clone(), measured_tps.clone());
        let commitments = ep.commitments();
        tokio::spawn(async move {
            let mut iv = tokio::time::interval(every);
            let (mut last, mut at) = (0u64, std::time::Instant::now());
            while !stop.load(Ordering::SeqCst) {
                iv.tick().await;
                // Throughput since the last heartbeat (the orchestrator uses it to balance stages).
                let (now_tokens, now) = (tokens.load(Ordering::Relaxed), std::time::Instant::now());
                let tps = (now_tokens - last) as f64 / now.duration_since(at).as_secs_f64().max(1e-3);
                (last, at) = (now_tokens, now);
                measured_tps.store(tps.to_bits(), Ordering::Relaxed);
                let busy = in_flight.load(Ordering::Relaxed);
                let heads = commitments.lock().heads();
                if let Err(e) = client.heartbeat(epoch.load(Ordering::SeqCst), busy, tps, &heads).await {
                    tracing::debug!(error = %e, "heartbeat failed");
                }
            }
        })
    };
    // Frames out, one queue per peer (a dead peer delays only its own);
    // reports out in the order they were made, retried while the
    // orchestrator restarts.
    let (report_tx, mut report_rx) = mpsc::unbounded_channel::<iota_protocol::pb::report::Kind>();
    let hostile_reporter = opts.adversary == Some(Adversary::HostileUnreachable);
    let pump = {
        let (ep, store, report_tx) = (ep.clone(), store.clone(), report_tx.clone());
        tokio::spawn(async move {
            let mut senders = PeerSenders::new(ep.clone(), store.clone(), report_tx.clone());
            while let Some(o) = out_rx.recv().await {
                match o {
                    // The `hostile-unreachable` test tool: its pipeline
                    // frames never leave; it blames the neighbour instead.
                    // Its merge frames go out: it merges honestly.
                    Output::Frame { to, meta, .. }
                        if hostile_reporter
                            && matches!(
                                meta.direction,
                                iota_core::wire::Direction::Activation | iota_core::wire::Direction::ActivationGrad
                            ) =>
                    {
                        deliver::report_unreachable(&report_tx, to, &meta);
                    }
                    Output::Frame { to, meta, payload, fallback } => senders.send(to, meta, payload, fallback),
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
                }
            }
        })
    };
    let report_task = {
        let mut client = client.clone();
        tokio::spawn(async move {
            while let Some(k) = report_rx.recv().await {
                // The orchestrator may be restarting: retry what did not
                // reach it (a lost merge report would stall the stage until
                // the phase timeout). Reports are idempotent; stale ones are
                // counted and ignored.
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
    };
    let metrics_server = match opts.metrics {
        Some(at) => {
            let (ep, metrics, epoch, tokens, in_flight) =
                (ep.clone(), metrics.clone(), epoch.clone(), tokens.clone(), in_flight.clone());
            let router: iota_protocol::http_endpoint::Router = Arc::new(move |path: &str| {
                (path == "/metrics").then(|| {
                    let transport = ep.stats();
                    let text = metrics.encode(&crate::miner_metrics::Scrape {
                        transport: &transport,
                        tokens: tokens.load(Ordering::Relaxed),
                        in_flight: in_flight.load(Ordering::Relaxed),
                        store_retries: crate::granted_store::store_retries(),
                        epoch: epoch.load(Ordering::Relaxed),
                    });
                    iota_protocol::http_endpoint::Page {
                        content_type: iota_protocol::http_endpoint::OPENMETRICS,
                        body: text.into_bytes(),
                    }
                })
            });
            let (bound, task) = iota_protocol::http_endpoint::serve(at, router).await?;
            info!(at = %format!("http://{bound}/metrics"), "metrics");
            Some(task)
        }
        None => None,
    };
    // The compute thread.
    let rt = tokio::runtime::Handle::current();
    let me = ep.peer_id();
    let (ep_dir, ep_ctx) = (dir.clone(), ctx.clone());
    let stop_c = stop.clone();
    let commitments_c = ep.commitments();
    let _black_hole = black_hole;
    let (crash_at, adversary) = (opts.crash_at, opts.adversary);
    let fault = opts.merge_fault.or_else(|| adversary.and_then(Adversary::merge_fault));
    let accomplices = opts.accomplices.clone();
    let (evidence_bytes, evidence_frame_bytes) = (opts.evidence_bytes, opts.evidence_frame_bytes);
    // Snapshots past the memory budget go to disk, in a directory of this
    // miner's own (miners on one machine may share the parent).
    let evidence_spill = match (&opts.evidence_dir, cfg.spec.validation.validators.is_empty()) {
        (Some(parent), false) => {
            let dir = parent.join(&me.to_hex()[..16]);
            let spill = evidence_log::SpillDir::open(dir.clone(), opts.evidence_disk_bytes)
                .with_context(|| format!("opening the evidence directory {}", dir.display()))?;
            info!(dir = %dir.display(), "weights snapshots past the memory budget are kept on disk for validators");
            Some(spill)
        }
        _ => None,
    };
    let slowdown = opts.slowdown.max(1);
    let min_frame = Duration::from_millis(opts.min_frame_ms);
    let (gemm, cpu_bf16_gemm, recompute) = (opts.gemm, opts.cpu_bf16_gemm, opts.recompute);
    let compute = std::thread::Builder::new().name("iota-stage".into()).spawn(move || -> Result<MinerSummary> {
        let butterfly = cfg.spec.merge.method == iota_protocol::MergeMethod::Butterfly;
        let merge_spec = cfg.spec.merge.clone();
        let fault_merge = (butterfly && fault.is_some()).then(|| {
            let mut b = merge::Butterfly::new(me, merge_spec, store.clone(), rt.clone(), ep_ctx.clone());
            b.fault = fault;
            b.accomplices = accomplices.clone();
            Box::new(b) as Box<dyn merge::Merge>
        });
        let io = ComputeIo {
            in_rx,
            out_tx,
            stop: stop_c,
            crash_at,
            tokens,
            in_flight,
            fault_merge,
            adversary,
            commitments: commitments_c,
            sent,
            evidence_bytes,
            evidence_frame_bytes,
            evidence_spill,
            slowdown,
            min_frame,
            metrics,
            device_memory: None,
            device_high_water: None,
        };
        // The backend is made on this thread, with the context bound to it.
        match gpu {
            None => {
                let be = Arc::new(if cpu_bf16_gemm {
                    iota_model::CpuBackend::with_bf16_gemm()
                } else {
                    iota_model::CpuBackend::new()
                });
                compute_loop(
                    Worker::new(be, me, cfg, data, store, rt, ep_dir, ep_ctx)
                        .with_corpus_cache(corpus_cache)
                        .with_memory(Some(memory))
                        .with_recompute(recompute),
                    io,
                )
            }
            Some(gpu) => {
                gpu.ctx.bind_to_thread().map_err(|e| anyhow::anyhow!("binding the CUDA context: {e:?}"))?;
                let ctx = gpu.ctx.clone();
                let pool = gpu.clone();
                let be = Arc::new(iota_cuda::backend::CudaBackend::with_precision(gpu, gemm)?);
                info!(backend = %be.name(), "stage computes on the GPU");
                let io = ComputeIo {
                    device_memory: Some(Box::new(move || {
                        ctx.mem_get_info().ok().map(|(free, total)| ((total - free) as u64, total as u64))
                    })),
                    device_high_water: Some(Box::new(move || pool.pool_high_water())),
                    ..io
                };
                compute_loop(
                    Worker::new(be, me, cfg, data, store, rt, ep_dir, ep_ctx)
                        .with_corpus_cache(corpus_cache)
                        .with_memory(Some(memory))
                        .with_recompute(recompute),
                    io,
                )
            }
        }
    })?;
    let mut summary = tokio::task::spawn_blocking(move || compute.join())
        .await?
        .map_err(|_| anyhow::anyhow!("stage worker panicked"))??;
    // Let the last frames and reports go out, then stop.
    drop(in_tx);
    let _ = tokio::time::timeout(Duration::from_secs(5), pump).await;
    drop(report_tx);
    let _ = tokio::time::timeout(Duration::from_secs(5), report_task).await;
    summary.transport = ep.stats();
    finished.store(true, Ordering::SeqCst);
    for t in [cmd_task, frame_task, hb_task, tick_task].into_iter().chain(metrics_server) {
        t.abort();
    }
    ep.close();
    Ok(summary)
}

/// What a miner tells the orchestrator it computes on.
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

/// Connects to the orchestrator at `url` (retrying while it starts), TLS
/// pinned to `pinned`; a plaintext URL only with `plaintext` (local tests).
/// Validators connect the same way.
pub async fn connect(
    url: &str,
    id: Arc<Identity>,
    pinned: Option<iota_core::PeerId>,
    plaintext: bool,
    tls_ca: Option<&std::path::Path>,
) -> Result<ControlClient> {
    let roots = tls_ca.map(iota_protocol::tls_identity::load_ca_roots).transpose()?;
    if url.starts_with("http://") && !plaintext {
        anyhow::bail!(
            "{url} is plaintext: the orchestrator's URL is https://... (iota-control orchestrator prints it); \
             --insecure-plaintext allows http:// for local tests"
        );
    }
    let mut last = None;
    for _ in 0..50 {
        let attempt = match &roots {
            _ if plaintext => ControlClient::connect_insecure_plaintext(url.to_string(), id.clone(), pinned).await,
            Some(r) => ControlClient::connect_ca(url.to_string(), id.clone(), pinned, r.clone()).await,
            None => ControlClient::connect(url.to_string(), id.clone(), pinned).await,
        };
        match attempt {
            Ok(c) => return Ok(c),
            Err(e) => last = Some(e),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(anyhow::anyhow!(
        "cannot reach the orchestrator at {url}: {}",
        last.map(|e| format!("{e:#}")).unwrap_or_default()
    ))
}
