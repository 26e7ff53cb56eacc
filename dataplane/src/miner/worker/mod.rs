//! The stage worker: a miner's compute, as a state machine run on its own
//! thread. Inputs are orchestrator commands and data-plane frames; outputs
//! are frames to send and reports to make.
//!
//! A micro-batch flows head -> ... -> tail (activations) and back (their
//! gradients) along the pathway the orchestrator published in its `Route`.
//! Each miner steps its optimizer after every `grad_accum` micro-batches it
//! finished backward for. At the end of an epoch it uploads its stage
//! weights; the stage's aggregator averages the uploads; every replica then
//! starts the next epoch from the merged weights.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use anyhow::{Context, Result, bail};
use bytes::Bytes;
use iota_core::commitment::Commitments;
use iota_core::wire::Direction;
use iota_core::{Identity, MicroBatchId, PeerId, SampleId};
use iota_model::data::Corpus;
use iota_model::optim::AdamW;
use iota_model::{Backend, CpuBackend, Stage, StageInput, codec};
use iota_protocol::{MergeMethod, RunConfig, SharedStore, pb};
use tracing::{info, warn};

use super::adversary::{Adversary, Tamper};
use super::events::{Input, Output};
use super::evidence_log::{self, DEFAULT_EVIDENCE_BYTES, EvidenceLog, MbKey};
use super::merge::{Butterfly, Merge, ParameterServer};
use super::waits::Waits;
use crate::frame::{FrameMeta, RunContext};
use crate::inner_step::OptimizerState;
use crate::sent_frames::SentFrames;
use crate::tls::PeerDirectory;
use crate::transport::ReceivedFrame;

mod frames;
mod lifecycle;
mod startup;
mod steps;

pub use super::hashes::{tokens_hash, weights_hash};

/// Frames held back because their route has not arrived yet.
const MAX_EARLY: usize = 256;

/// The stage side of a miner, on the backend it computes with (`CpuBackend`
/// or `iota_cuda::backend::CudaBackend`).
pub struct Worker<B: Backend = CpuBackend> {
    me: PeerId,
    cfg: RunConfig,
    /// Where this miner reads the run's corpus (None: the toy corpus, or
    /// the run's store when the run says its corpus is there).
    data: Option<std::path::PathBuf>,
    /// Where chunks of a corpus fetched from the store are kept (None: not kept).
    corpus_cache: Option<std::path::PathBuf>,
    be: Arc<B>,
    store: SharedStore,
    rt: tokio::runtime::Handle,
    merge: Box<dyn Merge>,
    /// Tokens this miner pushed through its stage (for the throughput it reports).
    pub tokens: Arc<AtomicU64>,
    /// Micro-batches routed through this miner and not finished here yet
    /// (what its heartbeat reports).
    pub in_flight: Arc<AtomicU32>,
    dir: Arc<PeerDirectory>,
    ctx: Arc<RunContext>,
    corpus: Option<Arc<Corpus>>,
    stage: Option<Stage<B>>,
    optim: Option<AdamW<B>>,
    stage_index: u32,
    epoch: u64,
    /// The epoch whose training phase this worker has started, if it is in one.
    training: Option<u64>,
    /// Epoch whose merged weights the stage holds (None: initial weights).
    weights_after: Option<u64>,
    routes: HashMap<MbKey, pb::Route>,
    /// The id of the forward frame each micro-batch arrived in: the frames
    /// this miner sends for it answer that one (the hash chain validators
    /// audit a pathway with).
    inbound: HashMap<MbKey, [u8; 32]>,
    /// Per routed micro-batch: the neighbour whose input it waits for.
    waits: Waits,
    early: VecDeque<(MbKey, ReceivedFrame)>,
    accumulated: usize,
    pub steps: u64,
    /// Micro-batches this miner finished this epoch.
    work: u64,
    pub done: bool,
    pub rejected_frames: u64,
    /// The miner's commitment chains: this worker adds the hash of its
    /// weights after every inner step (the endpoint adds its frames).
    pub commitments: Arc<parking_lot::Mutex<Commitments>>,
    /// What this miner keeps of its epoch's work for validators.
    evidence: EvidenceLog,
    /// The frames its endpoint sent, as signed (None: not recorded, so it
    /// cannot answer evidence requests).
    sent: Option<Arc<SentFrames>>,
    /// A dishonest test miner's change to the activations it sends.
    tamper: Option<Tamper>,
    /// What it signs its traces of inner steps with (`set_signer`).
    signer: Option<Arc<Identity>>,
    /// The memory this miner stated (bytes, backend): an assigned stage it
    /// does not hold is refused before anything is allocated.
    memory: Option<(u64, iota_core::memory_plan::ComputeBackend)>,
    /// When the stage recomputes activations (decided at `assign`).
    recompute: iota_core::memory_fit::Recompute,
    /// The merge behind compute (`merge.overlap`): this replica's own
    /// weights when the epoch's training started, and the previous epoch's
    /// merged weights once they came, held until the epoch ends (landing in
    /// lifecycle.rs).
    overlap_started: Option<Vec<f32>>,
    overlap_held: Option<(u64, Vec<f32>)>,
    /// Registration to the first finished micro-batch, by part.
    startup: startup::Startup,
    /// The records of its inner steps (kept with validators only).
    recorder: steps::StepRecorder,
}

/// An assigned stage this miner's memory does not hold: the miner stops,
/// saying so, instead of failing inside an allocation.
#[derive(Debug, thiserror::Error)]
#[error("assigned {0}; stopping before anything is allocated")]
pub struct StageDoesNotFit(pub iota_core::memory_fit::DoesNotFit);

fn mb_key(epoch: u64, shard: u32, first: u64, attempt: u32) -> MbKey {
    (epoch, shard, first, attempt)
}

/// The 64-bit key a stage files saved activations under.
fn stage_key(k: &MbKey) -> u64 {
    iota_core::rng::derive(0x6d62, &[k.0, k.1 as u64, k.2, k.3 as u64])
}

impl<B: Backend + 'static> Worker<B> {
    // Everything a worker runs with comes from the miner's shell at once;
    // a struct for it would only be unpacked here.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        be: Arc<B>,
        me: PeerId,
        cfg: RunConfig,
        data: Option<std::path::PathBuf>,
        store: SharedStore,
        rt: tokio::runtime::Handle,
        dir: Arc<PeerDirectory>,
        ctx: Arc<RunContext>,
    ) -> Worker<B> {
        let merge: Box<dyn Merge> = match cfg.spec.merge.method {
            MergeMethod::ParameterServer => Box::new(ParameterServer::new(store.clone(), rt.clone(), me)),
            MergeMethod::Butterfly => {
                Box::new(Butterfly::new(me, cfg.spec.merge.clone(), store.clone(), rt.clone(), ctx.clone()))
            }
        };
        let step_window = cfg.spec.validation.step_window;
        Worker {
            me,
            cfg,
            data,
            corpus_cache: None,
            be,
            merge,
            tokens: Arc::new(AtomicU64::new(0)),
            in_flight: Arc::new(AtomicU32::new(0)),
            store,
            rt,
            dir,
            ctx,
            corpus: None,
            stage: None,
            optim: None,
            stage_index: 0,
            epoch: 0,
            training: None,
            weights_after: None,
            routes: HashMap::new(),
            inbound: HashMap::new(),
            waits: Waits::default(),
            early: VecDeque::new(),
            accumulated: 0,
            steps: 0,
            work: 0,
            done: false,
            rejected_frames: 0,
            commitments: Arc::default(),
            evidence: EvidenceLog::new(DEFAULT_EVIDENCE_BYTES).with_step_window(step_window),
            sent: None,
            tamper: None,
            signer: None,
            memory: None,
            recompute: iota_core::memory_fit::Recompute::Auto,
            overlap_started: None,
            overlap_held: None,
            startup: startup::Startup::default(),
            recorder: steps::StepRecorder::default(),
        }
    }

    /// Whether the run has validators (only they read the commitments of
    /// inner steps and the evidence kept for them).
    fn validated(&self) -> bool {
        !self.cfg.spec.validation.validators.is_empty()
    }

    /// Whether validators recompute inner steps (the run's
    /// `validation.check_inner_steps`): only then are steps recorded.
    fn records_steps(&self) -> bool {
        self.validated() && self.cfg.spec.validation.check_inner_steps
    }

    /// The memory this miner's stage may use (bytes) and what it computes
    /// with: `assign` refuses a stage its plan does not hold.
    /// The epoch this worker is in.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    pub fn with_memory(mut self, memory: Option<(u64, iota_core::memory_plan::ComputeBackend)>) -> Self {
        self.memory = memory.filter(|(bytes, _)| *bytes > 0);
        self
    }

    /// When the stage recomputes activations in its backward.
    pub fn with_recompute(mut self, recompute: iota_core::memory_fit::Recompute) -> Self {
        self.recompute = recompute;
        self
    }

    /// Keeps the chunks of a corpus fetched from the run's store in `dir`.
    pub fn with_corpus_cache(mut self, dir: Option<std::path::PathBuf>) -> Self {
        self.corpus_cache = dir;
        self
    }

    /// Answers evidence requests from `sent` (the endpoint's record of the
    /// frames it sent) and what `log` keeps (see `evidence_log`).
    pub fn set_evidence(&mut self, sent: Arc<SentFrames>, log: EvidenceLog) {
        self.sent = Some(sent);
        self.evidence = log.with_step_window(self.cfg.spec.validation.step_window);
    }

    /// What this worker keeps for validators.
    pub fn evidence(&self) -> &EvidenceLog {
        &self.evidence
    }

    /// Makes this worker a dishonest miner (a test tool; the modes that do
    /// not change outputs are acted out by the miner's shell).
    /// The key this miner signs its traces of inner steps with (without
    /// one it answers no trace ask).
    pub fn set_signer(&mut self, signer: Arc<Identity>) {
        self.signer = Some(signer);
    }

    /// Answers each trace ask of `r` (`trace_answer`).
    fn answer_traces(&mut self, r: &pb::EvidenceRequest, out: &mut Vec<Output>) {
        use evidence_log::trace_answer::{Laziness, Tracer, answer_trace};
        let lazy = self.tamper.as_ref().and_then(|t| match (t.skips_weight_grads(), t.skips_optimizer()) {
            (true, _) => Some(Laziness::NoWeightGrads),
            (_, true) => Some(Laziness::NoStep),
            _ => None,
        });
        for item in r.items.iter().filter(|w| w.trace_step > 0).take(1) {
            let t = Tracer {
                be: &self.be,
                cfg: &self.cfg,
                ctx: &self.ctx,
                corpus: self.corpus.as_ref(),
                signer: self.signer.as_deref(),
                lazy,
            };
            answer_trace(&mut self.evidence, (r.epoch, item), self.me, &t, (&self.store, &self.rt), out);
        }
    }

    pub fn set_adversary(&mut self, a: Option<Adversary>) {
        self.tamper = a.and_then(|a| Tamper::new(a, self.me));
    }

    pub fn peer(&self) -> PeerId {
        self.me
    }

    pub fn stage(&self) -> Option<&Stage<B>> {
        self.stage.as_ref()
    }

    /// Whether it holds the first stage (where a route starts a forward).
    pub fn is_head(&self) -> bool {
        self.stage.is_some() && self.stage_index == 0
    }

    /// Handles one input; errors are reported to the caller, who logs them
    /// (a failed micro-batch is re-routed by the orchestrator's timeout).
    pub fn handle(&mut self, input: Input, out: &mut Vec<Output>) -> Result<()> {
        let r = self.dispatch(input, out);
        self.inbound.retain(|k, _| self.routes.contains_key(k));
        self.waits.track(self.stage_index as usize, &self.routes, &self.inbound);
        self.in_flight.store(self.routes.len() as u32, Ordering::Relaxed);
        r
    }

    fn dispatch(&mut self, input: Input, out: &mut Vec<Output>) -> Result<()> {
        match input {
            Input::Command(c) => self.command(c, out),
            Input::Frame(f) if f.header.direction == Direction::WeightSlice => {
                self.merge.frame(*f, out)?;
                self.take_merged()
            }
            Input::Frame(f) => self.frame(*f, out),
            Input::Tick => {
                self.waits.report_overdue(&self.routes, self.cfg.spec.route_timeout_ms, out);
                self.merge.tick(out)?;
                self.take_merged()
            }
        }
    }

    /// Replaces the stage's weights with a finished merge's result.
    fn take_merged(&mut self) -> Result<()> {
        if let Some((epoch, params)) = self.merge.take_merged()
            && self.stage.is_some()
        {
            if self.cfg.spec.merge.overlap {
                return self.merged_behind_compute(epoch, params);
            }
            let Some(s) = self.stage.as_mut() else { return Ok(()) };
            s.set_params(&params)?;
            self.weights_after = Some(epoch);
            if let Some(e) = self.training {
                // Merged weights that land during training are computed with.
                if self.validated() {
                    self.recorder.weights_replaced(weights_hash(&params));
                }
                self.evidence.weights_changed(e, params);
            }
        }
        Ok(())
    }

    /// Replaces the merge strategy (tests and the bench use this to inject faults).
    pub fn set_merge(&mut self, m: Box<dyn Merge>) {
        self.merge = m;
    }

    /// The merge keeps its large audit records in `dir` (`Merge::keep_records_in`).
    pub fn merge_records_in(&mut self, dir: std::path::PathBuf) {
        self.merge.keep_records_in(dir);
    }

    fn command(&mut self, c: pb::command::Kind, out: &mut Vec<Output>) -> Result<()> {
        match c {
            pb::command::Kind::Assign(a) => self.assign(a, out),
            pb::command::Kind::Stored(st) => {
                self.merge.stored(st, out)?;
                self.take_merged()
            }
            pb::command::Kind::Peers(p) => {
                self.add_peers(&p.peers);
                Ok(())
            }
            pb::command::Kind::Phase(p) => self.phase(p, out),
            pb::command::Kind::Route(r) => {
                let key = mb_key(r.epoch, r.shard, r.first_sample, r.attempt);
                if r.epoch != self.epoch || r.pathway.len() != self.cfg.spec.stages as usize {
                    bail!("route for epoch {} with {} hops is not for this run state", r.epoch, r.pathway.len());
                }
                if r.pathway[self.stage_index as usize] != self.me.0 {
                    return Ok(()); // not on this pathway at our stage
                }
                self.routes.insert(key, r);
                self.startup.routed();
                if self.stage_index == 0 {
                    self.head_forward(key, out)?;
                }
                // Frames that overtook their route.
                let (ready, rest): (Vec<_>, Vec<_>) = self.early.drain(..).partition(|(k, _)| *k == key);
                self.early = rest.into();
                for (_, f) in ready {
                    self.frame(f, out)?;
                }
                Ok(())
            }
            pb::command::Kind::Verdict(v) => {
                self.merge.verdict(v, out)?;
                self.take_merged()
            }
            pb::command::Kind::EvidenceRequest(r) => {
                let sent = self.sent.as_ref();
                evidence_log::answer(&mut self.evidence, &r, sent, self.me, &self.store, &self.rt, out);
                self.answer_traces(&r, out);
                Ok(())
            }
            pb::command::Kind::ContributionRequest(r) => self.merge.contribution_request(&r, out),
            // For validators.
            pb::command::Kind::EpochWork(_)
            | pb::command::Kind::MergeCheck(_)
            | pb::command::Kind::MergeAudit(_)
            | pb::command::Kind::MergeAuditContext(_) => Ok(()),
            pb::command::Kind::Cancel(c) => {
                let key = mb_key(c.epoch, c.shard, c.first_sample, c.attempt);
                self.routes.remove(&key);
                self.recorder.dropped(&key);
                if let Some(s) = self.stage.as_mut() {
                    s.discard(stage_key(&key));
                }
                Ok(())
            }
        }
    }

    /// `answers`: the id of the frame (or, at the head, the hash of the
    /// tokens) this frame was computed from.
    fn frame_meta(
        &self,
        r: &pb::Route,
        direction: Direction,
        rows: usize,
        width: usize,
        answers: [u8; 32],
    ) -> FrameMeta {
        FrameMeta {
            direction,
            codec: self.cfg.train.codec,
            stage: self.stage_index as u16,
            epoch: r.epoch as u32,
            shard: r.shard,
            first_sample: r.first_sample,
            samples: r.samples,
            attempt: r.attempt,
            shape: vec![rows as u32, width as u32],
            answers,
        }
    }

    fn tokens(&self, r: &pb::Route) -> Result<(Vec<u32>, Vec<u32>)> {
        let corpus = self.corpus.as_ref().context("no corpus loaded")?;
        let mb = MicroBatchId { first: SampleId { epoch: 0, shard: r.shard, index: r.first_sample }, len: r.samples };
        Ok(corpus.micro_batch(self.cfg.train.seed, mb, self.cfg.train.seq))
    }

    /// Encodes `data` once, as it leaves: the receiver decodes exactly the
    /// quantized values the single-process trainer feeds the next stage,
    /// and a validator's recompute (`recompute`) gets the same bytes.
    /// (Quantizing twice, a round trip before the encoding, changes about a
    /// third of int8 rows.)
    fn send(&mut self, to: &[u8], meta: FrameMeta, data: &[f32], out: &mut Vec<Output>) -> Result<()> {
        let to = PeerId(to.try_into().context("bad peer id in route")?);
        let (rows, cols) = (meta.shape[0] as usize, meta.shape[1] as usize);
        let bytes = codec::encode(self.cfg.train.codec, rows, cols, data)?;
        if let Some(garbage) = self.tamper.as_mut().and_then(|t| t.wire_instead(meta.direction, data)) {
            let wire = codec::encode(self.cfg.train.codec, rows, cols, &garbage)?;
            let (wire, shown) = (Bytes::from(wire), Bytes::from(bytes));
            out.push(Output::FabricatedFrame { to, meta, wire, shown });
            return Ok(());
        }
        out.push(Output::Frame { to, meta, payload: Bytes::from(bytes), fallback: None });
        Ok(())
    }

    fn head_forward(&mut self, key: MbKey, out: &mut Vec<Output>) -> Result<()> {
        let r = self.routes[&key].clone();
        let (x, y) = self.tokens(&r)?;
        let (batch, seq) = (r.samples as usize, self.cfg.train.seq);
        if self.cfg.spec.stages == 1 {
            // The whole model on one miner: forward and backward at once.
            let k = self.cfg.train.grad_accum as f32;
            let t = self.stage.as_mut().unwrap().forward_backward(StageInput::Tokens(&x), &y, batch, seq, 1.0 / k)?;
            self.report_loss(&r, &t.losses, out);
            out.push(Output::Report(pb::report::Kind::BackwardDone(pb::BackwardDone {
                epoch: r.epoch,
                shard: r.shard,
                first_sample: r.first_sample,
                attempt: r.attempt,
            })));
            self.routes.remove(&key);
            return self.finished_one(key, r.samples, None, None);
        }
        self.tokens.fetch_add((batch * seq) as u64, Ordering::Relaxed);
        let stage = self.stage.as_mut().context("route before assignment")?;
        let mut h = stage.forward(stage_key(&key), StageInput::Tokens(&x), batch, seq)?;
        let width = stage.boundary_width();
        if let Some(t) = self.tamper.as_mut() {
            t.activations(key, &mut h);
        }
        let meta = self.frame_meta(&r, Direction::Activation, batch * seq, width, tokens_hash(&x));
        self.send(&r.pathway[1], meta, &h, out)?;
        self.evidence.forward(key, None, Direction::Activation);
        if self.records_steps() {
            self.recorder.forwarded(key);
        }
        Ok(())
    }

    fn report_loss(&self, r: &pb::Route, losses: &[f32], out: &mut Vec<Output>) {
        let mean = (losses.iter().map(|&l| l as f64).sum::<f64>() / losses.len().max(1) as f64) as f32;
        let mean = self.tamper.as_ref().map_or(mean, |t| t.reported_loss(mean));
        out.push(Output::Report(pb::report::Kind::Loss(pb::LossReport {
            epoch: r.epoch,
            shard: r.shard,
            first_sample: r.first_sample,
            attempt: r.attempt,
            loss: mean,
            tokens: losses.len() as u32,
        })));
    }

    /// Counts a finished micro-batch (`key`, of `samples`, whose input
    /// came from `prev` and gradient from `next`); steps the optimizer
    /// every `grad_accum`.
    fn finished_one(&mut self, key: MbKey, samples: u32, prev: Option<&[u8]>, next: Option<&[u8]>) -> Result<()> {
        if let Some(line) = self.startup.finished() {
            info!("{line}");
        }
        if self.records_steps() {
            self.recorder.finished(key, samples, prev, next);
        }
        self.work += 1;
        self.accumulated += 1;
        if self.accumulated >= self.cfg.train.grad_accum {
            let lr = self.cfg.train.schedule.at(self.steps);
            let lazy = self.tamper.as_ref().is_some_and(|t| t.skips_optimizer());
            let s = self.stage.as_mut().context("no stage assigned")?;
            let o = self.optim.as_mut().context("no optimizer: no stage assigned")?;
            if !lazy {
                let st = o.step(s, &self.cfg.train.adamw, lr);
                if !st.applied {
                    warn!(step = self.steps, "non-finite gradient; update skipped");
                }
            }
            s.zero_grads();
            self.accumulated = 0;
            let step = self.steps;
            self.steps += 1;
            // Committed before any frame computed with these weights leaves.
            // Only validators read the weights chain, the step records and
            // the versions kept for evidence; without them the copies to
            // the host and their hashes (seconds per step at 1.5b: the
            // whole stage and its optimizer state cross PCIe) are skipped,
            // and the chains stay empty, consistently.
            if self.validated() {
                self.commit_step(step)?;
            }
        }
        Ok(())
    }

    /// Commits inner step `step` just taken: the weights it left, its
    /// record, and what showing it takes.
    fn commit_step(&mut self, step: u64) -> Result<()> {
        let s = self.stage.as_ref().context("no stage")?;
        let params = s.params_host();
        let hash = weights_hash(&params);
        if !self.records_steps() {
            self.commitments.lock().weights(self.epoch, &hash);
            self.evidence.stepped(self.epoch, hash, params);
            return Ok(());
        }
        let o = self.optim.as_ref().context("no optimizer")?;
        let optimizer = OptimizerState { t: o.t, m: self.be.to_host(&o.m), v: self.be.to_host(&o.v) };
        let mut c = self.commitments.lock();
        let chain_before = c.steps_of(self.epoch);
        let (header, before, signers) = self.recorder.stepped((self.epoch, chain_before), step, hash, optimizer);
        c.weights(self.epoch, &hash);
        c.step(self.epoch, &header.hash());
        drop(c);
        self.evidence.record_step(self.epoch, header, before, signers);
        self.evidence.stepped(self.epoch, hash, params);
        Ok(())
    }
}
