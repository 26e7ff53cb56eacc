//! A failed inner step proven (`inner_step::prove`): a lazy miner that
//! answers with a trace bound to what it committed is narrowed to one
//! leaf or one segment's squared norm, and a referee holding only the
//! miner's committed chain re-checks it; an honest miner's trace agrees
//! with the validator's, so nothing is proven against it.

use iota_core::ParamLayout;
use iota_dataplane::hashes::weights_leaves;
use iota_dataplane::inner_step::StepEvidence;
use iota_dataplane::inner_step::proof_bytes::ProofLimits;
use iota_dataplane::inner_step::prove::{Dispute, StepProof, prove_step, trace_shown_step, verify_step_proof};
use iota_dataplane::inner_step::step_trace::{KeptBefore, StepTrace};
use iota_model::Stage;
use iota_model::optim::AdamW;

use super::steps::trained_with_steps;
use super::*;

/// What miner `stage` in `mode` answers a trace ask for step `j` with, as
/// a miner that means its trace to bind: the micro-batches as it ran them
/// (honestly, which its neighbours checked), and the optimizer step as it
/// ran it: on nothing (`SkipWeightGrad`, `SkipBackward`), or not at all
/// (`SkipOptimizer`, which claims a gradient norm that skips a step).
fn lazy_trace(s: &Swarm, stage: usize, mode: Option<Adversary>, honest: StepTrace, kept: &KeptBefore) -> StepTrace {
    let Some(mode) = mode else { return honest };
    let spec = StageSpec::split(&s.cfg.train.model, s.cfg.train.stages).unwrap()[stage].clone();
    let be = Arc::new(CpuBackend::new());
    let mut st = Stage::with_params(be.clone(), &s.cfg.train.model, spec, &kept.weights).unwrap();
    let mut opt = AdamW::<CpuBackend> { m: kept.m.clone(), v: kept.v.clone(), t: honest.t_before };
    let mut t = honest;
    if mode == Adversary::SkipOptimizer {
        t.sum_squares.iter_mut().for_each(|x| *x = f64::NAN);
    } else {
        st.set_grads(&vec![0.0; kept.grads.len()]).unwrap();
        opt.step(&mut st, &s.cfg.train.adamw, s.cfg.train.schedule.at(t.step));
    }
    t.w_after = weights_leaves(&st.params_host());
    (t.m_after, t.v_after) = (weights_leaves(&opt.m), weights_leaves(&opt.v));
    t
}

#[test]
fn a_lazy_step_is_proven_and_the_proof_re_checked_by_a_referee() {
    let cases = [
        (0, Some(Adversary::SkipBackward)),
        (0, Some(Adversary::SkipOptimizer)),
        (1, Some(Adversary::SkipWeightGrad)),
        (2, Some(Adversary::SkipWeightGrad)),
        (1, None),
    ];
    for (stage, mode) in cases {
        let mut s = trained_with_steps(mode.map(|m| (stage, m)), 8);
        let (mb, b) = s.all_evidence(stage).pop().expect("the last micro-batch");
        let ev = StepEvidence::decode(b.step.as_deref().unwrap(), s.step_limits(stage)).unwrap();
        let j = ev.from;
        let id = Identity::from_seed([stage as u8 + 1; 32]);
        let be = Arc::new(CpuBackend::new());
        let n = ParamLayout::for_stage(&s.cfg.train.model, &StageSpec::split(&s.cfg.train.model, 3).unwrap()[stage])
            .total() as u64;
        s.with_known(stage, mb, &b, |known| {
            // The miner's side: its own replay of the step, traced.
            let (honest, kept) = trace_shown_step(&be, &s.cfg, known, &ev, j).unwrap();
            let theirs = lazy_trace(&s, stage, mode, honest, &kept);
            let own = &ev.headers[usize::from(ev.carried)..];
            theirs.bind(&own[j as usize], n).unwrap_or_else(|e| panic!("{mode:?}: the lazy trace binds: {e:#}"));
            let sig = id.sign(&theirs.signing_digest(RUN, 0, stage as u32, &known.miner.0));
            let bytes = theirs.encode();
            // The validator's side.
            let proof = prove_step(&be, &s.cfg, (known, 0), &ev, j, (&bytes, sig)).unwrap();
            let Some(mode) = mode else {
                assert!(proof.is_none(), "nothing is proven against an honest miner");
                let mut forged = sig;
                forged[0] ^= 1;
                assert!(prove_step(&be, &s.cfg, (known, 0), &ev, j, (&bytes, forged)).is_err(), "an unsigned trace");
                return;
            };
            let proof = proof.unwrap_or_else(|| panic!("{mode:?} at {stage}: proven"));
            let kind = match &proof.dispute {
                Dispute::Norm(_) => "norm",
                Dispute::Leaf(_) => "leaf",
                Dispute::Segment { .. } => "segment",
            };
            let want = if mode == Adversary::SkipOptimizer { "norm" } else { "leaf" };
            assert_eq!(kind, want, "{mode:?} at {stage}");
            // On the wire and back, as a verdict carries it.
            let limits = ProofLimits {
                weights: n,
                activations: 1 << 20,
                max_headers: 16,
                max_mbs: 2,
                max_frame: 1 << 24,
                max_trace: 1 << 20,
            };
            assert_eq!(StepProof::decode(&proof.encode(), limits).unwrap(), proof, "{mode:?}: its bytes");
            // The referee's side: what it holds of the miner is its
            // committed chain; the proof holds.
            assert!(verify_step_proof(&be, &s.cfg, known, &proof).unwrap(), "{mode:?} at {stage}: the proof holds");
            let mut other = proof.clone();
            other.headers.pop();
            assert!(verify_step_proof(&be, &s.cfg, known, &other).is_err(), "records not the committed chain");
            let mut other = proof.clone();
            other.signature[5] ^= 1;
            assert!(verify_step_proof(&be, &s.cfg, known, &other).is_err(), "a signature not the miner's");
        });
    }
}

/// The same lazy miner answering with its micro-batches as it ran them
/// (no weight gradients): narrowed to a segment of one micro-batch, whose
/// frames the referee checks against its neighbours' signatures.
#[test]
fn skipped_weight_gradients_traced_as_run_are_proven_at_one_segment() {
    let stage = 1;
    let mut s = trained_with_steps(Some((stage, Adversary::SkipWeightGrad)), 8);
    let (mb, b) = s.all_evidence(stage).pop().expect("the last micro-batch");
    let ev = StepEvidence::decode(b.step.as_deref().unwrap(), s.step_limits(stage)).unwrap();
    let j = ev.from;
    let id = Identity::from_seed([stage as u8 + 1; 32]);
    let be = Arc::new(CpuBackend::new());
    s.with_known(stage, mb, &b, |known| {
        let (honest, kept) = trace_shown_step(&be, &s.cfg, known, &ev, j).unwrap();
        let mut theirs = lazy_trace(&s, stage, Some(Adversary::SkipWeightGrad), honest, &kept);
        // Its gradients never accumulated: every segment's stays zero.
        let spec = StageSpec::split(&s.cfg.train.model, 3).unwrap()[stage].clone();
        let layout = ParamLayout::for_stage(&s.cfg.train.model, &spec);
        for t in &mut theirs.mbs {
            for (k, seg) in iota_model::segments_of(&layout, &spec).iter().enumerate() {
                t.grads[k] = weights_hash(&vec![0.0; seg.params.len()]);
            }
        }
        theirs.sum_squares.iter_mut().for_each(|x| *x = 0.0);
        let sig = id.sign(&theirs.signing_digest(RUN, 0, stage as u32, &known.miner.0));
        let proof = prove_step(&be, &s.cfg, (known, 0), &ev, j, (&theirs.encode(), sig)).unwrap().expect("proven");
        let Dispute::Segment { proof: seg, .. } = &proof.dispute else {
            panic!("a segment dispute: {:?}", proof.dispute)
        };
        assert!(seg.at.backward && seg.at.mb == 0, "{:?}", seg.at);
        assert!(verify_step_proof(&be, &s.cfg, known, &proof).unwrap(), "the segment proof holds");
        let mut other = proof.clone();
        if let Dispute::Segment { frames, .. } = &mut other.dispute {
            frames.grad_signer = s.miners[stage].id.0;
        }
        assert!(verify_step_proof(&be, &s.cfg, known, &other).is_err(), "a gradient frame not its neighbour's");
    });
}

/// The miner answers a trace ask itself (`WorkRef.trace_step`): it replays
/// the step, signs the trace and stores it under the trace key. A lazy
/// miner's trace shows the optimizer step it ran (so it binds to what it
/// committed) and the validator's proof holds; an honest miner's trace is
/// the validator's own, and nothing is proven.
#[test]
fn a_miner_answers_a_trace_ask_and_a_lazy_ones_answer_proves_it() {
    use iota_dataplane::inner_step::prove::split_trace_object;
    use iota_protocol::store_keys::trace_evidence_key;
    let cases = [(0, Some(Adversary::SkipOptimizer)), (1, Some(Adversary::SkipWeightGrad)), (2, None)];
    for (stage, mode) in cases {
        let mut s = trained_with_steps(mode.map(|m| (stage, m)), 8);
        s.miners[stage].w.set_signer(Arc::new(Identity::from_seed([stage as u8 + 1; 32])));
        let (mb, b) = s.all_evidence(stage).pop().expect("the last micro-batch");
        let ev = StepEvidence::decode(b.step.as_deref().unwrap(), s.step_limits(stage)).unwrap();
        let j = ev.from;
        let item = pb::WorkRef {
            shard: mb.shard,
            first_sample: mb.first_sample,
            attempt: mb.attempt,
            inner_step: true,
            trace_step: j + 1,
        };
        let from = s.reports.len();
        s.command(stage, pb::command::Kind::EvidenceRequest(pb::EvidenceRequest { epoch: 0, items: vec![item] }));
        let key = trace_evidence_key(0, &s.miners[stage].id, (mb.shard, mb.first_sample, mb.attempt), j);
        let announced = s.reports[from..].iter().any(|(i, k)| {
            matches!(k, pb::report::Kind::Stored(st) if *i == stage && st.object.as_ref().is_some_and(|o| o.key == key))
        });
        assert!(announced, "{mode:?} at {stage}: the trace is announced under its key");
        let object = s.rt.block_on(s.store.get(&key)).unwrap();
        let (trace, sig) = split_trace_object(&object).expect("a trace object");
        let be = Arc::new(CpuBackend::new());
        s.with_known(stage, mb, &b, |known| {
            let proof = prove_step(&be, &s.cfg, (known, 0), &ev, j, (trace, sig)).unwrap();
            match mode {
                None => assert!(proof.is_none(), "an honest miner's trace is the validator's"),
                Some(m) => {
                    let p = proof.unwrap_or_else(|| panic!("{m:?}: proven"));
                    assert!(verify_step_proof(&be, &s.cfg, known, &p).unwrap(), "{m:?}: the proof holds");
                }
            }
        });
    }
}
