//! Yuma consensus on hostile input: every malformed, oversized or extreme
//! field is refused with its name or computed without overflow, and nothing
//! panics.

use super::tests::{RAO, Rng, approx, input};
use super::*;

fn refused(inp: &YumaInput) -> YumaError {
    match run(inp) {
        Ok(_) => panic!("accepted {inp:?}"),
        Err(e) => e,
    }
}

#[test]
fn hostile_inputs_are_refused_with_the_field_named() {
    let ok = || input(&[1.0, 2.0], vec![vec![0.5, 0.5], vec![1.0, 0.0]]);
    assert!(run(&ok()).is_ok());

    let mut inp = ok();
    inp.stakes[1] = f64::NAN;
    let e = refused(&inp);
    assert!(matches!(&e, YumaError::BadValue { field, .. } if field == "stakes[1]"), "{e}");
    assert!(e.to_string().contains("stakes[1] is NaN"), "{e}");

    let mut inp = ok();
    inp.stakes[0] = -1.0;
    assert!(matches!(refused(&inp), YumaError::BadValue { field, .. } if field == "stakes[0]"));

    let mut inp = ok();
    inp.weights[1][0] = f64::INFINITY;
    assert!(matches!(refused(&inp), YumaError::BadValue { field, .. } if field == "weights[1][0]"));

    let mut inp = ok();
    inp.bonds = Some(vec![vec![0.0, 0.0], vec![0.0, -0.5]]);
    assert!(matches!(refused(&inp), YumaError::BadValue { field, .. } if field == "bonds[1][1]"));

    let mut inp = ok();
    inp.params.bonds_mode = BondsMode::Yuma3;
    inp.bonds = Some(vec![vec![0.0, 1.5], vec![0.0, 0.0]]);
    let e = refused(&inp);
    assert!(matches!(&e, YumaError::BadValue { field, .. } if field == "bonds[0][1]"), "{e}");
    assert!(e.to_string().contains("[0, 1]"), "{e}");

    // Ragged and wrong-sized.
    let mut inp = ok();
    inp.weights[1].push(0.0);
    assert!(matches!(refused(&inp), YumaError::Shape { field, expected: 2, found: 3, .. } if field == "weights[1]"));
    let mut inp = ok();
    inp.stakes.push(1.0);
    assert!(matches!(refused(&inp), YumaError::Shape { field, expected: 3, found: 2, .. } if field == "weights"));
    let mut inp = ok();
    inp.bonds = Some(vec![vec![0.0, 0.0]]);
    assert!(matches!(refused(&inp), YumaError::Shape { field, expected: 2, found: 1, .. } if field == "bonds"));
    let mut inp = ok();
    inp.bonds = Some(vec![vec![0.0, 0.0], vec![0.0]]);
    assert!(matches!(refused(&inp), YumaError::Shape { field, .. } if field == "bonds[1]"));
    let mut inp = ok();
    inp.validator_permits = Some(vec![true]);
    assert!(matches!(refused(&inp), YumaError::Shape { field, .. } if field == "validator_permits"));
    let mut inp = ok();
    inp.active = Some(vec![true; 3]);
    assert!(matches!(refused(&inp), YumaError::Shape { field, .. } if field == "active"));
    let mut inp = ok();
    inp.recently_registered = Some(vec![false]);
    assert!(matches!(refused(&inp), YumaError::Shape { field, .. } if field == "recently_registered"));

    // Empty sets and no stake.
    assert!(matches!(refused(&input(&[], vec![])), YumaError::Empty { field: "stakes", .. }));
    assert!(matches!(refused(&input(&[1.0], vec![vec![]])), YumaError::Empty { field: "weights[0]", .. }));
    assert_eq!(refused(&input(&[0.0, 0.0], vec![vec![1.0], vec![1.0]])), YumaError::NoStake);

    // Parameters.
    for (name, set) in [
        ("kappa", (|p: &mut YumaParams| p.kappa = 1.5) as fn(&mut YumaParams)),
        ("bonds_moving_average", |p| p.bonds_moving_average = -0.1),
        ("bonds_penalty", |p| p.bonds_penalty = f64::NAN),
        ("miner_share", |p| p.miner_share = 2.0),
        ("emission", |p| p.emission = f64::INFINITY),
    ] {
        let mut inp = ok();
        set(&mut inp.params);
        assert!(matches!(refused(&inp), YumaError::BadParam { name: n, .. } if n == name), "{name}");
    }
}

#[test]
fn oversized_inputs_are_refused_before_work() {
    let inp = input(&vec![1.0; MAX_UIDS + 1], vec![]);
    assert!(matches!(refused(&inp), YumaError::TooLarge { field: "stakes", len, .. } if len == MAX_UIDS + 1));
    let inp = input(&[1.0], vec![vec![0.0; MAX_UIDS + 1]]);
    assert!(matches!(refused(&inp), YumaError::TooLarge { field: "weights[0]", .. }));
    // 1025 x 65,536 cells: refused on the first row's length, so the other
    // rows need not even exist.
    let mut weights = vec![Vec::new(); 1025];
    weights[0] = vec![0.0; MAX_UIDS];
    let inp = input(&vec![1.0; 1025], weights);
    assert!(matches!(refused(&inp), YumaError::MatrixTooLarge { rows: 1025, cols: MAX_UIDS, .. }));
}

#[test]
fn garbage_never_panics() {
    let mut rng = Rng(7);
    let pick = |rng: &mut Rng| match rng.below(8) {
        0 => f64::NAN,
        1 => -rng.unit(),
        2 => f64::INFINITY,
        3 => f64::MAX,
        4 => f64::MIN_POSITIVE / 3.0,
        5 => 0.0,
        _ => rng.unit(),
    };
    let mut accepted = 0;
    for _ in 0..3_000 {
        let (v, m) = (rng.below(5), rng.below(4));
        // Now and then a row of another length, or one row too many.
        let len = |rng: &mut Rng| if rng.below(10) == 0 { rng.below(4) } else { m };
        let rows = if rng.below(10) == 0 { v + 1 } else { v };
        let inp = YumaInput {
            stakes: (0..v).map(|_| pick(&mut rng)).collect(),
            weights: (0..rows).map(|_| (0..len(&mut rng)).map(|_| pick(&mut rng)).collect()).collect(),
            bonds: if rng.below(2) == 0 {
                None
            } else {
                Some((0..v).map(|_| (0..len(&mut rng)).map(|_| pick(&mut rng)).collect()).collect())
            },
            params: YumaParams { kappa: pick(&mut rng), emission: pick(&mut rng), ..YumaParams::default() },
            ..YumaInput::default()
        };
        if let Ok(out) = run(&inp) {
            accepted += 1;
            let all = out.emission.miners.iter().chain(&out.emission.validators);
            assert!(all.clone().all(|e| e.is_finite() && *e >= 0.0), "{inp:?} -> {out:?}");
            let total: f64 = all.sum();
            assert!(total <= inp.params.emission * (1.0 + 1e-9), "{inp:?} -> {out:?}");
            assert!(out.bonds.iter().flatten().all(|b| b.is_finite() && (0.0..=1.0).contains(b)), "{out:?}");
        }
    }
    assert!(accepted > 20, "only {accepted} accepted: the generator tests nothing but refusals");
}

#[test]
fn huge_but_finite_values_do_not_overflow() {
    let mut inp = input(&[f64::MAX, f64::MAX], vec![vec![f64::MAX, f64::MAX], vec![f64::MAX, 0.0]]);
    inp.bonds = Some(vec![vec![f64::MAX; 2], vec![f64::MAX; 2]]);
    let out = run(&inp).unwrap();
    assert_eq!(out.active_stake, vec![0.5, 0.5]);
    assert_eq!(out.consensus, vec![1.0, 0.5]);
    let total: f64 = out.emission.miners.iter().chain(&out.emission.validators).sum();
    assert!(approx(total, RAO, RAO * 1e-12), "{total}");
}

// ---------------------------------------------------------------------------
// JSON and the command behind `iota-control yuma`.

#[test]
fn json_round_trip() {
    let json = r#"{
        "stakes": [1, 3],
        "weights": [[1, 0, 1], [0, 1, 1]],
        "params": { "emission": 100, "bonds_mode": "classic" }
    }"#;
    let text = run_json(json).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    for field in ["consensus", "ranks", "trust", "incentive"] {
        assert_eq!(v[field].as_array().map(Vec::len), Some(3), "{field}");
    }
    for field in ["active_stake", "validator_trust", "dividends"] {
        assert_eq!(v[field].as_array().map(Vec::len), Some(2), "{field}");
    }
    assert_eq!(v["bonds"].as_array().map(Vec::len), Some(2));
    assert_eq!(v["bonds"][0].as_array().map(Vec::len), Some(3));
    let miners: Vec<f64> = serde_json::from_value(v["emission"]["miners"].clone()).unwrap();
    let validators: Vec<f64> = serde_json::from_value(v["emission"]["validators"].clone()).unwrap();
    assert_eq!((miners.len(), validators.len()), (3, 2));
    assert!(approx(miners.iter().chain(&validators).sum::<f64>(), 100.0, 1e-9));
    // Validator 1 (75% of stake) wins: miner 0, rated only by validator 0, gets nothing.
    assert_eq!(miners[0], 0.0);
    assert!(miners[1] > 0.0 && miners[2] > 0.0);

    // The output parses back as YumaOutput, and it is what `run` returns.
    let parsed: YumaOutput = serde_json::from_str(&text).unwrap();
    let direct = run(&serde_json::from_str::<YumaInput>(json).unwrap()).unwrap();
    assert_eq!(parsed, direct);

    // Bonds fed back: a second epoch accepts them.
    let again = serde_json::json!({ "stakes": [1, 3], "weights": [[1, 0, 1], [0, 1, 1]], "bonds": parsed.bonds });
    assert!(run_json(&again.to_string()).is_ok());
}

#[test]
fn bad_json_is_refused() {
    for (json, needle) in [
        ("{", "EOF"),
        (r#"{"stakes": [1], "weights": [[1]], "kappa": 0.5}"#, "unknown field `kappa`"),
        (r#"{"stakes": [1], "weights": [[1]], "params": {"kapa": 0.5}}"#, "unknown field `kapa`"),
        (r#"{"stakes": [1e400], "weights": [[1]]}"#, "number out of range"),
        (r#"{"stakes": [1], "weights": [[1]], "params": {"bonds_mode": "yuma4"}}"#, "unknown variant"),
    ] {
        let e = run_json(json).unwrap_err();
        assert!(matches!(&e, YumaError::Json(m) if m.contains(needle)), "{json}: {e}");
    }
    let e = run_json(r#"{"stakes": [1, -2], "weights": [[1], [1]]}"#).unwrap_err();
    assert!(matches!(&e, YumaError::BadValue { field, .. } if field == "stakes[1]"), "{e}");
}
