//! What a finished swarm prints: the loss per epoch, the counts, the wire
//! bytes per token, the phases' times, where the compute went, and the
//! payout table.

use iota_protocol::RunConfig;

use crate::swarm::SwarmReport;

/// Each stage's forward + backward seconds per micro-batch, the mean of
/// its replicas' (from the step times each miner left; None for a stage
/// none reported), by stage index.
pub fn stage_compute_seconds(totals: &[Option<iota_dataplane::stats::WireTotals>]) -> Vec<Option<f64>> {
    let stages = totals.iter().flatten().filter_map(|t| t.stage).max().map_or(0, |s| s as usize + 1);
    (0..stages)
        .map(|s| {
            let per: Vec<f64> = totals
                .iter()
                .flatten()
                .filter(|t| t.stage == Some(s as u32))
                .filter_map(|t| t.step_times.seconds_per_micro_batch())
                .collect();
            (!per.is_empty()).then(|| per.iter().sum::<f64>() / per.len() as f64)
        })
        .collect()
}

/// The summary's line on where the miners' compute went: each stage's
/// time per micro-batch and its busiest miner's share of the training
/// time (the stage that sets the pipeline's pace shows as the busy one).
fn compute_line(totals: &[Option<iota_dataplane::stats::WireTotals>], training_s: f64) -> Option<String> {
    let stages = stage_compute_seconds(totals);
    if stages.is_empty() || training_s <= 0.0 {
        return None;
    }
    let cells: Vec<String> = stages
        .iter()
        .enumerate()
        .map(|(s, secs)| {
            let busy = totals
                .iter()
                .flatten()
                .filter(|t| t.stage == Some(s as u32))
                .map(|t| (t.step_times.forward.seconds() + t.step_times.backward.seconds()) / training_s)
                .fold(0.0, f64::max);
            match secs {
                Some(x) => format!("stage {s} {:.1} ms (busy {:.0}%)", x * 1e3, 100.0 * busy.min(1.0)),
                None => format!("stage {s} -"),
            }
        })
        .collect();
    Some(format!(
        "compute per micro-batch, forward + backward (the tail's loss with them), mean of replicas: {}; busy: its \
         busiest miner's share of the training time",
        cells.join(", ")
    ))
}

/// Bytes per token that cross stage boundaries (activations and their
/// gradients, frame headers included).
pub fn wire_bytes_per_token(cfg: &RunConfig) -> f64 {
    let spec = iota_core::StageSpec::split(&cfg.train.model, cfg.train.stages).ok();
    let width = spec.and_then(|s| s.first().map(|s| s.boundary_width)).unwrap_or(cfg.train.model.d_model);
    let tokens = (cfg.train.batch * cfg.train.seq) as f64;
    let per_frame = cfg.train.codec.row_bytes(width) as f64 * tokens + iota_core::wire::payload_offset() as f64;
    2.0 * (cfg.train.stages.saturating_sub(1)) as f64 * per_frame / tokens
}

pub fn print_summary(cfg: &RunConfig, r: &SwarmReport) {
    for line in crate::epoch_table::epoch_table(&r.history) {
        println!("{line}");
    }
    if r.validators > 0 {
        println!(
            "validation: {} validators, {} guilty votes, {} convictions, {} miners ejected",
            r.validators, r.guilty_votes, r.convictions, r.ejected
        );
    }
    print_payouts(r);
    if !r.miners.is_empty() {
        println!("{:>16} {:>5} {:>24} {:>9} {:>12}", "miner", "stage", "device", "delivered", "tok/s (mean)");
        for (peer, stage, device, delivered, tps) in &r.miners {
            let device: String = device.chars().take(24).collect();
            println!("{:>16} {stage:>5} {device:>24} {delivered:>9} {tps:>12.0}", &peer.to_hex()[..16]);
        }
    }
    println!(
        "micro-batches: {} completed, {} re-routed, {} dropped; {} tokens in {:.1}s ({:.0} tokens/s)",
        r.completed,
        r.rerouted,
        r.dropped,
        r.tokens,
        r.elapsed.as_secs_f64(),
        r.tokens as f64 / r.elapsed.as_secs_f64().max(1e-9)
    );
    let boundaries = cfg.train.stages.saturating_sub(1);
    // The same traffic uncompressed: the full hidden state in bf16, no
    // bottleneck, no headers.
    let bf16_hidden = 2.0 * boundaries as f64 * 2.0 * cfg.train.model.d_model as f64;
    let measured = match r.boundary_bytes {
        Some(b) if r.tokens > 0 && boundaries > 0 => {
            let per = b as f64 / r.tokens as f64;
            format!(
                "{per:.1} measured on the wire ({:.3}x of bf16 hidden states at {bf16_hidden:.0}), ",
                per / bf16_hidden
            )
        }
        _ => String::new(),
    };
    println!(
        "boundary traffic, bytes per token: {measured}{:.1} by formula ({} codec, {boundaries} boundaries, both \
         directions, framing included; re-sends count on the wire)",
        wire_bytes_per_token(cfg),
        cfg.train.codec.name(),
    );
    if cfg.spec.merge.method == iota_protocol::MergeMethod::Butterfly {
        match r.merge_from_store {
            (0, 0) => println!("merge: every butterfly slice went over the data plane"),
            (c, u) => println!(
                "merge: {c} contributions and {u} merged updates went through the object store instead of the \
                 data plane (a peer unreachable or a frame lost; the orchestrator's log names the replicas)"
            ),
        }
    }
    let c = &r.counters;
    let phases = c.training_ms + c.uploading_ms + c.merging_ms;
    if phases > 0 {
        println!(
            "time: training {:.1}s, upload {:.1}s, merge {:.1}s ({:.0}% of the epochs outside training)",
            c.training_ms as f64 / 1e3,
            c.uploading_ms as f64 / 1e3,
            c.merging_ms as f64 / 1e3,
            100.0 * (c.uploading_ms + c.merging_ms) as f64 / phases as f64
        );
    }
    if c.merges_behind_compute > 0 {
        println!(
            "merge behind compute: {} of the merges ran while the next epoch trained (merge time above: only \
             what training waited for them, and the last, synchronous merge)",
            c.merges_behind_compute
        );
    }
    let gib = |b: u64| format!("{:.2}", b as f64 / (1u64 << 30) as f64);
    let peaks: Vec<String> = r
        .miner_totals
        .iter()
        .map(|t| match t {
            Some(t) if t.peak_device_bytes > 0 => {
                format!("{} (device {})", gib(t.peak_rss_bytes), gib(t.peak_device_bytes))
            }
            Some(t) => gib(t.peak_rss_bytes),
            None => "-".into(),
        })
        .collect();
    if !peaks.is_empty() {
        println!("peak memory per miner process, GiB resident: {}", peaks.join(", "));
    }
    if let Some(line) = compute_line(&r.miner_totals, c.training_ms as f64 / 1e3) {
        println!("{line}");
    }
    match &r.model {
        Ok(p) => println!(
            "model: {} (Hugging Face Llama folder; try `iota generate --model {} --prompt \"...\"`)",
            p.display(),
            p.display()
        ),
        Err(why) if !r.interrupted => println!("model: none exported ({why})"),
        Err(_) => {}
    }
    if r.interrupted {
        println!("interrupted; run the same command again to resume from the saved state");
    }
}

/// The payout table: each miner's work, verdicts, last consensus weight and
/// incentive, and its emission over the run; then the validators'.
pub fn print_payouts(r: &SwarmReport) {
    if r.payouts.is_empty() {
        return;
    }
    let total: f64 =
        r.payouts.iter().map(|p| p.emission).sum::<f64>() + r.validator_pay.iter().map(|v| v.1).sum::<f64>();
    println!(
        "payouts over {} settled epochs (emission 1 per epoch; clasp, weight and incentive: the last settled \
         epoch's; ledger in the run's state.sqlite, `iota-control ledger verify`):",
        r.settled_epochs
    );
    println!(
        "{:>16} {:>5} {:>9} {:>7} {:>9} {:>8} {:>8} {:>9} {:>9}",
        "miner", "stage", "completed", "guilty", "convicted", "clasp", "weight", "incentive", "emission"
    );
    for p in &r.payouts {
        println!(
            "{:>16} {:>5} {:>9} {:>7} {:>9} {:>8} {:>8.4} {:>9.4} {:>9.4}",
            &p.peer.to_hex()[..16],
            p.stage,
            p.completed,
            p.guilty_votes,
            p.convictions,
            p.clasp_effect.map_or("-".to_string(), |e| format!("{e:+.4}")),
            p.weight,
            p.incentive,
            p.emission
        );
    }
    // Without validators the operator (the orchestrator's key) rates the
    // work, and takes the validators' half.
    let role = if r.validators == 0 { "oper" } else { "valid" };
    for (v, x) in &r.validator_pay {
        println!("{:>16} {:>5} {:>75.4}", &v.to_hex()[..16], role, x);
    }
    println!("{:>16} {:>81.4}", "total", total);
}

#[cfg(test)]
mod tests {
    use super::{compute_line, stage_compute_seconds};
    use iota_dataplane::stats::{Busy, StepTimes, WireTotals};

    fn miner(stage: u32, fwd: (u64, u64), bwd: (u64, u64)) -> Option<WireTotals> {
        let step_times = StepTimes {
            forward: Busy { count: fwd.0, micros: fwd.1 },
            backward: Busy { count: bwd.0, micros: bwd.1 },
            ..StepTimes::default()
        };
        Some(WireTotals { stage: Some(stage), step_times, ..WireTotals::default() })
    }

    #[test]
    fn the_summary_says_each_stages_compute_and_its_busiest_miner() {
        // Stage 0: two replicas at 100 and 300 ms per micro-batch; stage 1
        // (the tail: its forward holds the backward) 10 x 800 ms; one miner
        // left no totals.
        let totals = vec![
            miner(0, (10, 200_000), (10, 800_000)),
            miner(0, (5, 300_000), (5, 1_200_000)),
            None,
            miner(1, (10, 8_000_000), (0, 0)),
        ];
        let per = stage_compute_seconds(&totals);
        assert_eq!(per.len(), 2);
        assert!((per[0].unwrap() - 0.2).abs() < 1e-9, "{per:?}");
        assert!((per[1].unwrap() - 0.8).abs() < 1e-9, "{per:?}");
        let line = compute_line(&totals, 10.0).unwrap();
        assert!(line.contains("stage 0 200.0 ms (busy 15%)") && line.contains("stage 1 800.0 ms (busy 80%)"), "{line}");
        assert_eq!(compute_line(&totals, 0.0), None, "no training time, no shares");
        assert_eq!(compute_line(&[None], 5.0), None, "nothing reported");
    }
}
