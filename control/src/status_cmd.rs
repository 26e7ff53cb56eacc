//! `iota-control status`: a running orchestrator's state and payout table,
//! from its Status RPC (open to any identity: this command signs with a
//! throwaway one).

use std::sync::Arc;

use anyhow::{Context, Result};
use iota_core::{Identity, PeerId};
use iota_protocol::pb;

#[derive(clap::Args)]
pub struct StatusArgs {
    /// The orchestrator's URL (https://HOST:PORT).
    #[arg(long, default_value = "https://127.0.0.1:7100")]
    pub orchestrator: String,
    /// The orchestrator's key (64 hex), pinned; without it the first server
    /// answering is trusted.
    #[arg(long)]
    pub orchestrator_key: Option<String>,
    /// Print the status as JSON instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Accept a plaintext http:// orchestrator URL (local tests only).
    #[arg(long)]
    pub insecure_plaintext: bool,
    /// The orchestrator has a CA-issued certificate: check its chain
    /// against the CA certificates (PEM) in FILE and the URL's host.
    #[arg(long, value_name = "FILE", conflicts_with = "insecure_plaintext")]
    pub tls_ca: Option<std::path::PathBuf>,
}

fn short(peer: &[u8]) -> String {
    peer.try_into().map(PeerId).map(|p| p.to_hex()).unwrap_or_else(|_| "?".into())
}

/// The status as JSON (field names as in the protocol).
pub fn to_json(st: &pb::RunStatus) -> serde_json::Value {
    let phase = pb::Phase::try_from(st.phase).map(|p| p.as_str_name()).unwrap_or("UNKNOWN");
    serde_json::json!({
        "run_id": st.run_id,
        "epoch": st.epoch,
        "phase": phase,
        "stages": st.stages.iter().map(|s| serde_json::json!({"stage": s.stage, "miners": s.miners, "healthy": s.healthy})).collect::<Vec<_>>(),
        "completed": st.completed,
        "rerouted": st.rerouted,
        "dropped": st.dropped,
        "last_loss": st.last_loss,
        "tokens": st.tokens,
        "validators": st.validators,
        "convictions": st.convictions,
        "ejected": st.ejected,
        "rollbacks": st.rollbacks,
        "settled_epochs": st.settled_epochs,
        "payouts": st.payouts.iter().map(|p| serde_json::json!({
            "peer": short(&p.peer),
            "stage": p.stage,
            "completed": p.completed,
            "guilty_votes": p.guilty_votes,
            "convictions": p.convictions,
            "clasp_effect": if p.has_clasp { Some(p.clasp_effect) } else { None },
            "weight": p.weight,
            "incentive": p.incentive,
            "emission": p.emission,
        })).collect::<Vec<_>>(),
        "validator_pay": st.validator_pay.iter().map(|b| serde_json::json!({"peer": short(&b.peer), "emission": b.emission})).collect::<Vec<_>>(),
    })
}

/// The status as text: the run line, the stages, then the payout table.
pub fn to_text(st: &pb::RunStatus) -> String {
    use std::fmt::Write;
    let phase = pb::Phase::try_from(st.phase).map(|p| p.as_str_name()).unwrap_or("UNKNOWN");
    let mut o = String::new();
    let _ = writeln!(
        o,
        "run {} epoch {} {phase}: {} micro-batches completed, {} re-routed, {} dropped; last loss {:.4}",
        st.run_id, st.epoch, st.completed, st.rerouted, st.dropped, st.last_loss
    );
    for s in &st.stages {
        let _ = writeln!(o, "  stage {}: {} miners, {} healthy", s.stage, s.miners, s.healthy);
    }
    let _ = writeln!(
        o,
        "validators live {}, convictions {}, ejected {}, rollbacks {}; {} epochs settled",
        st.validators, st.convictions, st.ejected, st.rollbacks, st.settled_epochs
    );
    if !st.payouts.is_empty() {
        let _ = writeln!(
            o,
            "{:>16} {:>5} {:>9} {:>7} {:>9} {:>8} {:>8} {:>9} {:>9}",
            "miner", "stage", "completed", "guilty", "convicted", "clasp", "weight", "incentive", "emission"
        );
        for p in &st.payouts {
            let clasp = if p.has_clasp { format!("{:+.4}", p.clasp_effect) } else { "-".into() };
            let name = short(&p.peer);
            let _ = writeln!(
                o,
                "{:>16} {:>5} {:>9} {:>7} {:>9} {clasp:>8} {:>8.4} {:>9.4} {:>9.4}",
                &name[..16.min(name.len())],
                p.stage,
                p.completed,
                p.guilty_votes,
                p.convictions,
                p.weight,
                p.incentive,
                p.emission
            );
        }
        for b in &st.validator_pay {
            let name = short(&b.peer);
            let _ = writeln!(o, "{:>16} {:>5} {:>75.4}", &name[..16.min(name.len())], "valid", b.emission);
        }
    }
    o
}

pub async fn run(a: StatusArgs) -> Result<()> {
    let pinned = a
        .orchestrator_key
        .as_deref()
        .map(|k| PeerId::from_hex(k.trim()).context("--orchestrator-key must be 64 hex characters"))
        .transpose()?;
    let id = Arc::new(Identity::generate());
    let mut client =
        iota_dataplane::miner::connect(&a.orchestrator, id, pinned, a.insecure_plaintext, a.tls_ca.as_deref()).await?;
    let st = client.status().await.map_err(|s| anyhow::anyhow!("status refused: {}", s.message()))?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&to_json(&st))?);
    } else {
        print!("{}", to_text(&st));
    }
    Ok(())
}
