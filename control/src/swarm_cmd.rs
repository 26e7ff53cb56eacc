//! `iota-control swarm`: a whole run on this machine (an orchestrator, its
//! miners and validators as processes on loopback).

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;

use crate::cli::RunArgs;
use crate::swarm::{self, SwarmOptions};

#[derive(Args)]
pub struct SwarmArgs {
    #[command(flatten)]
    pub run: RunArgs,
    /// gRPC listen address of the orchestrator (port 0 = any).
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: SocketAddr,
    /// Serve Prometheus metrics at http://ADDR/metrics (off by default;
    /// give a loopback address unless the scraper is elsewhere: the
    /// page is unauthenticated).
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<SocketAddr>,
    /// Serve the web dashboard (loss curves, throughput, miners,
    /// pathways, merge, validation, payouts) at http://ADDR/; without
    /// ADDR on 127.0.0.1:7180. Off by default; read-only and
    /// unauthenticated, so keep it on loopback unless told otherwise.
    #[arg(long, value_name = "ADDR", num_args = 0..=1, default_missing_value = "127.0.0.1:7180")]
    pub dashboard: Option<SocketAddr>,
    /// Compute threads per miner process (default: 1 with cpu miners;
    /// with cuda miners the machine's cores shared out among them).
    #[arg(long)]
    pub threads_per_miner: Option<usize>,
    /// The iota-miner binary (default: next to this one).
    #[arg(long)]
    pub miner_bin: Option<PathBuf>,
    /// Memory each miner states, in GiB (`iota-miner run --memory-gib`):
    /// to run as on cards of that size, say 16, on a larger one.
    #[arg(long, value_name = "GIB")]
    pub miner_memory_gib: Option<f64>,
    /// When each miner recomputes activations in the backward
    /// (`iota-miner run --recompute`: auto or always).
    #[arg(long, value_name = "WHEN")]
    pub miner_recompute: Option<String>,
    /// Where every miner computes: cpu, cuda (all on GPU 0) or cuda:N.
    #[arg(long, default_value = "cpu")]
    pub miner_device: String,
    /// Validators to run beside the miners (each with stake 100; keys
    /// in RUN_DIR/keys): they recompute a sample of every miner's work
    /// each epoch and vote on it before the merge.
    #[arg(long, default_value_t = 0)]
    pub validators: u32,
    /// Test tool: make miner K an adversary, MODE@K (the modes
    /// `iota-miner run --adversary` takes: noise, zeros, replay,
    /// loss-lie, copy, grad-noise, lazy, merge-equivocate, nan,
    /// merge-garbage, merge-lie, withholder, lying-owner,
    /// framing-sender, fabricated-evidence, silent, closed, slow, flaky,
    /// hostile-unreachable; not collude or referee-collusion, which
    /// need their accomplices' ids); repeatable.
    #[arg(long, value_name = "MODE@K", hide = true)]
    pub adversary: Vec<String>,
    /// Read flags from a TOML file (keys are flag names; flags given
    /// on the command line win).
    #[arg(long)]
    pub config_file: Option<PathBuf>,
}

/// Runs the swarm to the run's end (Ctrl-C stops it; the same command
/// resumes), then prints its summary.
pub async fn run(args: SwarmArgs, log_format: iota_dataplane::LogFormat) -> Result<()> {
    let SwarmArgs { mut run, miner_device, miner_memory_gib, miner_recompute, .. } = args;
    if let Some(r) = miner_recompute.as_deref()
        && iota_core::memory_fit::Recompute::parse(r).is_none()
    {
        anyhow::bail!("--miner-recompute '{r}': auto or always");
    }
    if let Some(g) = miner_memory_gib
        && !(g.is_finite() && g > 0.0)
    {
        anyhow::bail!("--miner-memory-gib {g}: a positive number of GiB");
    }
    // It starts the miners here: `--schedule auto` decides from their device.
    run.local_miner_device = Some(miner_device.clone());
    let validators = validator_identities(&mut run, args.validators)?;
    let adversaries = parse_adversaries(&args.adversary)?;
    let cfg = crate::run_claim::claimed_config(&run, None, false).await?;
    let miner_bin = miner_binary(args.miner_bin)?;
    let miners = (cfg.spec.stages * cfg.spec.replicas) as usize;
    let report = swarm::run(SwarmOptions {
        cfg: cfg.clone(),
        data: run.data_path()?,
        store: if run.bucket.is_some() { None } else { Some(run.store_dir()?) },
        bucket: run.s3_store().await?,
        run_dir: run.run_dir.clone(),
        listen: args.listen,
        metrics: args.metrics,
        dashboard: args.dashboard,
        log_format,
        miner_bin,
        threads_per_miner: args
            .threads_per_miner
            .unwrap_or_else(|| swarm::default_threads_per_miner(&miner_device, miners)),
        miner_device,
        validators,
        adversaries,
        extra_miner_args: swarm::miner_memory_args(miner_memory_gib, miner_recompute.as_deref()),
    })
    .await?;
    swarm::print_summary(&cfg, &report);
    if report.interrupted {
        std::process::exit(130);
    }
    if let Some(why) = report.trained_nothing() {
        anyhow::bail!("the swarm trained nothing: {why}");
    }
    Ok(())
}

/// The swarm's validators' identities (RUN_DIR/keys, made on first use),
/// each listed in the run with stake 100.
fn validator_identities(run: &mut RunArgs, count: u32) -> Result<Vec<iota_core::Identity>> {
    let mut ids = Vec::new();
    for i in 0..count {
        let path = run.run_dir.join("keys").join(format!("validator-{i}.key"));
        let id = iota_dataplane::identity_file::load_or_create(&path)?;
        run.validator_stakes.push(format!("{}:100", id.peer_id().to_hex()));
        ids.push(id);
    }
    Ok(ids)
}

/// `--adversary MODE@K` as (miner index, mode), refusing unknown modes and
/// those that need their accomplices' ids.
fn parse_adversaries(given: &[String]) -> Result<Vec<(u32, String)>> {
    given
        .iter()
        .map(|a| {
            let (mode, k) = a.split_once('@').with_context(|| format!("--adversary {a}: want MODE@K"))?;
            if iota_dataplane::miner::Adversary::parse(mode).is_none() {
                let names: Vec<&str> = iota_dataplane::miner::Adversary::NAMES.iter().map(|(n, _)| *n).collect();
                anyhow::bail!("--adversary {a}: unknown mode '{mode}' ({})", names.join(", "));
            }
            if mode == "collude" {
                anyhow::bail!(
                    "--adversary {a}: colluders need each other's peer ids, which the swarm does not \
                     hand out; run them with `iota-miner run --adversary collude --accomplices HEX,...`"
                );
            }
            let k = k.parse::<u32>().with_context(|| format!("--adversary {a}: K is a miner index"))?;
            Ok((k, mode.to_string()))
        })
        .collect()
}

/// The iota-miner binary: --miner-bin, else the one next to this binary.
fn miner_binary(given: Option<PathBuf>) -> Result<PathBuf> {
    let bin = match given {
        Some(p) => p,
        None => std::env::current_exe()?.parent().context("no binary directory")?.join("iota-miner"),
    };
    if !bin.exists() {
        anyhow::bail!("{} not found; build it (package iota-dataplane) or pass --miner-bin", bin.display());
    }
    Ok(bin)
}

#[cfg(test)]
mod tests {
    /// The simulator acts out the miner's adversary modes under the same
    /// names (`iota_roles::sim::SimAdversary` mirrors the miner's list:
    /// the roles crate cannot see the data plane's): a mode added to one
    /// and not the other fails here.
    #[test]
    fn the_simulator_knows_every_adversary_mode_of_the_miner_by_its_name() {
        let miner: Vec<&str> = iota_dataplane::miner::Adversary::NAMES.iter().map(|(n, _)| *n).collect();
        let sim: Vec<&str> = crate::sim::SimAdversary::NAMES.iter().map(|(n, _)| *n).collect();
        assert_eq!(miner, sim);
        for n in miner {
            assert_eq!(crate::sim::SimAdversary::parse(n).map(|a| a.name()), Some(n));
        }
    }
}
