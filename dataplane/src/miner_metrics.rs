//! A miner's Prometheus metrics (`iota-miner run --metrics ADDR`): step
//! times by kind, merge times, tokens, frames and bytes per lane (framing
//! included), frames rejected by reason, send failures, store retries and
//! device memory. Histograms are kept live; counters owned elsewhere (the
//! transport's, the store's) are read at each scrape.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::stats::{StatsSnapshot, lane_name};

type Labels = Vec<(String, String)>;
type HistogramFamily = Family<Labels, Histogram, fn() -> Histogram>;

/// Step and merge times: 1 ms to about 65 s.
fn seconds_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 17))
}

/// What a stage worker's input was, for the step-time histogram.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepKind {
    /// A route the head starts (its forward) or activations in (forward).
    Forward,
    /// Activation gradients in (backward, and the optimizer when due).
    Backward,
    /// A weight slice in (the merge's reduce).
    WeightSlice,
    /// An orchestrator command (phases, merge plans, uploads; a route
    /// past the head, which only records where its frames go).
    Command,
}

impl crate::stats::StepTimes {
    /// The tally of inputs of `kind`.
    pub fn of_kind(&mut self, kind: StepKind) -> &mut crate::stats::Busy {
        match kind {
            StepKind::Forward => &mut self.forward,
            StepKind::Backward => &mut self.backward,
            StepKind::WeightSlice => &mut self.weight_slice,
            StepKind::Command => &mut self.command,
        }
    }
}

impl StepKind {
    fn name(self) -> &'static str {
        match self {
            StepKind::Forward => "forward",
            StepKind::Backward => "backward",
            StepKind::WeightSlice => "weight_slice",
            StepKind::Command => "command",
        }
    }
}

/// The live part of a miner's metrics (cheap to clone and share).
#[derive(Clone)]
pub struct MinerMetrics {
    steps: HistogramFamily,
    merges: Histogram,
    /// Device memory in use and in all (bytes; `u64::MAX`: not measured,
    /// the CPU).
    device_used: Arc<AtomicU64>,
    device_total: Arc<AtomicU64>,
}

impl Default for MinerMetrics {
    fn default() -> Self {
        MinerMetrics {
            steps: Family::new_with_constructor(seconds_buckets),
            merges: seconds_buckets(),
            device_used: Arc::new(AtomicU64::new(u64::MAX)),
            device_total: Arc::new(AtomicU64::new(u64::MAX)),
        }
    }
}

/// What the scrape reads from elsewhere.
pub struct Scrape<'a> {
    pub transport: &'a StatsSnapshot,
    pub tokens: u64,
    pub in_flight: u32,
    pub store_retries: u64,
    pub epoch: u64,
    /// Where the miner stands (None before its first heartbeat reply).
    pub standing: Option<crate::miner::standing::StandingMetrics>,
}

impl MinerMetrics {
    /// The stage worker handled one input of `kind` in `seconds`.
    pub fn observe_step(&self, kind: StepKind, seconds: f64) {
        self.steps.get_or_create(&vec![("kind".into(), kind.name().into())]).observe(seconds);
    }

    /// A merge took `seconds`, from its plan to the next phase, as this
    /// miner saw it.
    pub fn observe_merge(&self, seconds: f64) {
        self.merges.observe(seconds);
    }

    /// The device's memory in use and in all (bytes).
    pub fn set_device_memory(&self, used: u64, total: u64) {
        self.device_used.store(used, Ordering::Relaxed);
        self.device_total.store(total, Ordering::Relaxed);
    }

    /// The metrics now, as the text exposition format.
    pub fn encode(&self, s: &Scrape) -> String {
        let mut r = Registry::with_prefix("iota_miner");
        r.register("step_seconds", "Time the stage worker spent on one input, by kind.", self.steps.clone());
        r.register(
            "merge_seconds",
            "Time from a merge plan to the next phase, as this miner saw it.",
            self.merges.clone(),
        );
        let counter = |r: &mut Registry, name: &str, help: &str, v: u64| {
            let c: Counter = Counter::default();
            c.inc_by(v);
            r.register(name, help, c);
        };
        counter(&mut r, "tokens", "Tokens through micro-batches this miner computed.", s.tokens);
        let g: Gauge = Gauge::default();
        g.set(i64::from(s.in_flight));
        r.register("in_flight", "Micro-batches this miner holds state for.", g);
        let g: Gauge = Gauge::default();
        g.set(s.epoch as i64);
        r.register("epoch", "The epoch this miner works in.", g);
        let lanes = [
            ("frames_sent", "Frames sent, by lane."),
            ("sent_bytes", "Bytes sent, by lane (framing included: prefix, header, padding, payload)."),
            ("frames_received", "Frames received and accepted, by lane."),
            ("received_bytes", "Bytes received in accepted frames, by lane (framing included)."),
        ];
        for (i, (name, help)) in lanes.into_iter().enumerate() {
            let f = Family::<Labels, Counter>::default();
            for (d, l) in &s.transport.lanes {
                let v = [l.frames_sent, l.bytes_sent, l.frames_received, l.bytes_received][i];
                f.get_or_create(&vec![("lane".into(), lane_name(*d).into())]).inc_by(v);
            }
            r.register(name, help, f);
        }
        let rejected = Family::<Labels, Counter>::default();
        for (reason, n) in &s.transport.rejected {
            rejected.get_or_create(&vec![("reason".into(), (*reason).into())]).inc_by(*n);
        }
        r.register("frames_rejected", "Frames refused on receipt, by reason.", rejected);
        counter(&mut r, "send_failures", "Frames that could not be sent.", s.transport.send_failures);
        counter(&mut r, "connects", "Data-plane connections dialled.", s.transport.connects);
        counter(&mut r, "store_retries", "Object-store operations retried after a transient failure.", s.store_retries);
        if let Some(st) = &s.standing {
            standing_metrics(&mut r, st);
        }
        let (used, total) = (self.device_used.load(Ordering::Relaxed), self.device_total.load(Ordering::Relaxed));
        if used != u64::MAX {
            let g: Gauge = Gauge::default();
            g.set(used as i64);
            r.register("device_memory_used_bytes", "Device memory in use (the whole GPU's, as the driver reports).", g);
            let g: Gauge = Gauge::default();
            g.set(total as i64);
            r.register("device_memory_total_bytes", "Device memory in all.", g);
        }
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &r);
        out
    }
}

/// The standing as gauges: one per state (1 for the current one, as
/// Prometheus' state sets do), the stage and the pay.
fn standing_metrics(r: &mut Registry, st: &crate::miner::standing::StandingMetrics) {
    use crate::miner::standing::{STATES, state_name};
    let states = Family::<Labels, Gauge>::default();
    let names = STATES.iter().map(|s| state_name(*s)).chain(["unreachable"]);
    for name in names {
        states.get_or_create(&vec![("state".into(), name.into())]).set(i64::from(name == st.state));
    }
    r.register("standing", "Where this miner stands (1: the current state), as the orchestrator says.", states);
    let g: Gauge = Gauge::default();
    g.set(i64::from(st.stage));
    r.register("stage", "The stage this miner is assigned.", g);
    let pay = |r: &mut Registry, name: &str, help: &str, v: f64| {
        let g = Gauge::<f64, AtomicU64>::default();
        g.set(v);
        r.register(name, help, g);
    };
    pay(r, "paid_last_epoch", "What this miner was paid in the last settled epoch.", st.paid_last);
    pay(r, "paid", "What this miner was paid over the run.", st.paid_total);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exposition_holds_what_was_observed() {
        let m = MinerMetrics::default();
        m.observe_step(StepKind::Forward, 0.003);
        m.observe_step(StepKind::Forward, 0.005);
        m.observe_step(StepKind::Backward, 0.010);
        m.observe_merge(2.5);
        let mut t = StatsSnapshot::default();
        t.lanes[0].1.bytes_sent = 1234;
        t.lanes[1].1.frames_received = 7;
        t.rejected.insert("bad_signature", 3);
        let standing =
            crate::miner::standing::StandingMetrics { state: "benched", stage: 2, paid_last: 0.25, paid_total: 1.5 };
        let text = m.encode(&Scrape {
            transport: &t,
            tokens: 512,
            in_flight: 2,
            store_retries: 4,
            epoch: 1,
            standing: Some(standing),
        });
        for line in [
            "iota_miner_step_seconds_count{kind=\"forward\"} 2",
            "iota_miner_step_seconds_count{kind=\"backward\"} 1",
            "iota_miner_merge_seconds_count 1",
            "iota_miner_tokens_total 512",
            "iota_miner_sent_bytes_total{lane=\"activations\"} 1234",
            "iota_miner_frames_received_total{lane=\"activation_grads\"} 7",
            "iota_miner_frames_rejected_total{reason=\"bad_signature\"} 3",
            "iota_miner_store_retries_total 4",
            "iota_miner_in_flight 2",
            "iota_miner_standing{state=\"benched\"} 1",
            "iota_miner_standing{state=\"training\"} 0",
            "iota_miner_standing{state=\"unreachable\"} 0",
            "iota_miner_stage 2",
            "iota_miner_paid 1.5",
            "iota_miner_paid_last_epoch 0.25",
        ] {
            assert!(text.lines().any(|l| l == line), "no `{line}` in\n{text}");
        }
        assert!(!text.contains("device_memory"), "no device memory on the CPU");
        m.set_device_memory(3 << 30, 16 << 30);
        let text =
            m.encode(&Scrape { transport: &t, tokens: 0, in_flight: 0, store_retries: 0, epoch: 0, standing: None });
        assert!(!text.contains("iota_miner_standing"), "no standing before the first reply");
        assert!(text.contains(&format!("iota_miner_device_memory_used_bytes {}", 3u64 << 30)), "{text}");
        assert!(text.ends_with("# EOF\n"));
    }
}
