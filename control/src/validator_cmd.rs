//! `iota-control validator`: a validator process joining a run.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;

#[derive(Args)]
pub struct ValidatorArgs {
    /// The orchestrator's URL (https://HOST:PORT).
    #[arg(long, default_value = "https://127.0.0.1:7100")]
    pub orchestrator: String,
    /// The orchestrator's key (64 hex), pinned.
    #[arg(long)]
    pub orchestrator_key: Option<String>,
    /// The orchestrator's join token (`iota://KEY@HOST:PORT`, which it
    /// prints): its URL and its key, pinned, in one.
    #[arg(long, value_name = "TOKEN", conflicts_with_all = ["orchestrator", "orchestrator_key", "insecure_plaintext"])]
    pub join: Option<String>,
    /// This validator's identity file (made on first use).
    #[arg(long, default_value = "validator.key")]
    pub identity: PathBuf,
    /// Print this validator's public key and exit.
    #[arg(long)]
    pub print_key: bool,
    /// The run's object store directory (when the run keeps its objects
    /// in one on this machine; not with a bucket).
    #[arg(long)]
    pub store: Option<PathBuf>,
    /// The run's corpus (as the miners have it).
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// This validator's secret sampling seed (default: random).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Seconds a miner has to deliver the evidence drawn from it.
    #[arg(long, default_value_t = 30)]
    pub evidence_timeout_s: u64,
    /// Accept a plaintext http:// orchestrator URL (local tests only).
    #[arg(long)]
    pub insecure_plaintext: bool,
    /// The orchestrator has a CA-issued certificate: check its chain
    /// against the CA certificates (PEM) in FILE and the URL's host.
    #[arg(long, value_name = "FILE", conflicts_with = "insecure_plaintext")]
    pub tls_ca: Option<PathBuf>,
}

/// Validates the run until it ends, then prints what it found.
pub async fn run(args: ValidatorArgs) -> Result<()> {
    let ValidatorArgs { mut orchestrator, mut orchestrator_key, join, identity, print_key, .. } = args;
    if let Some(t) = join {
        let t = iota_protocol::join_token::JoinToken::parse(&t).map_err(anyhow::Error::msg)?;
        orchestrator = t.url();
        orchestrator_key = Some(t.key.to_hex());
    }
    let id = iota_dataplane::identity_file::load_or_create(&identity)?;
    if print_key {
        println!("{}", id.peer_id().to_hex());
        return Ok(());
    }
    let key = orchestrator_key
        .map(|k| iota_core::PeerId::from_hex(&k).context("--orchestrator-key is not 64 hex characters"))
        .transpose()?;
    let mut opts = crate::validator::ValidatorOptions::local(
        orchestrator,
        args.seed.unwrap_or_else(crate::validator::random_seed),
    );
    opts.orchestrator_key = key;
    opts.insecure_plaintext = args.insecure_plaintext;
    opts.tls_ca = args.tls_ca;
    opts.store = args.store;
    opts.data = args.data;
    opts.evidence_timeout = std::time::Duration::from_secs(args.evidence_timeout_s);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let s = crate::validator::run(opts, id, stop).await?;
    println!(
        "validated {} rounds: {} evidence objects checked, {} cleared, {} guilty",
        s.rounds,
        s.checked,
        s.cleared_votes,
        s.guilty_votes.len()
    );
    for (epoch, miner, why) in &s.guilty_votes {
        println!("  guilty: epoch {epoch} miner {miner}: {why}");
    }
    Ok(())
}
