//! wan: the swarm of separate hosts (`iota_tests::netns::NetSwarm`: s3s-fs,
//! the orchestrator and each miner in a network namespace of its own, TLS,
//! admission, the bucket) on unshaped veths (the baseline: loopback speed)
//! and with every miner's link shaped (rate by `tc tbf`; delay, jitter and
//! loss on the data plane by a relay): tokens/s of each and the training
//! loss at equal tokens. Needs root (namespaces), s3s-fs and the workspace's
//! release binaries.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use iota_tests::netns::{NetSwarm, Wan, epoch_losses};
use iota_tests::udp_relay::LinkShape;

#[derive(clap::Args)]
pub struct Args {
    /// Model preset.
    #[arg(long, default_value = "small")]
    model: String,
    #[arg(long, default_value_t = 3)]
    stages: u32,
    #[arg(long, default_value_t = 2)]
    replicas: u32,
    #[arg(long, default_value_t = 2)]
    epochs: u64,
    /// Micro-batches per epoch.
    #[arg(long, default_value_t = 24)]
    micro_batches: u64,
    #[arg(long, default_value_t = 4)]
    batch: usize,
    #[arg(long, default_value_t = 128)]
    seq: usize,
    /// Each miner's link rate, each way (Mbit/s).
    #[arg(long, default_value_t = 100)]
    rate_mbit: u32,
    /// Round-trip time added on the data plane (ms; half each way).
    #[arg(long, default_value_t = 50)]
    rtt_ms: u64,
    /// Jitter added to each datagram's delay, each way (ms, uniform).
    #[arg(long, default_value_t = 2)]
    jitter_ms: u64,
    /// Datagrams lost on the data plane, each way (a fraction).
    #[arg(long, default_value_t = 0.01)]
    loss: f64,
    /// The miners' data-plane congestion controller (cubic, bbr).
    #[arg(long, default_value = "cubic")]
    congestion: String,
    /// Longest either run may take (s).
    #[arg(long, default_value_t = 900)]
    limit_s: u64,
}

struct Outcome {
    tokens: u64,
    seconds: f64,
    losses: Vec<f32>,
    wall: f64,
    relayed: (u64, u64),
}

fn run_one(a: &Args, wan: Option<Wan>) -> Result<Outcome> {
    let (stages, replicas, epochs) = (a.stages.to_string(), a.replicas.to_string(), a.epochs.to_string());
    let (mbs, batch, seq) = (a.micro_batches.to_string(), a.batch.to_string(), a.seq.to_string());
    let flags = [
        ["--model", a.model.as_str(), "--stages", &stages, "--replicas", &replicas],
        ["--epochs", &epochs, "--micro-batches", &mbs, "--batch", &batch],
        ["--seq", &seq, "--outer-momentum", "0.5", "--route-timeout-s", "60"],
    ]
    .concat();
    let miners = u8::try_from(a.stages * a.replicas).context("too many miners")?;
    let t0 = Instant::now();
    let miner_flags = ["--congestion", a.congestion.as_str()];
    let mut s = match wan {
        None => NetSwarm::start_with(miners, &flags, &miner_flags),
        Some(w) => NetSwarm::start_shaped(miners, &flags, &miner_flags, w),
    }
    .context("the swarm of hosts cannot run here (the reason is printed above)")?;
    let out = s.wait_done(Duration::from_secs(a.limit_s));
    let wall = t0.elapsed().as_secs_f64();
    let line = out
        .lines()
        .find_map(|l| l.strip_prefix("trained "))
        .with_context(|| format!("the orchestrator printed no training time:\n{out}"))?;
    let mut words = line.split_whitespace();
    let tokens: u64 = words.next().context("tokens")?.parse()?;
    let seconds: f64 = words.nth(2).context("seconds")?.parse()?;
    Ok(Outcome { tokens, seconds, losses: epoch_losses(&out), wall, relayed: s.relayed() })
}

pub fn run(a: Args) -> Result<()> {
    let link = LinkShape {
        delay: Duration::from_millis(a.rtt_ms / 2),
        jitter: Duration::from_millis(a.jitter_ms),
        loss: a.loss,
        seed: 17,
    };
    let wan = Wan { rate_mbit: a.rate_mbit, link };
    println!(
        "wan: {} {} stages x {} replicas, {} epochs x {} micro-batches of {} x {} tokens; each host in its own \
         namespace (s3s-fs, orchestrator over TLS, miners); data-plane congestion control {}",
        a.model, a.stages, a.replicas, a.epochs, a.micro_batches, a.batch, a.seq, a.congestion
    );
    let base = run_one(&a, None)?;
    let shaped = run_one(&a, Some(wan))?;
    let label = format!("{} Mbit/s, {} ms RTT, {}% loss", a.rate_mbit, a.rtt_ms, a.loss * 100.0);
    println!("\n  {:<34} {:>10} {:>10} {:>10} {:>12}", "miner links", "tokens/s", "train s", "wall s", "final loss");
    for (name, o) in [("veth, unshaped (baseline)", &base), (label.as_str(), &shaped)] {
        println!(
            "  {:<34} {:>10.0} {:>10.1} {:>10.1} {:>12.4}",
            name,
            o.tokens as f64 / o.seconds,
            o.seconds,
            o.wall,
            o.losses.last().copied().unwrap_or(f32::NAN)
        );
    }
    anyhow::ensure!(base.tokens == shaped.tokens, "unequal tokens: {} and {}", base.tokens, shaped.tokens);
    let (b, s) = (base.losses.last().copied().unwrap_or(f32::NAN), shaped.losses.last().copied().unwrap_or(f32::NAN));
    println!(
        "  ratios: throughput {:.2}x (goal >= 0.5x), final loss at equal tokens ({}) {:+.2}% (goal within 2%)",
        (shaped.tokens as f64 / shaped.seconds) / (base.tokens as f64 / base.seconds),
        shaped.tokens,
        (s / b - 1.0) * 100.0
    );
    println!(
        "  epoch losses: baseline {:?}, shaped {:?}; relays forwarded {} datagrams, dropped {}",
        base.losses, shaped.losses, shaped.relayed.0, shaped.relayed.1
    );
    Ok(())
}
