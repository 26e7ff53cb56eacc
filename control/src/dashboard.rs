//! The orchestrator's web dashboard: one page served from the binary
//! (`dashboard.html`, plain HTML, CSS and JavaScript drawing on canvases;
//! no build step) that polls `/api/state`, the run's state as JSON.

use iota_core::PeerId;
use serde_json::{Value, json};

use crate::orchestrator::{Ms, Orchestrator};

/// The page itself.
pub const PAGE: &str = include_str!("dashboard.html");

/// Points of the training-loss curve sent at most (older ones are
/// averaged in buckets, so a long run's curve stays a few KiB).
pub const MAX_CURVE_POINTS: usize = 600;
/// Rows of each table sent at most.
const MAX_MINERS: usize = 512;
const MAX_PATHWAYS: usize = 16;
const MAX_EPOCHS: usize = 200;
const MAX_PAYOUTS: usize = 64;

fn short(p: &PeerId) -> String {
    p.to_hex()[..12].to_string()
}

/// Finite JSON numbers only (JSON has no NaN): NaN and infinities are null.
fn num(x: f64) -> Value {
    if x.is_finite() { json!(x) } else { Value::Null }
}

/// `(micro-batch index, loss)` of every finite loss in `losses` (indexed in
/// order), averaged in at most `max` equal buckets: (mean index, mean loss).
pub fn downsample(losses: &[f32], max: usize) -> Vec<(f64, f64)> {
    let n = losses.len();
    if n == 0 || max == 0 {
        return Vec::new();
    }
    let per = n.div_ceil(max);
    let mut out = Vec::with_capacity(n.div_ceil(per));
    for (b, chunk) in losses.chunks(per).enumerate() {
        let (mut xs, mut ys, mut k) = (0.0, 0.0, 0usize);
        for (i, l) in chunk.iter().enumerate() {
            if l.is_finite() {
                xs += (b * per + i) as f64;
                ys += f64::from(*l);
                k += 1;
            }
        }
        if k > 0 {
            out.push((xs / k as f64, ys / k as f64));
        }
    }
    out
}

/// The run's state for the dashboard at `now`.
pub fn state(o: &Orchestrator, now: Ms) -> Value {
    let spec = o.spec();
    let c = o.counters();
    let history = o.history();
    let (losses, train, held_out) = curves(o);
    let training_s = o.training_ms(now) as f64 / 1e3;
    let per_mb = o.tokens_per_micro_batch();
    let miners = miners_json(o, now, training_s, per_mb);
    let stages: Vec<Value> = (0..spec.stages)
        .map(|s| {
            let of: Vec<_> = o.miners().filter(|m| m.stage == s && m.subscribed).collect();
            json!({
                "stage": s,
                "miners": of.len(),
                "healthy": of.iter().filter(|m| m.live() && !m.benched).count(),
                "reported_tokens_per_s": num(of.iter().filter(|m| m.live()).map(|m| m.tokens_per_s).sum()),
                "merge": o.merge_progress(s),
            })
        })
        .collect();
    let pathways: Vec<Value> = o
        .pathways_in_flight(MAX_PATHWAYS)
        .into_iter()
        .map(|(p, n)| json!({"miners": p.iter().map(short).collect::<Vec<_>>(), "in_flight": n}))
        .collect();
    let epochs = epochs_json(history);
    let verdicts = o.verdicts();
    let payouts = payouts_json(o);
    let phase = format!("{:?}", o.phase()).to_lowercase();
    json!({
        "run_id": spec.run_id,
        "now_ms": now,
        "epoch": o.epoch(),
        "epochs": spec.epoch_count(),
        "phase": phase,
        "micro_batches_per_epoch": spec.micro_batches_per_epoch,
        "completed": c.completed,
        "rerouted": c.rerouted,
        "dropped": c.dropped,
        "tokens": c.tokens,
        "tokens_per_micro_batch": num(per_mb),
        "training_s": training_s,
        "last_loss": num(f64::from(c.last_loss)),
        "train": train,
        "train_points": losses.iter().filter(|l| l.is_finite()).count(),
        "held_out": held_out,
        "stages": stages,
        "miners": miners,
        "pathways": pathways,
        "epochs_done": epochs,
        "validators": {
            "registered": o.validators().count(),
            "live": o.validators_live(now),
            "verdicts": verdicts.len(),
            "guilty": verdicts.iter().filter(|v| v.guilty).count(),
            "convictions": c.convictions,
            "ejected": c.ejected,
            "rollbacks": c.rollbacks,
        },
        "merge_faults": {
            "hash_mismatches": c.hash_mismatches,
            "bad_objects": c.bad_objects,
            "divergent_merges": c.divergent_merges,
            "contributions_from_store": c.merge_contributions_from_store,
            "updates_from_store": c.merge_updates_from_store,
        },
        "payouts": payouts,
        "settled_epochs": o.settlements().last().map_or(0, |s| s.epoch + 1),
    })
}

/// The training curve (every epoch's micro-batches in issue order, then
/// the current epoch's completed ones; x counts micro-batches), downsampled,
/// and the held-out losses placed on it.
fn curves(o: &Orchestrator) -> (Vec<f32>, Vec<Value>, Vec<Value>) {
    let history = o.history();
    let mut losses: Vec<f32> = history.iter().flat_map(|e| e.losses.iter().copied()).collect();
    let mut held_out = Vec::new();
    let mut at = 0usize;
    for e in history {
        at += e.losses.len();
        if let Some(l) = e.held_out_loss.filter(|l| l.is_finite()) {
            held_out.push(json!([at, l, e.epoch]));
        }
    }
    losses.extend(o.current_losses());
    let train: Vec<Value> = downsample(&losses, MAX_CURVE_POINTS).into_iter().map(|(x, y)| json!([x, y])).collect();
    (losses, train, held_out)
}

/// The subscribed miners (at most `MAX_MINERS`), by stage then peer.
fn miners_json(o: &Orchestrator, now: Ms, training_s: f64, per_mb: f64) -> Vec<Value> {
    let mut miners: Vec<Value> = o
        .miners()
        .filter(|m| m.subscribed)
        .take(MAX_MINERS)
        .map(|m| {
            let health = if m.ejected {
                "ejected"
            } else if m.removed {
                "removed"
            } else if m.benched {
                "benched"
            } else if !m.healthy {
                "silent"
            } else if m.joining {
                "joining"
            } else {
                "healthy"
            };
            json!({
                "peer": short(&m.peer),
                "stage": m.stage,
                "device": if m.device.is_empty() { "?" } else { m.device.as_str() },
                "health": health,
                "convicted": m.convicted,
                "in_flight": m.in_flight,
                "delivered": m.delivered,
                "reported_tokens_per_s": num(m.tokens_per_s),
                "mean_tokens_per_s": num(if training_s > 0.0 { m.delivered as f64 * per_mb / training_s } else { 0.0 }),
                "latency_ms": num(m.latency_ms),
                "last_seen_s": now.saturating_sub(m.last_seen_ms) as f64 / 1e3,
            })
        })
        .collect();
    miners.sort_by_key(|m| (m["stage"].as_u64(), m["peer"].as_str().map(String::from)));
    miners
}

/// The latest epochs (at most `MAX_EPOCHS`), newest first.
fn epochs_json(history: &[crate::orchestrator::EpochSummary]) -> Vec<Value> {
    history
        .iter()
        .rev()
        .take(MAX_EPOCHS)
        .map(|e| {
            json!({
                "epoch": e.epoch,
                "mean_loss": num(f64::from(e.mean_loss)),
                "held_out_loss": e.held_out_loss.map(|l| num(f64::from(l))),
                "completed": e.completed,
                "dropped": e.dropped,
                "convicted": e.convicted.len(),
                "rolled_back": e.rolled_back,
            })
        })
        .collect()
}

/// The payout table (at most `MAX_PAYOUTS` rows).
fn payouts_json(o: &Orchestrator) -> Vec<Value> {
    o.payout_table()
        .into_iter()
        .take(MAX_PAYOUTS)
        .map(|p| {
            json!({
                "peer": short(&p.peer),
                "stage": p.stage,
                "completed": p.completed,
                "guilty_votes": p.guilty_votes,
                "convictions": p.convictions,
                "clasp_effect": p.clasp_effect.map(num),
                "weight": num(p.weight),
                "incentive": num(p.incentive),
                "emission": num(p.emission),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn downsampling_is_bounded_and_averages_finite_losses() {
        assert!(downsample(&[], 10).is_empty());
        let few = [3.0, f32::NAN, 1.0];
        assert_eq!(downsample(&few, 10), vec![(0.0, 3.0), (2.0, 1.0)], "NaN (dropped) points are skipped");
        let many: Vec<f32> = (0..10_001).map(|i| i as f32).collect();
        let d = downsample(&many, 600);
        assert!(d.len() <= 600 && d.len() >= 500, "{}", d.len());
        // Each bucket's mean of x and y agree (y = x here), and the buckets
        // cover the whole run in order.
        assert!(d.iter().all(|(x, y)| (x - y).abs() < 1e-9));
        assert!(d.windows(2).all(|w| w[0].0 < w[1].0));
        assert!(d[0].0 < 10.0 && d.last().unwrap().0 > 9_980.0);
        assert!(downsample(&[f32::NAN; 5], 2).is_empty());
    }

    #[test]
    fn non_finite_numbers_become_null() {
        assert_eq!(num(f64::NAN), Value::Null);
        assert_eq!(num(f64::INFINITY), Value::Null);
        assert_eq!(num(1.5), json!(1.5));
    }
}
