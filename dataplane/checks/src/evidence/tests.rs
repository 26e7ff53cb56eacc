//! The checks of a middle stage's backward (`check_backward`), link by link.

use std::sync::Arc;

use iota_core::commitment::{Chain, EpochHeads};
use iota_core::merge::{OuterOpt, ReduceRule};
use iota_core::{Identity, ModelConfig, Rng, StageSpec};
use iota_model::data::TokenizerKind;
use iota_model::optim::{AdamWConfig, LrSchedule};
use iota_model::train::TrainConfig;
use iota_model::{CpuBackend, Stage, codec};
use iota_wire::{MergeSpec, RunSpec};

use super::*;
use crate::frame::{FrameLimits, FrameMeta, build_header, prefix_bytes};

const RUN: u64 = 99;
const BATCH: usize = 2;
const SEQ: usize = 16;
const CODEC: WireCodec = WireCodec::Int8Row;

fn run_config() -> iota_wire::RunConfig {
    let train = TrainConfig {
        model: ModelConfig::preset("tiny").unwrap(),
        tokenizer: TokenizerKind::Byte,
        stages: 3,
        batch: BATCH,
        seq: SEQ,
        grad_accum: 1,
        steps: 10,
        schedule: LrSchedule { peak: 3e-3, warmup: 1, total: 10, min_ratio: 0.1 },
        adamw: AdamWConfig::default(),
        codec: CODEC,
        seed: 11,
    };
    iota_wire::RunConfig {
        spec: RunSpec {
            run_id: RUN,
            stages: 3,
            micro_batches_per_epoch: 4,
            batch: BATCH as u32,
            max_in_flight: 2,
            route_timeout_ms: 5_000,
            heartbeat_timeout_ms: 3_000,
            max_attempts: 4,
            phase_timeout_ms: 20_000,
            merge: MergeSpec { rule: ReduceRule::Mean, outer: OuterOpt::AVERAGE, ..Default::default() },
            ..RunSpec::default()
        },
        train,
        max_shards: 1,
        val_fraction: 0.02,
        corpus: None,
        store: Default::default(),
        corpus_in_store: false,
    }
}

/// A whole signed frame, as its sender's endpoint writes it.
fn signed(id: &Identity, direction: Direction, mb: SampledMb, shape: [u32; 2], answers: [u8; 32], p: &[u8]) -> Vec<u8> {
    let meta = FrameMeta {
        direction,
        codec: CODEC,
        stage: 1,
        epoch: mb.epoch as u32,
        shard: mb.shard,
        first_sample: mb.first_sample,
        samples: mb.samples,
        attempt: mb.attempt,
        shape: shape.to_vec(),
        answers,
    };
    let h = build_header(&meta, RUN, 5, p, id);
    let mut v = prefix_bytes(&h);
    v.extend_from_slice(p);
    v
}

fn id_of(frame: &[u8], from: &Identity) -> [u8; 32] {
    decode_frame(frame, &RunContext::new(RUN, FrameLimits::default()), from.peer_id()).unwrap().0.frame_id()
}

/// An honest middle stage's evidence for one attempt whose backward ran
/// on the weights after an inner step (`w_b`), not its forward's (`w_f`).
struct Middle {
    r: Recompute<CpuBackend>,
    up: Identity,
    miner: Identity,
    down: Identity,
    mb: SampledMb,
    shape: [u32; 2],
    w_f: Vec<f32>,
    w_b: Vec<f32>,
    hashes: Vec<[u8; 32]>,
    committed: EpochHeads,
    input: Vec<u8>,
    input_payload: Vec<u8>,
    output: Vec<u8>,
    received: Vec<u8>,
    received_payload: Vec<u8>,
    sent: Vec<u8>,
}

fn middle() -> Middle {
    let cfg = run_config();
    let be = Arc::new(CpuBackend::new());
    let spec = StageSpec::split(&cfg.train.model, 3).unwrap()[1].clone();
    let width = spec.boundary_width;
    let w_f = Stage::new(be.clone(), &cfg.train.model, spec, cfg.train.seed).params_host();
    let w_b: Vec<f32> = w_f.iter().enumerate().map(|(i, w)| w * 0.97 + if i % 2 == 0 { 1e-3 } else { -1e-3 }).collect();
    let hashes = vec![weights_hash(&w_b), [9; 32]];
    let committed = EpochHeads { epoch: 0, weights: Chain::of(&hashes), ..Default::default() };
    let rows = BATCH * SEQ;
    let shape = [rows as u32, width as u32];
    let mb = SampledMb { epoch: 0, shard: 2, first_sample: 8, samples: BATCH as u32, attempt: 0 };
    let (up, miner, down) = (Identity::from_seed([1; 32]), Identity::from_seed([2; 32]), Identity::from_seed([3; 32]));
    let mut rng = Rng::new(3);
    let x: Vec<f32> = (0..rows * width).map(|_| rng.normal()).collect();
    let input_payload = codec::encode(CODEC, rows, width, &x).unwrap();
    let input = signed(&up, Direction::Activation, mb, shape, [4; 32], &input_payload);
    let r = Recompute::new(be, cfg).unwrap();
    let out = r.forward(1, &w_f, ForwardInput::Wire(&input_payload), BATCH).unwrap();
    let output = signed(&miner, Direction::Activation, mb, shape, id_of(&input, &up), &out);
    let g: Vec<f32> = (0..rows * width).map(|_| rng.normal() * 1e-2).collect();
    let received_payload = codec::encode(CODEC, rows, width, &g).unwrap();
    let received = signed(&down, Direction::ActivationGrad, mb, shape, id_of(&output, &miner), &received_payload);
    let din =
        r.backward_after(1, &w_f, &w_b, ForwardInput::Wire(&input_payload), &received_payload, BATCH).unwrap().unwrap();
    let sent = signed(&miner, Direction::ActivationGrad, mb, shape, id_of(&input, &up), &din);
    Middle {
        r,
        up,
        miner,
        down,
        mb,
        shape,
        w_f,
        w_b,
        hashes,
        committed,
        input,
        input_payload,
        output,
        received,
        received_payload,
        sent,
    }
}

impl Middle {
    fn check(&self, received: &[u8], sent: &[u8], w_b: &[f32]) -> Finding {
        self.check_with(received, sent, w_b, Some(self.down.peer_id()))
    }

    fn check_with(&self, received: &[u8], sent: &[u8], w_b: &[f32], downstream: Option<PeerId>) -> Finding {
        let ctx = RunContext::new(RUN, FrameLimits::default());
        let k = Known {
            ctx: &ctx,
            miner: self.miner.peer_id(),
            stage: 1,
            upstream: Some(self.up.peer_id()),
            downstream,
            tokens: None,
            committed: &self.committed,
            epoch_starts: &[weights_hash(&self.w_f)],
            codec: CODEC,
            tolerance: 0.0,
        };
        let forward = ForwardEvidence {
            input_frame: Some(&self.input),
            output_frame: &self.output,
            weights: &self.w_f,
            step_hashes: &self.hashes,
        };
        assert_eq!(check_forward(&self.r, &k, self.mb, forward), Finding::Honest, "the forward is honest");
        let ev = BackwardEvidence { forward, received_grad: received, sent_grad: sent, weights: w_b };
        check_backward(&self.r, &k, self.mb, ev)
    }

    /// The sent gradient, signed by the miner, with other values.
    fn sent_with(&self, f: impl Fn(usize, f32) -> f32) -> Vec<u8> {
        let (rows, width) = (self.shape[0] as usize, self.shape[1] as usize);
        let (_, p) =
            decode_frame(&self.sent, &RunContext::new(RUN, FrameLimits::default()), self.miner.peer_id()).unwrap();
        let v: Vec<f32> =
            codec::decode(CODEC, rows, width, p).unwrap().iter().enumerate().map(|(i, x)| f(i, *x)).collect();
        let answers = id_of(&self.input, &self.up);
        signed(
            &self.miner,
            Direction::ActivationGrad,
            self.mb,
            self.shape,
            answers,
            &codec::encode(CODEC, rows, width, &v).unwrap(),
        )
    }
}

#[track_caller]
fn cheated(f: Finding, why: &str) {
    match f {
        Finding::Cheated(w) => assert!(w.contains(why), "{w:?} should say {why:?}"),
        Finding::Honest => panic!("not caught: {why}"),
    }
}

#[test]
fn an_honest_middle_backward_passes_bit_for_bit() {
    let m = middle();
    assert_eq!(m.check(&m.received, &m.sent, &m.w_b), Finding::Honest);
    // A backward on the forward's own weights (no step between).
    let din =
        m.r.backward(1, &m.w_f, ForwardInput::Wire(&m.input_payload), &m.received_payload, BATCH).unwrap().unwrap();
    let same = signed(&m.miner, Direction::ActivationGrad, m.mb, m.shape, id_of(&m.input, &m.up), &din);
    assert_ne!(same, m.sent, "the step changes the upstream gradient");
    assert_eq!(m.check(&m.received, &same, &m.w_f), Finding::Honest);
    // Each claimed with the other's weights is caught.
    cheated(m.check(&m.received, &same, &m.w_b), "recomputed upstream gradient differs: max |d|");
    cheated(m.check(&m.received, &m.sent, &m.w_f), "recomputed upstream gradient differs");
}

#[test]
fn a_tampered_upstream_gradient_fails_the_recompute() {
    let m = middle();
    let noisy = m.sent_with(|i, x| x * if i % 3 == 0 { 1.1 } else { 0.95 });
    match m.check(&m.received, &noisy, &m.w_b) {
        Finding::Cheated(why) => {
            assert!(why.starts_with("recomputed upstream gradient differs: max |d| "), "{why}");
            assert!(why.contains(", relative L2 "), "{why}");
        }
        Finding::Honest => panic!("noise not caught"),
    }
    cheated(m.check(&m.received, &m.sent_with(|_, _| 0.0), &m.w_b), "upstream gradient differs");
    // The gradient of another received gradient (a replay of another
    // micro-batch's, re-labelled) is not this one's.
    let other: Vec<u8> = {
        let (rows, width) = (m.shape[0] as usize, m.shape[1] as usize);
        let g: Vec<f32> = (0..rows * width).map(|i| ((i % 7) as f32 - 3.0) * 1e-3).collect();
        let p = codec::encode(CODEC, rows, width, &g).unwrap();
        let din = m.r.backward_after(1, &m.w_f, &m.w_b, ForwardInput::Wire(&m.input_payload), &p, BATCH);
        let answers = id_of(&m.input, &m.up);
        signed(&m.miner, Direction::ActivationGrad, m.mb, m.shape, answers, &din.unwrap().unwrap())
    };
    cheated(m.check(&m.received, &other, &m.w_b), "upstream gradient differs");
    // Weights it never committed to, for the backward.
    let lazy: Vec<f32> = m.w_b.iter().map(|w| w * 0.5).collect();
    cheated(m.check(&m.received, &m.sent, &lazy), "the backward's weights are not ones it committed to");
    cheated(m.check(&m.received, &m.sent, &m.w_b[..10]), "the backward's weights");
}

#[test]
fn the_received_gradient_must_come_from_downstream_for_this_attempt_and_output() {
    let m = middle();
    let output_id = id_of(&m.output, &m.miner);
    let g = |id: &Identity, d: Direction, mb: SampledMb, answers: [u8; 32]| {
        signed(id, d, mb, m.shape, answers, &m.received_payload)
    };
    let ag = Direction::ActivationGrad;
    // Signed by someone other than the pathway's next stage: its
    // upstream, the miner itself.
    cheated(m.check(&g(&m.up, ag, m.mb, output_id), &m.sent, &m.w_b), "received gradient frame");
    cheated(m.check(&g(&m.miner, ag, m.mb, output_id), &m.sent, &m.w_b), "received gradient frame");
    // For another attempt, or another micro-batch.
    let other = SampledMb { attempt: 1, ..m.mb };
    cheated(m.check(&g(&m.down, ag, other, output_id), &m.sent, &m.w_b), "not the sampled micro-batch's gradient");
    let other = SampledMb { first_sample: 16, ..m.mb };
    cheated(m.check(&g(&m.down, ag, other, output_id), &m.sent, &m.w_b), "not the sampled micro-batch's gradient");
    // An activation, not a gradient.
    let act = g(&m.down, Direction::Activation, m.mb, output_id);
    cheated(m.check(&act, &m.sent, &m.w_b), "not the sampled micro-batch's gradient");
    // Answering a frame other than the miner's output.
    cheated(m.check(&g(&m.down, ag, m.mb, [7; 32]), &m.sent, &m.w_b), "does not answer the output frame");
    let input_id = id_of(&m.input, &m.up);
    cheated(m.check(&g(&m.down, ag, m.mb, input_id), &m.sent, &m.w_b), "does not answer the output frame");
    // Garbage and truncation: refused, no panic.
    cheated(m.check(&m.received[..m.received.len() - 1], &m.sent, &m.w_b), "received gradient frame");
    cheated(m.check(&[], &m.sent, &m.w_b), "received gradient frame");
    cheated(m.check(&[0xff; 64], &m.sent, &m.w_b), "received gradient frame");
    // Not a middle stage: no downstream neighbour.
    cheated(m.check_with(&m.received, &m.sent, &m.w_b, None), "only a middle stage's backward");
}

#[test]
fn the_sent_gradient_must_be_the_miners_for_this_attempt_and_answer_its_input() {
    let m = middle();
    let (_, p) = decode_frame(&m.sent, &RunContext::new(RUN, FrameLimits::default()), m.miner.peer_id()).unwrap();
    let s = |id: &Identity, d: Direction, mb: SampledMb, answers: [u8; 32]| signed(id, d, mb, m.shape, answers, p);
    let (ag, input_id) = (Direction::ActivationGrad, id_of(&m.input, &m.up));
    assert_eq!(m.check(&m.received, &s(&m.miner, ag, m.mb, input_id), &m.w_b), Finding::Honest);
    // Answering another frame: the output, the received gradient, junk.
    for answers in [id_of(&m.output, &m.miner), id_of(&m.received, &m.down), [0; 32]] {
        let f = m.check(&m.received, &s(&m.miner, ag, m.mb, answers), &m.w_b);
        cheated(f, "the sent gradient does not answer the input frame");
    }
    // Another attempt's, or not signed by the miner.
    let other = SampledMb { attempt: 2, ..m.mb };
    cheated(m.check(&m.received, &s(&m.miner, ag, other, input_id), &m.w_b), "the sent gradient frame is not");
    cheated(m.check(&m.received, &s(&m.down, ag, m.mb, input_id), &m.w_b), "sent gradient frame");
    cheated(m.check(&m.received, &s(&m.miner, Direction::Activation, m.mb, input_id), &m.w_b), "is not the sampled");
    cheated(m.check(&m.received, &m.sent[..m.sent.len() / 2], &m.w_b), "sent gradient frame");
}
