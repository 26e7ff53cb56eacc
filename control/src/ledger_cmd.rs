//! `iota-control ledger verify|show`: the settlement ledger of a run
//! directory, re-checked and summed.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap::Subcommand;
use iota_core::PeerId;

use crate::settlement::ledger::{self, Settlement, Verified};
use crate::state_db::StateDb;

#[derive(Subcommand)]
pub enum LedgerCmd {
    /// Re-check the whole ledger: the sequence, every link and hash, every
    /// signature (by the orchestrator's key), every epoch's Yuma step
    /// recomputed from its recorded input, the bonds carried from epoch to
    /// epoch and the emission paid. Exits with status 1 naming the first
    /// entry that fails.
    Verify {
        /// The run directory (its state.sqlite holds the ledger).
        #[arg(long, default_value = "runs/swarm")]
        run_dir: PathBuf,
        /// The orchestrator's key the entries must be signed with (64 hex).
        /// Default: RUN_DIR/keys/orchestrator.key's, if there is one; else
        /// the first entry's signer, which every other must match.
        #[arg(long)]
        orchestrator_key: Option<String>,
    },
    /// Verify the ledger, then print each identity's balance (emission
    /// summed over every settled epoch) and the last epoch's payouts.
    Show {
        #[arg(long, default_value = "runs/swarm")]
        run_dir: PathBuf,
        #[arg(long)]
        orchestrator_key: Option<String>,
    },
}

/// The key entries must carry: given, or the run directory's orchestrator
/// key (read, never made here).
fn expected_signer(run_dir: &Path, given: Option<&str>) -> Result<Option<PeerId>> {
    if let Some(hex) = given {
        return PeerId::from_hex(hex.trim()).map(Some).context("--orchestrator-key must be 64 hex characters");
    }
    let key = run_dir.join("keys").join("orchestrator.key");
    if key.exists() {
        return Ok(Some(iota_dataplane::identity_file::load_or_create(&key)?.peer_id()));
    }
    Ok(None)
}

/// Opens the ledger of `run_dir` and verifies it.
pub fn verify(run_dir: &Path, key: Option<&str>) -> Result<(Verified, Vec<ledger::Entry>)> {
    let db = run_dir.join("state.sqlite");
    if !db.exists() {
        bail!("{} does not exist: no run has been settled in {}", db.display(), run_dir.display());
    }
    let entries = StateDb::open(&db)?.ledger()?;
    let signer = expected_signer(run_dir, key)?;
    let v = ledger::verify(&entries, signer).context("the ledger does not verify")?;
    Ok((v, entries))
}

pub fn run(cmd: LedgerCmd) -> Result<()> {
    match cmd {
        LedgerCmd::Verify { run_dir, orchestrator_key } => {
            let (v, _) = verify(&run_dir, orchestrator_key.as_deref())?;
            let signer = v.signer.map_or("nobody (empty ledger)".to_string(), |s| s.to_hex());
            println!(
                "ledger OK: {} entries, signed by {signer}; every Yuma step recomputes; {} epochs rolled back",
                v.entries, v.epochs_rolled_back
            );
        }
        LedgerCmd::Show { run_dir, orchestrator_key } => {
            let (v, entries) = verify(&run_dir, orchestrator_key.as_deref())?;
            println!("{} settled epochs (ledger verified)", v.entries);
            let mut balances: Vec<(PeerId, f64)> = v.balances.into_iter().collect();
            balances.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
            println!("{:>64} {:>12}", "identity", "balance");
            for (p, x) in &balances {
                println!("{} {x:>12.6}", p.to_hex());
            }
            if let Some(last) = entries.last() {
                let s: Settlement = serde_json::from_str(&last.body)?;
                println!("epoch {}{}:", s.epoch, if s.rolled_back { " (merge rolled back)" } else { "" });
                for (p, x) in s.payouts() {
                    println!("  {} {x:>12.6}", p.to_hex());
                }
            }
        }
    }
    Ok(())
}
