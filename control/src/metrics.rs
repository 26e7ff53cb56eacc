//! The orchestrator's Prometheus metrics: a snapshot of the run's state
//! encoded in the exposition format at each scrape (the state machine keeps
//! plain counters; nothing here runs between scrapes).

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::orchestrator::{Orchestrator, Phase};

type Labels = Vec<(String, String)>;

fn counter(r: &mut Registry, name: &str, help: &str, value: u64) {
    let c: Counter = Counter::default();
    c.inc_by(value);
    r.register(name, help, c);
}

fn gauge(r: &mut Registry, name: &str, help: &str, value: i64) {
    let g: Gauge = Gauge::default();
    g.set(value);
    r.register(name, help, g);
}

fn gauge_f(r: &mut Registry, name: &str, help: &str, value: f64) {
    let g: Gauge<f64, std::sync::atomic::AtomicU64> = Gauge::default();
    g.set(value);
    r.register(name, help, g);
}

/// The run's metrics, as the text exposition format.
pub fn orchestrator_metrics(o: &Orchestrator) -> String {
    let mut r = Registry::with_prefix("iota");
    let c = o.counters();
    let spec = o.spec();
    gauge(&mut r, "epoch", "The epoch the run is in (0-based).", o.epoch() as i64);
    gauge(&mut r, "epochs", "Epochs the run trains.", spec.epoch_count() as i64);
    let phases = Family::<Labels, Gauge>::default();
    for p in [Phase::Waiting, Phase::Training, Phase::Uploading, Phase::Merging, Phase::Done] {
        let name = format!("{p:?}").to_lowercase();
        phases.get_or_create(&vec![("phase".into(), name)]).set(i64::from(o.phase() == &p));
    }
    r.register("phase", "1 for the phase the run is in, 0 for the others.", phases);
    counter(&mut r, "micro_batches_completed", "Micro-batches whose loss the tail reported.", c.completed);
    counter(&mut r, "micro_batches_rerouted", "Micro-batch attempts re-issued on another pathway.", c.rerouted);
    counter(&mut r, "micro_batches_dropped", "Micro-batches given up after every attempt.", c.dropped);
    counter(&mut r, "tokens", "Training tokens through completed micro-batches.", c.tokens);
    gauge_f(&mut r, "train_loss", "Mean loss of the last completed micro-batch (nats/token).", f64::from(c.last_loss));
    if let Some(e) = o.history().last() {
        gauge_f(&mut r, "epoch_mean_loss", "Mean training loss of the last finished epoch.", f64::from(e.mean_loss));
    }
    let miners = Family::<Labels, Gauge>::default();
    let tps = Family::<Labels, Gauge<f64, std::sync::atomic::AtomicU64>>::default();
    let in_flight = Family::<Labels, Gauge>::default();
    for s in 0..spec.stages {
        for state in ["healthy", "unhealthy", "benched"] {
            miners.get_or_create(&vec![("stage".into(), s.to_string()), ("state".into(), state.into())]).set(0);
        }
    }
    for m in o.miners() {
        let state = if m.benched {
            "benched"
        } else if m.healthy {
            "healthy"
        } else {
            "unhealthy"
        };
        miners.get_or_create(&vec![("stage".into(), m.stage.to_string()), ("state".into(), state.into())]).inc();
        let stage = ("stage".to_string(), m.stage.to_string());
        tps.get_or_create(&vec![stage.clone()]).inc_by(m.tokens_per_s);
        in_flight.get_or_create(&vec![stage]).inc_by(i64::from(m.in_flight));
    }
    r.register("miners", "Registered miners per stage, by state.", miners);
    r.register("stage_tokens_per_second", "Tokens per second the stage's miners report, summed.", tps);
    r.register("stage_in_flight", "Micro-batches routed through the stage's miners and not finished.", in_flight);
    counter(&mut r, "convictions", "Convictions by validators' stake.", c.convictions);
    counter(&mut r, "miners_ejected", "Miners ejected after repeated convictions.", c.ejected);
    counter(&mut r, "miners_benched", "Times a miner was benched for not delivering.", c.benched);
    counter(&mut r, "merge_hash_mismatches", "Butterfly partitions whose two owners disagreed.", c.hash_mismatches);
    counter(&mut r, "divergent_merges", "Merges after which replicas' weights differed.", c.divergent_merges);
    counter(
        &mut r,
        "merge_contributions_from_store",
        "Butterfly contributions an owner read from the object store (the sender could not deliver them).",
        c.merge_contributions_from_store,
    );
    counter(
        &mut r,
        "merge_updates_from_store",
        "Merged butterfly slices a replica read from the object store (the update never reached it).",
        c.merge_updates_from_store,
    );
    counter(
        &mut r,
        "merges_behind_compute",
        "Merges that ran while the next epoch trained (--merge-overlap).",
        c.merges_behind_compute,
    );
    counter(&mut r, "store_objects_bad", "Store objects a reader found unlike their announcement.", c.bad_objects);
    counter(
        &mut r,
        "store_objects_foreign",
        "Announcements of objects the announcer was not asked to write.",
        c.foreign_objects,
    );
    counter(
        &mut r,
        "commitment_breaks",
        "Heartbeats whose commitments contradicted earlier ones.",
        c.commitment_breaks,
    );
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = encode(&mut out, &r);
    out
}
