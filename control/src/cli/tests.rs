use clap::Parser;

use iota_core::StageSpec;
use iota_protocol::MergeSpec;

use super::*;

#[derive(Parser)]
struct Flags {
    #[command(flatten)]
    run: RunArgs,
}

fn args(dir: &std::path::Path, extra: &[&str]) -> RunArgs {
    let base = ["x", "--model", "tiny", "--stages", "2", "--replicas", "1", "--run-dir", dir.to_str().unwrap()];
    Flags::parse_from(base.iter().chain(extra)).run
}

#[test]
fn the_default_optimizer_is_muon_where_it_is_cheap_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let parsed = |model: &str, stages: &str, extra: &[&str]| {
        let base = ["x", "--model", model, "--stages", stages, "--run-dir", dir.path().to_str().unwrap()];
        let run = Flags::parse_from(base.iter().chain(extra)).run;
        let cfg = run.run_config().unwrap();
        (cfg.train.adamw.optimizer_name(), run.optimizer_note(&cfg))
    };
    let cfg = |extra: &[&str]| parsed("tiny", "2", extra);
    // `small` in 3 stages at batch 8 x seq 128: the LM head sets the
    // tail's pace and Newton-Schulz adds about 6% to it.
    let (small, note) = parsed("small", "3", &[]);
    assert_eq!(small, "muon");
    let note = note.unwrap();
    assert!(note.starts_with("optimizer: muon (auto") && note.contains("about 6%"), "{note}");
    // `tiny`'s blocks are most of its work: AdamW, and the line says
    // how to have Muon anyway.
    let (tiny, note) = cfg(&[]);
    assert_eq!(tiny, "adamw");
    assert!(note.unwrap().contains("--optimizer muon"));
    // Sixteen times the tokens per step makes Muon cheap there too.
    assert_eq!(cfg(&["--grad-accum", "16"]).0, "muon");
    // A named optimizer is taken as it is, with no line.
    assert_eq!(parsed("small", "3", &["--optimizer", "adamw"]), ("adamw", None));
    assert_eq!(cfg(&["--optimizer", "nadam"]), ("nadam", None));
    let bad = args(dir.path(), &["--optimizer", "lion"]).run_config().unwrap_err().to_string();
    assert!(bad.contains("auto, adamw, nadam, muon"), "{bad}");
}

#[test]
fn the_merge_ramp_starts_at_one_step_per_replica_and_is_a_setting() {
    let dir = tempfile::tempdir().unwrap();
    let plain = args(dir.path(), &[]).run_config().unwrap();
    assert_eq!(plain.spec.ramp_first_epoch, 0);
    assert!(!plain.to_json().contains("ramp"), "off, it is left out: older run ids stand");
    // One replica accumulating 3 micro-batches a step: epochs of 3, 6,
    // 12, 24, then the full 48.
    let ramp = args(dir.path(), &["--merge-ramp", "--grad-accum", "3"]).run_config().unwrap();
    assert_eq!(ramp.spec.ramp_first_epoch, 3);
    assert_eq!((0..5).map(|e| ramp.spec.epoch_len(e)).collect::<Vec<_>>(), vec![3, 6, 12, 24, 48]);
    assert_ne!(ramp.spec.run_id, args(dir.path(), &["--grad-accum", "3"]).run_config().unwrap().spec.run_id);
    let both = args(dir.path(), &["--merge-ramp", "--merge-overlap"]).run_config().unwrap_err().to_string();
    assert!(both.contains("merge ramp") && both.contains("overlap"), "{both}");
}

#[test]
fn a_run_directory_holds_one_run() {
    let dir = tempfile::tempdir().unwrap();
    let run = args(dir.path(), &[]);
    let cfg = run.run_config().unwrap();
    run.claim_run_dir(&cfg).unwrap();
    assert!(run.store_dir().unwrap().is_absolute() && run.store_dir().unwrap().is_dir());
    // What miners receive names no path of the orchestrator's host.
    let json = cfg.to_json();
    let here = dir.path().to_str().unwrap();
    assert!(!json.contains(here) && !json.contains("\"store\""), "{json}");
    let corpus = dir.path().join("corpus.txt");
    std::fs::write(&corpus, iota_model::data::synthetic::grammar_text(4, 30_000)).unwrap();
    let with_data = args(dir.path(), &["--data", corpus.to_str().unwrap()]).run_config().unwrap();
    assert!(!with_data.to_json().contains("corpus.txt"));
    assert_ne!(with_data.corpus, cfg.corpus, "the corpus is named by its content");
    std::fs::write(dir.path().join("state.sqlite"), b"the first run's state").unwrap();
    // The same command resumes: same settings, same run id.
    let again = args(dir.path(), &[]).run_config().unwrap();
    assert_eq!(again.spec.run_id, cfg.spec.run_id);
    run.claim_run_dir(&again).unwrap();
    // Other settings: refused, naming them; the state is untouched. They
    // also make another run id (the id was seed/stages/replicas/epochs only).
    let other_run = args(dir.path(), &["--lr", "0.001", "--merge-rule", "mean"]);
    let other = other_run.run_config().unwrap();
    assert_ne!(other.spec.run_id, cfg.spec.run_id);
    let err = other_run.claim_run_dir(&other).unwrap_err().to_string();
    assert!(err.contains("train.schedule.peak: 0.002") && err.contains("spec.merge.rule"), "{err}");
    assert!(err.contains("--new-run"), "{err}");
    assert_eq!(std::fs::read(dir.path().join("state.sqlite")).unwrap(), b"the first run's state");
    // --new-run archives the old run and starts the new one there.
    let new_run = args(dir.path(), &["--lr", "0.001", "--merge-rule", "mean", "--new-run"]);
    new_run.claim_run_dir(&new_run.run_config().unwrap()).unwrap();
    assert_eq!(std::fs::read(dir.path().join("archive-1/state.sqlite")).unwrap(), b"the first run's state");
    assert!(!dir.path().join("state.sqlite").exists());
}

#[test]
fn a_run_without_validators_keeps_its_settings_and_a_bucket_is_one_of_them() {
    let dir = tempfile::tempdir().unwrap();
    let plain = args(dir.path(), &[]).run_config().unwrap();
    // As before validation existed: nothing about it in what miners get
    // or in the settings (so older run directories still resume).
    assert!(!plain.to_json().contains("validation"));
    let v = format!("{}:7", "ab".repeat(32));
    let validated = args(dir.path(), &["--validator", &v]).run_config().unwrap();
    assert!(validated.to_json().contains("validation"));
    assert_ne!(validated.spec.run_id, plain.spec.run_id);
    // The default bottleneck style is not written either (the settings,
    // so the run ids, of runs from before it existed are unchanged);
    // the residual one is a setting.
    assert!(!plain.to_json().contains("bottleneck_style"));
    let res = args(dir.path(), &["--bottleneck-style", "residual"]).run_config().unwrap();
    assert!(res.to_json().contains("\"bottleneck_style\":\"residual\""));
    assert_ne!(res.spec.run_id, plain.spec.run_id);
    assert_eq!(
        args(dir.path(), &["--bottleneck-style", "linear"]).run_config().unwrap().spec.run_id,
        plain.spec.run_id
    );
    assert!(args(dir.path(), &["--bottleneck-style", "cubic"]).run_config().is_err());
    assert_eq!(RunConfig::from_json(&validated.to_json()).unwrap().spec.validation.validators[0].stake, 7);
    // The bucket is a setting: another bucket is another run.
    let a = args(dir.path(), &["--bucket", "s3://one/run"]);
    let b = args(dir.path(), &["--bucket", "s3://two/run"]);
    let (ca, cb) = (a.run_config().unwrap(), b.run_config().unwrap());
    assert_ne!(ca.spec.run_id, cb.spec.run_id);
    a.claim_run_dir(&ca).unwrap();
    std::fs::write(dir.path().join("state.sqlite"), b"state").unwrap();
    let err = b.claim_run_dir(&cb).unwrap_err().to_string();
    assert!(err.contains("bucket") && err.contains("s3://one/run"), "{err}");
}

#[test]
fn config_file_becomes_flags_that_the_command_line_overrides() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("run.toml");
    std::fs::write(&p, "model = \"tiny\"\nepochs = 5\nlr = 0.001\n").unwrap();
    let args: Vec<String> = ["iota-control", "swarm", "--config-file", p.to_str().unwrap(), "--epochs", "2"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let out = expand_config_file(args).unwrap();
    assert_eq!(&out[..2], &["iota-control", "swarm"]);
    let joined = out.join(" ");
    assert!(joined.contains("--model tiny") && joined.contains("--lr 0.001"));
    assert!(joined.ends_with("--epochs 2"), "command-line flags come last: {joined}");
    std::fs::write(&p, "model = [1, 2]\n").unwrap();
    assert!(
        expand_config_file(vec!["x".into(), "swarm".into(), "--config-file".into(), p.to_str().unwrap().into()])
            .is_err()
    );
}

#[test]
fn warm_ups_are_settings_with_defaults_from_the_run_length() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = |extra: &[&str]| args(dir.path(), extra).run_config().unwrap();
    // 40 epochs x 48 micro-batches over 1 replica: 1,920 steps, a
    // twentieth of which is 96; at most 100, at least 1.
    let plain = cfg(&["--epochs", "40"]);
    assert_eq!(plain.train.schedule.warmup, 96);
    assert_eq!(cfg(&["--epochs", "100"]).train.schedule.warmup, 100);
    let short = cfg(&["--epochs", "40", "--warmup-steps", "10"]);
    assert_eq!(short.train.schedule.warmup, 10);
    assert_ne!(short.spec.run_id, plain.spec.run_id);
    assert_eq!(cfg(&["--warmup-steps", "0"]).train.schedule.warmup, 1);
    assert_eq!(cfg(&["--epochs", "1", "--warmup-steps", "1000"]).train.schedule.warmup, 48);
    // The pipeline's warm-up is the learning rate's by default, in
    // micro-batches (steps x replicas x grad_accum); one replica, 2 in
    // flight by default: 1 during it.
    assert_eq!(plain.spec.pipeline_warmup_micro_batches, 96);
    assert_eq!(short.spec.pipeline_warmup_micro_batches, 10);
    let piped = cfg(&["--epochs", "40", "--pipeline-warmup-steps", "50", "--grad-accum", "2"]);
    assert_eq!(piped.spec.pipeline_warmup_micro_batches, 100);
    let at: Vec<u32> = [(0, 0), (0, 47), (1, 48), (2, 3), (2, 4), (3, 0)]
        .iter()
        .map(|&(e, s)| piped.spec.max_in_flight_at(e, s))
        .collect();
    assert_eq!(at, vec![1, 1, 1, 1, 2, 2]);
    assert_ne!(piped.spec.run_id, plain.spec.run_id);
    // Off, it is left out of the settings: a run made before it existed
    // resumes with --pipeline-warmup-steps 0, under its old run id.
    let off = cfg(&["--pipeline-warmup-steps", "0"]);
    assert_eq!(off.spec.pipeline_warmup_micro_batches, 0);
    assert!(!off.to_json().contains("pipeline_warmup") && plain.to_json().contains("pipeline_warmup"));
}

#[test]
fn muon_momentum_is_taken_between_zero_and_one_and_left_unset_by_default() {
    let dir = tempfile::tempdir().unwrap();
    assert_eq!(args(dir.path(), &[]).run_config().unwrap().train.adamw.muon_momentum, None);
    let set = args(dir.path(), &["--optimizer", "muon", "--muon-momentum", "0.975"]).run_config().unwrap();
    assert_eq!(set.train.adamw.muon_momentum, Some(0.975));
    for bad in ["1", "0", "-0.5", "1.5", "NaN"] {
        let flag = format!("--muon-momentum={bad}");
        let err = args(dir.path(), &[flag.as_str()]).run_config().unwrap_err().to_string();
        assert!(err.contains("between 0 and 1"), "{bad}: {err}");
    }
}

#[test]
fn the_schedule_cuts_the_same_run_into_shorter_epochs_for_cpu_swarms_on_this_machine() {
    let dir = tempfile::tempdir().unwrap();
    let with = |device: Option<&str>, extra: &[&str]| {
        let base = ["x", "--model", "tiny", "--stages", "2", "--replicas", "2", "--epochs", "6"];
        let mut run =
            Flags::parse_from(base.iter().chain(&["--run-dir", dir.path().to_str().unwrap()]).chain(extra)).run;
        run.local_miner_device = device.map(String::from);
        let cfg = run.run_config().unwrap();
        (cfg.clone(), run.schedule_note(&cfg).unwrap())
    };
    let (served, note) = with(None, &[]);
    assert_eq!((served.spec.epochs, served.spec.micro_batches_per_epoch, served.spec.max_in_flight), (6, 48, 4));
    assert!(note.starts_with("schedule: throughput (auto"), "{note}");
    let (local, note) = with(Some("cpu"), &[]);
    assert_eq!((local.spec.epochs, local.spec.micro_batches_per_epoch, local.spec.max_in_flight), (72, 4, 2));
    assert!(note.starts_with("schedule: loss (auto"), "{note}");
    // The same run otherwise: tokens, optimizer steps and warm-ups.
    assert_eq!(local.spec.total_micro_batches(), served.spec.total_micro_batches());
    assert_eq!((local.train.steps, local.train.schedule), (served.train.steps, served.train.schedule));
    assert_eq!(local.spec.pipeline_warmup_micro_batches, served.spec.pipeline_warmup_micro_batches);
    // ... but not the same run: a run directory of the other refuses it.
    assert_ne!(local.spec.run_id, served.spec.run_id);
    // Named flags win over the schedule's choices.
    let (deep, _) = with(Some("cpu"), &["--max-in-flight", "4"]);
    assert_eq!((deep.spec.micro_batches_per_epoch, deep.spec.max_in_flight), (4, 4));
    let (gpu, _) = with(Some("cuda"), &[]);
    assert_eq!(gpu.spec, served.spec);
    let (named, _) = with(Some("cuda"), &["--schedule", "loss"]);
    assert_eq!(named.spec.run_id, local.spec.run_id);
    assert!(!note.contains("validators"), "{note}");
    // Validators with short epochs would recompute every micro-batch: said.
    let peer = "11".repeat(32);
    let validator = format!("{peer}:100");
    let (_, checked) = with(Some("cpu"), &["--schedule", "loss", "--validator", validator.as_str()]);
    assert!(checked.contains("they will recompute all of its work"), "{checked}");
    let (_, auto) = with(Some("cpu"), &["--validator", validator.as_str()]);
    assert!(auto.starts_with("schedule: throughput (auto") && !auto.contains("recompute all"), "{auto}");
}

#[test]
fn a_run_made_before_the_schedule_is_refused_with_how_to_resume_it() {
    let dir = tempfile::tempdir().unwrap();
    let run = |device: Option<&str>, extra: &[&str]| {
        let mut run = args(dir.path(), extra);
        run.local_miner_device = device.map(String::from);
        let cfg = run.run_config().unwrap();
        run.claim_run_dir(&cfg)
    };
    // The old default: long epochs, a full pipeline.
    run(Some("cpu"), &["--schedule", "throughput"]).unwrap();
    let err = format!("{:#}", run(Some("cpu"), &[]).unwrap_err());
    assert!(err.contains("resumes with --schedule throughput"), "{err}");
    // A named schedule that differs gets the plain refusal.
    let err = format!("{:#}", run(Some("cpu"), &["--schedule", "loss"]).unwrap_err());
    assert!(!err.contains("--schedule auto took"), "{err}");
    run(Some("cpu"), &["--schedule", "throughput"]).unwrap();
}

#[test]
fn stage_layers_are_even_balanced_or_listed_and_the_even_split_keeps_its_run_id() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = |extra: &[&str]| args(dir.path(), extra).run_config();
    let plain = cfg(&[]).unwrap();
    assert_eq!(plain.train.model.stage_layers, None);
    // tiny: 4 layers in 2 stages, 2 + 2 when even.
    for even in ["even", "2,2"] {
        let c = cfg(&["--stage-layers", even]).unwrap();
        assert_eq!((c.train.model.stage_layers.clone(), &c.spec.run_id), (None, &plain.spec.run_id), "{even}");
    }
    let listed = cfg(&["--stage-layers", "3,1"]).unwrap();
    assert_eq!(listed.train.model.stage_layers, Some(vec![3, 1]));
    assert_ne!(listed.spec.run_id, plain.spec.run_id, "another split is another run");
    let specs = StageSpec::split(&listed.train.model, 2).unwrap();
    assert_eq!(specs.iter().map(|s| s.layers.clone()).collect::<Vec<_>>(), vec![0..3, 3..4]);
    for (bad, says) in
        [("0,4", "each >= 1"), ("1,2,1", "3 stage(s)"), ("2,3", "adding up to 5"), ("two,two", "even, balanced")]
    {
        let err = format!("{:#}", cfg(&["--stage-layers", bad]).unwrap_err());
        assert!(err.contains(says), "{bad}: {err}");
    }
    // IOTA's shape: the tail's LM head weighs about four blocks.
    let base = ["x", "--model", "1.5b", "--stages", "3", "--seq", "1024", "--run-dir", dir.path().to_str().unwrap()];
    let big = |split: &str| {
        let run = Flags::parse_from(base.iter().chain(&["--stage-layers", split])).run;
        run.run_config().unwrap().train.model.stage_layers
    };
    assert_eq!(big("balanced"), Some(vec![6, 6, 4]), "at the GPT-2 vocabulary runs train with");
    let mut m = Flags::parse_from(base).run.run_config().unwrap().train.model;
    let even = iota_core::compute_plan::stage_imbalance(&m, 3, 1024).unwrap();
    m.stage_layers = big("balanced");
    let balanced = iota_core::compute_plan::stage_imbalance(&m, 3, 1024).unwrap();
    // The slowest stage over the stages' mean: 1.13 -> 1.02.
    assert!(even > 1.1 && balanced < 1.03, "even {even}, balanced {balanced}");
    assert_eq!(big("6,5,5"), None, "the even split of 16 in 3");
    // What the run's first lines say of it.
    let note = |split: &str| {
        let run = Flags::parse_from(base.iter().chain(&["--stage-layers", split])).run;
        run.stage_note(&run.run_config().unwrap())
    };
    let even = note("even").expect("even is 1.13x, balanced 1.02x: worth a hint");
    assert!(even.contains("6,5,5 (even)") && even.contains("balanced (6,6,4)"), "{even}");
    let chosen = note("balanced").unwrap();
    assert!(chosen.starts_with("blocks per stage: 6,6,4 (--stage-layers balanced)"), "{chosen}");
    // tiny in 2 stages: even is already balanced enough to say nothing.
    let quiet = args(dir.path(), &[]);
    assert_eq!(quiet.stage_note(&quiet.run_config().unwrap()), None);
}

#[test]
fn a_balanced_split_within_a_card_size_keeps_every_stage_on_that_card() {
    // IOTA's shape at Llama 3's vocabulary, batch 4 x 1024, 2 micro-batches
    // held: balanced alone puts 7 blocks and the embedding on the head,
    // which a 16 GiB card does not hold; within 16 GiB it is 6,7,3.
    let m = ModelConfig::preset("1.5b").unwrap();
    let shape = (4, 1024, 2);
    assert_eq!(stage_layers("balanced", &m, 3, shape).unwrap(), Some(vec![7, 7, 2]));
    assert_eq!(stage_layers("balanced:16", &m, 3, shape).unwrap(), Some(vec![6, 7, 3]));
    assert_eq!(stage_layers("balanced:80", &m, 3, shape).unwrap(), Some(vec![7, 7, 2]), "no bound on an 80 GiB card");
    for (bad, says) in [
        ("balanced:4", "no split"),
        ("balanced:x", "card size"),
        ("balanced:-1", "card size"),
        ("even:3", "balanced:GIB"),
    ] {
        let err = format!("{:#}", stage_layers(bad, &m, 3, shape).unwrap_err());
        assert!(err.contains(says), "{bad}: {err}");
    }
    assert!(stage_layers("balanced", &m, 17, shape).is_err(), "more stages than blocks");
}

/// The flags take their defaults from `RunSpec::default()`, the one place
/// the run's defaults are written: a run made with no flags but its shape
/// has the default of every setting the launcher does not derive.
#[test]
fn the_flags_default_to_the_run_specs_defaults() {
    let dir = tempfile::tempdir().unwrap();
    let got = args(dir.path(), &[]).run_config().unwrap().spec;
    let want = RunSpec::default();
    let derived = RunSpec {
        // What the launcher derives from the model, the corpus, the shape
        // and the cadence rather than reads from a flag's default.
        run_id: want.run_id,
        stages: want.stages,
        replicas: want.replicas,
        epochs: want.epochs,
        micro_batches_per_epoch: want.micro_batches_per_epoch,
        batch: want.batch,
        n_shards: want.n_shards,
        max_in_flight: want.max_in_flight,
        pipeline_warmup_micro_batches: want.pipeline_warmup_micro_batches,
        merge: MergeSpec { stage_params: want.merge.stage_params.clone(), ..got.merge.clone() },
        ..got.clone()
    };
    assert_eq!(derived, want);
    // And a flag set moves its setting off the default.
    let flags = ["--route-timeout-s", "7", "--validation-rate", "0.1", "--max-slice-mib", "1", "--store-mbit", "10"];
    let set = args(dir.path(), &flags).run_config().unwrap().spec;
    let got = (set.route_timeout_ms, set.validation.rate, set.merge.max_slice_bytes, set.merge.store_mbit);
    assert_eq!(got, (7_000, 0.1, 1 << 20, 10));
    // A setting at its default is left out of the settings, so the run ids
    // of runs saved before it existed stand; set, it is kept.
    assert!(!args(dir.path(), &[]).run_config().unwrap().to_json().contains("store_mbit"));
    assert!(args(dir.path(), &["--store-mbit", "10"]).run_config().unwrap().to_json().contains("\"store_mbit\":10"));
    assert!(args(dir.path(), &["--store-mbit", "0"]).run_config().is_err());
}

/// `--merge-codec sparse` brings its own defaults (density 1/20, outer lr
/// 1.5); a named outer lr stands with either codec, and the bf16 merge's
/// stays 1.
#[test]
fn a_sparse_merge_takes_its_own_outer_lr_unless_told() {
    let dir = tempfile::tempdir().unwrap();
    let merge = |extra: &[&str]| args(dir.path(), extra).run_config().unwrap().spec.merge;
    let plain = merge(&[]);
    assert_eq!((plain.outer.lr, plain.sparse_density), (1.0, 0.0));
    let sparse = merge(&["--merge-codec", "sparse"]);
    assert_eq!((sparse.outer.lr, sparse.sparse_density), (1.5, 1.0 / 20.0));
    assert_eq!(merge(&["--merge-codec", "sparse", "--outer-lr", "1"]).outer.lr, 1.0);
    assert_eq!(merge(&["--outer-lr", "0.7"]).outer.lr, 0.7);
    let zero = args(dir.path(), &["--merge-codec", "sparse", "--outer-lr", "0"]).run_config().unwrap_err();
    assert!(zero.to_string().contains("--outer-lr must be positive"), "{zero}");
}
