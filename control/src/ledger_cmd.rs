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
    /// epoch and the emission paid, and every proof of a failed inner step
    /// a conviction rests on re-read from the run's store and re-checked
    /// (a run whose objects are in a bucket: not re-read, and it says so).
    /// Exits with status 1 naming the first entry that fails.
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

/// Re-reads every step proof the entries convict on from the run's store
/// and re-checks it as the orchestrator did (`StepReferee`): an error
/// names the first that does not hold. Says what it did: a run whose
/// objects are in a bucket, or whose store is gone, is not re-read.
async fn recheck_step_proofs(run_dir: &Path, entries: &[ledger::Entry]) -> Result<String> {
    let mut records = Vec::new();
    for e in entries {
        let s: Settlement = serde_json::from_str(&e.body)?;
        records.extend(s.step_proofs);
    }
    if records.is_empty() {
        return Ok("no step proofs".into());
    }
    let settings_path = run_dir.join(iota_model::run_dir::SETTINGS_FILE);
    let settings: serde_json::Value = match std::fs::read(&settings_path) {
        Ok(b) => serde_json::from_slice(&b).with_context(|| format!("reading {}", settings_path.display()))?,
        Err(_) => return Ok(format!("{} step proofs not re-read (no {})", records.len(), settings_path.display())),
    };
    let store_dir = run_dir.join("store");
    if settings.get("bucket").is_some_and(|b| !b.is_null()) || !store_dir.is_dir() {
        return Ok(format!(
            "{} step proofs not re-read (the run's objects are not in {})",
            records.len(),
            store_dir.display()
        ));
    }
    let cfg = crate::cli::config_from_settings(&settings)?;
    let data = settings.get("data").and_then(|d| d.as_str()).map(PathBuf::from);
    let n = recheck_step_proofs_in(&store_dir, (cfg, data), &records).await?;
    Ok(format!("{n} step proofs re-read from the store and re-checked"))
}

/// Re-reads each step proof `records` name from the run's store in
/// `store_dir` and re-checks it on the run's settings and corpus; how many
/// (all of them, or an error naming the first that does not hold).
pub async fn recheck_step_proofs_in(
    store_dir: &Path,
    (cfg, data): (iota_protocol::RunConfig, Option<PathBuf>),
    records: &[ledger::StepProofRecord],
) -> Result<usize> {
    let store =
        iota_dataplane::local_store::LocalDirStore::shared(store_dir, iota_dataplane::fileio::FileIo::start(false))?;
    let referee = crate::step_referee::StepReferee::new(store, cfg, data);
    for r in records {
        let hash: [u8; 32] = PeerId::from_hex(&r.hash).map(|p| p.0).context("a step proof's hash is not 64 hex")?;
        let inputs = crate::orchestrator::StepRefereeInputs {
            stage: r.stage,
            steps: r.steps,
            upstream: r.upstream.clone(),
            downstream: r.downstream.clone(),
        };
        let fail =
            |why: String| anyhow::anyhow!("epoch {}: the step proof against {} does not hold: {why}", r.epoch, r.miner);
        match referee.check((r.epoch, r.validator, r.miner, hash), inputs).await.map_err(fail)? {
            crate::step_referee::Rechecked::Held => {}
            crate::step_referee::Rechecked::Unread(why) => return Err(fail(why)),
        }
    }
    Ok(records.len())
}

pub async fn run(cmd: LedgerCmd) -> Result<()> {
    match cmd {
        LedgerCmd::Verify { run_dir, orchestrator_key } => {
            let (v, entries) = verify(&run_dir, orchestrator_key.as_deref())?;
            let proofs = recheck_step_proofs(&run_dir, &entries).await?;
            let signer = v.signer.map_or("nobody (empty ledger)".to_string(), |s| s.to_hex());
            println!(
                "ledger OK: {} entries, signed by {signer}; every Yuma step recomputes; {} epochs rolled back; {proofs}",
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
