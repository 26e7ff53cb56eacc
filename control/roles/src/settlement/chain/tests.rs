use std::collections::BTreeMap;
use std::io::Write;
use std::process::{Command, Stdio};

use iota_core::PeerId;
use serde_json::json;

use super::hotkey::{self, BITTENSOR_SS58_PREFIX, Hotkey, Ss58Error};
use super::scale::{CallIndex, encode_compact, set_weights_call};
use super::subtensor::{SubtensorAdapter, SubtensorConfig};
use super::weights::{WeightError, clip_to_max_weight, weights_for_emit};
use super::*;
use crate::settlement::yuma::{self, YumaInput};

/// Alice's sr25519 public key (Substrate's dev account `//Alice`).
const ALICE_PUBLIC: &str = "d43593c715fdd31c61141abd04a99fd6822c8558854ccde39a5684e7a56da27d";
const ALICE_SS58: &str = "5GrwvaEF5zXb26Fz9rcQpDWS57CtERHpNehXCPcNoHGKutQY";
/// The mini-secret seed `subkey inspect //Alice` prints for that key.
const ALICE_SEED: &str = "e5be9a5092b81bca64be81d212e7f2f9eba183bb7a90954f7b76361f6edb5c0a";

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex<const N: usize>(s: &str) -> [u8; N] {
    let v: Vec<u8> = (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect();
    v.try_into().unwrap()
}

fn peer(i: u8) -> PeerId {
    PeerId([i; 32])
}

fn emit(weights: &[f64]) -> (Vec<u16>, Vec<u16>) {
    let uids: Vec<u16> = (0..weights.len() as u16).collect();
    weights_for_emit(&uids, weights).unwrap()
}

// ---- weights to u16 ------------------------------------------------------

#[test]
fn all_zero_or_empty_weights_give_nothing() {
    assert_eq!(emit(&[0.0, 0.0, -0.0]), (vec![], vec![]));
    assert_eq!(emit(&[]), (vec![], vec![]));
}

#[test]
fn a_single_weight_becomes_u16_max() {
    assert_eq!(emit(&[1e-30]), (vec![0], vec![65535]));
    assert_eq!(weights_for_emit(&[7], &[3.0]).unwrap(), (vec![7], vec![65535]));
}

#[test]
fn the_largest_weight_is_scaled_to_u16_max_and_zeros_are_dropped_with_their_uids() {
    let (uids, vals) = weights_for_emit(&[4, 9, 2, 5], &[0.5, 2.0, 0.0, 1.0]).unwrap();
    assert_eq!(uids, vec![4, 9, 5]);
    // 0.25 * 65535 = 16383.75 -> 16384; 0.5 * 65535 = 32767.5 -> 32768.
    assert_eq!(vals, vec![16384, 65535, 32768]);
    // Scale does not matter.
    assert_eq!(emit(&[5.0, 20.0, 10.0]), emit(&[0.25, 1.0, 0.5]));
}

#[test]
fn rounding_ties_go_to_even_as_python_round_does() {
    // m / 65535 * 65535 is exactly m in f64 for each of these, so each is
    // a tie: Python's round goes to the even neighbour.
    let ties = [0.5, 1.5, 2.5, 3.5, 100.5, 65534.5];
    let mut w: Vec<f64> = ties.iter().map(|m| m / 65535.0).collect();
    for (m, x) in ties.iter().zip(&w) {
        assert_eq!(x * 65535.0, *m, "the test's premise: {m} is an exact tie");
    }
    w.push(1.0);
    let (uids, vals) = emit(&w);
    // 0.5 rounds to 0 and is dropped with its uid.
    assert_eq!(uids, vec![1, 2, 3, 4, 5, 6]);
    assert_eq!(vals, vec![2, 2, 4, 100, 65534, 65535]);
    // Just above a tie rounds up, just below rounds down.
    let up = f64::from_bits((2.5f64 / 65535.0).to_bits() + 1);
    let down = f64::from_bits((3.5f64 / 65535.0).to_bits() - 1);
    assert_eq!(emit(&[up, down, 1.0]).1, vec![3, 3, 65535]);
}

#[test]
fn bad_weights_are_refused_as_the_sdk_refuses_them() {
    assert_eq!(weights_for_emit(&[0, 1], &[1.0]), Err(WeightError::LengthMismatch { uids: 2, weights: 1 }));
    assert_eq!(weights_for_emit(&[0, 1], &[1.0, -0.5]), Err(WeightError::Negative { index: 1, value: -0.5 }));
    assert!(matches!(weights_for_emit(&[0, 1], &[f64::NAN, 1.0]), Err(WeightError::NotFinite { index: 0, .. })));
    assert!(matches!(weights_for_emit(&[0], &[f64::INFINITY]), Err(WeightError::NotFinite { index: 0, .. })));
}

#[test]
fn clipping_caps_every_share_at_the_limit_and_keeps_the_rest_in_proportion() {
    let w = [10.0, 1.0, 2.0, 3.0, 0.0, 4.0];
    let limit = 0.3;
    let c = clip_to_max_weight(&w, limit).unwrap();
    let sum: f64 = c.iter().sum();
    assert!((sum - 1.0).abs() < 1e-12, "sums to 1: {sum}");
    let max = c.iter().copied().fold(0.0, f64::max);
    assert!(max <= limit && max > limit - 1e-6, "the largest share lands on the limit: {max}");
    // Below the cutoff, the ratios are untouched.
    assert!((c[2] / c[1] - 2.0).abs() < 1e-12 && (c[5] / c[3] - 4.0 / 3.0).abs() < 1e-12);
    assert_eq!(c[4], 0.0);
    // Within the limit: only normalised.
    assert_eq!(clip_to_max_weight(&[1.0, 1.0, 2.0], 0.5).unwrap(), vec![0.25, 0.25, 0.5]);
    // A limit no vector can meet: uniform.
    assert_eq!(clip_to_max_weight(&[1.0, 0.0, 5.0], 0.3).unwrap(), vec![1.0 / 3.0; 3]);
    assert_eq!(clip_to_max_weight(&[0.0, 0.0], 0.9), Err(WeightError::AllZero));
    assert_eq!(clip_to_max_weight(&[1.0], 0.0), Err(WeightError::BadLimit(0.0)));
}

// ---- SCALE ---------------------------------------------------------------

#[test]
fn compact_integers_encode_as_the_scale_spec_gives() {
    let cases: &[(u64, &[u8])] = &[
        (0, &[0x00]),
        (1, &[0x04]),
        (42, &[0xa8]),
        (63, &[0xfc]),
        (64, &[0x01, 0x01]),
        (69, &[0x15, 0x01]),
        (16383, &[0xfd, 0xff]),
        (16384, &[0x02, 0x00, 0x01, 0x00]),
        ((1 << 30) - 1, &[0xfe, 0xff, 0xff, 0xff]),
        (1 << 30, &[0x03, 0x00, 0x00, 0x00, 0x40]),
        (1 << 32, &[0x07, 0x00, 0x00, 0x00, 0x00, 0x01]),
        (u64::MAX, &[0x13, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]),
    ];
    for &(n, want) in cases {
        let mut out = Vec::new();
        encode_compact(n, &mut out);
        assert_eq!(out, want, "compact({n})");
    }
}

#[test]
fn the_set_weights_call_is_pallet_call_then_arguments_in_order() {
    let call = set_weights_call(CallIndex::FINNEY_SET_WEIGHTS, 9, &[0, 300], &[65535, 32768], 1_000_002);
    let want: Vec<u8> = [
        &[7u8, 0][..],                   // SubtensorModule, set_weights
        &[9, 0],                         // netuid: u16
        &[0x08, 0x00, 0x00, 0x2c, 0x01], // dests: compact(2), 0, 300
        &[0x08, 0xff, 0xff, 0x00, 0x80], // weights: compact(2), 65535, 32768
        &1_000_002u64.to_le_bytes(),     // version_key: u64
    ]
    .concat();
    assert_eq!(call, want);
    let empty = set_weights_call(CallIndex { pallet: 1, call: 2 }, 0, &[], &[], 0);
    assert_eq!(empty, [&[1u8, 2, 0, 0, 0, 0][..], &[0; 8]].concat());
}

// ---- hotkeys and SS58 ----------------------------------------------------

#[test]
fn ss58_of_alice_is_the_documented_address() {
    let key: [u8; 32] = unhex(ALICE_PUBLIC);
    assert_eq!(hotkey::ss58_encode(BITTENSOR_SS58_PREFIX, &key).unwrap(), ALICE_SS58);
    assert_eq!(hotkey::ss58_decode(ALICE_SS58), Ok((42, key)));
    assert_eq!(hotkey::ss58_encode(64, &key), Err(Ss58Error::UnsupportedPrefix(64)));
}

#[test]
fn ss58_decoding_catches_a_changed_character() {
    let mut bad = ALICE_SS58.to_string();
    bad.replace_range(10..11, "y");
    assert_eq!(hotkey::ss58_decode(&bad), Err(Ss58Error::BadChecksum));
    assert_eq!(hotkey::ss58_decode("0OIl"), Err(Ss58Error::NotBase58));
    assert_eq!(hotkey::ss58_decode("5Grwva"), Err(Ss58Error::BadLength(4)));
}

#[test]
fn a_hotkey_from_alices_seed_is_alice() {
    let k = Hotkey::from_seed(&unhex(ALICE_SEED));
    assert_eq!(hex(&k.public()), ALICE_PUBLIC);
    assert_eq!(k.ss58(), ALICE_SS58);
    assert_eq!(format!("{k:?}"), format!("Hotkey(\"{ALICE_SS58}\")"), "Debug shows no secret");
}

#[test]
fn signatures_verify_and_nothing_else_does() {
    let k = Hotkey::from_seed(&[7; 32]);
    let other = Hotkey::from_seed(&[8; 32]);
    let msg = b"iota-rs weights, epoch 3";
    let sig = k.sign(msg);
    assert!(hotkey::verify(&k.public(), msg, &sig));
    assert_ne!(sig, k.sign(msg), "nonces are randomised");
    assert!(hotkey::verify(&k.public(), msg, &k.sign(msg)));
    assert!(!hotkey::verify(&k.public(), b"iota-rs weights, epoch 4", &sig));
    assert!(!hotkey::verify(&other.public(), msg, &sig));
    let mut flipped = sig;
    flipped[5] ^= 1;
    assert!(!hotkey::verify(&k.public(), msg, &flipped));
    assert!(!hotkey::verify(&k.public(), msg, &[0; 64]), "a malformed signature is false, not a panic");
}

// ---- the chains ----------------------------------------------------------

#[test]
fn the_local_chain_records_each_submission_in_order() {
    let mut c = LocalLedgerChain::new();
    let miners = [peer(1), peer(2)];
    let r0 = c.submit_weights(4, peer(9), &miners, &[0.25, 0.75]).unwrap();
    let r1 = c.submit_weights(4, peer(8), &miners, &[1.0, 0.0]).unwrap();
    assert_eq!((r0.seq, r1.seq), (0, 1));
    assert_eq!(r0.account, peer(9).to_hex());
    let back: LocalRecord = serde_json::from_slice(&r0.payload).unwrap();
    assert_eq!(back, c.records()[0]);
    assert_eq!(back.weights, vec![0.25, 0.75]);
    assert_eq!(c.submit_weights(5, peer(9), &miners, &[1.0]), Err(ChainError::Shape { miners: 2, weights: 1 }));
    assert!(matches!(
        c.submit_weights(5, peer(9), &miners, &[1.0, -1.0]),
        Err(ChainError::Weights(WeightError::Negative { index: 1, .. }))
    ));
    assert_eq!(c.records().len(), 2, "a refused submission leaves no record");
}

fn adapter(config: SubtensorConfig) -> SubtensorAdapter {
    let hotkeys = BTreeMap::from([(peer(9), Hotkey::from_seed(&unhex(ALICE_SEED)))]);
    let uids = BTreeMap::from([(peer(1), 12), (peer(2), 3), (peer(3), 40)]);
    SubtensorAdapter::new(config, hotkeys, uids).unwrap()
}

#[test]
fn the_subtensor_adapter_builds_the_set_weights_call_for_the_validators_hotkey() {
    let config = SubtensorConfig { version_key: 7, ..SubtensorConfig::finney(9) };
    let mut a = adapter(config);
    let miners = [peer(1), peer(2), peer(3), peer(4)];
    let r = a.submit_weights(2, peer(9), &miners, &[0.5, 1.0, 0.0, 0.0]).unwrap();
    assert_eq!(r.account, ALICE_SS58);
    assert_eq!(r.payload, set_weights_call(CallIndex::FINNEY_SET_WEIGHTS, 9, &[12, 3], &[32768, 65535], 7));
    let p = &a.prepared()[0];
    assert_eq!((p.dests.as_slice(), p.weights.as_slice(), p.epoch), (&[12, 3][..], &[32768, 65535][..], 2));
    assert_eq!(p.call, r.payload);

    assert_eq!(a.submit_weights(2, peer(8), &miners, &[1.0; 4]), Err(ChainError::UnknownValidator(peer(8))));
    assert_eq!(
        a.submit_weights(2, peer(9), &miners, &[1.0, 1.0, 1.0, 0.5]),
        Err(ChainError::UnregisteredMiner(peer(4)))
    );
    assert_eq!(a.submit_weights(2, peer(9), &miners, &[0.0; 4]), Err(ChainError::NothingToSet));
    assert_eq!(a.prepared().len(), 1);
    let twice = BTreeMap::from([(peer(1), 5), (peer(2), 5)]);
    assert_eq!(SubtensorAdapter::new(config, BTreeMap::new(), twice).unwrap_err(), ChainError::DuplicateUid { uid: 5 });
}

#[test]
fn the_subtensor_adapter_clips_to_the_subnets_max_weight_limit() {
    // 0.4 of u16::MAX; unclipped, miner 3 would hold 80% of the weight.
    let limit = 26214;
    let mut a = adapter(SubtensorConfig { max_weight_limit: limit, ..SubtensorConfig::finney(1) });
    let miners = [peer(1), peer(2), peer(3)];
    a.submit_weights(0, peer(9), &miners, &[0.1, 0.1, 0.8]).unwrap();
    let vals = &a.prepared()[0].weights;
    let sum: u32 = vals.iter().map(|&v| u32::from(v)).sum();
    let share = f64::from(*vals.iter().max().unwrap()) / f64::from(sum);
    assert!(share <= f64::from(limit) / 65535.0 + 1e-4, "largest share {share} is within the limit");
    assert_eq!(vals[0], vals[1]);
}

#[test]
fn a_settlement_submits_every_validator_row_that_carries_weight() {
    let input = YumaInput {
        stakes: vec![60.0, 30.0, 10.0],
        weights: vec![vec![0.5, 0.5], vec![0.0, 0.0], vec![1.0, 0.0]],
        ..YumaInput::default()
    };
    let output = yuma::run(&input).unwrap();
    let s: Settlement = serde_json::from_value(json!({
        "run_id": 1, "epoch": 6,
        "validators": [peer(7), peer(8), peer(9)],
        "miners": [peer(1), peer(2)],
        "input": input, "output": output,
        "rolled_back": false, "convicted": [],
    }))
    .unwrap();
    let mut c = LocalLedgerChain::new();
    let done = submit_settlement(&mut c, &s);
    let who: Vec<PeerId> = done.iter().map(|(v, _)| *v).collect();
    assert_eq!(who, vec![peer(7), peer(9)], "the silent validator's row is not submitted");
    assert!(done.iter().all(|(_, r)| r.as_ref().is_ok_and(|r| r.epoch == 6)));
    assert_eq!(c.records()[1].weights, vec![1.0, 0.0]);
    // On subtensor, only validator 9's hotkey is held.
    let mut a = adapter(SubtensorConfig::finney(9));
    let done = submit_settlement(&mut a, &s);
    assert_eq!(done[0].1, Err(ChainError::UnknownValidator(peer(7))));
    assert_eq!(done[1].1.as_ref().unwrap().account, ALICE_SS58);
}

// ---- against the real SDK ------------------------------------------------

/// Runs `scripts/bittensor-crosscheck.py` under the Python that has the
/// `bittensor` package (`IOTA_BITTENSOR_PYTHON`, default `python3`) and
/// compares: u16 conversion and clipping case by case, the hotkey's public
/// key and SS58 address from one seed, and that the SDK verifies a
/// signature made here. Skips, saying so, where the SDK is not installed.
#[test]
fn the_adapter_matches_the_bittensor_sdk() {
    let python = std::env::var("IOTA_BITTENSOR_PYTHON").unwrap_or_else(|_| "python3".into());
    let importable = Command::new(&python)
        .args(["-c", "import bittensor"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !importable {
        println!("skipped: `{python}` cannot import bittensor (pip install bittensor, or set IOTA_BITTENSOR_PYTHON)");
        return;
    }
    let ties: Vec<f64> = [0.5, 1.5, 2.5, 3.5, 100.5, 65534.5].iter().map(|m| m / 65535.0).chain([1.0]).collect();
    let mut rng = iota_core::rng::Rng::new(0x5eed);
    let random: Vec<f64> = (0..64).map(|i| if i % 7 == 0 { 0.0 } else { rng.next_f64() * 1e3 }).collect();
    let cases: Vec<(Vec<f64>, u16)> = vec![
        (vec![0.5, 1.0, 0.25], 65535),
        (vec![0.0, 0.0, 0.0], 65535),
        (vec![3.0], 65535),
        (ties, 65535),
        (vec![1e-300, 1.0, 1e-5, 7.62939453125e-6], 65535),
        (random.clone(), 65535),
        (vec![10.0, 1.0, 2.0, 3.0, 0.0, 4.0], 19660),
        (vec![0.1, 0.1, 0.8], 26214),
        (random, 1000),
        (vec![1.0, 0.0, 5.0], 13107),
        (vec![1.0, -0.5], 65535),
    ];
    let seed = [0x42u8; 32];
    let k = Hotkey::from_seed(&seed);
    let msg = b"iota-rs crosscheck";
    let req = json!({
        "cases": cases.iter().map(|(w, limit)| json!({
            "uids": (0..w.len()).collect::<Vec<_>>(), "weights": w, "max_weight_limit": limit,
        })).collect::<Vec<_>>(),
        "seed": hex(&seed), "message": hex(msg), "signature": hex(&k.sign(msg)),
    });
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/bittensor-crosscheck.py");
    let mut child = Command::new(&python)
        .arg(script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python starts");
    child.stdin.take().unwrap().write_all(req.to_string().as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "crosscheck failed: {}", String::from_utf8_lossy(&out.stderr));
    let got: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    println!("against {} ({}, {})", got["sdk"], got["emit"], got["clip"]);
    for (i, ((w, limit), sdk)) in cases.iter().zip(got["cases"].as_array().unwrap()).enumerate() {
        let uids: Vec<u16> = (0..w.len() as u16).collect();
        let ours = (|| {
            let row =
                if *limit < 65535 { clip_to_max_weight(w, weights::max_weight_share(*limit))? } else { w.clone() };
            weights_for_emit(&uids, &row)
        })();
        match ours {
            Ok((u, v)) => assert_eq!(sdk, &json!({"uids": u, "weights": v}), "case {i}: {w:?} limit {limit}"),
            Err(e) => assert!(sdk.get("error").is_some(), "case {i}: we refuse ({e}), the SDK gives {sdk}"),
        }
    }
    assert_eq!(got["public"], json!(hex(&k.public())));
    assert_eq!(got["ss58"], json!(k.ss58()));
    assert_eq!(got["verified"], json!(true), "the SDK verifies our signature");
}
