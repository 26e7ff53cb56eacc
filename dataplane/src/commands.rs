//! The `iota-miner` command line: `run` joins a training run, `selftest`
//! checks the compute kernels, `transport-probe` measures the data plane.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{Args, Parser, Subcommand};
use iota_core::{Identity, PeerId};
use std::sync::atomic::{AtomicBool, Ordering};

use crate::miner::{self, MinerOptions};
use crate::probe::{self, ProbeReport};
use crate::{Endpoint, FrameLimits, HostPool, PeerDirectory, RunContext, TransportConfig, identity_file};

#[derive(Parser)]
#[command(name = "iota-miner", version, about = "iota-rs miner: the data-plane daemon")]
pub struct Cli {
    #[command(subcommand)]
    pub cmd: Cmd,
    /// Log lines as text for people, or as one JSON object per line for
    /// log collectors (RUST_LOG filters either).
    #[arg(long, global = true, value_enum, default_value_t = crate::LogFormat::Text)]
    pub log_format: crate::LogFormat,
}

#[derive(Subcommand)]
pub enum Cmd {
    /// Join a training run: register with the orchestrator, take the stage it
    /// assigns, and work until the run is done.
    Run(Box<RunArgs>),
    /// Measure the QUIC data plane: send frames to a peer and report
    /// throughput and latency (send start to acknowledgement).
    ///
    /// Two machines: start `--listen ADDR --allow PEER` on one (it prints its
    /// peer id), then `--connect ADDR --peer ID` on the other, each with its
    /// own `--identity` file. One machine: `--local`.
    TransportProbe(ProbeArgs),
    /// Check the custom kernels (butterfly reduce slice, int8 wire codec)
    /// against their CPU references on fresh random inputs; prints a table
    /// and exits non-zero on any failure. `--device cpu` checks the CPU
    /// references against plain re-computations (no GPU needed).
    Selftest(SelftestArgs),
    /// Where a running miner stands: its state (waiting, training, merging,
    /// benched, suspended ...), why, its stage and what it was paid, as its
    /// `/status` page says (the miner must run with `--metrics ADDR`).
    Status(StatusArgs),
}

#[derive(Args)]
pub struct StatusArgs {
    /// The address the miner serves its metrics at (its `--metrics`).
    #[arg(long, default_value = "127.0.0.1:9100")]
    metrics: String,
}

/// Reads the running miner's `/status` line and prints it.
async fn status(a: StatusArgs) -> Result<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let ask = async {
        let mut s = tokio::net::TcpStream::connect(&a.metrics).await?;
        s.write_all(b"GET /status HTTP/1.0\r\nHost: miner\r\n\r\n").await?;
        let mut body = Vec::new();
        // Bounded: a line and its headers.
        s.take(64 << 10).read_to_end(&mut body).await?;
        anyhow::Ok(body)
    };
    let reply = tokio::time::timeout(std::time::Duration::from_secs(5), ask)
        .await
        .map_err(|_| anyhow::anyhow!("no answer from {} in 5 s", a.metrics))?
        .with_context(|| {
            format!("reading http://{}/status (is the miner running with --metrics {}?)", a.metrics, a.metrics)
        })?;
    println!("{}", status_line(&reply, &a.metrics)?);
    Ok(())
}

/// The line a miner's `/status` reply holds (an HTTP/1 response).
fn status_line(reply: &[u8], from: &str) -> Result<String> {
    let text = String::from_utf8_lossy(reply);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let first = head.lines().next().unwrap_or("");
    anyhow::ensure!(
        first.starts_with("HTTP/1.") && first.split(' ').nth(1) == Some("200"),
        "http://{from}/status answered: {first}"
    );
    let line: String = body.trim().chars().filter(|c| !c.is_control()).collect();
    Ok(if line.is_empty() { "the miner has had no heartbeat reply yet".to_string() } else { line })
}

#[derive(Args)]
pub struct SelftestArgs {
    /// cpu or cuda.
    #[arg(long, default_value = "cuda")]
    device: String,
}

fn selftest(a: SelftestArgs) -> Result<()> {
    use iota_cuda::selftest::{Device, run};
    let device = match a.device.as_str() {
        "cpu" => Device::Cpu,
        "cuda" => Device::Cuda,
        d => anyhow::bail!("unknown device '{d}' (cpu, cuda)"),
    };
    if device == Device::Cuda {
        iota_cuda::ensure_nvrtc();
    }
    let checks = run(device)?;
    println!("{:<40} {:>14} {:>14} {:>10} {:>6} {:>10}", "op", "shape", "max rel err", "tolerance", "", "ms");
    let mut failed = 0;
    for c in &checks {
        let ok = c.passed();
        failed += usize::from(!ok);
        println!(
            "{:<40} {:>14} {:>14.3e} {:>10.1e} {:>6} {:>10.2}",
            c.op,
            c.shape,
            c.max_rel_err,
            c.tolerance,
            if ok { "pass" } else { "FAIL" },
            c.millis
        );
    }
    anyhow::ensure!(failed == 0, "{failed} of {} checks failed", checks.len());
    Ok(())
}

#[derive(Args)]
pub struct RunArgs {
    /// Orchestrator URL (https://; `iota-control orchestrator` prints it).
    #[arg(long, default_value = "https://127.0.0.1:7100")]
    orchestrator: String,
    /// Accept a plaintext http:// orchestrator URL: nothing but the signed
    /// messages is then protected. For local tests only.
    #[arg(long)]
    insecure_plaintext: bool,
    /// The orchestrator has a CA-issued certificate (`iota-control
    /// orchestrator --tls-cert`): check its chain against the CA
    /// certificates (PEM) in FILE and the URL's host name.
    #[arg(long, value_name = "FILE", conflicts_with = "insecure_plaintext")]
    tls_ca: Option<PathBuf>,
    /// The orchestrator's identity (64 hex characters; `iota-control
    /// orchestrator` prints it). The miner refuses a server with another key
    /// and every reply or command it did not sign. Without it the miner
    /// trusts whichever orchestrator answers, and says so.
    #[arg(long, value_parser = parse_peer)]
    orchestrator_key: Option<PeerId>,
    /// The orchestrator's join token (`iota://KEY@HOST:PORT`, which
    /// `iota-control orchestrator` prints): its URL and its key, pinned, in
    /// one. Instead of --orchestrator and --orchestrator-key.
    #[arg(long, value_name = "TOKEN", value_parser = parse_join,
          conflicts_with_all = ["orchestrator", "orchestrator_key", "insecure_plaintext"])]
    join: Option<iota_protocol::join_token::JoinToken>,
    /// The object store directory of the run (shared by the orchestrator and
    /// every miner; `iota-control orchestrator` prints it).
    #[arg(long)]
    store: Option<PathBuf>,
    /// The run's corpus on this machine (text, .jsonl, .bin shards). Without
    /// it the generated toy corpus is used, or, when the run trains on a
    /// prepared corpus (`iota-control orchestrator --prepared-data`), the
    /// corpus in the run's store; either way it must be the run's (checked
    /// by its hash).
    #[arg(long)]
    data: Option<PathBuf>,
    /// Where chunks of a prepared corpus fetched from the run's store are
    /// kept (checked again before each use), so a restart does not fetch
    /// them again.
    #[arg(long, default_value = "iota-cache/corpus")]
    corpus_cache: PathBuf,
    /// In a validated run, validators may ask for the weights of any inner
    /// step of an epoch after it ends (the miner's evidence). Snapshots are
    /// kept in memory up to --evidence-memory-mib and past it in files
    /// below DIR (one directory per miner identity; removed as the next
    /// epoch starts). Give it a disk with room for an epoch's steps: a
    /// snapshot is 4 bytes a stage weight (28 MB for a `small` stage, about
    /// 2 GB for a `1.5b` one). With `--merge-codec sparse`, the records of
    /// what this miner contributed (six stage-sized vectors, for audits)
    /// are kept here too, in files removed as they are created, while the
    /// filesystem keeps 1 GiB free (else in memory).
    #[arg(long, value_name = "DIR", default_value = "iota-cache/evidence")]
    evidence_dir: PathBuf,
    /// Memory for the evidence's weights snapshots, in MiB (received frames
    /// get a quarter of it besides).
    #[arg(long, value_name = "MIB", default_value_t = 1024,
          value_parser = clap::value_parser!(u64).range(1..=1 << 24))]
    evidence_memory_mib: u64,
    /// Most disk for the evidence's snapshots per epoch, in GiB (default:
    /// as much as --evidence-dir's filesystem holds with 1 GiB left free).
    /// Work past it cannot be shown to a validator, which counts it as
    /// evidence withheld.
    #[arg(long, value_name = "GIB", value_parser = parse_gib)]
    evidence_disk_gib: Option<u64>,
    /// UDP address the data plane listens on (port 0 = any free port). For
    /// a swarm across machines listen on 0.0.0.0:PORT and give --advertise.
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Address other miners should dial, if not the listen address (e.g.
    /// behind NAT or when listening on 0.0.0.0).
    #[arg(long)]
    advertise: Option<String>,
    /// This miner's identity file (created if missing; keep it secret).
    #[arg(long, default_value = "iota-miner.key")]
    identity: PathBuf,
    /// Compute threads (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Receive pool budget in MiB.
    #[arg(long, default_value_t = 256)]
    pool_mib: usize,
    /// Where the stage computes: cpu (the fp32 reference), cuda (GPU 0) or
    /// cuda:N. `iota-miner selftest --device cuda` checks a GPU first.
    #[arg(long, default_value = "cpu")]
    device: iota_cuda::ComputeDevice,
    /// GEMM precision on CUDA: bf16 (bf16 operands, fp32 accumulation) or fp32.
    #[arg(long, default_value = "bf16", value_parser = parse_gemm)]
    gemm: iota_cuda::backend::GemmPrecision,
    /// A test tool, hidden: behave as a bad miner (silent, closed, slow,
    /// flaky, noise, zeros, replay) so liveness and validation can be
    /// tested end to end with real processes. Never for a real run.
    #[arg(long, hide = true, value_parser = parse_adversary)]
    adversary: Option<miner::Adversary>,
    /// A test tool, hidden: with `--adversary collude`, the peer ids (hex)
    /// of the miners it conspires with. Never for a real run.
    #[arg(long, hide = true, value_delimiter = ',', value_parser = parse_peer)]
    accomplices: Vec<PeerId>,
    /// A test tool, hidden: each frame of work takes at least N ms (the
    /// worker sleeps the rest), so a chaos test's run lasts a known least
    /// time on any machine. Never for a real run.
    #[arg(long, hide = true, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=10_000))]
    min_frame_ms: u64,
    /// The data plane's congestion controller: bbr (model-based) or cubic
    /// (loss-based). Over 100 Mbit/s with 50 ms RTT and 1% loss, a `small`
    /// 3x2 swarm trained at 0.68x of its unshaped speed with bbr and 0.17x
    /// with cubic (docs/BENCHMARKS.md, `iota-bench wan`).
    #[arg(long, default_value = "bbr", value_parser = parse_congestion)]
    congestion: crate::Congestion,
    /// Serve this miner's Prometheus metrics at http://ADDR/metrics: step
    /// times, tokens, frames and bytes per lane, frames rejected by reason,
    /// merge times, store retries, GPU memory. Off by default; read-only
    /// and unauthenticated, so give a loopback address unless the scraper
    /// is elsewhere.
    #[arg(long, value_name = "ADDR")]
    metrics: Option<std::net::SocketAddr>,
    /// Memory this miner's stage may use, in GiB (default: on a GPU its
    /// free memory at start; on the CPU none is stated). The miner states
    /// it when it registers: the orchestrator assigns it only a stage its
    /// memory plan holds (`iota-bench scale --plan-only` prints the plan)
    /// and routes it no more micro-batches than fit, and the miner stops
    /// with one line saying what its stage needs if it is assigned one that
    /// does not.
    #[arg(long, value_name = "GIB", value_parser = parse_gib)]
    memory_gib: Option<u64>,
    /// When the stage recomputes its activations in the backward instead
    /// of keeping them for every micro-batch in flight: the same gradients,
    /// for about a third more compute. `auto`: only where the stated memory
    /// holds more micro-batches that way (a `1.5b` head stage at batch 4 x
    /// 1024 on a 16 GB card); `always`: whatever the memory.
    #[arg(long, value_name = "WHEN", default_value = "auto", value_parser = parse_recompute)]
    recompute: iota_core::memory_fit::Recompute,
    /// For launchers (the local swarm), hidden: on exit, write the wire
    /// totals (frames and bytes per lane, rejections) as JSON to FILE.
    #[arg(long, hide = true, value_name = "FILE")]
    stats_out: Option<std::path::PathBuf>,
}

/// GiB (a positive decimal) as bytes.
fn parse_gib(s: &str) -> Result<u64, String> {
    match s.trim().parse::<f64>() {
        Ok(g) if g.is_finite() && g > 0.0 && g < 1e6 => Ok((g * (1u64 << 30) as f64) as u64),
        _ => Err(format!("'{s}' is not a positive number of GiB")),
    }
}

fn parse_recompute(s: &str) -> Result<iota_core::memory_fit::Recompute, String> {
    iota_core::memory_fit::Recompute::parse(s).ok_or_else(|| format!("'{s}': recompute is auto or always"))
}

fn parse_congestion(s: &str) -> Result<crate::Congestion, String> {
    crate::Congestion::parse(s)
        .ok_or_else(|| format!("unknown congestion controller '{s}' ({})", crate::Congestion::NAMES.join(", ")))
}

fn parse_adversary(s: &str) -> Result<miner::Adversary, String> {
    miner::Adversary::parse(s).ok_or_else(|| {
        let names: Vec<&str> = miner::Adversary::NAMES.iter().map(|(n, _)| *n).collect();
        format!("unknown adversary '{s}' ({})", names.join(", "))
    })
}

fn parse_gemm(s: &str) -> Result<iota_cuda::backend::GemmPrecision, String> {
    iota_cuda::backend::GemmPrecision::parse(s).ok_or_else(|| format!("unknown GEMM precision '{s}' (bf16, fp32)"))
}

#[derive(Args)]
pub struct ProbeArgs {
    /// Run both ends in this process over 127.0.0.1.
    #[arg(long, conflicts_with_all = ["listen", "connect"])]
    local: bool,
    /// Receive on this UDP address.
    #[arg(long, conflicts_with = "connect")]
    listen: Option<SocketAddr>,
    /// Send to the prober listening at this address.
    #[arg(long, requires = "peer")]
    connect: Option<SocketAddr>,
    /// Peer id (hex) of the listener to send to.
    #[arg(long)]
    peer: Option<String>,
    /// Peer ids (hex) allowed to send to this listener.
    #[arg(long)]
    allow: Vec<String>,
    /// This node's identity file (created if missing; keep it secret).
    #[arg(long, default_value = "iota-probe.key")]
    identity: PathBuf,
    /// Frames to send.
    #[arg(long, default_value_t = 1000)]
    frames: u64,
    /// Payload bytes per frame (a multiple of 4).
    #[arg(long, default_value_t = 256 << 10)]
    size: usize,
    /// Receive pool budget in MiB.
    #[arg(long, default_value_t = 256)]
    pool_mib: usize,
}

/// Runs one parsed command line (on its own tokio runtime).
pub fn run(cli: Cli) -> Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting the tokio runtime")?;
    rt.block_on(async {
        match cli.cmd {
            Cmd::Run(a) => run_miner(*a).await,
            Cmd::TransportProbe(a) => transport_probe(a).await,
            Cmd::Selftest(a) => selftest(a),
            Cmd::Status(a) => status(a).await,
        }
    })
}

async fn run_miner(a: RunArgs) -> Result<()> {
    if let Some(t) = a.threads {
        rayon::ThreadPoolBuilder::new().num_threads(t).build_global().context("setting the thread count")?;
    }
    if let iota_cuda::ComputeDevice::Cuda(_) = a.device {
        // Fail before joining the run, not after taking an assignment.
        anyhow::ensure!(iota_cuda::driver_present(), "{}", iota_cuda::CudaError::NoDriver);
    }
    let id = identity_file::load_or_create(&a.identity)?;
    println!("peer id: {}", id.peer_id().to_hex());
    let (orchestrator, orchestrator_key) = match &a.join {
        Some(t) => (t.url(), Some(t.key)),
        None => (a.orchestrator, a.orchestrator_key),
    };
    let mut opts = MinerOptions::local(orchestrator);
    opts.listen = a.listen;
    opts.advertise = a.advertise;
    opts.pool_bytes = a.pool_mib << 20;
    opts.device = a.device;
    opts.gemm = a.gemm;
    opts.orchestrator_key = orchestrator_key;
    opts.insecure_plaintext = a.insecure_plaintext;
    opts.tls_ca = a.tls_ca;
    opts.store = a.store;
    opts.data = a.data;
    opts.corpus_cache = Some(a.corpus_cache);
    opts.evidence_dir = Some(a.evidence_dir);
    opts.evidence_bytes = usize::try_from(a.evidence_memory_mib << 20).unwrap_or(usize::MAX);
    opts.evidence_frame_bytes = opts.evidence_bytes / 4;
    opts.evidence_disk_bytes = a.evidence_disk_gib.unwrap_or(u64::MAX);
    opts.adversary = a.adversary;
    opts.accomplices = a.accomplices;
    opts.min_frame_ms = a.min_frame_ms;
    opts.congestion = a.congestion;
    opts.metrics = a.metrics;
    opts.memory_limit = a.memory_gib;
    opts.recompute = a.recompute;
    if let Some(adv) = a.adversary {
        tracing::warn!(?adv, "running as a bad miner on purpose (--adversary, a test tool)");
    }
    let stop = Arc::new(AtomicBool::new(false));
    {
        let stop = stop.clone();
        ctrlc::set_handler(move || stop.store(true, Ordering::SeqCst)).context("installing the Ctrl-C handler")?;
    }
    let stats_out = a.stats_out.clone();
    let s = miner::run(opts, id, stop).await?;
    if let Some(path) = stats_out {
        let mut totals = s.transport.wire_totals();
        totals.peak_rss_bytes = crate::stats::peak_rss_bytes();
        totals.peak_device_bytes = s.peak_device_bytes;
        totals.stage = Some(s.stage);
        totals.recomputed = s.recomputed;
        totals.step_times = s.step_times;
        let json = serde_json::to_vec_pretty(&totals)?;
        std::fs::write(&path, json).with_context(|| format!("writing {}", path.display()))?;
    }
    println!("stage {} done: {} optimizer steps", s.stage, s.optimizer_steps);
    Ok(())
}

fn parse_join(s: &str) -> Result<iota_protocol::join_token::JoinToken, String> {
    iota_protocol::join_token::JoinToken::parse(s)
}

fn parse_peer(s: &str) -> Result<PeerId, String> {
    PeerId::from_hex(s.trim()).ok_or_else(|| format!("'{s}' is not a peer id (64 hex characters)"))
}

fn endpoint(addr: SocketAddr, id: Identity, pool_mib: usize) -> Result<Endpoint> {
    let ctx = Arc::new(RunContext::new(0, FrameLimits::default()));
    Endpoint::bind(addr, id, PeerDirectory::new(), ctx, HostPool::new(pool_mib << 20), TransportConfig::default())
        .with_context(|| format!("binding {addr}"))
}

fn print_report(r: &ProbeReport) {
    println!(
        "{} frames x {} bytes in {:.3}s: {:.3} GB/s, {:.0} frames/s, latency p50 {:.2} ms, p99 {:.2} ms",
        r.frames,
        r.frame_bytes,
        r.elapsed.as_secs_f64(),
        r.gbps(),
        r.frames as f64 / r.elapsed.as_secs_f64(),
        r.latency(0.5).as_secs_f64() * 1e3,
        r.latency(0.99).as_secs_f64() * 1e3
    );
}

async fn transport_probe(a: ProbeArgs) -> Result<()> {
    if a.size == 0 || !a.size.is_multiple_of(4) {
        bail!("--size must be a positive multiple of 4");
    }
    if a.local {
        let rx = endpoint("127.0.0.1:0".parse()?, Identity::generate(), a.pool_mib)?;
        let tx = Arc::new(endpoint("127.0.0.1:0".parse()?, Identity::generate(), a.pool_mib)?);
        rx.directory().insert(tx.peer_id(), None);
        tx.directory().insert(rx.peer_id(), Some(rx.local_addr()?));
        let (frames, to) = (a.frames, rx.peer_id());
        let server = tokio::spawn(async move { probe::serve(&rx, frames).await });
        let r = probe::push(tx, to, a.frames, a.size).await?;
        server.await??;
        print_report(&r);
        return Ok(());
    }
    let id = identity_file::load_or_create(&a.identity)?;
    println!("peer id: {}", id.peer_id().to_hex());
    if let Some(addr) = a.listen {
        if a.allow.is_empty() {
            bail!("--listen needs at least one --allow PEER (the sender's peer id)");
        }
        let ep = endpoint(addr, id, a.pool_mib)?;
        for p in &a.allow {
            ep.directory().insert(parse_peer(p).map_err(anyhow::Error::msg)?, None);
        }
        println!("listening on {}; waiting for {} frames", ep.local_addr()?, a.frames);
        // Acknowledgements go back on the connection the sender opened.
        probe::serve(&ep, a.frames).await?;
        println!("received {} frames", a.frames);
        return Ok(());
    }
    let Some(addr) = a.connect else { bail!("give --local, --listen ADDR or --connect ADDR") };
    let peer = parse_peer(a.peer.as_deref().unwrap_or_default()).map_err(anyhow::Error::msg)?;
    let ep = Arc::new(endpoint("0.0.0.0:0".parse()?, id, a.pool_mib)?);
    ep.directory().insert(peer, Some(addr));
    let r = tokio::time::timeout(Duration::from_secs(3600), probe::push(ep, peer, a.frames, a.size)).await??;
    print_report(&r);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::status_line;

    #[test]
    fn a_status_reply_is_its_line_and_anything_else_an_error() {
        let ok = b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\ntraining stage 1 of 3, epoch 2\n";
        assert_eq!(status_line(ok, "m").unwrap(), "training stage 1 of 3, epoch 2");
        let empty = b"HTTP/1.1 200 OK\r\n\r\n\n";
        assert_eq!(status_line(empty, "m").unwrap(), "the miner has had no heartbeat reply yet");
        let missing = b"HTTP/1.1 404 Not Found\r\n\r\n";
        assert!(status_line(missing, "m").unwrap_err().to_string().contains("404"));
        assert!(status_line(b"garbage", "m").is_err());
        let hostile = b"HTTP/1.1 200 OK\r\n\r\nbenched\x1b[2J now\n";
        assert!(!status_line(hostile, "m").unwrap().contains('\x1b'));
    }
}
