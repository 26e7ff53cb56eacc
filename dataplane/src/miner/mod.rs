//! The miner daemon: joins a run, then runs its stage worker.
//!
//! Async side (tokio): the QUIC endpoint, the orchestrator's command stream
//! (re-subscribing if it drops, e.g. across an orchestrator restart),
//! heartbeats, and a pump that sends the worker's frames and reports. Compute
//! side: the `Worker` on its own thread, fed through a channel, so model math
//! never blocks the network. `daemon.rs` holds the run, step by step.

mod adversary;
mod compute_loop;
mod daemon;
mod deliver;
pub mod events;
pub mod evidence_log;
pub mod standing;
use iota_checks::hashes;
pub mod merge;
mod waits;
pub mod worker;

pub use self::adversary::Adversary;
pub use self::compute_loop::{CrashPoint, MinerSummary};
pub use self::daemon::run;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use iota_core::Identity;
use iota_cuda::ComputeDevice;
use iota_cuda::backend::GemmPrecision;
use iota_protocol::client::ControlClient;

use crate::transport::TransportConfig;

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
