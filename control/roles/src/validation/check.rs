//! A validator's check of one evidence object (a [`CheckJob`] from the
//! round): the bytes against the miner's signed announcement, the bundle's
//! bounds, then `evidence::check_forward`'s links and the recompute on the
//! CPU reference (at the tail `check_tail`; a middle stage is judged on its
//! forward and then on its backward, `check_backward`). Everything here
//! fails as `Err(why)`, and every why is the miner's doing: it announced
//! the object and chose its bytes.

use std::collections::BTreeMap;
use std::sync::Arc;

use iota_checks::evidence::{
    CROSS_BACKEND_TOLERANCE, Finding, Known, SampledMb, TailClaim, check_backward, check_forward, check_head_answer,
    check_tail,
};
use iota_checks::evidence_bundle::{BundleLimits, EvidenceBundle};
use iota_checks::frame::{FrameLimits, RunContext, decode_frame};
use iota_checks::hashes::weights_hash;
use iota_checks::inner_step::prove::{prove_step, split_trace_object};
use iota_checks::inner_step::{StepEvidence, StepKnown, StepLimits, check_step_at};
use iota_checks::recompute::Recompute;
use iota_core::wire::{Direction, header_bytes};
use iota_core::{MicroBatchId, ParamLayout, PeerId, SampleId, StageSpec};
use iota_model::data::Corpus;
use iota_model::{CpuBackend, Stage};
use iota_wire::RunConfig;

use super::lanes::{LaneRecord, ShownFrame};
use super::round::{CheckJob, ProveJob};

/// The device label a validator recomputes on: the CPU reference, fp32.
pub const VALIDATOR_DEVICE: &str = "cpu";

/// How far a miner's tensors may sit from the validator's recompute, by the
/// device the miner registered with. On the validator's own device the
/// arithmetic is the same, so the bytes must be (tolerance 0); on another
/// (a GPU's bf16 or TF32 GEMMs, or reductions in another order) they are
/// held to the calibrated cross-backend bound. The label is the miner's own
/// claim, so a cheat can claim a GPU: the bound is set so that claiming one
/// buys no room for the cheats we know of (see `CROSS_BACKEND_TOLERANCE`).
pub fn tolerance_for(device: &str) -> f64 {
    if device == VALIDATOR_DEVICE { 0.0 } else { CROSS_BACKEND_TOLERANCE }
}

/// What a validator checks with: the run, its corpus (for the head's
/// tokens) and the recompute, plus the seed's initial weights per stage.
pub struct Checker {
    cfg: RunConfig,
    run_id: u64,
    corpus: Option<Arc<Corpus>>,
    recompute: Recompute<CpuBackend>,
    be: Arc<CpuBackend>,
    initial: BTreeMap<u32, [u8; 32]>,
    /// The inner step the last check's recompute failed at (`check_lanes`).
    failed_step: Option<u32>,
}

impl Checker {
    pub fn new(cfg: RunConfig, run_id: u64, corpus: Option<Arc<Corpus>>) -> anyhow::Result<Checker> {
        let be = Arc::new(CpuBackend::new());
        let recompute = Recompute::new(be.clone(), cfg.clone())?;
        Ok(Checker { cfg, run_id, corpus, recompute, be, initial: BTreeMap::new(), failed_step: None })
    }

    /// The hash of the weights the run seed gives `stage` (what every
    /// miner of it starts epoch 0 from).
    pub fn initial_hash(&mut self, stage: u32) -> Result<[u8; 32], String> {
        if let Some(h) = self.initial.get(&stage) {
            return Ok(*h);
        }
        let specs = StageSpec::split(&self.cfg.train.model, self.cfg.train.stages).map_err(|e| e.to_string())?;
        let spec = specs.get(stage as usize).ok_or_else(|| format!("the run has no stage {stage}"))?.clone();
        let st = Stage::new(self.be.clone(), &self.cfg.train.model, spec, self.cfg.train.seed);
        let h = weights_hash(&st.params_host());
        self.initial.insert(stage, h);
        Ok(h)
    }

    /// The run seed's initial weights of every stage (the model before any
    /// merge: the first baseline of the held-out loss).
    pub fn initial_weights(&self) -> Result<Vec<Vec<f32>>, String> {
        let specs = StageSpec::split(&self.cfg.train.model, self.cfg.train.stages).map_err(|e| e.to_string())?;
        Ok(specs
            .into_iter()
            .map(|spec| Stage::new(self.be.clone(), &self.cfg.train.model, spec, self.cfg.train.seed).params_host())
            .collect())
    }

    /// The mean per-token loss of the whole model (`weights`, one vector
    /// per stage) on `batches` held-out micro-batches, through the wire
    /// codec between stages as the swarm computes it. An error when it
    /// cannot be computed (a stage's values overflow the codec, say).
    pub fn held_out_loss(&self, weights: &[Vec<f32>], batches: u32) -> Result<f32, String> {
        use iota_checks::recompute::ForwardInput;
        let corpus = self.corpus.as_ref().ok_or("no corpus for the held-out batches")?;
        let (batch, seq) = (self.cfg.train.batch, self.cfg.train.seq);
        let last = weights.len().checked_sub(1).ok_or("no stages")?;
        let r = &self.recompute;
        let (mut sum, mut n) = (0f64, 0usize);
        for b in 0..u64::from(batches.max(1)) {
            let (x, y) = corpus.val_batch(self.cfg.train.seed, b, batch, seq);
            let t = if last == 0 {
                r.tail(0, &weights[0], ForwardInput::Tokens(&x), &y, batch)
            } else {
                let mut a = r.forward(0, &weights[0], ForwardInput::Tokens(&x), batch).map_err(|e| format!("{e:#}"))?;
                for (s, w) in weights.iter().enumerate().take(last).skip(1) {
                    a = r.forward(s as u32, w, ForwardInput::Wire(&a), batch).map_err(|e| format!("{e:#}"))?;
                }
                r.tail(last as u32, &weights[last], ForwardInput::Wire(&a), &y, batch)
            }
            .map_err(|e| format!("{e:#}"))?;
            sum += t.losses.iter().map(|&l| f64::from(l)).sum::<f64>();
            n += t.losses.len();
        }
        Ok((sum / n.max(1) as f64) as f32)
    }

    fn stage_weights(&self, stage: u32) -> Result<u64, String> {
        let specs = StageSpec::split(&self.cfg.train.model, self.cfg.train.stages).map_err(|e| e.to_string())?;
        let spec = specs.get(stage as usize).ok_or_else(|| format!("the run has no stage {stage}"))?;
        Ok(ParamLayout::for_stage(&self.cfg.train.model, spec).total() as u64)
    }

    /// Checks `bytes`, read from the store for `job`.
    pub fn check(&mut self, job: &CheckJob, bytes: &[u8]) -> Result<(), String> {
        self.check_lanes(job, bytes).0
    }

    /// `check`, and the gradient frames the object shows crossing the
    /// miner's lanes for the attempt (what the round holds a sender's
    /// evidence against its receiver's with, `lanes`), each only where
    /// it is signed by its sender for the attempt, whatever the check's
    /// result (a frame its sender signed says what it sent, whoever shows
    /// it).
    pub fn check_lanes(&mut self, job: &CheckJob, bytes: &[u8]) -> (Result<(), String>, LaneRecord) {
        if bytes.len() as u64 != job.object.size || *blake3::hash(bytes).as_bytes() != job.object.hash {
            return (Err("the evidence object is not what its miner announced".into()), LaneRecord::default());
        }
        let limits = match self.limits(job) {
            Ok(l) => l,
            Err(why) => return (Err(why), LaneRecord::default()),
        };
        let bundle = match EvidenceBundle::decode(bytes, limits) {
            Ok(b) => b,
            Err(e) => return (Err(format!("evidence bundle: {e}")), LaneRecord::default()),
        };
        let record = self.lane_record(job, &bundle);
        self.failed_step = None;
        let result = self.check_bundle(job, bundle);
        (result, LaneRecord { failed_step: self.failed_step.take(), ..record })
    }

    fn limits(&self, job: &CheckJob) -> Result<BundleLimits, String> {
        Ok(BundleLimits {
            max_frame: FrameLimits::default().max_payload.saturating_add(4096),
            weights: self.stage_weights(job.stage)?,
            max_steps: self.cfg.spec.micro_batches_per_epoch.saturating_add(1),
        })
    }

    /// The ids of the gradient frames `bundle` shows for `job`'s attempt:
    /// the one its miner sent upstream (the tail's output, a middle
    /// stage's sent gradient) and the one it received from downstream (a
    /// head's or middle stage's), each signed by its sender.
    fn lane_record(&self, job: &CheckJob, bundle: &EvidenceBundle) -> LaneRecord {
        let ctx = RunContext::new(self.run_id, FrameLimits::default());
        let Ok(e) = u32::try_from(job.epoch) else { return LaneRecord::default() };
        ctx.set_epoch_window(e, e);
        let gradient_of = |frame: &[u8], signer: PeerId| -> Option<ShownFrame> {
            let (h, _) = decode_frame(frame, &ctx, signer).ok()?;
            let of_attempt = u64::from(h.epoch) == job.epoch
                && (h.shard, h.first_sample, h.attempt) == job.key
                && h.samples == job.samples;
            (h.direction == Direction::ActivationGrad && of_attempt)
                .then(|| ShownFrame { id: h.frame_id(), header: header_bytes(&h) })
        };
        let tail = job.reported_loss.is_some();
        let sent = if tail { Some(&bundle.output_frame[..]) } else { bundle.backward.as_ref().map(|b| &b.sent[..]) };
        let received = bundle.backward.as_ref().map(|b| &b.received[..]);
        LaneRecord {
            sent_grad: sent.filter(|_| job.upstream.is_some()).and_then(|f| gradient_of(f, job.miner)),
            received_grad: received.zip(job.downstream).and_then(|(f, down)| gradient_of(f, down)),
            failed_step: None,
        }
    }

    fn check_bundle(&mut self, job: &CheckJob, bundle: EvidenceBundle) -> Result<(), String> {
        let mut epoch_starts = vec![match job.epoch_start {
            Some(h) => h,
            None => self.initial_hash(job.stage)?,
        }];
        epoch_starts.extend(job.merged_start);
        // The head's tokens and the tail's targets, from the corpus as the
        // miners read them.
        let data = if job.stage == 0 || job.reported_loss.is_some() {
            let corpus = self.corpus.as_ref().ok_or("no corpus to take the micro-batch from")?;
            let mb =
                MicroBatchId { first: SampleId { epoch: 0, shard: job.key.0, index: job.key.1 }, len: job.samples };
            Some(corpus.micro_batch(self.cfg.train.seed, mb, self.cfg.train.seq))
        } else {
            None
        };
        let tokens = data.as_ref().filter(|_| job.stage == 0).map(|(x, _)| x.as_slice());
        let ctx = RunContext::new(self.run_id, FrameLimits::default());
        let e = u32::try_from(job.epoch).map_err(|_| "an epoch past the frame's range")?;
        ctx.set_epoch_window(e, e);
        let known = Known {
            ctx: &ctx,
            miner: job.miner,
            stage: job.stage,
            upstream: job.upstream,
            downstream: job.downstream,
            tokens,
            committed: &job.heads,
            epoch_starts: &epoch_starts,
            codec: self.cfg.train.codec,
            tolerance: tolerance_for(&job.device),
        };
        let mb = SampledMb {
            epoch: job.epoch,
            shard: job.key.0,
            first_sample: job.key.1,
            samples: job.samples,
            attempt: job.key.2,
        };
        let middle = job.stage > 0 && job.reported_loss.is_none();
        // A head of a split model shows the answer to its output.
        let answered_head = job.stage == 0 && job.downstream.is_some();
        let finding = match (job.reported_loss, &data) {
            (Some(reported_loss), Some((_, targets))) => {
                let claim = TailClaim { targets, reported_loss };
                check_tail(&self.recompute, &known, mb, bundle.as_forward(), claim)
            }
            _ => match check_forward(&self.recompute, &known, mb, bundle.as_forward()) {
                Finding::Honest if middle => match bundle.as_backward() {
                    Some(ev) => check_backward(&self.recompute, &known, mb, ev),
                    None => Finding::Cheated("a middle stage's evidence without its backward".into()),
                },
                Finding::Honest if answered_head => match &bundle.backward {
                    Some(b) if b.sent.is_empty() && b.weights.is_none() => {
                        check_head_answer(&known, mb, bundle.as_forward(), &b.received)
                    }
                    Some(_) => Finding::Cheated("a head's evidence with a gradient it sent".into()),
                    None => Finding::Cheated("a head's evidence without the gradient that answered its output".into()),
                },
                f => f,
            },
        };
        match finding {
            Finding::Honest => self.check_inner_step(job, &bundle, &ctx, &epoch_starts),
            Finding::Cheated(why) => Err(why),
        }
    }

    /// The inner steps the attempt's backward went into (`inner_step`), for
    /// the attempt asked with them: shown whenever the miner committed a
    /// steps chain, and a miner that committed inner steps commits their
    /// records too.
    fn check_inner_step(
        &mut self,
        job: &CheckJob,
        bundle: &EvidenceBundle,
        ctx: &RunContext,
        epoch_starts: &[[u8; 32]],
    ) -> Result<(), String> {
        // One drawn attempt per miner is asked with its steps.
        if !self.cfg.spec.validation.check_inner_steps || !job.inner_step {
            return Ok(());
        }
        let steps = &job.heads.steps;
        if steps.len == 0 {
            return match job.heads.weights.len {
                0 => Ok(()),
                n => Err(format!("{n} inner steps committed without their records")),
            };
        }
        let ev = self.step_evidence(job, bundle)?;
        let tolerance = tolerance_for(&job.device);
        let (finding, at) = self.with_step_known(job, &bundle.step_hashes, (ctx, epoch_starts), |known| {
            check_step_at(&self.be, &self.cfg, known, &ev)
        });
        match finding {
            Finding::Honest => Ok(()),
            Finding::Cheated(why) => {
                // A proof needs the miner's backend (`prove_step`).
                self.failed_step = at.filter(|_| tolerance == 0.0);
                Err(why)
            }
        }
    }

    /// The inner steps `bundle` shows, within the run's bounds.
    fn step_evidence(&self, job: &CheckJob, bundle: &EvidenceBundle) -> Result<StepEvidence, String> {
        let bytes = bundle.step.as_deref().ok_or("no inner step shown for a committed steps chain")?;
        let limits = StepLimits {
            weights: self.stage_weights(job.stage)?,
            max_headers: self.cfg.spec.micro_batches_per_epoch.saturating_add(2),
            max_mbs: self.cfg.train.grad_accum.max(1) as u64,
            max_frame: FrameLimits::default().max_payload.saturating_add(4096),
            window: u64::from(self.cfg.spec.validation.step_window),
        };
        StepEvidence::decode(bytes, limits).map_err(|e| format!("inner step: {e:#}"))
    }

    /// Runs `f` with what this validator knows of `job`'s miner for its
    /// inner steps.
    fn with_step_known<R>(
        &self,
        job: &CheckJob,
        step_hashes: &[[u8; 32]],
        (ctx, epoch_starts): (&RunContext, &[[u8; 32]]),
        f: impl FnOnce(&StepKnown) -> R,
    ) -> R {
        let corpus = self.corpus.clone();
        let (seed, seq) = (self.cfg.train.seed, self.cfg.train.seq);
        let data = move |shard: u32, index: u64, len: u32| {
            let mb = MicroBatchId { first: SampleId { epoch: 0, shard, index }, len };
            corpus.as_ref().map(|c| c.micro_batch(seed, mb, seq))
        };
        let known = StepKnown {
            ctx,
            miner: job.miner,
            stage: job.stage,
            steps: &job.heads.steps,
            previous_steps: job.previous_steps.as_ref(),
            step_hashes,
            epoch_starts,
            attempt: job.key,
            completed: &job.completed,
            upstream_miners: &job.upstream_miners,
            downstream_miners: &job.downstream_miners,
            data: &data,
            tolerance: tolerance_for(&job.device),
        };
        f(&known)
    }

    /// The proof that step `p.step` of the step object `step_bytes` (the
    /// one `p.job` checked, whose recompute failed there) is not what the
    /// miner's signed trace of it (`trace_bytes`) says: the encoded
    /// `StepProof`, or why there is none (objects not the announced ones,
    /// a trace not signed, not bound to the step's record, or agreeing
    /// with this validator's own).
    pub fn prove(&mut self, p: &ProveJob, step_bytes: &[u8], trace_bytes: &[u8]) -> Result<Vec<u8>, String> {
        let job = &p.job;
        for (bytes, o) in [(step_bytes, &job.object), (trace_bytes, &p.trace)] {
            if bytes.len() as u64 != o.size || *blake3::hash(bytes).as_bytes() != o.hash {
                return Err(format!("the object {} is not what its miner announced", o.key));
            }
        }
        let bundle =
            EvidenceBundle::decode(step_bytes, self.limits(job)?).map_err(|e| format!("evidence bundle: {e}"))?;
        let ev = self.step_evidence(job, &bundle)?;
        let (trace, signature) = split_trace_object(trace_bytes).ok_or("not a trace object")?;
        let mut epoch_starts = vec![match job.epoch_start {
            Some(h) => h,
            None => self.initial_hash(job.stage)?,
        }];
        epoch_starts.extend(job.merged_start);
        let ctx = RunContext::new(self.run_id, FrameLimits::default());
        let e = u32::try_from(job.epoch).map_err(|_| "an epoch past the frame's range")?;
        ctx.set_epoch_window(e, e);
        let proven = self.with_step_known(job, &bundle.step_hashes, (&ctx, &epoch_starts), |known| {
            prove_step(&self.be, &self.cfg, (known, job.epoch), &ev, p.step, (trace, signature))
        });
        match proven {
            Ok(Some(proof)) => Ok(proof.encode()),
            Ok(None) => Err("its trace agrees with this validator's recompute".into()),
            Err(e) => Err(format!("{e:#}")),
        }
    }
}
