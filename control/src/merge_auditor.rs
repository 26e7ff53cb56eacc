//! The validator's side of a merge audit, its I/O: on `Command.merge_audit`
//! it reads the stage's outer momentum and polls the store for every
//! participant's contribution (which the orchestrator asked each of them
//! to store), recomputes the partition
//! (`validation::merge_audit::recompute_partition`) and answers
//! `Validate(MergeAuditResult)`: the hash, or who never stored a
//! contribution of theirs in time.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use iota_core::PeerId;
use iota_dataplane::miner::merge::read_parts;
use iota_protocol::client::ControlClient;
use iota_protocol::manifest::from_pb_list;
use iota_protocol::store_keys::contrib_prefix;
use iota_protocol::{MergeSpec, SharedStore, pb, plan_from_pb};
use tracing::{info, warn};

use crate::validation::merge_audit::{AuditFinding, recompute_partition};

/// How long a validator waits for the participants to store their
/// contributions before it names the missing ones.
pub const CONTRIBUTION_WAIT: Duration = Duration::from_secs(10);
/// Participants an audit reads at most (a stage's replicas).
const MAX_AUDIT_PARTICIPANTS: usize = 1024;
/// Between two looks in the store.
const POLL: Duration = Duration::from_millis(200);

/// Runs one audit and sends its answer; returns the time it computed
/// (reading the momentum and recomputing, not waiting for the store).
pub async fn audit(
    ma: pb::MergeAudit,
    spec: MergeSpec,
    run_id: u64,
    store: SharedStore,
    mut client: ControlClient,
) -> Duration {
    let mut busy = Duration::ZERO;
    let plan = ma.plan.as_ref().map(plan_from_pb);
    let (epoch, stage, generation) = match &plan {
        Some(Ok(p)) => (p.epoch, p.stage, p.partitions.get(ma.partition as usize).map_or(0, |x| x.generation)),
        _ => (0, 0, 0),
    };
    let result = match plan {
        Some(Ok(plan)) => recompute(&ma, &plan, &spec, run_id, &store, &mut busy).await,
        Some(Err(e)) => Err(format!("the audit's plan: {e}")),
        None => Err("an audit without a plan".into()),
    };
    let mut answer = pb::MergeAuditResult { epoch, stage, partition: ma.partition, generation, ..Default::default() };
    match result {
        Ok(AuditFinding::Recomputed(h, flagged)) => {
            info!(epoch, stage, partition = ma.partition, flagged = flagged.len(), "merge partition audited");
            answer.hash = h.to_vec();
            answer.flagged = flagged.iter().map(|p| p.0.to_vec()).collect();
        }
        Ok(AuditFinding::Missing(ps)) => {
            warn!(epoch, stage, partition = ma.partition, missing = ps.len(), "merge contributions never stored");
            answer.missing = ps.iter().map(|p| p.0.to_vec()).collect();
            answer.reason = format!("{} contribution(s) not stored in {} s", ps.len(), CONTRIBUTION_WAIT.as_secs());
        }
        Err(why) => {
            warn!(epoch, stage, partition = ma.partition, why = %why, "merge audit not possible");
            answer.reason = why.chars().filter(|c| (' '..='~').contains(c)).take(256).collect();
        }
    }
    if let Err(e) = client.validate(pb::validator_report::Kind::MergeAudit(answer)).await {
        warn!(error = %e, "sending a merge audit failed");
    }
    busy
}

async fn recompute(
    ma: &pb::MergeAudit,
    plan: &iota_core::merge::MergePlan,
    spec: &MergeSpec,
    run_id: u64,
    store: &SharedStore,
    busy: &mut Duration,
) -> Result<AuditFinding, String> {
    let t0 = Instant::now();
    let k = ma.partition;
    let part = plan.partitions.get(k as usize).ok_or_else(|| format!("partition {k} is not in the plan"))?;
    if part.len > plan.params || plan.participants.len() > MAX_AUDIT_PARTICIPANTS {
        return Err("the audited partition is out of bounds".into());
    }
    let momentum = if plan.epoch == 0 || spec.outer.momentum == 0.0 {
        vec![0.0f32; part.len as usize]
    } else {
        let objects = from_pb_list(&ma.momentum).map_err(|e| format!("momentum objects: {e}"))?;
        let r = read_parts(store, &objects, part.offset, part.len).await.map_err(|e| format!("momentum: {e}"))?;
        if !r.bad.is_empty() {
            return Err(format!("{} momentum part(s) do not match their announcement", r.bad.len()));
        }
        // Owners use zeros where the momentum is missing; so does the audit.
        r.values
    };
    *busy += t0.elapsed();
    let prefix = format!("{}{k:06}/", contrib_prefix(plan.epoch, plan.stage));
    let deadline = Instant::now() + CONTRIBUTION_WAIT;
    let mut frames: BTreeMap<PeerId, Vec<u8>> = BTreeMap::new();
    loop {
        for p in &plan.participants {
            if frames.contains_key(&p.peer) {
                continue;
            }
            if let Ok(bytes) = store.get(&format!("{prefix}{}.frame", p.peer.to_hex())).await {
                frames.insert(p.peer, bytes);
            }
        }
        let mut m = momentum.clone(); // the reduce updates it in place
        let t = Instant::now();
        let found = recompute_partition(spec, run_id, plan, k, &frames, &mut m)?;
        *busy += t.elapsed();
        match found {
            AuditFinding::Missing(ps) if Instant::now() < deadline => {
                // A frame that is there but not the sender's may yet be
                // replaced: look again.
                for p in ps {
                    frames.remove(&p);
                }
                tokio::time::sleep(POLL).await;
            }
            found => return Ok(found),
        }
    }
}
