//! Inner steps shown and recomputed (`inner_step`): with two micro-batches
//! per step, an honest pathway's bundles show the step each drawn attempt
//! went into, and the validator's recompute reaches the committed weights
//! and optimizer state bit for bit, also where a step's micro-batches were
//! forwarded on different weights; miners that skip their weight
//! gradients, their optimizer steps or (a head) their whole backward
//! commit to what they did, and the recompute names them.

use std::collections::BTreeMap;

use super::*;
use iota_dataplane::inner_step::{StepEvidence, StepKnown, StepLimits, check_step};

/// Micro-batches per inner step in these tests.
pub(super) const ACCUM: usize = 2;
/// Micro-batches trained: two inner steps.
const MBS: u64 = 4;

fn accumulating_config(window: u32) -> RunConfig {
    let mut cfg = run_config();
    cfg.train.grad_accum = ACCUM;
    cfg.spec.micro_batches_per_epoch = MBS;
    cfg.spec.validation.check_inner_steps = true;
    cfg.spec.validation.step_window = window;
    cfg
}

/// Trains `MBS` micro-batches with the head's gradients held back for the
/// first three (so the head's second step accumulates a micro-batch
/// forwarded before its first step and one after), and ends the epoch.
/// `window`: the run's `validation.step_window` (1: every step's optimizer
/// state kept; 8: the first step's only, the second replayed from it).
pub(super) fn trained_with_steps(bad: Option<(usize, Adversary)>, window: u32) -> Swarm {
    let mut s = Swarm::with_config(bad, accumulating_config(window));
    s.hold_grads_to = Some(0);
    for n in 0..3 {
        s.train(n);
    }
    s.release();
    s.train(3);
    let done = s.reports.iter().filter(|(_, k)| matches!(k, pb::report::Kind::BackwardDone(_))).count();
    assert_eq!(done as u64, MBS, "every micro-batch went forward and back");
    s.phase(pb::Phase::Uploading);
    s
}

impl Swarm {
    /// The validator's check of the inner step miner `i`'s bundle for
    /// `mb` shows.
    fn check_step(&self, i: usize, mb: SampledMb, b: &EvidenceBundle) -> Finding {
        let Some(bytes) = b.step.as_deref() else { return Finding::Cheated("no step shown".into()) };
        let ev = match StepEvidence::decode(bytes, self.step_limits(i)) {
            Ok(ev) => ev,
            Err(e) => return Finding::Cheated(format!("{e:#}")),
        };
        self.with_known(i, mb, b, |known| check_step(&Arc::new(CpuBackend::new()), &self.cfg, known, &ev))
    }

    /// Bounds on stage `i`'s shown steps in these tests.
    pub(super) fn step_limits(&self, i: usize) -> StepLimits {
        let stage = StageSpec::split(&self.cfg.train.model, self.cfg.train.stages).unwrap()[i].clone();
        StepLimits {
            weights: ParamLayout::for_stage(&self.cfg.train.model, &stage).total() as u64,
            max_headers: 16,
            max_mbs: ACCUM as u64,
            max_frame: 1 << 24,
            window: 8,
        }
    }

    /// Runs `f` with what a validator knows of miner `i` for the drawn
    /// `mb` whose bundle is `b` (its committed heads, the pathway, the
    /// corpus).
    pub(super) fn with_known<R>(
        &self,
        i: usize,
        mb: SampledMb,
        b: &EvidenceBundle,
        f: impl FnOnce(&StepKnown) -> R,
    ) -> R {
        let upload = self.reports.iter().find_map(|(j, k)| match k {
            pb::report::Kind::UploadDone(u) if *j == i => Some(u.commitments.clone()),
            _ => None,
        });
        let heads = iota_protocol::commitments_pb::from_pb(&upload.expect("an UploadDone")).unwrap();
        let committed = heads.into_iter().find(|h| h.epoch == 0).expect("epoch 0's heads");
        let path: Vec<PeerId> = self.miners.iter().map(|m| m.id).collect();
        let completed: BTreeMap<(u32, u64, u32), Vec<PeerId>> =
            (0..MBS).map(|n| self.mb(n)).map(|m| ((m.shard, m.first_sample, m.attempt), path.clone())).collect();
        let corpus = iota_dataplane::corpus::load_corpus(&self.cfg, None).unwrap();
        let (seed, seq) = (self.cfg.train.seed, self.cfg.train.seq);
        let data = move |shard: u32, index: u64, len: u32| {
            let id = MicroBatchId { first: SampleId { epoch: 0, shard, index }, len };
            Some(corpus.micro_batch(seed, id, seq))
        };
        let ctx = RunContext::new(RUN, FrameLimits::default());
        let neighbours = |d: isize| -> Vec<PeerId> {
            i.checked_add_signed(d).and_then(|j| self.miners.get(j)).map(|m| m.id).into_iter().collect()
        };
        let (up, down) = (neighbours(-1), neighbours(1));
        let known = StepKnown {
            ctx: &ctx,
            miner: self.miners[i].id,
            stage: i as u32,
            steps: &committed.steps,
            previous_steps: None,
            step_hashes: &b.step_hashes,
            epoch_starts: &[weights_hash(&self.miners[i].start)],
            attempt: (mb.shard, mb.first_sample, mb.attempt),
            completed: &completed,
            upstream_miners: &up,
            downstream_miners: &down,
            data: &data,
            tolerance: 0.0,
        };
        f(&known)
    }

    /// Every attempt's evidence from miner `i`, asked with its inner steps.
    pub(super) fn all_evidence(&mut self, i: usize) -> Vec<(SampledMb, EvidenceBundle)> {
        let mbs: Vec<SampledMb> = (0..MBS).map(|n| self.mb(n)).collect();
        self.evidence_showing(i, &mbs, true)
    }
}

#[test]
fn honest_inner_steps_recompute_bit_for_bit_with_mixed_forward_weights() {
    for window in [1, 8] {
        let mut s = trained_with_steps(None, window);
        for stage in 0..3 {
            for (n, (mb, b)) in s.all_evidence(stage).into_iter().enumerate() {
                let limits = StepLimits {
                    weights: b.weights.len() as u64,
                    max_headers: 16,
                    max_mbs: 2,
                    max_frame: 1 << 24,
                    window: 8,
                };
                let ev = StepEvidence::decode(b.step.as_deref().expect("a step shown"), limits).unwrap();
                assert!(!ev.carried, "the first epoch on the stage carries nothing in");
                assert_eq!(ev.headers.len(), 2, "two steps");
                let index = ev.index.expect("every micro-batch went into a step");
                let from = if window == 1 { index } else { 0 };
                assert_eq!(ev.from, from, "window {window}: stage {stage} micro-batch {n} shown from its window");
                assert_eq!(ev.frames.len(), 2 * (index - from + 1) as usize, "every replayed micro-batch's frames");
                if stage == 0 && n >= 2 {
                    // The head's second step: micro-batch 2 forwarded on the
                    // start, 3 after the first step.
                    let h = &ev.headers[1];
                    assert_ne!(h.mbs[0].weights, h.mbs[1].weights, "mixed forward weights");
                    // Alone: its state before, the older one and the one
                    // after; replayed from the first: the start and the end.
                    assert_eq!(ev.weights.len(), if window == 1 { 3 } else { 2 }, "states shown");
                }
                assert_eq!(s.check_step(stage, mb, &b), Finding::Honest, "window {window}: stage {stage} mb {n}");
            }
            // Asked plainly, an attempt's object does not show its steps.
            let plain = s.evidence(stage, &[s.mb(0)]);
            assert!(plain[0].1.step.is_none(), "stage {stage}: steps shown unasked");
        }
    }
}

/// A replay longer than the run's window is refused (a miner must keep
/// the states it would otherwise push onto its validators' compute).
#[test]
fn a_step_shown_from_further_back_than_the_window_fails() {
    let mut s = trained_with_steps(None, 8);
    let (mb, b) = s.all_evidence(1).pop().expect("the last micro-batch");
    s.cfg.spec.validation.step_window = 1;
    let f = s.check_step(1, mb, &b);
    assert!(matches!(&f, Finding::Cheated(w) if w.contains("window of 1")), "{f:?}");
}

#[test]
fn a_step_shown_with_another_optimizer_state_or_an_unsigned_gradient_fails() {
    let mut s = trained_with_steps(None, 8);
    let (mb, b) = s.all_evidence(1).pop().expect("the last micro-batch");
    let limits =
        StepLimits { weights: b.weights.len() as u64, max_headers: 16, max_mbs: 2, max_frame: 1 << 24, window: 8 };
    let ev = StepEvidence::decode(b.step.as_deref().unwrap(), limits).unwrap();
    let with = |ev: StepEvidence| EvidenceBundle { step: Some(ev.encode()), ..b.clone() };
    // Huge second moments make any gradient's update vanish: not the
    // committed state, so refused before any recompute.
    let mut inflated = ev.clone();
    inflated.optimizer.v.iter_mut().for_each(|v| *v = 1e30);
    let f = s.check_step(1, mb, &with(inflated));
    assert!(matches!(&f, Finding::Cheated(w) if w.contains("optimizer state shown")), "{f:?}");
    // A gradient frame signed by the miner itself, not its neighbour.
    let mut forged = ev.clone();
    forged.frames[0].grad_signer = s.miners[1].id.0;
    let f = s.check_step(1, mb, &with(forged));
    assert!(matches!(&f, Finding::Cheated(w) if w.contains("not signed by its pathway's neighbour")), "{f:?}");
    // A record left out of the chain.
    let mut short = ev.clone();
    short.headers.pop();
    let f = s.check_step(1, mb, &with(short));
    assert!(matches!(&f, Finding::Cheated(w) if w.contains("not the committed steps chain")), "{f:?}");
    // Claiming the attempt is in no step.
    let none = StepEvidence { index: None, optimizer: Default::default(), weights: vec![], frames: vec![], ..ev };
    let f = s.check_step(1, mb, &with(none));
    assert!(matches!(&f, Finding::Cheated(w) if w.contains("in a step it did not show")), "{f:?}");
}

#[test]
fn lazy_steps_are_named_by_the_recompute_and_their_honest_neighbours_pass() {
    let cases = [
        (0, Adversary::SkipBackward),
        (0, Adversary::SkipOptimizer),
        (1, Adversary::SkipWeightGrad),
        (2, Adversary::SkipWeightGrad),
    ];
    for (stage, mode) in cases {
        let mut s = trained_with_steps(Some((stage, mode)), 8);
        for (n, (mb, b)) in s.all_evidence(stage).into_iter().enumerate() {
            // What it sent and shows of the attempt itself is honest work.
            if stage < 2 {
                let forward = s.check(stage, mb, &b);
                assert_eq!(forward, Finding::Honest, "{mode:?} at {stage}, micro-batch {n}: its frames");
            }
            match s.check_step(stage, mb, &b) {
                Finding::Cheated(why) => assert!(why.contains("recomputed, the step"), "{mode:?}: {why}"),
                Finding::Honest => panic!("{mode:?} at stage {stage}, micro-batch {n}: not caught"),
            }
        }
        for other in (0..3).filter(|o| *o != stage) {
            for (mb, b) in s.all_evidence(other) {
                assert_eq!(s.check_step(other, mb, &b), Finding::Honest, "{mode:?}: honest stage {other}");
            }
        }
    }
}
