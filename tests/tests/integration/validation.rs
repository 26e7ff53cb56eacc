//! Validation: recomputing a miner's work reproduces an honest miner's
//! payloads bit for bit (checked against the single-process trainer), and
//! tampered payloads are measured as such.

use std::sync::Arc;

use iota_core::WireCodec;
use iota_dataplane::recompute::{ForwardInput, Recompute, compare};
use iota_model::train::Pipeline;
use iota_model::{CpuBackend, codec};
use iota_tests::tiny_run;

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn recompute_reproduces_the_trainer_bit_for_bit_and_measures_tampering() {
    let cfg = tiny_run(3, 1, 1, 8, WireCodec::Int8Row);
    let corpus = iota_dataplane::corpus::load_corpus(&cfg, None).unwrap();
    let be = Arc::new(CpuBackend::new());
    let mut p = Pipeline::new(be.clone(), cfg.train.clone()).unwrap();
    let initial: Vec<Vec<f32>> = p.stages().iter().map(|s| s.params_host()).collect();
    for _ in 0..2 {
        p.train_step(&corpus).unwrap();
    }
    let w: Vec<Vec<f32>> = p.stages().iter().map(|s| s.params_host()).collect();
    let (batch, seq) = (cfg.train.batch, cfg.train.seq);
    let (x, y) = corpus.val_batch(cfg.train.seed, 3, batch, seq);
    let (trainer_losses, _) = p.accumulate(&x, &y, 77, 1.0).unwrap();

    // Stage by stage, from the payloads the previous recompute produced.
    let r = Recompute::new(be, cfg.clone()).unwrap();
    let a0 = r.forward(0, &w[0], ForwardInput::Tokens(&x), batch).unwrap();
    let a1 = r.forward(1, &w[1], ForwardInput::Wire(&a0), batch).unwrap();
    let tail = r.tail(2, &w[2], ForwardInput::Wire(&a1), &y, batch).unwrap();
    assert_eq!(bits(&tail.losses), bits(&trainer_losses), "the three recomputed stages are the trainer's model");
    let g2 = tail.grad.expect("the tail of a split model sends a gradient");
    let g1 = r.backward(1, &w[1], ForwardInput::Wire(&a0), &g2, batch).unwrap().expect("a middle stage sends one");
    assert_eq!(r.backward(0, &w[0], ForwardInput::Tokens(&x), &g1, batch).unwrap(), None, "the head sends none");
    // Recomputing again gives the same bytes.
    assert_eq!(r.forward(1, &w[1], ForwardInput::Wire(&a0), batch).unwrap(), a1);
    assert_eq!(r.backward(1, &w[1], ForwardInput::Wire(&a0), &g2, batch).unwrap(), Some(g1.clone()));

    // What a cheater could send instead of a1.
    let (rows, width) = (batch * seq, cfg.train.model.bottleneck);
    let honest = codec::decode(cfg.train.codec, rows, width, &a1).unwrap();
    let same = compare(cfg.train.codec, rows, width, &a1, &a1).unwrap();
    assert!(same.identical && same.passes(0.0));
    let mut noisy = honest.clone();
    for (i, v) in noisy.iter_mut().enumerate() {
        *v += if i % 2 == 0 { 0.05 } else { -0.05 };
    }
    let noise = codec::encode(cfg.train.codec, rows, width, &noisy).unwrap();
    let c = compare(cfg.train.codec, rows, width, &noise, &a1).unwrap();
    assert!(!c.identical && c.rel_l2 > 1e-3 && !c.passes(1e-4), "{c:?}");
    let zeros = codec::encode(cfg.train.codec, rows, width, &vec![0.0; rows * width]).unwrap();
    let c = compare(cfg.train.codec, rows, width, &zeros, &a1).unwrap();
    assert!((c.rel_l2 - 1.0).abs() < 1e-9 && !c.passes(0.5), "{c:?}");
    // Stale weights (a miner that skipped its inner steps) compute other bytes.
    let stale = r.forward(1, &initial[1], ForwardInput::Wire(&a0), batch).unwrap();
    let c = compare(cfg.train.codec, rows, width, &stale, &a1).unwrap();
    assert!(!c.identical && c.rel_l2 > 1e-4, "{c:?}");
    // The gradient of another micro-batch's input (a replayed gradient).
    let (x2, _) = corpus.val_batch(cfg.train.seed, 4, batch, seq);
    let a0_other = r.forward(0, &w[0], ForwardInput::Tokens(&x2), batch).unwrap();
    let g1_other = r.backward(1, &w[1], ForwardInput::Wire(&a0_other), &g2, batch).unwrap().unwrap();
    assert!(!compare(cfg.train.codec, rows, width, &g1_other, &g1).unwrap().identical);
    // A claimed payload that does not even decode is as far off as can be.
    let c = compare(cfg.train.codec, rows, width, &a1[..10], &a1).unwrap();
    assert!(c.rel_l2.is_infinite());

    // Uploads are hostile: wrong sizes are errors, not panics.
    assert!(r.forward(1, &w[1][..10], ForwardInput::Wire(&a0), batch).is_err());
    assert!(r.forward(1, &w[1], ForwardInput::Wire(&a0[..a0.len() - 1]), batch).is_err());
    assert!(r.forward(0, &w[0], ForwardInput::Tokens(&x[..5]), batch).is_err());
    assert!(r.forward(1, &w[1], ForwardInput::Tokens(&x), batch).is_err(), "only the head takes tokens");
    assert!(r.forward(2, &w[2], ForwardInput::Wire(&a1), batch).is_err(), "the tail sends no activations");
    assert!(r.forward(7, &w[1], ForwardInput::Wire(&a0), batch).is_err());
    assert!(r.forward(1, &w[1], ForwardInput::Wire(&a0), 0).is_err());
    assert!(r.tail(2, &w[2], ForwardInput::Wire(&a1), &y[..3], batch).is_err());
}
