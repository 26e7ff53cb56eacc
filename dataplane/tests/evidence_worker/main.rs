//! The miner side of sampled recompute, in process: three stage workers
//! (head, middle, tail) on real endpoints train a few micro-batches of
//! `tiny`, then answer an `EvidenceRequest`. The bundles they upload pass
//! the validator's `evidence::check_forward` (and the middle stage's
//! `evidence::check_backward`) when they are honest, and the activations
//! of a `Noise` head and the upstream gradients of a `GradNoise` middle
//! stage fail them on the recompute.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use iota_core::merge::ReduceRule;
use iota_core::wire::Direction;
use iota_core::{Identity, MicroBatchId, ModelConfig, ParamLayout, PeerId, SampleId, StageSpec, WireCodec};
use iota_dataplane::evidence::{
    Finding, ForwardEvidence, Known, SampledMb, check_backward, check_forward, check_head_answer,
};
use iota_dataplane::evidence_bundle::{BundleLimits, EvidenceBundle};
use iota_dataplane::fileio::FileIo;
use iota_dataplane::frame::{self, FrameLimits, RunContext};
use iota_dataplane::local_store::LocalDirStore;
use iota_dataplane::miner::Adversary;
use iota_dataplane::miner::events::{Input, Output};
use iota_dataplane::miner::worker::{Worker, tokens_hash, weights_hash};
use iota_dataplane::recompute::Recompute;
use iota_dataplane::sent_frames::TapLimits;
use iota_dataplane::{Endpoint, HostPool, PeerDirectory, TransportConfig};
use iota_model::CpuBackend;
use iota_model::data::TokenizerKind;
use iota_model::optim::{AdamWConfig, LrSchedule};
use iota_model::train::TrainConfig;
use iota_protocol::store_keys::{evidence_key, step_evidence_key};
use iota_protocol::{MergeMethod, MergeSpec, RunConfig, RunSpec, SharedStore, StoredObject, pb};

mod lifecycle;
mod step_proofs;
mod steps;

const RUN: u64 = 99;
const BATCH: usize = 2;
/// Micro-batches trained: one inner step after each (grad_accum 1).
const MICRO_BATCHES: u64 = 3;

fn run_config() -> RunConfig {
    let model = ModelConfig::preset("tiny").unwrap();
    let (stages, seq) = (3u32, 32usize);
    let train = TrainConfig {
        model,
        tokenizer: TokenizerKind::Byte,
        stages: stages as usize,
        batch: BATCH,
        seq,
        grad_accum: 1,
        steps: 10,
        schedule: LrSchedule { peak: 3e-3, warmup: 1, total: 10, min_ratio: 0.1 },
        adamw: AdamWConfig::default(),
        codec: WireCodec::Int8Row,
        seed: 11,
    };
    let mut cfg = RunConfig {
        spec: RunSpec {
            run_id: RUN,
            stages,
            micro_batches_per_epoch: MICRO_BATCHES,
            batch: BATCH as u32,
            n_shards: 0,
            max_in_flight: 2,
            route_timeout_ms: 5_000,
            heartbeat_timeout_ms: 3_000,
            max_attempts: 4,
            phase_timeout_ms: 20_000,
            merge: MergeSpec {
                method: MergeMethod::Butterfly,
                rule: ReduceRule::CenteredClip { tau_factor: 2.0, iters: 3 },
                ..MergeSpec::default()
            },
            ..RunSpec::default()
        },
        train,
        max_shards: 16,
        val_fraction: 0.02,
        corpus: None,
        store: Default::default(),
        corpus_in_store: false,
    };
    cfg.spec.merge.stage_params = StageSpec::split(&cfg.train.model, stages as usize)
        .unwrap()
        .iter()
        .map(|s| ParamLayout::for_stage(&cfg.train.model, s).total() as u64)
        .collect();
    // Miners keep per-step weights evidence only for a run that has
    // validators; these tests play the validator's part.
    cfg.spec.validation.validators =
        vec![iota_protocol::run_spec::ValidatorStake { peer: iota_core::PeerId([0x7a; 32]), stake: 1 }];
    iota_dataplane::corpus::fix_shards(&mut cfg, None).unwrap();
    cfg
}

struct Miner {
    w: Worker,
    ep: Endpoint,
    id: PeerId,
    /// The weights it started the epoch from.
    start: Vec<f32>,
}

/// A swarm of one pathway, driven frame by frame from this thread.
struct Swarm {
    rt: tokio::runtime::Runtime,
    cfg: RunConfig,
    store: SharedStore,
    miners: Vec<Miner>,
    reports: Vec<(usize, pb::report::Kind)>,
    /// Gradient frames to this miner are held back (in `held`) until
    /// `release`, so that micro-batches overlap at it.
    hold_grads_to: Option<usize>,
    held: Vec<(usize, Output)>,
    _dir: tempfile::TempDir,
}

impl Swarm {
    /// A pathway of honest miners but for `bad`: (stage, mode).
    fn new(bad: Option<(usize, Adversary)>) -> Swarm {
        Swarm::with_config(bad, run_config())
    }

    fn with_config(bad: Option<(usize, Adversary)>, cfg: RunConfig) -> Swarm {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let store = {
            let _g = rt.enter();
            LocalDirStore::shared(dir.path(), FileIo::start(true)).unwrap()
        };
        let be = Arc::new(CpuBackend::new());
        let mut miners = Vec::new();
        for stage in 0..cfg.spec.stages {
            let _g = rt.enter();
            let id = Identity::from_seed([stage as u8 + 1; 32]);
            let me = id.peer_id();
            let ctx = Arc::new(RunContext::new(RUN, FrameLimits::default()));
            let peers = PeerDirectory::new();
            let cfg_t = TransportConfig::default();
            let ep = Endpoint::bind(
                "127.0.0.1:0".parse().unwrap(),
                id,
                peers.clone(),
                ctx.clone(),
                HostPool::new(64 << 20),
                cfg_t,
            )
            .unwrap();
            let mut w = Worker::new(be.clone(), me, cfg.clone(), None, store.clone(), rt.handle().clone(), peers, ctx);
            w.set_evidence(
                ep.tap_sent_frames(TapLimits::default()),
                iota_dataplane::miner::evidence_log::EvidenceLog::new(64 << 20),
            );
            w.set_adversary(bad.filter(|(s, _)| *s == stage as usize).map(|(_, a)| a));
            miners.push(Miner { w, ep, id: me, start: Vec::new() });
        }
        let mut s =
            Swarm { rt, cfg, store, miners, reports: Vec::new(), hold_grads_to: None, held: Vec::new(), _dir: dir };
        let peers: Vec<pb::PeerInfo> = s
            .miners
            .iter()
            .enumerate()
            .map(|(i, m)| pb::PeerInfo {
                peer_id: m.id.0.to_vec(),
                data_addr: m.ep.local_addr().unwrap().to_string(),
                stage: i as u32,
            })
            .collect();
        let stages = s.cfg.spec.stages;
        for i in 0..s.miners.len() {
            let a = pb::Assignment { stage: i as u32, num_stages: stages, peers: peers.clone(), ..Default::default() };
            s.command(i, pb::command::Kind::Assign(a));
            s.miners[i].start = s.miners[i].w.stage().unwrap().params_host();
        }
        s.phase(pb::Phase::Training);
        s
    }

    fn command(&mut self, i: usize, k: pb::command::Kind) {
        let mut out = Vec::new();
        self.miners[i].w.handle(Input::Command(k), &mut out).unwrap();
        self.pump(i, out);
    }

    fn phase(&mut self, phase: pb::Phase) {
        for i in 0..self.miners.len() {
            let p = pb::PhaseChange { epoch: 0, phase: phase as i32, ..Default::default() };
            self.command(i, pb::command::Kind::Phase(p));
        }
    }

    /// Carries frames between the workers until none is left; keeps reports.
    fn pump(&mut self, from: usize, out: Vec<Output>) {
        let mut queue: VecDeque<(usize, Output)> = out.into_iter().map(|o| (from, o)).collect();
        while let Some((i, o)) = queue.pop_front() {
            let hold = self.hold_grads_to.map(|h| self.miners[h].id);
            if matches!(&o, Output::Frame { to, meta, .. } if meta.direction == Direction::ActivationGrad && Some(*to) == hold)
            {
                self.held.push((i, o));
                continue;
            }
            let (to, meta, payload, shown) = match o {
                Output::Frame { to, meta, payload, .. } => (to, meta, payload, None),
                Output::FabricatedFrame { to, meta, wire, shown } => (to, meta, wire, Some(shown)),
                Output::Report(k) => {
                    self.reports.push((i, k));
                    continue;
                }
                Output::Store { key, .. } | Output::StoreRaw { key, .. } => {
                    panic!("a training step stored {key}: only merge audits do")
                }
            };
            {
                {
                    self.rt.block_on(self.miners[i].ep.send_showing(to, &meta, payload, shown)).unwrap();
                    let j = self.miners.iter().position(|m| m.id == to).unwrap();
                    let ep = &self.miners[j].ep;
                    let recv = async { tokio::time::timeout(Duration::from_secs(10), ep.recv()).await };
                    let f = self.rt.block_on(recv).unwrap().unwrap();
                    let mut out = Vec::new();
                    self.miners[j].w.handle(Input::Frame(Box::new(f)), &mut out).unwrap();
                    queue.extend(out.into_iter().map(|o| (j, o)));
                }
            }
        }
    }

    /// Delivers the held gradient frames, in the order they were sent.
    fn release(&mut self) {
        self.hold_grads_to = None;
        for (i, o) in std::mem::take(&mut self.held) {
            self.pump(i, vec![o]);
        }
    }

    fn pathway(&self) -> Vec<Vec<u8>> {
        self.miners.iter().map(|m| m.id.0.to_vec()).collect()
    }

    fn mb(&self, n: u64) -> SampledMb {
        SampledMb { epoch: 0, shard: 1, first_sample: n * BATCH as u64, samples: BATCH as u32, attempt: 0 }
    }

    /// Routes micro-batch `n` along the pathway and runs it to the end.
    fn train(&mut self, n: u64) {
        self.train_in(0, n);
    }

    /// `train` in run epoch `epoch`.
    fn train_in(&mut self, epoch: u64, n: u64) {
        let mb = self.mb(n);
        let r = pb::Route {
            epoch,
            shard: mb.shard,
            first_sample: mb.first_sample,
            samples: mb.samples,
            attempt: 0,
            pathway: self.pathway(),
            ..Default::default()
        };
        // Downstream first, so no frame waits for its route.
        for i in (0..self.miners.len()).rev() {
            self.command(i, pb::command::Kind::Route(r.clone()));
        }
    }

    /// Asks miner `i` for the evidence of `mbs`; returns what it announced
    /// and stored, checked against the announcement.
    fn evidence(&mut self, i: usize, mbs: &[SampledMb]) -> Vec<(SampledMb, EvidenceBundle)> {
        self.evidence_showing(i, mbs, false)
    }

    /// `evidence`, each attempt asked with its inner steps where `steps`.
    fn evidence_showing(&mut self, i: usize, mbs: &[SampledMb], steps: bool) -> Vec<(SampledMb, EvidenceBundle)> {
        let items = mbs
            .iter()
            .map(|m| pb::WorkRef {
                shard: m.shard,
                first_sample: m.first_sample,
                attempt: m.attempt,
                inner_step: steps,
                trace_step: 0,
            })
            .collect();
        let from = self.reports.len();
        self.command(i, pb::command::Kind::EvidenceRequest(pb::EvidenceRequest { epoch: 0, items }));
        let stored: Vec<pb::StoredObject> = self.reports[from..]
            .iter()
            .filter_map(|(j, k)| match k {
                pb::report::Kind::Stored(s) if *j == i && s.epoch == 0 && s.stage == i as u32 => s.object.clone(),
                _ => None,
            })
            .collect();
        assert_eq!(stored.len(), mbs.len(), "one announced object per attempt");
        let stage = StageSpec::split(&self.cfg.train.model, self.cfg.train.stages).unwrap()[i].clone();
        let limits = BundleLimits {
            max_frame: 1 << 24,
            weights: ParamLayout::for_stage(&self.cfg.train.model, &stage).total() as u64,
            max_steps: 64,
        };
        mbs.iter()
            .zip(stored)
            .map(|(m, o)| {
                let name = if steps { step_evidence_key } else { evidence_key };
                let key = name(0, &self.miners[i].id, m.shard, m.first_sample, m.attempt);
                assert_eq!(o.key, key);
                let bytes = self.rt.block_on(self.store.get(&key)).unwrap();
                let announced = StoredObject::of(&key, &bytes, self.miners[i].id);
                assert_eq!((o.size, o.hash.as_slice()), (announced.size, &announced.hash[..]));
                (*m, EvidenceBundle::decode(&bytes, limits).unwrap())
            })
            .collect()
    }

    /// The validator's check of miner `i`'s bundle for `mb`: its forward,
    /// and a middle stage's backward too.
    fn check(&self, i: usize, mb: SampledMb, b: &EvidenceBundle) -> Finding {
        match self.check_one(i, mb, b, false) {
            Finding::Honest if i == 1 => self.check_one(i, mb, b, true),
            Finding::Honest if i == 0 => self.check_answer(mb, b),
            f => f,
        }
    }

    /// The head's link 5: the gradient that answered its output.
    fn check_answer(&self, mb: SampledMb, b: &EvidenceBundle) -> Finding {
        let Some(bw) = b.backward.as_ref() else { return Finding::Cheated("no answer".into()) };
        let ctx = RunContext::new(RUN, FrameLimits::default());
        let committed = Default::default();
        let known = Known {
            ctx: &ctx,
            miner: self.miners[0].id,
            stage: 0,
            upstream: None,
            downstream: Some(self.miners[1].id),
            tokens: None,
            committed: &committed,
            epoch_starts: &[],
            codec: self.cfg.train.codec,
            tolerance: 0.0,
        };
        check_head_answer(&known, mb, b.as_forward(), &bw.received)
    }

    fn check_one(&self, i: usize, mb: SampledMb, b: &EvidenceBundle, backward: bool) -> Finding {
        let corpus = iota_dataplane::corpus::load_corpus(&self.cfg, None).unwrap();
        let id =
            MicroBatchId { first: SampleId { epoch: 0, shard: mb.shard, index: mb.first_sample }, len: mb.samples };
        let (tokens, _) = corpus.micro_batch(self.cfg.train.seed, id, self.cfg.train.seq);
        let upload = self.reports.iter().find_map(|(j, k)| match k {
            pb::report::Kind::UploadDone(u) if *j == i => Some(u.commitments.clone()),
            _ => None,
        });
        let heads = iota_protocol::commitments_pb::from_pb(&upload.expect("an UploadDone")).unwrap();
        let committed = heads.into_iter().find(|h| h.epoch == 0).expect("epoch 0's heads");
        let steps = self.cfg.spec.micro_batches_per_epoch / self.cfg.train.grad_accum as u64;
        assert_eq!(committed.weights.len, steps, "one inner step per grad_accum micro-batches");
        let ctx = RunContext::new(RUN, FrameLimits::default());
        let known = Known {
            ctx: &ctx,
            miner: self.miners[i].id,
            stage: i as u32,
            upstream: i.checked_sub(1).map(|u| self.miners[u].id),
            downstream: self.miners.get(i + 1).map(|m| m.id),
            tokens: (i == 0).then_some(&tokens[..]),
            committed: &committed,
            epoch_starts: &[weights_hash(&self.miners[i].start)],
            codec: self.cfg.train.codec,
            tolerance: 0.0,
        };
        let r = Recompute::new(Arc::new(CpuBackend::new()), self.cfg.clone()).unwrap();
        if backward {
            return check_backward(&r, &known, mb, b.as_backward().expect("a middle stage's backward"));
        }
        let ev = ForwardEvidence {
            input_frame: b.input_frame.as_deref(),
            output_frame: &b.output_frame,
            weights: &b.weights,
            step_hashes: &b.step_hashes,
        };
        check_forward(&r, &known, mb, ev)
    }
}

/// Trains `MICRO_BATCHES` micro-batches, one after the other, and ends
/// the epoch's training.
fn trained(bad: Option<(usize, Adversary)>) -> Swarm {
    ended(Swarm::new(bad), 0)
}

/// Trains micro-batches `from..MICRO_BATCHES` one after the other, and
/// ends the epoch's training.
fn ended(mut s: Swarm, from: u64) -> Swarm {
    for n in from..MICRO_BATCHES {
        s.train(n);
    }
    let done = s.reports.iter().filter(|(_, k)| matches!(k, pb::report::Kind::BackwardDone(_))).count();
    assert_eq!(done as u64, MICRO_BATCHES, "every micro-batch went forward and back");
    s.phase(pb::Phase::Uploading);
    s
}

#[test]
fn honest_evidence_passes_the_validators_check_and_noise_fails_it() {
    let mut s = trained(None);
    let mbs: Vec<SampledMb> = (0..MICRO_BATCHES).map(|n| s.mb(n)).collect();
    for stage in [0, 1] {
        for (n, (mb, b)) in s.evidence(stage, &mbs).into_iter().enumerate() {
            assert_eq!(b.input_frame.is_some(), stage > 0, "an input frame except at the head");
            let bw = b.backward.as_ref().expect("a middle stage's backward, a head's answer");
            assert_eq!(bw.sent.is_empty(), stage == 0, "the head sends no gradient");
            // One after the other: each backward ran on its forward's weights.
            assert!(b.backward.as_ref().is_none_or(|bw| bw.weights.is_none()));
            assert_eq!(b.step_hashes.len() as u64, MICRO_BATCHES);
            // Micro-batch n went forward after n inner steps.
            let expected = if n == 0 { weights_hash(&s.miners[stage].start) } else { b.step_hashes[n - 1] };
            assert_eq!(weights_hash(&b.weights), expected, "stage {stage} micro-batch {n}: its weights");
            assert_eq!(s.check(stage, mb, &b), Finding::Honest, "stage {stage} micro-batch {n}");
        }
    }
    // The tail's evidence is the gradient frame it sent back, answering
    // the middle stage's activation it came in.
    let tail = s.evidence(2, &mbs[..1]);
    let b = &tail[0].1;
    let ctx = RunContext::new(RUN, FrameLimits::default());
    let (out, _) = frame::decode_frame(&b.output_frame, &ctx, s.miners[2].id).unwrap();
    let (inp, _) = frame::decode_frame(b.input_frame.as_deref().unwrap(), &ctx, s.miners[1].id).unwrap();
    assert_eq!((out.direction, inp.direction), (Direction::ActivationGrad, Direction::Activation));
    assert_eq!(out.answers, inp.frame_id());
    // Unknown attempts are skipped; another epoch is ignored.
    let unknown = SampledMb { attempt: 5, ..mbs[0] };
    let from = s.reports.len();
    let items = vec![pb::WorkRef {
        shard: unknown.shard,
        first_sample: unknown.first_sample,
        attempt: 5,
        inner_step: false,
        trace_step: 0,
    }];
    s.command(0, pb::command::Kind::EvidenceRequest(pb::EvidenceRequest { epoch: 0, items: items.clone() }));
    s.command(0, pb::command::Kind::EvidenceRequest(pb::EvidenceRequest { epoch: 7, items }));
    assert_eq!(s.reports.len(), from, "nothing announced");

    // A head that adds noise to its activations signs and uploads what it
    // sent, and is caught on the recompute; the honest middle stage that
    // computed on its noisy input still passes.
    let mut s = trained(Some((0, Adversary::Noise)));
    let head = s.evidence(0, &mbs);
    for (mb, b) in &head {
        match s.check(0, *mb, b) {
            Finding::Cheated(why) => assert!(why.contains("differs"), "{why}"),
            Finding::Honest => panic!("noise not caught"),
        }
        let (out, _) =
            frame::decode_frame(&b.output_frame, &RunContext::new(RUN, FrameLimits::default()), s.miners[0].id)
                .expect("well formed and signed");
        let id =
            MicroBatchId { first: SampleId { epoch: 0, shard: mb.shard, index: mb.first_sample }, len: mb.samples };
        let corpus = iota_dataplane::corpus::load_corpus(&s.cfg, None).unwrap();
        assert_eq!(out.answers, tokens_hash(&corpus.micro_batch(s.cfg.train.seed, id, s.cfg.train.seq).0));
    }
    for (mb, b) in s.evidence(1, &mbs) {
        assert_eq!(s.check(1, mb, &b), Finding::Honest);
    }
}

#[test]
fn zeros_and_replay_heads_are_caught_on_the_recompute() {
    for adv in [Adversary::Zeros, Adversary::Replay] {
        let mut s = trained(Some((0, adv)));
        let mbs: Vec<SampledMb> = (0..MICRO_BATCHES).map(|n| s.mb(n)).collect();
        for (n, (mb, b)) in s.evidence(0, &mbs).into_iter().enumerate() {
            let f = s.check(0, mb, &b);
            // Replay's first micro-batch is its honest one.
            if adv == Adversary::Replay && n == 0 {
                assert_eq!(f, Finding::Honest);
            } else {
                assert!(matches!(&f, Finding::Cheated(why) if why.contains("differs")), "{adv:?} {n}: {f:?}");
            }
        }
    }
}

/// Evidence made after the fact: a head that sends garbage on the wire
/// (its first micro-batch's activations replayed) while it computes
/// honestly, and uploads honest frames signed as if sent, passes the
/// recompute of its forward but not link 5: the gradient its neighbour
/// sent back answers the frame that really crossed the wire. A middle
/// stage doing the same is caught on its backward's link 5 likewise. The
/// honest miners around them still pass.
#[test]
fn evidence_signed_after_the_fact_does_not_answer_what_the_neighbour_received() {
    let mut s = trained(Some((0, Adversary::FabricatedEvidence)));
    let mbs: Vec<SampledMb> = (0..MICRO_BATCHES).map(|n| s.mb(n)).collect();
    for (n, (mb, b)) in s.evidence(0, &mbs).into_iter().enumerate() {
        assert_eq!(s.check_one(0, mb, &b, false), Finding::Honest, "{n}: what it shows is honest work");
        match s.check(0, mb, &b) {
            // The first micro-batch went out honest.
            Finding::Honest if n == 0 => {}
            Finding::Cheated(why) if n > 0 => {
                assert_eq!(why, "the received gradient does not answer the output frame")
            }
            f => panic!("micro-batch {n}: {f:?}"),
        }
    }
    for (mb, b) in s.evidence(1, &mbs) {
        assert_eq!(s.check(1, mb, &b), Finding::Honest, "the middle stage that took the garbage is honest");
    }

    let mut s = trained(Some((1, Adversary::FabricatedEvidence)));
    for (n, (mb, b)) in s.evidence(1, &mbs).into_iter().enumerate() {
        assert_eq!(s.check_one(1, mb, &b, false), Finding::Honest, "{n}: its forward as shown");
        match s.check(1, mb, &b) {
            Finding::Honest if n == 0 => {}
            Finding::Cheated(why) if n > 0 => assert!(why.contains("does not answer the output frame"), "{why}"),
            f => panic!("micro-batch {n}: {f:?}"),
        }
    }
    for (mb, b) in s.evidence(0, &mbs) {
        assert_eq!(s.check(0, mb, &b), Finding::Honest, "the head upstream of it is honest");
    }
}

/// A gradient that does not answer the activation a miner sent for the
/// attempt is refused, not trained on (it would fail that miner's
/// evidence: a hostile neighbour could frame it that way); the attempt
/// does not finish, and the miner's evidence for the others still passes.
#[test]
fn a_gradient_answering_another_frame_is_refused() {
    let mut s = Swarm::new(None);
    s.hold_grads_to = Some(0);
    s.train(0);
    assert_eq!(s.held.len(), 1, "the gradient to the head, held");
    let (from, o) = s.held.pop().unwrap();
    s.hold_grads_to = None;
    let Output::Frame { to, mut meta, payload, fallback } = o else { panic!("a frame") };
    meta.answers = [7; 32];
    let rejected = s.miners[0].w.rejected_frames;
    s.pump(from, vec![Output::Frame { to, meta, payload, fallback }]);
    assert_eq!(s.miners[0].w.rejected_frames, rejected + 1, "refused");
    let done = s.reports.iter().filter(|(_, k)| matches!(k, pb::report::Kind::BackwardDone(_))).count();
    assert_eq!(done, 0, "the attempt did not finish at the head");
}

/// A middle stage's backward: honest evidence passes `check_backward` bit
/// for bit, also when an inner step came between a micro-batch's forward
/// and its backward (the stage ran that backward on its forward's stashed
/// weights, so the bundle carries no other weights); a
/// `GradNoise` middle stage passes its forward check and fails its
/// backward's recompute.
#[test]
fn a_middle_stages_backward_is_checked_and_grad_noise_fails_it() {
    // Micro-batches 0 and 1 both go forward through the middle stage
    // before either gradient comes back: 1's backward comes after 0's
    // inner step, and runs on the weights 1 was forwarded with.
    let overlapped = |bad| {
        let mut s = Swarm::new(bad);
        s.hold_grads_to = Some(1);
        s.train(0);
        s.train(1);
        assert_eq!(s.held.len(), 2, "both gradients held");
        s.release();
        ended(s, 2)
    };
    let mut s = overlapped(None);
    let mbs: Vec<SampledMb> = (0..MICRO_BATCHES).map(|n| s.mb(n)).collect();
    let middle = s.evidence(1, &mbs);
    for (n, (mb, b)) in middle.iter().enumerate() {
        let bw = b.backward.as_ref().expect("a middle stage's bundle carries its backward");
        // 1 went forward on the start and back after one step, on the start.
        assert_eq!(bw.weights, None, "micro-batch {n}");
        if n == 1 {
            assert_eq!(weights_hash(&b.weights), weights_hash(&s.miners[1].start));
            assert!(!b.step_hashes.is_empty(), "an inner step came before its backward");
        }
        // The frames are the ones that crossed the wire.
        let ctx = RunContext::new(RUN, FrameLimits::default());
        let (got, _) = frame::decode_frame(&bw.received, &ctx, s.miners[2].id).unwrap();
        let (sent, _) = frame::decode_frame(&bw.sent, &ctx, s.miners[1].id).unwrap();
        let (out, _) = frame::decode_frame(&b.output_frame, &ctx, s.miners[1].id).unwrap();
        let (inp, _) = frame::decode_frame(b.input_frame.as_deref().unwrap(), &ctx, s.miners[0].id).unwrap();
        assert_eq!((got.answers, sent.answers), (out.frame_id(), inp.frame_id()));
        assert_eq!(s.check(1, *mb, b), Finding::Honest, "micro-batch {n}");
    }
    // Micro-batch 1's Honest above is the stashing check: the validator
    // recomputes its backward on the forward's weights, bit for bit, which
    // a stage running it on the stepped weights would not match.

    let mut s = overlapped(Some((1, Adversary::GradNoise)));
    for (n, (mb, b)) in s.evidence(1, &mbs).into_iter().enumerate() {
        match s.check_one(1, mb, &b, false) {
            Finding::Honest => {}
            f => panic!("micro-batch {n}: its forward is honest: {f:?}"),
        }
        match s.check(1, mb, &b) {
            Finding::Cheated(why) => {
                assert!(why.starts_with("recomputed upstream gradient differs: max |d|"), "{why}");
                assert!(why.contains("relative L2"), "{why}");
            }
            Finding::Honest => panic!("micro-batch {n}: noisy gradient not caught"),
        }
    }
    // The head, whose backward took the noisy gradient, is still honest.
    for (mb, b) in s.evidence(0, &mbs) {
        assert_eq!(s.check(0, mb, &b), Finding::Honest);
    }
}
