//! CLASP on seeded simulated epochs: known per-miner effects under a falling
//! loss trend, unequal and correlated routing, late joiners, noise-adding
//! miners, honest-only epochs, and hostile input.

use iota_core::Rng;

use super::linalg::{critical_value, normal_isf, normal_sf, spd_inverse};
use super::*;

/// The epoch's training trend (nats) at progress `t` in [0, 1]: falls fast,
/// then flattens, like a training window's loss.
fn trend(t: f64) -> f64 {
    3.0 + 1.2 * (-3.0 * t).exp()
}

/// Key of replica `r` at stage `s`.
fn key(s: usize, r: usize) -> u32 {
    (s * 100 + r) as u32
}

struct Sample {
    order: u64,
    path: Vec<u32>,
    loss: f64,
}

/// One simulated epoch of `n` pathways. At each stage the replica is drawn
/// with probability proportional to `weight(stage, replica, t, path so far)`
/// (0 = not working then); the loss is the trend, plus each chosen miner's
/// `effects[stage][replica]`, plus N(0, sigma(t)^2) noise.
fn simulate(
    seed: u64,
    n: u64,
    effects: &[Vec<f64>],
    weight: impl Fn(usize, usize, f64, &[usize]) -> f64,
    sigma: impl Fn(f64) -> f64,
) -> Vec<Sample> {
    let mut rng = Rng::new(seed);
    (0..n)
        .map(|i| {
            let t = i as f64 / n as f64;
            let mut chosen = Vec::with_capacity(effects.len());
            let mut loss = trend(t) + sigma(t) * rng.normal() as f64;
            for (s, eff) in effects.iter().enumerate() {
                let w: Vec<f64> = (0..eff.len()).map(|r| weight(s, r, t, &chosen)).collect();
                let mut u = rng.next_f64() * w.iter().sum::<f64>();
                let r = w.iter().position(|&wr| {
                    u -= wr;
                    u < 0.0
                });
                let r = r.unwrap_or_else(|| w.iter().rposition(|&wr| wr > 0.0).unwrap());
                chosen.push(r);
                loss += eff[r];
            }
            Sample { order: i, path: chosen.iter().enumerate().map(|(s, &r)| key(s, r)).collect(), loss }
        })
        .collect()
}

fn uniform(_: usize, _: usize, _: f64, _: &[usize]) -> f64 {
    1.0
}

fn feed(samples: &[Sample], stages: usize) -> Clasp<u32> {
    let horizon = samples.len() as u64;
    let mut c = Clasp::new(stages, horizon);
    for s in samples {
        c.record(s.order, &s.path, s.loss as f32).unwrap();
    }
    c
}

/// Mean loss through `key` at `stage` minus the mean loss through its peers:
/// the naive attribution CLASP must beat.
fn naive(samples: &[Sample], stage: usize, k: u32) -> f64 {
    let (mut a, mut na, mut b, mut nb) = (0.0, 0.0, 0.0, 0.0);
    for s in samples {
        if s.path[stage] == k {
            a += s.loss;
            na += 1.0;
        } else {
            b += s.loss;
            nb += 1.0;
        }
    }
    a / na - b / nb
}

/// The true contrast of replica `r` at stage `s`: its effect minus its
/// peers' effects weighted by their sample counts in this run.
fn true_effect(samples: &[Sample], effects: &[Vec<f64>], s: usize, r: usize) -> f64 {
    let mut counts = vec![0.0; effects[s].len()];
    for x in samples {
        counts[(x.path[s] as usize) % 100] += 1.0;
    }
    let n_peers: f64 = counts.iter().enumerate().filter(|&(k, _)| k != r).map(|(_, c)| c).sum();
    let peers: f64 = effects[s].iter().zip(&counts).enumerate().filter(|&(k, _)| k != r).map(|(_, (e, c))| e * c).sum();
    effects[s][r] - peers / n_peers
}

fn est(report: &ClaspReport<u32>, s: usize, r: usize) -> Estimate {
    match report.get(s, key(s, r)).expect("miner in report").verdict {
        Verdict::Estimated(e) => e,
        Verdict::Unidentifiable(u) => panic!("stage {s} replica {r}: {u:?}"),
    }
}

fn flagged(report: &ClaspReport<u32>) -> Vec<u32> {
    report.harmful().map(|m| m.key).collect()
}

#[test]
fn recovers_known_effects_ranks_them_and_covers_them() {
    let effects = vec![vec![0.0, 0.05, -0.03], vec![0.02, -0.04, 0.0, 0.08], vec![-0.02, 0.0, 0.06]];
    let ci95 = ClaspParams { z: 1.96, bonferroni: false, ..ClaspParams::default() };
    let (mut covered, mut total) = (0, 0);
    for seed in 0..20 {
        let samples = simulate(seed, 4000, &effects, uniform, |_| 0.1);
        let clasp = feed(&samples, 3);
        let report = clasp.estimate(&ci95);
        for (s, eff) in effects.iter().enumerate() {
            // Ranking inside the stage matches the truth.
            let mut by_est: Vec<usize> = (0..eff.len()).collect();
            by_est.sort_by(|&a, &b| est(&report, s, a).effect.total_cmp(&est(&report, s, b).effect));
            let mut by_true: Vec<usize> = (0..eff.len()).collect();
            by_true.sort_by(|&a, &b| eff[a].total_cmp(&eff[b]));
            assert_eq!(by_est, by_true, "seed {seed} stage {s}");
            for r in 0..eff.len() {
                let e = est(&report, s, r);
                let truth = true_effect(&samples, &effects, s, r);
                total += 1;
                covered += (e.lo <= truth && truth <= e.hi) as u32;
            }
        }
        // Default (Bonferroni) flags: the three clearly worse miners always;
        // never one whose true contrast is not positive.
        let flags = flagged(&clasp.estimate(&ClaspParams::default()));
        for k in [key(0, 1), key(1, 3), key(2, 2)] {
            assert!(flags.contains(&k), "seed {seed}: {k} not flagged ({flags:?})");
        }
        for &k in &flags {
            let (s, r) = (k as usize / 100, k as usize % 100);
            assert!(true_effect(&samples, &effects, s, r) > 0.0, "seed {seed}: {k} flagged");
        }
    }
    // 95% intervals: coverage near 95% (binomial sd 1.5% over 200 checks);
    // too low means standard errors too small, too high means too wide.
    let coverage = covered as f64 / total as f64;
    assert!((0.90..=0.99).contains(&coverage), "coverage {coverage} ({covered}/{total})");
}

/// A tiny linear pipeline: stage s maps its input by `w[s]`; a noisy miner
/// adds N(0, noise^2) to its output. The loss is the mean squared error
/// against the noiseless composition plus label noise, plus the trend. The
/// harm of noise `s` at stage 0 is `s^2 |w2 w1|_F^2 / d`.
#[test]
fn a_miner_adding_more_noise_gets_a_worse_effect() {
    const D: usize = 8;
    let mut init = Rng::new(7);
    let w: Vec<Vec<f64>> =
        (0..3).map(|_| (0..D * D).map(|_| init.normal() as f64 / (D as f64).sqrt()).collect()).collect();
    let matvec = |m: &[f64], x: &[f64]| -> Vec<f64> { (0..D).map(|i| dot(&m[i * D..(i + 1) * D], x)).collect() };
    // |w2 w1|_F^2 / d: the expected loss per unit of noise variance at stage 0.
    let gain: f64 = (0..D)
        .map(|j| {
            let e: Vec<f64> = (0..D).map(|i| (i == j) as u8 as f64).collect();
            let v = matvec(&w[2], &matvec(&w[1], &e));
            dot(&v, &v)
        })
        .sum::<f64>()
        / D as f64;

    let levels = [0.0, 0.1, 0.2, 0.3, 0.5];
    let n = 3000u64;
    let mut effects = Vec::new();
    for &noise in &levels {
        let mut rng = Rng::new(11); // common random numbers across levels
        let mut clasp = Clasp::new(3, n);
        for i in 0..n {
            let t = i as f64 / n as f64;
            let path: Vec<usize> = (0..3).map(|_| rng.below(3) as usize).collect();
            let x: Vec<f64> = (0..D).map(|_| rng.normal() as f64).collect();
            let mut h = x.clone();
            let mut clean = x;
            for (s, ws) in w.iter().enumerate() {
                h = matvec(ws, &h);
                clean = matvec(ws, &clean);
                let sd = if s == 0 && path[0] == 1 { noise } else { 0.0 };
                for v in &mut h {
                    *v += sd * rng.normal() as f64;
                }
            }
            let mse: f64 =
                (0..D).map(|i| (h[i] - clean[i] - 0.3 * rng.normal() as f64).powi(2)).sum::<f64>() / D as f64;
            let keys: Vec<u32> = path.iter().enumerate().map(|(s, &r)| key(s, r)).collect();
            clasp.record(i, &keys, (trend(t) + mse) as f32).unwrap();
        }
        let report = clasp.estimate(&ClaspParams::default());
        let e = est(&report, 0, 1);
        let harm = noise * noise * gain;
        assert!(
            (e.effect - harm).abs() < 4.0 * e.se,
            "noise {noise}: effect {} vs harm {harm} (se {})",
            e.effect,
            e.se
        );
        if noise == 0.0 || noise >= 0.2 {
            assert_eq!(e.harmful, noise > 0.0, "noise {noise}: {e:?}");
        }
        // Only the noisy miner is ever flagged.
        assert!(flagged(&report).iter().all(|&k| k == key(0, 1)), "noise {noise}: {:?}", flagged(&report));
        effects.push(e.effect);
    }
    assert!(effects.windows(2).all(|p| p[0] < p[1]), "not monotone: {effects:?}");
}

#[test]
fn a_bad_head_miner_is_flagged_not_its_peers_nor_other_stages() {
    // Stage 0: replica 0 is bad (+0.15). Stage 2: replica 0 is much better
    // (-0.2), and the bad head miner sends 95% of its samples there while its
    // peers send 10%: a naive per-miner mean credits the bad miner.
    let effects = vec![vec![0.15, 0.0, 0.0], vec![0.0, 0.03], vec![-0.2, 0.0, 0.0, 0.0]];
    let weight = |s: usize, r: usize, _t: f64, path: &[usize]| match (s, r) {
        (1, 0) => 0.7,
        (1, 1) => 0.3,
        (2, 0) if path[0] == 0 => 0.95,
        (2, _) if path[0] == 0 => 0.05 / 3.0,
        (2, 0) => 0.1,
        (2, _) => 0.9 / 3.0,
        _ => 1.0,
    };
    // Honest spread below this margin is not harm (stage 2's average
    // replicas are ~0.1 worse than their peers, which include the star).
    let params = ClaspParams { min_harm: 0.12, ..ClaspParams::default() };
    for seed in 0..5 {
        let samples = simulate(100 + seed, 3000, &effects, weight, |_| 0.05);
        assert!(naive(&samples, 0, key(0, 0)) < 0.0, "the naive mean should credit the bad miner");
        let report = feed(&samples, 3).estimate(&params);
        assert_eq!(flagged(&report), vec![key(0, 0)], "seed {seed}");
        let bad = est(&report, 0, 0);
        let truth = true_effect(&samples, &effects, 0, 0);
        assert!((bad.effect - truth).abs() < 4.0 * bad.se, "seed {seed}: {bad:?} vs {truth}");
        assert!(est(&report, 2, 0).hi < -0.15, "the star downstream is recognised: {:?}", est(&report, 2, 0));
    }
}

#[test]
fn a_late_joiner_is_not_credited_for_the_falling_loss() {
    // Stage 0: replica 2 joins at mid-epoch (honest). Stage 1: unequal
    // traffic 1:2:3. Stage 2: replica 1 joins at mid-epoch and is harmful.
    let effects = vec![vec![0.0, 0.0, 0.0], vec![0.0, 0.0, 0.0], vec![0.0, 0.04]];
    let weight = |s: usize, r: usize, t: f64, _: &[usize]| match (s, r) {
        (0, 2) | (2, 1) if t < 0.5 => 0.0,
        (1, r) => (r + 1) as f64,
        _ => 1.0,
    };
    for seed in 0..5 {
        let samples = simulate(200 + seed, 4000, &effects, weight, |_| 0.05);
        // Naive means see the late miners' lower loss as skill.
        assert!(naive(&samples, 0, key(0, 2)) < -0.2, "naive {}", naive(&samples, 0, key(0, 2)));
        assert!(naive(&samples, 2, key(2, 1)) < -0.2, "naive {}", naive(&samples, 2, key(2, 1)));
        let report = feed(&samples, 3).estimate(&ClaspParams::default());
        let late = est(&report, 0, 2);
        assert!(late.lo < 0.0 && late.hi > 0.0 && late.effect.abs() < 0.01, "seed {seed}: honest late joiner {late:?}");
        let bad = est(&report, 2, 1);
        assert!(bad.harmful && (bad.effect - 0.04).abs() < 4.0 * bad.se, "seed {seed}: harmful late joiner {bad:?}");
        assert_eq!(flagged(&report), vec![key(2, 1)], "seed {seed}");
    }
}

#[test]
fn honest_miners_are_not_flagged_and_errors_are_calibrated() {
    // 200 honest epochs with unequal traffic, a late joiner and noise that
    // shrinks as training goes on. 10 miners per epoch.
    let effects = vec![vec![0.0; 3], vec![0.0; 4], vec![0.0; 3]];
    let weight = |s: usize, r: usize, t: f64, _: &[usize]| match (s, r) {
        (1, r) => [1.0, 1.0, 2.0, 4.0][r],
        (2, 2) if t < 0.3 => 0.0,
        _ => 1.0,
    };
    let loose = |z| ClaspParams { z, bonferroni: false, ..ClaspParams::default() };
    let (mut strict, mut at_2, mut at_1, mut tests) = (0, 0, 0, 0);
    for seed in 0..200 {
        let samples = simulate(1000 + seed, 1200, &effects, weight, |t| 0.05 * (1.0 + 2.0 * (1.0 - t)));
        let clasp = feed(&samples, 3);
        let report = clasp.estimate(&ClaspParams::default());
        assert_eq!(report.tested, 10);
        tests += report.tested;
        strict += flagged(&report).len();
        at_2 += flagged(&clasp.estimate(&loose(2.0))).len();
        at_1 += flagged(&clasp.estimate(&loose(1.0))).len();
    }
    // Default: family-wise 0.13% per epoch, ~0.3 expected in 200 epochs.
    assert!(strict <= 2, "{strict} honest miners flagged in 200 epochs");
    // Uncorrected one-sided tests flag at their nominal rates (2.3% and
    // 15.9% of 2000): the standard errors are neither too small nor too big.
    assert!((25..=70).contains(&at_2), "z=2: {at_2} of {tests}");
    assert!((240..=400).contains(&at_1), "z=1: {at_1} of {tests}");
}

#[test]
fn routing_that_ties_two_stages_together_is_not_identifiable() {
    // Head replica 0 always feeds body replica 0, head 1 always body 1: the
    // head's contrast is the body's, and no number is given to either.
    let effects = vec![vec![0.2, 0.0], vec![0.0, 0.0]];
    let tied = |s: usize, r: usize, _: f64, path: &[usize]| if s == 1 && path[0] != r { 0.0 } else { 1.0 };
    let samples = simulate(5, 2000, &effects, tied, |_| 0.05);
    let report = feed(&samples, 2).estimate(&ClaspParams::default());
    assert!(naive(&samples, 0, key(0, 0)) > 0.15 && naive(&samples, 1, key(1, 0)) > 0.15);
    for m in &report.miners {
        assert_eq!(m.verdict, Verdict::Unidentifiable(Unidentifiable::Confounded), "{m:?}");
    }
    assert_eq!(report.tested, 0);
    // A third body replica that takes 20% from both heads connects them.
    let effects = vec![vec![0.2, 0.0], vec![0.0, 0.0, 0.0]];
    let mixed = |s: usize, r: usize, _: f64, path: &[usize]| match (s, r) {
        (1, 2) => 0.25,
        (1, r) if path[0] != r => 0.0,
        _ => 1.0,
    };
    let samples = simulate(6, 2000, &effects, mixed, |_| 0.05);
    let report = feed(&samples, 2).estimate(&ClaspParams::default());
    assert_eq!(flagged(&report), vec![key(0, 0)]);
    assert!((est(&report, 0, 0).effect - 0.2).abs() < 4.0 * est(&report, 0, 0).se);
}

#[test]
fn sole_replicas_and_thin_miners_get_no_number() {
    let effects = vec![vec![0.0], vec![0.0, 0.0, 0.0]];
    let thin = |s: usize, r: usize, _: f64, _: &[usize]| if s == 1 && r == 2 { 0.01 } else { 1.0 };
    let samples = simulate(9, 1000, &effects, thin, |_| 0.05);
    let report = feed(&samples, 2).estimate(&ClaspParams::default());
    let verdict = |s, r| report.get(s, key(s, r)).unwrap().verdict.clone();
    assert_eq!(verdict(0, 0), Verdict::Unidentifiable(Unidentifiable::SoleReplica));
    let thin = report.get(1, key(1, 2)).unwrap().samples;
    assert!((1..16).contains(&thin), "{thin}");
    assert_eq!(verdict(1, 2), Verdict::Unidentifiable(Unidentifiable::TooFewSamples));
    assert!(matches!(verdict(1, 0), Verdict::Estimated(_)));
    assert_eq!(report.tested, 2);
}

#[test]
fn hostile_input_is_counted_and_never_panics() {
    let mut c: Clasp<u32> = Clasp::new(3, 100);
    // Nothing recorded: every estimate is empty, not a panic.
    let r = c.estimate(&ClaspParams::default());
    assert_eq!((r.samples, r.miners.len(), r.sigma), (0, 0, None));
    assert_eq!(c.record(0, &[1, 2, 3], f32::NAN), Err(Reject::NonFinite));
    assert_eq!(c.record(0, &[1, 2, 3], f32::INFINITY), Err(Reject::NonFinite));
    assert_eq!(c.record(0, &[1, 2, 3], f32::NEG_INFINITY), Err(Reject::NonFinite));
    assert_eq!(c.record(0, &[1, 2, 3], 1e30), Err(Reject::OutOfRange));
    assert_eq!(c.record(0, &[], 3.0), Err(Reject::WrongLength));
    assert_eq!(c.record(0, &[1, 2], 3.0), Err(Reject::WrongLength));
    assert_eq!(c.record(0, &[1, 2, 3, 4], 3.0), Err(Reject::WrongLength));
    assert_eq!(c.samples(), 0);
    // One sample, then an order far past the horizon: no fit yet.
    c.record(u64::MAX, &[1, 2, 3], 3.0).unwrap();
    let r = c.estimate(&ClaspParams::default());
    assert_eq!((r.samples, r.beyond_horizon), (1, 1));
    assert!(r.miners.iter().all(|m| m.verdict == Verdict::Unidentifiable(Unidentifiable::NoFit)));
    // Identical losses everywhere: zero residual, effects zero, nothing flagged.
    for i in 0..200u64 {
        c.record(i, &[(i % 2) as u32, 2 + (i % 3) as u32, 7], 3.0).unwrap();
    }
    let r = c.estimate(&ClaspParams::default());
    assert_eq!(r.harmful().count(), 0);
    assert!(r.miners.iter().filter_map(|m| m.effect()).all(|e| e.abs() < 1e-6));
    // Absurd parameters are replaced by the defaults.
    let bad = ClaspParams { z: f64::NAN, bonferroni: true, min_harm: f64::INFINITY, min_samples: 16, ridge: -1.0 };
    assert_eq!(c.estimate(&bad), c.estimate(&ClaspParams::default()));
    let huge_ridge = ClaspParams { ridge: 1e300, ..ClaspParams::default() };
    let _ = c.estimate(&huge_ridge);
    let counts = c.rejected();
    assert_eq!((counts.non_finite, counts.out_of_range, counts.wrong_length, counts.total()), (3, 1, 3, 7));

    // Caps: samples and miner columns.
    let cfg = ClaspConfig { max_samples: 5, max_miners: 4, ..ClaspConfig::new(2, 10) };
    let mut c: Clasp<u32> = Clasp::with_config(cfg);
    c.record(0, &[1, 2], 1.0).unwrap();
    c.record(1, &[3, 4], 1.0).unwrap();
    assert_eq!(c.record(2, &[5, 2], 1.0), Err(Reject::TooManyMiners));
    c.record(2, &[3, 2], 1.0).unwrap();
    c.record(3, &[1, 4], 1.0).unwrap();
    c.record(4, &[1, 4], 1.0).unwrap();
    assert_eq!(c.record(5, &[1, 4], 1.0), Err(Reject::OverCap));
    assert_eq!((c.rejected().too_many_miners, c.rejected().over_cap, c.samples()), (1, 1, 5));
    let _ = c.estimate(&ClaspParams::default());

    // Degenerate shapes: no stages, zero horizon, knot counts out of range.
    let mut c: Clasp<u32> = Clasp::new(0, 0);
    for i in 0..10 {
        c.record(i, &[], i as f32).unwrap();
    }
    assert!(c.estimate(&ClaspParams::default()).miners.is_empty());
    for knots in [0, 1, 2, 1000] {
        let mut c: Clasp<u32> = Clasp::with_config(ClaspConfig { trend_knots: knots, ..ClaspConfig::new(1, 50) });
        for i in 0..100u64 {
            c.record(i, &[(i % 3) as u32], (i % 7) as f32).unwrap();
        }
        let r = c.estimate(&ClaspParams::default());
        assert_eq!(r.tested, 3, "knots {knots}");
    }
}

#[test]
fn the_report_is_a_pure_function_of_the_records() {
    let effects = vec![vec![0.0, 0.1], vec![0.0, 0.0, -0.05]];
    let samples = simulate(3, 500, &effects, uniform, |_| 0.1);
    let a = feed(&samples, 2).estimate(&ClaspParams::default());
    let b = feed(&samples, 2).estimate(&ClaspParams::default());
    assert_eq!(a, b);
    assert_eq!(
        a.miners.iter().map(|m| (m.stage, m.key)).collect::<Vec<_>>(),
        vec![(0, 0), (0, 1), (1, 100), (1, 101), (1, 102)]
    );
}

fn spd_inverse_inverts(p: usize) {
    let mut rng = Rng::new(1);
    let m: Vec<f64> = (0..p * p).map(|_| rng.normal() as f64).collect();
    let mut a = vec![0.0; p * p];
    for i in 0..p {
        for j in 0..p {
            a[i * p + j] = (0..p).map(|k| m[i * p + k] * m[j * p + k]).sum::<f64>() + if i == j { 0.5 } else { 0.0 };
        }
    }
    let (inv, tr) = spd_inverse(&a, p).unwrap();
    for i in 0..p {
        for j in 0..p {
            let v: f64 = (0..p).map(|k| a[i * p + k] * inv[k * p + j]).sum();
            assert!((v - (i == j) as u8 as f64).abs() < 1e-9, "({i},{j}) {v}");
        }
    }
    assert!((tr - (0..p).map(|i| inv[i * p + i]).sum::<f64>()).abs() < 1e-9);
    let mut not_pd = a.clone();
    not_pd[0] = -1.0;
    assert!(spd_inverse(&not_pd, p).is_none());
}

/// The inverse compiled for AVX gives the same bits as the baseline build
/// of the same code: validators on different machines must agree on who
/// CLASP finds harmful.
#[test]
fn the_inverse_is_the_same_bits_with_or_without_avx() {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx") {
        let p = 45;
        let mut rng = Rng::new(3);
        let m: Vec<f64> = (0..p * p).map(|_| rng.normal() as f64).collect();
        let mut a = vec![0.0; p * p];
        for i in 0..p {
            for j in 0..p {
                a[i * p + j] =
                    (0..p).map(|k| m[i * p + k] * m[j * p + k]).sum::<f64>() + if i == j { 0.3 } else { 0.0 };
            }
        }
        let (fast, fast_tr) = spd_inverse(&a, p).unwrap();
        let (base, base_tr) = super::linalg::spd_inverse_in(&a, p).unwrap();
        assert_eq!(fast_tr.to_bits(), base_tr.to_bits());
        assert!(fast.iter().zip(&base).all(|(x, y)| x.to_bits() == y.to_bits()), "the AVX inverse differs");
        return;
    }
    println!("skipped: this CPU has no AVX, so there is only the baseline inverse to run");
}

#[test]
fn numerics_match_references() {
    // spd_inverse: a A^-1 = I on a random SPD matrix, trace of the inverse;
    // at 37 rows the factor's dot products run over whole chunks of eight
    // and a remainder.
    for p in [7, 37] {
        spd_inverse_inverts(p);
    }
    // Normal tail and its inverse; Student-t quantiles (tables).
    assert!((normal_sf(3.0) - 1.349_898e-3).abs() < 1e-9);
    assert!((normal_sf(-1.0) - 0.841_344_7).abs() < 1e-6);
    assert!((normal_isf(0.025) - 1.959_964).abs() < 1e-5);
    assert!((normal_isf(1e-8) - 5.612_001).abs() < 1e-4);
    assert!((critical_value(1.959_964, 1, 10.0) - 2.228).abs() < 5e-3);
    assert!((critical_value(1.959_964, 1, 30.0) - 2.042).abs() < 2e-3);
    assert!((critical_value(3.0, 1, 1e9) - 3.0).abs() < 1e-6);
    // Bonferroni over 10 tests at z = 3: the 1.35e-4 tail, z = 3.6425.
    assert!((critical_value(3.0, 10, f64::INFINITY) - 3.642_52).abs() < 1e-3);
}
