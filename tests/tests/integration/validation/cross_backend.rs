//! Issue 13 across backends: miners whose GEMMs round their operands to
//! bf16 (a GPU's arithmetic, simulated on the CPU) checked by validators
//! recomputing on the fp32 reference, within `CROSS_BACKEND_TOLERANCE`.

use super::*;

/// Issue 13, false positives across backends: every miner computes with
/// bf16 GEMM operands (a GPU's arithmetic, simulated on the CPU; device
/// "cpu (bf16 gemms)") and the validators recompute on the fp32 reference.
/// No byte matches, yet over two epochs no miner is accused: each is
/// judged within the cross-backend tolerance, and every one is cleared.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn honest_bf16_miners_checked_by_fp32_validators_are_never_accused() {
    let r = run_scenario_with(None, (3, 2), 2, 16, |o| o.cpu_bf16_gemm = true).await;
    assert_eq!(r.history.len(), 2);
    let guilty: Vec<_> = r.verdicts.iter().filter(|v| v.guilty).collect();
    assert!(guilty.is_empty(), "{guilty:?}");
    let cleared: std::collections::BTreeSet<_> = r.verdicts.iter().filter(|v| !v.guilty).map(|v| v.miner).collect();
    assert!(cleared.len() >= 5, "the miners were checked and cleared: {cleared:?}");
    assert!(r.checked >= 2 * 3 * 3, "{}", r.checked);
}

/// ... and a noisy head among them, on the same bf16 arithmetic, is still
/// convicted in its first epoch: the tolerance is far below its noise.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_noisy_bf16_head_is_convicted_within_the_cross_backend_tolerance() {
    let r = run_scenario_with(Some((Adversary::Noise, Place::Head)), (3, 2), 2, 16, |o| o.cpu_bf16_gemm = true).await;
    let bad = r.bad.unwrap();
    let first = r.verdicts.iter().filter(|v| v.miner == bad).map(|v| v.epoch).min().expect("the adversary was judged");
    assert_eq!(r.history[first as usize].convicted, vec![bad], "{:?}", r.verdicts);
    let against_honest: Vec<_> = r.verdicts.iter().filter(|v| v.guilty && v.miner != bad).collect();
    assert!(against_honest.is_empty(), "honest miners accused: {against_honest:?}");
}

/// The cross-backend tolerance, measured: an honest miner whose GEMMs
/// round their operands to bf16 (a GPU's `--gemm bf16`, simulated on the
/// CPU) recomputed on the fp32 reference from the same inputs differs by
/// much less than `CROSS_BACKEND_TOLERANCE` (beyond the codec's rounding) in every payload and loss it
/// sends; a miner sending zeros, noise of 10% of the activations' RMS or
/// another micro-batch's output differs by far more.
#[test]
fn an_honest_bf16_miner_is_within_the_cross_backend_tolerance_and_cheats_are_not() {
    use iota_dataplane::evidence::CROSS_BACKEND_TOLERANCE as TOL;
    let cfg = tiny_run(3, 1, 1, 8, WireCodec::Int8Row);
    let corpus = iota_dataplane::corpus::load_corpus(&cfg, None).unwrap();
    let fp = Arc::new(CpuBackend::new());
    let mut p = Pipeline::new(fp.clone(), cfg.train.clone()).unwrap();
    // Early weights and weights trained further (sharper predictions give
    // the tail's gradient rows a few large values, where rounding shows).
    let mut trained = Vec::new();
    for steps in [4, 16] {
        for _ in 0..steps {
            p.train_step(&corpus).unwrap();
        }
        trained.push(p.stages().iter().map(|s| s.params_host()).collect::<Vec<Vec<f32>>>());
    }
    let (batch, seq) = (cfg.train.batch, cfg.train.seq);
    let (rows, width) = (batch * seq, cfg.train.model.bottleneck);
    let reference = Recompute::new(fp, cfg.clone()).unwrap();
    let bf16 = Recompute::new(Arc::new(CpuBackend::with_bf16_gemm()), cfg.clone()).unwrap();
    let c = cfg.train.codec;
    let rel = |claimed: &[u8], honest: &[u8]| compare(c, rows, width, claimed, honest).unwrap().rel_l2_beyond_rounding;
    let raw = |claimed: &[u8], honest: &[u8]| compare(c, rows, width, claimed, honest).unwrap().rel_l2;
    let (mut worst, mut worst_raw, mut worst_loss) = (0f64, 0f64, 0f64);
    let mut cheats = Vec::new();
    for (w, b) in trained.iter().flat_map(|w| (0..6).map(move |b| (w, b))) {
        let (x, y) = corpus.val_batch(cfg.train.seed, b, batch, seq);
        // Each stage from the same input bytes, as a validator recomputes.
        let a0 = reference.forward(0, &w[0], ForwardInput::Tokens(&x), batch).unwrap();
        let a0_bf = bf16.forward(0, &w[0], ForwardInput::Tokens(&x), batch).unwrap();
        let a1 = reference.forward(1, &w[1], ForwardInput::Wire(&a0), batch).unwrap();
        let a1_bf = bf16.forward(1, &w[1], ForwardInput::Wire(&a0), batch).unwrap();
        let t = reference.tail(2, &w[2], ForwardInput::Wire(&a1), &y, batch).unwrap();
        let t_bf = bf16.tail(2, &w[2], ForwardInput::Wire(&a1), &y, batch).unwrap();
        let (g2, g2_bf) = (t.grad.unwrap(), t_bf.grad.unwrap());
        let g1 = reference.backward(1, &w[1], ForwardInput::Wire(&a0), &g2, batch).unwrap().unwrap();
        let g1_bf = bf16.backward(1, &w[1], ForwardInput::Wire(&a0), &g2, batch).unwrap().unwrap();
        for (claimed, honest) in [(&a0_bf, &a0), (&a1_bf, &a1), (&g2_bf, &g2), (&g1_bf, &g1)] {
            worst = worst.max(rel(claimed, honest));
            worst_raw = worst_raw.max(raw(claimed, honest));
        }
        let mean = |l: &[f32]| l.iter().map(|&v| f64::from(v)).sum::<f64>() / l.len() as f64;
        let (l, l_bf) = (mean(&t.losses), mean(&t_bf.losses));
        worst_loss = worst_loss.max((l_bf - l).abs() / l.abs());

        // Cheats on the middle stage's activation.
        let honest = codec::decode(c, rows, width, &a1).unwrap();
        let rms = (honest.iter().map(|v| v * v).sum::<f32>() / honest.len() as f32).sqrt();
        let noisy: Vec<f32> =
            honest.iter().enumerate().map(|(i, v)| v + if i % 2 == 0 { 0.1 * rms } else { -0.1 * rms }).collect();
        cheats.push(("noise 10% RMS", rel(&codec::encode(c, rows, width, &noisy).unwrap(), &a1)));
        cheats.push(("zeros", rel(&codec::encode(c, rows, width, &vec![0.0; rows * width]).unwrap(), &a1)));
        let (x2, _) = corpus.val_batch(cfg.train.seed, b + 100, batch, seq);
        let a0_other = reference.forward(0, &w[0], ForwardInput::Tokens(&x2), batch).unwrap();
        cheats.push(("another micro-batch's output", rel(&a0_other, &a0)));
    }
    println!(
        "honest bf16 against fp32: payloads rel L2 beyond rounding <= {worst:.2e} (all of it: {worst_raw:.2e}), \
         losses rel <= {worst_loss:.2e}; tolerance {TOL}"
    );
    println!("cheats: {cheats:?}");
    assert!(worst > 0.0, "rounding the GEMM operands changed no payload: the simulation is off");
    assert!(worst * 4.0 <= TOL && worst_loss * 4.0 <= TOL, "an honest bf16 miner is too close to the tolerance");
    for (what, r) in cheats {
        assert!(r >= 3.0 * TOL, "{what}: rel L2 {r:.3e} is within 3x the tolerance");
    }
}
