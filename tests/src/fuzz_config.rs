//! The `run_config` fuzz target's body: the run configuration a miner or a
//! validator receives from the orchestrator at registration, as JSON. It
//! comes over the network, so a hostile or broken orchestrator must not be
//! able to make a miner panic, loop or allocate without bound with it.
//!
//! Random bytes seldom make JSON of the right shape, so most inputs are
//! edits of a real run configuration: the input picks leaves of its JSON
//! and values to put there (extremes, wrong types, removal), then the
//! result goes through `RunConfig::from_json` and, when accepted, through
//! what a miner does next with it (the memory accounting of every stage).

use iota_core::memory_fit::RunMemoryNeeds;
use iota_core::memory_plan::{ComputeBackend, InnerOptimizer};
use iota_core::{ParamLayout, StageSpec, WireCodec};
use iota_protocol::RunConfig;
use serde_json::Value;

use crate::fuzz_input::Bytes;

/// Two real configurations: the tests' `tiny` swarm, and one with every
/// optional optimizer setting present so that its fields are leaves too.
fn base(which: u8) -> Value {
    static BASES: std::sync::OnceLock<[Value; 2]> = std::sync::OnceLock::new();
    BASES.get_or_init(|| [make_base(false), make_base(true)])[which as usize % 2].clone()
}

fn make_base(every_setting: bool) -> Value {
    let mut cfg = crate::tiny_run(3, 2, 2, 8, WireCodec::Int8Row);
    if every_setting {
        cfg.train.adamw.muon = true;
        cfg.train.adamw.nesterov = true;
        cfg.train.adamw.stage_beta1 = vec![0.9, 0.95];
        cfg.train.adamw.stage_lr = vec![0.5, 1.0];
        cfg.spec.max_in_flight = 3;
        cfg.spec.ramp_first_epoch = 2;
        // `tiny`'s 4 blocks in 3 stages, not the even 2,1,1.
        cfg.train.model.stage_layers = Some(vec![1, 1, 2]);
    }
    serde_json::to_value(&cfg).expect("a run config is JSON")
}

/// JSON pointers of every leaf (and of every empty container).
fn leaves(v: &Value, at: String, out: &mut Vec<String>) {
    match v {
        Value::Object(m) if !m.is_empty() => m.iter().for_each(|(k, x)| leaves(x, format!("{at}/{k}"), out)),
        Value::Array(a) if !a.is_empty() => a.iter().enumerate().for_each(|(i, x)| leaves(x, format!("{at}/{i}"), out)),
        _ => out.push(at),
    }
}

/// A value the input chooses: the extremes of each number type, floats
/// that overflow an f32, wrong types.
fn hostile(b: &mut Bytes, old: &Value) -> Option<Value> {
    let n = |x: f64| serde_json::Number::from_f64(x).map(Value::Number);
    Some(match b.u8() % 16 {
        0 => Value::from(0u64),
        1 => Value::from(1u64),
        2 => Value::from(-1i64),
        3 => Value::from(u32::MAX as u64 + b.u8() as u64 - 128),
        4 => Value::from(u64::MAX - b.u8() as u64),
        5 => Value::from(b.u64()),
        6 => Value::from(1u64 << (b.u8() % 64)),
        7 => n(1e39)?,
        8 => n(-1e39)?,
        9 => n(f64::MAX)?,
        10 => n(b.u16() as f64 / 1000.0 - 16.0)?,
        11 => n(f64::from(f32::MIN_POSITIVE) / 4.0)?,
        12 => old.as_f64().and_then(|x| n(x * 2f64.powi(b.u8() as i32 % 64 - 8)))?,
        13 => Value::Null,
        14 => Value::String(String::from_utf8_lossy(b.take(8)).into_owned()),
        _ => Value::Array(vec![old.clone()]),
    })
}

/// The JSON an input stands for: the input itself (mode 0 mod 4) or a
/// real configuration with the input's edits.
fn edit_json(data: &[u8]) -> String {
    let mut b = Bytes(data);
    let mode = b.u8();
    if mode % 4 == 0 {
        return String::from_utf8_lossy(b.0).into_owned();
    }
    let mut v = base(mode / 4);
    let mut at = Vec::new();
    leaves(&v, String::new(), &mut at);
    for _ in 0..1 + b.u8() % 4 {
        let path = &at[b.u16() as usize % at.len()];
        let Some(old) = v.pointer(path).cloned() else { continue };
        if b.u8() % 8 == 0 {
            // A field left out: its serde default, or a refusal.
            let (parent, key) = path.rsplit_once('/').expect("a pointer has a slash");
            if let Some(Value::Object(m)) = v.pointer_mut(parent) {
                m.remove(key);
            }
        } else if let Some(new) = hostile(&mut b, &old) {
            *v.pointer_mut(path).expect("found above") = new;
        }
    }
    v.to_string()
}

pub fn run_config(data: &[u8]) {
    let json = edit_json(data);
    let Ok(cfg) = RunConfig::from_json(&json) else { return };
    // What the orchestrator sent, the miner can describe back exactly: no
    // setting accepted in a form that does not survive its own JSON.
    let again = RunConfig::from_json(&cfg.to_json()).expect("an accepted run config reads back");
    assert!(again == cfg, "an accepted run config changed on its way back through JSON");
    // What a miner does next (lifecycle.rs): every stage's layout and the
    // memory it needs on each backend, for as many held micro-batches as
    // the run lets the orchestrator route to it.
    let t = &cfg.train;
    let specs = StageSpec::split(&t.model, t.stages).expect("a validated config splits into its stages");
    for s in &specs {
        let total = ParamLayout::for_stage(&t.model, s).total();
        assert!(total > 0, "stage {} has no parameters", s.index);
    }
    // The last micro-batch of the run: its global number and first sample.
    // Its last epoch (the merge ramp adds epochs) ends on the run's last
    // micro-batch.
    let (last_epoch, spec) = (cfg.spec.epoch_count() - 1, &cfg.spec);
    let last_seq = spec.epoch_len(last_epoch) - 1;
    assert!(spec.epoch_start(last_epoch) + last_seq + 1 == spec.total_micro_batches(), "the epochs lose micro-batches");
    let last = spec.micro_batch(last_epoch, last_seq);
    assert!(last.shard < spec.n_shards);
    let _ = spec.max_in_flight_at(last_epoch, last_seq);
    let held = cfg.spec.max_in_flight.clamp(1, 256) as usize;
    let optimizer = InnerOptimizer::of(&t.adamw);
    if let Ok(needs) = RunMemoryNeeds::new(&t.model, t.stages, t.batch, t.seq, held, optimizer) {
        for stage in 0..specs.len() {
            let _ = needs.check(ComputeBackend::Cpu, stage, 16 << 30);
        }
    }
}

#[cfg(test)]
mod tests {
    use iota_core::Rng;

    /// The edits reach past the parser: some edited configs are accepted
    /// and go on to the memory accounting, some are refused. A longer
    /// campaign without cargo-fuzz: `FUZZ_ITERS=200000 cargo test -p
    /// iota-tests --release --lib fuzz_config`.
    #[test]
    fn edited_run_configs_are_accepted_or_refused_and_never_panic() {
        let iters = std::env::var("FUZZ_ITERS").ok().and_then(|s| s.parse().ok()).unwrap_or(3000u64);
        let mut rng = Rng::new(7);
        let (mut accepted, mut refused) = (0, 0);
        for i in 0..iters {
            let len = 1 + (rng.next_u64() % 40) as usize;
            let mut data: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
            data[0] |= 1; // the edit path, not raw bytes
            let r = std::panic::catch_unwind(|| super::run_config(&data));
            assert!(r.is_ok(), "run_config panicked on input {i}: {data:?}");
            let json = super::edit_json(&data);
            match iota_protocol::RunConfig::from_json(&json) {
                Ok(_) => accepted += 1,
                Err(_) => refused += 1,
            }
        }
        assert!(accepted > iters / 20 && refused > iters / 20, "accepted {accepted}, refused {refused}");
    }
}

#[cfg(test)]
mod regressions {
    use super::*;

    /// An edit-path input that sets the leaf at `pointer` of base 0 to
    /// `hostile` value number `pick`.
    fn setting(pointer: &str, pick: u8) -> Vec<u8> {
        let mut at = Vec::new();
        leaves(&base(0), String::new(), &mut at);
        let i = at.iter().position(|p| p == pointer).unwrap_or_else(|| panic!("{pointer} is not a leaf: {at:?}"));
        let i = u16::try_from(i).unwrap().to_le_bytes();
        vec![1, 0, i[0], i[1], 1, pick]
    }

    fn refusal(data: &[u8]) -> String {
        let json = edit_json(data);
        run_config(data);
        RunConfig::from_json(&json).expect_err("refused").to_string()
    }

    /// Settings outside their range are refused by name; a number past
    /// f32's range is refused by the parser (it never becomes infinity).
    #[test]
    fn a_setting_outside_its_range_is_refused() {
        for (leaf, pick, name) in [
            ("/train/adamw/weight_decay", 2, "weight_decay"),
            ("/train/adamw/eps", 0, "eps"),
            ("/train/schedule/min_ratio", 2, "min_ratio"),
            ("/val_fraction", 1, "val_fraction"),
            ("/train/adamw/grad_clip", 7, "out of range"),
        ] {
            let e = refusal(&setting(leaf, pick));
            assert!(e.contains(name), "{leaf}: {e}");
        }
    }

    /// Found by this target: a model of 2^32-wide layers overflowed the
    /// parameter count (a panic in a debug build, a wrong size in release).
    #[test]
    fn a_model_beyond_the_size_limits_is_refused_by_name() {
        for (leaf, name) in [("/train/model/d_model", "d_model"), ("/train/model/vocab_size", "vocab_size")] {
            let e = refusal(&setting(leaf, 3));
            assert!(e.contains(&format!("{name} ")) && e.contains("exceeds this build's limit"), "{leaf}: {e}");
        }
        let e = refusal(&setting("/train/batch", 3));
        assert!(e.contains("--batch x --seq"), "{e}");
        // Epochs near u64::MAX overflowed the last micro-batch's global
        // number (a panic in a debug build): seen reading run_spec.rs,
        // now addressed by this target.
        let e = refusal(&setting("/spec/epochs", 4));
        assert!(e.contains("must be at most"), "{e}");
    }
}
