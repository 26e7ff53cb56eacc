//! `iota-bench`: benchmarks that print our figure next to a baseline measured
//! in the same run, as a ratio. Results and reproduce commands are recorded in
//! docs/BENCHMARKS.md.

mod adversary;
mod butterfly;
mod clasp;
mod control;
mod convergence;
mod liveness;
mod scale;
mod scale_measured;
mod sim;
mod stage_cpu;
mod stage_gpu;
mod store;
mod swarm;
mod timing;
mod transport;
mod wan;

use clap::{Parser, Subcommand};

// mimalloc, with per-thread byte counts (the control bench measures what the
// orchestrator keeps per miner; one thread-local add per call otherwise).
#[global_allocator]
static GLOBAL: iota_model::alloc::ThreadCounted<mimalloc::MiMalloc> =
    iota_model::alloc::ThreadCounted(mimalloc::MiMalloc);

#[derive(Parser)]
#[command(name = "iota-bench", version, about = "iota-rs benchmarks (each with a same-run baseline)")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Forward+backward of one body stage on the CPU backend (d=512, 8 heads,
    /// ffn 1408, 4 blocks, bottleneck in and out) against the same GEMMs
    /// alone (the floor); also prints each preset's boundary compression.
    StageCpu(stage_cpu::Args),
    /// Forward+backward of one body stage of the `1b` preset on the GPU
    /// (CudaBackend) against the same stage in PyTorch on the same GPU
    /// (bench/stage_ref.py, eager and torch.compile); achieved TFLOP/s
    /// against the measured bf16 GEMM peak. Needs an NVIDIA GPU.
    StageGpu(stage_gpu::Args),
    /// Move 1 GiB as frames over loopback with our QUIC data plane, plain TCP
    /// and TLS 1.3 over TCP; throughput, CPU per GiB, latency, ratios.
    Transport(transport::Args),
    /// The local swarm (orchestrator + STAGES x REPLICAS miner processes)
    /// against single-process training on the same tokens: tokens/s and the
    /// final validation loss.
    Swarm(Box<swarm::Args>),
    /// The swarm's training algorithm against one process on the same
    /// tokens from one seed and data order: one process at the global
    /// batch, synchronous data parallel, the swarm merging every H inner
    /// steps (H = 1, 8, 32, 128 and its own epoch), and its own interval
    /// without the bottleneck and with the f32 codec. Prints validation
    /// loss and wall time for each, and writes the loss curves (SVG).
    Convergence(Box<convergence::Args>),
    /// One stage's butterfly merge with R in-process replicas on loopback
    /// QUIC (R = 2, 4, 8, 16; P = 25M) against the parameter-server merge of
    /// the same weights: bytes per replica, the aggregator's bytes, time.
    Butterfly(butterfly::Args),
    /// The orchestrator on one core: registrations/s and signed RPCs/s
    /// (server side, in process) against one Ed25519 verification, and the
    /// bytes it keeps per registered miner at 100 / 1,000 / 10,000 miners.
    Control(control::Args),
    /// tiny 2x2 in process with one silent, closed, slow or flaky miner in
    /// the head stage, the tail stage or joining mid-run, against the same
    /// swarm with honest miners only: wall-time ratio, drops, benching.
    Liveness(liveness::Args),
    /// tiny 3x2 in process with two validators and one dishonest miner
    /// (noise, zeros, replay in the head; copy, grad-noise, lazy in the
    /// middle; loss-lie, noisy or stale gradients in the tail), against the same swarm with honest miners only: detected, the
    /// epoch of the conviction, honest miners flagged, wall-time ratio,
    /// validator compute as a share of the miners'.
    Adversary(adversary::Args),
    /// CLASP on seeded simulated epochs: detection power for a miner of
    /// harm h (0.01-0.1 nats) against the pathways sampled (64-4096), with
    /// the honest miners' false-positive rate and the naive per-miner mean
    /// as the baseline from the same runs; estimate time up to 1,024 miners.
    Clasp(clasp::Args),
    /// The swarm of separate hosts (network namespaces: s3s-fs, the
    /// orchestrator, each miner; TLS, admission, the bucket), `small` 3 x 2,
    /// with unshaped links (the baseline) and with every miner's link at
    /// 100 Mbit/s, 50 ms RTT, 1% loss: tokens/s and the loss at equal
    /// tokens. Needs root, s3s-fs and the release binaries.
    Wan(wan::Args),
    /// A checkpoint through the bucket (s3s-fs on loopback): the
    /// orchestrator's S3 client and a miner's presigned URLs, upload and
    /// download, against a plain file copy of the same bytes.
    Store(store::Args),
    /// Per-miner memory and traffic of each stage of a model (`1.5b`,
    /// `15b`, ...): with --plan-only, every stage's memory by what holds it
    /// (weights, gradients, optimizer moments, stashes, bf16 copies, saved
    /// activations, workspaces), which cards (16, 24, 80 GiB) hold it, the
    /// boundary bytes per token and the merge's bytes per replica per epoch,
    /// from the accounting a miner states when it registers. Without
    /// --plan-only: a swarm of that shape and one process of the same model
    /// on --device, in one run: tokens/s ratio, the epochs' share outside
    /// training, time to the first micro-batch, store fallbacks, each
    /// miner's peak memory beside its plan.
    Scale(scale::Args),
    /// The deterministic swarm simulator (orchestrator, miners, network,
    /// churn on a virtual clock) at 100 / 1,000 / 2,000 / 10,000 miners:
    /// events/s, memory per miner, wall time per simulated epoch, against
    /// real time; and one Yuma epoch at 256 validators x 4,096 miners.
    Sim(sim::Args),
}

fn main() {
    iota_model::alloc::keep_freed_memory();
    // Logs only when asked for: the tables are the output.
    if std::env::var_os("RUST_LOG").is_some() {
        iota_dataplane::init_logging();
    }
    let res = match Cli::parse().cmd {
        Cmd::StageCpu(a) => stage_cpu::run(a),
        Cmd::StageGpu(a) => stage_gpu::run(a),
        Cmd::Transport(a) => transport::run(a),
        Cmd::Swarm(a) => swarm::run(*a),
        Cmd::Convergence(a) => convergence::run(*a),
        Cmd::Butterfly(a) => butterfly::run(a),
        Cmd::Control(a) => control::run(a),
        Cmd::Liveness(a) => liveness::run(a),
        Cmd::Adversary(a) => adversary::run(a),
        Cmd::Clasp(a) => clasp::run(a),
        Cmd::Wan(a) => wan::run(a),
        Cmd::Store(a) => store::run(a),
        Cmd::Scale(a) => scale::run(a),
        Cmd::Sim(a) => sim::run(a),
    };
    if let Err(e) = res {
        eprintln!("error: {e:#}");
        std::process::exit(2);
    }
}

#[cfg(test)]
mod cli_tests {
    /// Every subcommand's arguments are well formed: no two share a name
    /// (a bench that flattens the run's arguments must not repeat one of
    /// them), which clap checks only when a command is built.
    #[test]
    fn every_subcommand_is_well_formed() {
        use clap::CommandFactory;
        super::Cli::command().debug_assert();
    }
}
