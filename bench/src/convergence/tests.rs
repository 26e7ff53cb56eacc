//! The harness's own checks: the comparisons it draws must be fair.

use super::*;
use iota_core::merge::{OuterOpt, ReduceRule};

pub(super) fn tiny_setup(replicas: usize, grad_accum: usize, steps: u64) -> (Setup, Corpus) {
    let mut model = iota_core::ModelConfig::preset("tiny").unwrap();
    model.bottleneck = 0;
    let train = TrainConfig {
        tokenizer: iota_core::train_config::TokenizerKind::Byte,
        stages: 2,
        batch: 2,
        seq: 16,
        grad_accum,
        steps,
        schedule: iota_core::train_config::LrSchedule { peak: 3e-3, warmup: 2, total: steps, min_ratio: 0.1 },
        adamw: Default::default(),
        codec: WireCodec::F32,
        seed: 7,
        model,
    };
    let text: Vec<u32> = (0..40_000u32).map(|i| (i * 7 + i / 13) % 200 + 20).collect();
    let corpus = Corpus::new(text, 16, 8, 0.05).unwrap();
    let merge = MergeSpec {
        rule: ReduceRule::Mean,
        outer: OuterOpt::AVERAGE,
        codec: WireCodec::F32,
        slices_per_replica: 2,
        ..MergeSpec::default()
    };
    (
        Setup {
            train,
            replicas,
            merge,
            seed: 7,
            mix_percent: 100,
            avg_muon_momentum_only: false,
            orth_merge: false,
            sparse_merge: None,
            sparse_local: false,
            sparse_flush_last: false,
            sparse_decay: 1.0,
        },
        corpus,
    )
}

fn params(t: &Trainer) -> Vec<Vec<f32>> {
    let p = match &t.mode {
        Mode::One(p) => p,
        Mode::Sync(r) => &r[0],
        Mode::Swarm { merged, .. } => merged,
    };
    p.stages().iter().map(|s| s.params_host()).collect()
}

fn max_diff(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    a.iter().flatten().zip(b.iter().flatten()).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

#[test]
fn synchronous_data_parallel_equals_one_process_at_the_global_batch() {
    let (setup, corpus) = tiny_setup(3, 2, 6);
    let be = Arc::new(CpuBackend::new());
    let mut one = Trainer::new(be.clone(), &setup, &Variant::OneProcess).unwrap();
    let mut sync = Trainer::new(be.clone(), &setup, &Variant::SyncDataParallel).unwrap();
    let start = params(&one);
    for _ in 0..6 {
        one.step(&corpus).unwrap();
        sync.step(&corpus).unwrap();
    }
    let (p1, p2) = (params(&one), params(&sync));
    let moved = max_diff(&start, &p1);
    let diff = max_diff(&p1, &p2);
    assert!(moved > 1e-3, "training moved the weights by {moved}");
    assert!(diff < 1e-5, "sync DP differs from one process by {diff} (moved {moved})");
    // Every replica holds the same weights.
    if let Mode::Sync(r) = &sync.mode {
        for p in &r[1..] {
            let q: Vec<Vec<f32>> = p.stages().iter().map(|s| s.params_host()).collect();
            assert_eq!(max_diff(&p2, &q), 0.0);
        }
    }
    // And replicas that do not average their gradients diverge from it:
    // the check above can fail.
    let mut apart = Trainer::new(
        be,
        &setup,
        &Variant::Swarm {
            interval: 100,
            bottleneck: true,
            f32_codec: false,
            mixed: false,
            overlap: 0,
            delay: 0,
            delay_from: 0,
            recompute: false,
            average_moments: false,
            ramp: MergeRamp::None,
            predict: false,
        },
    )
    .unwrap();
    for _ in 0..5 {
        apart.step(&corpus).unwrap();
    }
    if let Mode::Swarm { replicas, .. } = &apart.mode {
        let a: Vec<Vec<f32>> = replicas[0].stages().iter().map(|s| s.params_host()).collect();
        let b: Vec<Vec<f32>> = replicas[1].stages().iter().map(|s| s.params_host()).collect();
        assert!(max_diff(&a, &b) > 1e-4);
    }
}

#[test]
fn every_variant_trains_the_same_tokens() {
    // 3 global steps of 2 replicas x grad_accum 2: 12 micro-batches each.
    let (setup, corpus) = tiny_setup(2, 2, 3);
    let be = Arc::new(CpuBackend::new());
    for (v, steps) in [(Variant::OneProcess, 3), (Variant::OneProcessReplicaBatch, 6)] {
        let mut t = Trainer::new(be.clone(), &setup, &v).unwrap();
        for _ in 0..3 {
            t.step(&corpus).unwrap();
        }
        let Mode::One(p) = &t.mode else { unreachable!() };
        let micro_batches = p.step_count() * p.cfg.grad_accum as u64;
        assert_eq!((p.step_count(), micro_batches), (steps, 12), "{v:?}");
    }
}

#[test]
fn one_replica_merging_with_plain_averaging_is_one_process() {
    // R = 1: the merge must hand back exactly the replica's weights
    // (pseudo-gradient through the f32 codec, mean, lr 1), and a
    // pathway drawn from one replica is that replica's pipeline.
    let (setup, corpus) = tiny_setup(1, 1, 5);
    let be = Arc::new(CpuBackend::new());
    let mut one = Trainer::new(be.clone(), &setup, &Variant::OneProcess).unwrap();
    let mut swarm = Trainer::new(be, &setup, &swarm(2, 0, false)).unwrap();
    for _ in 0..5 {
        one.step(&corpus).unwrap();
        swarm.step(&corpus).unwrap();
    }
    assert_eq!(swarm.merges, 3, "merges after steps 2 and 4 and at the end");
    let d = max_diff(&params(&one), &params(&swarm));
    assert!(d < 1e-6, "{d}");
}

fn overlapped(interval: u64) -> Variant {
    Variant::Swarm {
        interval,
        bottleneck: true,
        f32_codec: false,
        mixed: true,
        overlap: interval,
        delay: 0,
        delay_from: 0,
        recompute: false,
        average_moments: false,
        ramp: MergeRamp::None,
        predict: false,
    }
}

#[test]
fn an_overlapped_merge_of_one_replica_is_one_process() {
    // R = 1: the merge returns the replica's weights, so landing it a window
    // late (merged + own now - own then) must leave the replica on exactly
    // the trajectory of one process.
    let (setup, corpus) = tiny_setup(1, 1, 5);
    let be = Arc::new(CpuBackend::new());
    let mut one = Trainer::new(be.clone(), &setup, &Variant::OneProcess).unwrap();
    let mut swarm = Trainer::new(be, &setup, &overlapped(2)).unwrap();
    for _ in 0..5 {
        one.step(&corpus).unwrap();
        swarm.step(&corpus).unwrap();
    }
    assert_eq!(swarm.merges, 3);
    let d = max_diff(&params(&one), &params(&swarm));
    assert!(d < 1e-6, "{d}");
}

#[test]
fn an_overlapped_merge_lands_a_window_late_and_keeps_each_replicas_progress() {
    let (setup, corpus) = tiny_setup(2, 1, 5);
    let be = Arc::new(CpuBackend::new());
    let mut lagged = Trainer::new(be.clone(), &setup, &overlapped(2)).unwrap();
    let mut sync = Trainer::new(be, &setup, &swarm(2, 0, false)).unwrap();
    let start = params(&lagged);
    for _ in 0..2 {
        lagged.step(&corpus).unwrap();
        sync.step(&corpus).unwrap();
    }
    // The first merge started but has not landed: the model is still the
    // initial one and the replicas keep their own weights.
    assert_eq!(max_diff(&params(&lagged), &start), 0.0);
    assert!(max_diff(&params(&sync), &start) > 1e-4);
    let Mode::Swarm { replicas, pending, .. } = &lagged.mode else { unreachable!() };
    let expected_first = pending.as_ref().expect("a merge in flight").merged.clone();
    let own = |p: &Pipeline<CpuBackend>| p.stages().iter().map(|s| s.params_host()).collect::<Vec<_>>();
    assert!(max_diff(&own(&replicas[0]), &own(&replicas[1])) > 1e-4, "replicas trained apart");
    // The first merge is what the synchronous merge computed at the same point.
    assert!(max_diff(&expected_first, &params(&sync)) < 1e-6);
    for _ in 0..2 {
        lagged.step(&corpus).unwrap();
    }
    // Step 4 ends the second window: the first merge landed (the model is
    // it), then the second started from each replica moved onto it with
    // its own two steps since: near the model, apart from each other.
    assert!(max_diff(&params(&lagged), &expected_first) < 1e-6);
    let Mode::Swarm { pending, .. } = &lagged.mode else { unreachable!() };
    let second = pending.as_ref().expect("the second merge in flight");
    let (a, b) = (&second.started_from[0], &second.started_from[1]);
    assert!(max_diff(a, b) > 1e-4, "each replica keeps its own progress");
    assert!(max_diff(a, &expected_first) > 1e-4 && max_diff(a, &expected_first) < 0.1);
    // The last step merges at once: every replica ends on the model.
    lagged.step(&corpus).unwrap();
    let Mode::Swarm { replicas, merged, pending, .. } = &lagged.mode else { unreachable!() };
    assert!(pending.is_none());
    for p in replicas {
        assert_eq!(max_diff(&own(p), &own(merged)), 0.0);
    }
}

#[test]
fn a_merge_that_takes_one_step_lands_one_step_into_the_next_window() {
    let (setup, corpus) = tiny_setup(2, 1, 6);
    let be = Arc::new(CpuBackend::new());
    let v = Variant::Swarm {
        interval: 3,
        bottleneck: true,
        f32_codec: false,
        mixed: true,
        overlap: 1,
        delay: 0,
        delay_from: 0,
        recompute: false,
        average_moments: false,
        ramp: MergeRamp::None,
        predict: false,
    };
    let mut t = Trainer::new(be, &setup, &v).unwrap();
    let start = params(&t);
    for _ in 0..3 {
        t.step(&corpus).unwrap();
    }
    let Mode::Swarm { pending, .. } = &t.mode else { unreachable!() };
    let first = pending.as_ref().expect("in flight after the window").merged.clone();
    assert_eq!(max_diff(&params(&t), &start), 0.0, "not landed yet");
    t.step(&corpus).unwrap();
    let Mode::Swarm { pending, .. } = &t.mode else { unreachable!() };
    assert!(pending.is_none(), "landed one step in");
    assert_eq!(max_diff(&params(&t), &first), 0.0);
    for _ in 0..2 {
        t.step(&corpus).unwrap();
    }
    assert_eq!(t.merges, 2);
}

#[test]
fn after_a_merge_every_replica_holds_the_merged_weights() {
    let (setup, corpus) = tiny_setup(2, 1, 3);
    let be = Arc::new(CpuBackend::new());
    let mut t = Trainer::new(be, &setup, &swarm(1, 0, false)).unwrap();
    t.step(&corpus).unwrap();
    // After a merge every replica holds the mean of what they had.
    if let Mode::Swarm { replicas, merged, .. } = &t.mode {
        for p in replicas {
            for (a, b) in p.stages().iter().zip(merged.stages()) {
                assert_eq!(a.params_host(), b.params_host());
            }
        }
    }
}

#[test]
fn variant_names_parse() {
    assert_eq!(
        Variant::parse("h8").unwrap(),
        Variant::Swarm {
            interval: 8,
            bottleneck: true,
            f32_codec: false,
            mixed: true,
            overlap: 0,
            delay: 0,
            delay_from: 0,
            recompute: false,
            average_moments: false,
            ramp: MergeRamp::None,
            predict: false
        }
    );
    assert_eq!(
        Variant::parse("h8-fixed").unwrap(),
        Variant::Swarm {
            interval: 8,
            bottleneck: true,
            f32_codec: false,
            mixed: false,
            overlap: 0,
            delay: 0,
            delay_from: 0,
            recompute: false,
            average_moments: false,
            ramp: MergeRamp::None,
            predict: false
        }
    );
    assert_eq!(
        Variant::parse("h24-no-bottleneck").unwrap(),
        Variant::Swarm {
            interval: 24,
            bottleneck: false,
            f32_codec: false,
            mixed: true,
            overlap: 0,
            delay: 0,
            delay_from: 0,
            recompute: false,
            average_moments: false,
            ramp: MergeRamp::None,
            predict: false
        }
    );
    assert_eq!(
        Variant::parse("h24-f32").unwrap(),
        Variant::Swarm {
            interval: 24,
            bottleneck: true,
            f32_codec: true,
            mixed: true,
            overlap: 0,
            delay: 0,
            delay_from: 0,
            recompute: false,
            average_moments: false,
            ramp: MergeRamp::None,
            predict: false
        }
    );
    assert_eq!(Variant::parse("h24-overlap").unwrap(), overlapped(24));
    assert_eq!(
        Variant::parse("h24-overlap6").unwrap(),
        Variant::Swarm {
            interval: 24,
            bottleneck: true,
            f32_codec: false,
            mixed: true,
            overlap: 6,
            delay: 0,
            delay_from: 0,
            recompute: false,
            average_moments: false,
            ramp: MergeRamp::None,
            predict: false
        }
    );
    assert!(Variant::parse("h4-overlap5").is_err() && Variant::parse("h4-overlap0").is_err());
    assert_eq!(Variant::parse("h24-delay2").unwrap(), swarm(24, 2, false));
    assert_eq!(Variant::parse("h24-delay2-predict").unwrap(), swarm(24, 2, true));
    assert!(Variant::parse("h24-delay0").is_err() && Variant::parse("h24-delay").is_err());
    let Variant::Swarm { delay, delay_from, predict, .. } = Variant::parse("h24-delay1-from48").unwrap() else {
        panic!("h24-delay1-from48 is a swarm variant")
    };
    assert_eq!((delay, delay_from, predict), (1, 48, false));
    assert!(Variant::parse("h24-delay1-from0").is_err() && Variant::parse("h24-delay1-fromx").is_err());
    let Variant::Swarm { delay, delay_from, recompute, .. } = Variant::parse("h24-delay2-recompute-from8").unwrap()
    else {
        panic!("a swarm variant")
    };
    assert_eq!((delay, delay_from, recompute), (2, 8, true));
    assert!(Variant::parse("h24-delay1-predict-recompute").is_err());
    assert!(Variant::parse("h0").is_err() && Variant::parse("h8-x").is_err() && Variant::parse("x").is_err());
    assert_eq!(default_runs(&[1, 8], 24).len(), 8);
}

/// A boundary variant that names the run's own boundary is the baseline,
/// bit for bit (so the comparison differs only in the boundary); another
/// boundary, and the residual style, train to another finite loss.
#[test]
fn a_boundary_variant_is_one_process_with_only_the_boundary_changed() {
    let (mut setup, corpus) = tiny_setup(2, 1, 4);
    let be = Arc::new(CpuBackend::new());
    let run = |setup: &Setup, v: &Variant| {
        let mut t = Trainer::new(be.clone(), setup, v).unwrap();
        for _ in 0..4 {
            t.step(&corpus).unwrap();
        }
        params(&t)
    };
    // The setup has no bottleneck and the f32 codec.
    assert_eq!(run(&setup, &Variant::OneProcess), run(&setup, &Variant::parse("one-no-bottleneck").unwrap()));
    (setup.train.model.bottleneck, setup.train.codec) = (4, WireCodec::Int8Row);
    let own = run(&setup, &Variant::OneProcess);
    assert_eq!(own, run(&setup, &Variant::parse("one-linear-b4-int8").unwrap()));
    assert_ne!(own, run(&setup, &Variant::parse("one-linear-b2-int8").unwrap()));
    let res = Variant::parse("one-residual-b4-int8").unwrap();
    let o = train_variant(&setup, &res, &corpus, 0, 2, 2).unwrap();
    assert!(o.final_loss.is_finite() && o.wire_bytes_per_token == Some(6), "{o:?}");
    let mut t = Trainer::new(be.clone(), &setup, &res).unwrap();
    let Mode::One(p) = &mut t.mode else { panic!("a boundary variant is one process") };
    assert!(p.stages()[0].layout().get("model.layers.1.bottleneck.encoder_mlp.down_proj.weight").is_some());
}

#[test]
fn the_harness_runs_end_to_end_on_tiny_and_draws_its_curves() {
    let out = tempfile::tempdir().unwrap();
    let args = <Cli as clap::Parser>::parse_from([
        "x",
        "--model",
        "tiny",
        "--epochs",
        "2",
        "--micro-batches",
        "8",
        "--batch",
        "4",
        "--seq",
        "32",
        "--intervals",
        "1,8",
        "--val-batches",
        "4",
        "--curve-every",
        "2",
        "--run-dir",
        out.path().join("run").to_str().unwrap(),
        "--out",
        out.path().join("plots").to_str().unwrap(),
    ]);
    run(args.a).unwrap();
    let files: Vec<PathBuf> = std::fs::read_dir(out.path().join("plots")).unwrap().map(|e| e.unwrap().path()).collect();
    let json = files.iter().find(|p| p.extension().is_some_and(|e| e == "json")).expect("results json");
    let svg = files.iter().find(|p| p.extension().is_some_and(|e| e == "svg")).expect("curves svg");
    let results: Vec<serde_json::Value> = serde_json::from_slice(&std::fs::read(json).unwrap()).unwrap();
    // one, sync, h1, h4 (the swarm's own: 8 / 2), h8, h4 fixed, no bottleneck, f32.
    assert_eq!(results.len(), 8, "{results:?}");
    for r in &results {
        let loss = r["final_loss"].as_f64().unwrap();
        assert!(loss.is_finite() && loss > 0.0 && loss < 6.0, "{r}");
        assert_eq!(r["curve"].as_array().unwrap().len(), 4, "points at steps 2, 4, 6 and the end (8)");
    }
    let svg = std::fs::read_to_string(svg).unwrap();
    assert_eq!(svg.matches("<polyline").count(), 8);
    assert!(svg.contains("swarm H=4"));
}

#[derive(clap::Parser)]
struct Cli {
    #[command(flatten)]
    a: Args,
}

/// The mixed-pathway swarm merging every `interval` steps, its gradients
/// `delay` steps late at the head.
fn swarm(interval: u64, delay: u64, predict: bool) -> Variant {
    Variant::Swarm {
        interval,
        bottleneck: true,
        f32_codec: false,
        mixed: true,
        overlap: 0,
        delay,
        predict,
        delay_from: 0,
        recompute: false,
        average_moments: false,
        ramp: MergeRamp::None,
    }
}

#[test]
fn pipelining_delay_falls_to_nothing_at_the_tail_and_refills_after_each_merge() {
    assert_eq!(stage_delays(2, 3), vec![2, 1, 0]);
    assert_eq!(stage_delays(1, 3), vec![1, 1, 0]);
    assert_eq!(stage_delays(3, 2), vec![3, 0]);
    assert_eq!(stage_delays(3, 1), vec![0]);
    let (setup, corpus) = tiny_setup(2, 1, 6);
    let be = Arc::new(CpuBackend::new());
    let run = |v: Variant| {
        let mut t = Trainer::new(be.clone(), &setup, &v).unwrap();
        for _ in 0..6 {
            t.step(&corpus).unwrap();
        }
        params(&t)
    };
    // A merge every step drains the pipeline every step: no delay is left.
    assert_eq!(run(swarm(1, 0, false)), run(swarm(1, 2, false)));
    // Between merges the delay changes the gradients, and prediction
    // changes them again (from the fourth step after a merge: it needs a
    // step taken before the weights it moves on).
    let plain = run(swarm(6, 0, false));
    let late = run(swarm(6, 2, false));
    let predicted = run(swarm(6, 2, true));
    assert!(max_diff(&plain, &late) > 1e-6);
    assert!(max_diff(&late, &predicted) > 1e-6);
    // A delay that starts after the last step is none; one that starts
    // midway changes only what follows (so neither plain nor fully late).
    let from = |n: u64| {
        let mut v = swarm(6, 2, false);
        if let Variant::Swarm { delay_from, .. } = &mut v {
            *delay_from = n;
        }
        run(v)
    };
    assert!(from(6) == plain);
    let midway = from(3);
    assert!(max_diff(&midway, &plain) > 1e-6 && max_diff(&midway, &late) > 1e-6);
    // The backward on current weights: with nothing delayed (a merge every
    // step), recomputing changes no bit; between merges it takes gradients
    // unlike both the stashed delayed ones and the undelayed ones.
    let recomputing = |interval: u64| {
        let mut v = swarm(interval, 2, false);
        if let Variant::Swarm { recompute, .. } = &mut v {
            *recompute = true;
        }
        run(v)
    };
    assert!(recomputing(1) == run(swarm(1, 0, false)));
    let recomputed = recomputing(6);
    assert!(max_diff(&recomputed, &plain) > 1e-6 && max_diff(&recomputed, &late) > 1e-6);
}

#[test]
fn averaged_moments_are_a_modifier_that_changes_only_the_windows_after_a_merge() {
    let Variant::Swarm { delay, delay_from, average_moments, .. } =
        Variant::parse("h24-delay1-from8-avg-moments").unwrap()
    else {
        panic!("a swarm variant")
    };
    assert_eq!((delay, delay_from, average_moments), (1, 8, true));
    assert!(Variant::parse("one-avg-moments").is_err());
    assert!(Variant::parse("h24-overlap-avg-moments").is_err(), "a merge landing late has no moment to average at");
    let (setup, corpus) = tiny_setup(2, 1, 6);
    let be = Arc::new(CpuBackend::new());
    let run = |interval: u64, average: bool| {
        let mut v = swarm(interval, 0, false);
        if let Variant::Swarm { average_moments, .. } = &mut v {
            *average_moments = average;
        }
        let mut t = Trainer::new(be.clone(), &setup, &v).unwrap();
        for _ in 0..6 {
            t.step(&corpus).unwrap();
        }
        params(&t)
    };
    // Merging only after the last step: the averaged moments move nothing.
    assert!(run(6, true) == run(6, false));
    // A merge after step 3: the next three steps start from shared moments.
    assert!(max_diff(&run(3, true), &run(3, false)) > 1e-6);
    // Only Muon's momentum: nothing to average under AdamW; under Muon,
    // something between averaging both moments and neither.
    let (mut setup, corpus) = tiny_setup(2, 1, 6);
    setup.avg_muon_momentum_only = true;
    let run_with = |setup: &Setup, average: bool| {
        let mut v = swarm(3, 0, false);
        if let Variant::Swarm { average_moments, .. } = &mut v {
            *average_moments = average;
        }
        let mut t = Trainer::new(be.clone(), setup, &v).unwrap();
        for _ in 0..6 {
            t.step(&corpus).unwrap();
        }
        params(&t)
    };
    assert!(run_with(&setup, true) == run_with(&setup, false), "AdamW has no Muon momentum");
    setup.train.adamw.set_optimizer("muon").unwrap();
    let muon_only = run_with(&setup, true);
    let none = run_with(&setup, false);
    setup.avg_muon_momentum_only = false;
    let both = run_with(&setup, true);
    assert!(max_diff(&muon_only, &none) > 1e-6 && max_diff(&muon_only, &both) > 1e-6);
}

#[test]
fn a_merge_ramp_merges_early_steps_more_often_then_every_interval() {
    let at =
        |ramp: MergeRamp, interval: u64| -> Vec<u64> { (1..=60).filter(|d| ramp.merges_after(*d, interval)).collect() };
    assert_eq!(at(MergeRamp::None, 24), vec![24, 48]);
    assert_eq!(at(MergeRamp::SyncUntil(3), 24), vec![1, 2, 3, 27, 51]);
    assert_eq!(at(MergeRamp::Doubling, 24), vec![1, 3, 7, 15, 31, 55]);
    assert_eq!(at(MergeRamp::Doubling, 1), (1..=60).collect::<Vec<_>>());
    let Variant::Swarm { ramp, delay_from, average_moments, .. } =
        Variant::parse("h24-delay1-from8-ramp-avg-moments").unwrap()
    else {
        panic!("a swarm variant")
    };
    assert_eq!((ramp, delay_from, average_moments), (MergeRamp::Doubling, 8, true));
    let Variant::Swarm { ramp, mixed, .. } = Variant::parse("h24-fixed-sync8").unwrap() else {
        panic!("a swarm variant")
    };
    assert_eq!((ramp, mixed), (MergeRamp::SyncUntil(8), false));
    assert!(Variant::parse("h24-sync0").is_err() && Variant::parse("one-ramp").is_err());
    assert!(Variant::parse("h24-overlap-ramp").is_err(), "a merge landing late has no ramp");
    // A ramp whose early merges all fall on the interval's own steps
    // changes nothing: the same merges, the same weights.
    let (setup, corpus) = tiny_setup(2, 1, 4);
    let be = Arc::new(CpuBackend::new());
    let run = |interval: u64, ramp: MergeRamp| {
        let mut v = swarm(interval, 0, false);
        if let Variant::Swarm { ramp: r, .. } = &mut v {
            *r = ramp;
        }
        let mut t = Trainer::new(be.clone(), &setup, &v).unwrap();
        for _ in 0..4 {
            t.step(&corpus).unwrap();
        }
        (params(&t), t.merges)
    };
    let (every_step, merges) = run(1, MergeRamp::None);
    assert_eq!(merges, 4);
    assert!(run(4, MergeRamp::SyncUntil(4)).0 == every_step);
    let (ramped, merges) = run(4, MergeRamp::Doubling);
    assert_eq!(merges, 3, "after steps 1, 3 and the last");
    assert!(max_diff(&ramped, &every_step) > 1e-6 && max_diff(&ramped, &run(4, MergeRamp::None).0) > 1e-6);
}

#[test]
fn mixing_on_no_step_trains_each_replica_on_its_own_pathway() {
    let (mut setup, corpus) = tiny_setup(2, 1, 4);
    let be = Arc::new(CpuBackend::new());
    let run = |setup: &Setup, v: Variant| {
        let mut t = Trainer::new(be.clone(), setup, &v).unwrap();
        for _ in 0..4 {
            t.step(&corpus).unwrap();
        }
        params(&t)
    };
    let mixed = run(&setup, swarm(8, 0, false));
    let fixed = run(&setup, Variant::parse("h8-fixed").unwrap());
    setup.mix_percent = 0;
    let unmixed = run(&setup, swarm(8, 0, false));
    assert!(max_diff(&unmixed, &fixed) < 1e-5, "{}", max_diff(&unmixed, &fixed));
    assert!(max_diff(&mixed, &fixed) > 1e-4, "mixed pathways train otherwise");
    setup.mix_percent = 50;
    let half = run(&setup, swarm(8, 0, false));
    assert!(max_diff(&half, &fixed) > 1e-4 && max_diff(&half, &mixed) > 1e-4);
}

/// `--sparse-merge`: contributions go through the sparse codec (far fewer
/// bytes, other merged weights than the merge codec's), the swarm trains.
#[test]
fn the_sparse_merge_sends_a_fraction_of_the_bytes_and_still_trains() {
    let swarm = Variant::parse("h2-fixed").unwrap();
    let run = |sparse: Option<f32>| {
        let (mut setup, corpus) = tiny_setup(2, 1, 6);
        setup.sparse_merge = sparse;
        let mut t = Trainer::new(Arc::new(CpuBackend::new()), &setup, &swarm).unwrap();
        for _ in 0..6 {
            t.step(&corpus).unwrap();
        }
        let Mode::Swarm { sim, .. } = &t.mode else { panic!("a swarm variant") };
        (params(&t), sim.sent_bytes, t.eval(&corpus, 2).unwrap())
    };
    let (dense, (sent, bytes), _) = run(None);
    assert_eq!(sent, bytes, "without the sparse codec the merge codec's bytes are sent");
    let (sparse, (sent, bytes), loss) = run(Some(1.0 / 16.0));
    assert!(sent > 0 && sent * 8 < bytes, "{sent} sparse bytes against {bytes}");
    assert!(max_diff(&dense, &sparse) > 1e-6, "the sparse codec is in the merge's path");
    assert!(loss.is_finite(), "{loss}");
    // With the residual kept in the replicas' weights, a replica after a
    // merge is the merged weights less what it has not sent.
    let (mut setup, corpus) = tiny_setup(2, 1, 4);
    (setup.sparse_merge, setup.sparse_local) = (Some(1.0 / 16.0), true);
    let mut t = Trainer::new(Arc::new(CpuBackend::new()), &setup, &swarm).unwrap();
    t.step(&corpus).unwrap();
    t.step(&corpus).unwrap();
    let Mode::Swarm { sim, replicas, merged, .. } = &t.mode else { panic!("a swarm variant") };
    for (i, rep) in replicas.iter().enumerate() {
        for (s, st) in rep.stages().iter().enumerate() {
            let theta = merged.stages()[s].params_host();
            let want = sim.replica_weights(i, s, &theta);
            assert_ne!(want, theta, "replica {i} stage {s} keeps a residual");
            assert_eq!(st.params_host(), want, "replica {i} stage {s}");
        }
    }
}
