//! Answering a trace ask (`WorkRef.trace_step`): a validator's recompute
//! of one of the inner steps this miner showed failed, and it asks for the
//! miner's own trace of that step (PROTOCOL.md, "A failed step as a
//! proof"). The miner replays the step from the state it showed, traced,
//! signs the trace and uploads it under the attempt's trace key. An honest
//! miner's trace is its own work; the validator's proof can then only fail.

use std::collections::BTreeMap;
use std::sync::Arc;

use iota_core::commitment::Chain;
use iota_core::{Identity, MicroBatchId, PeerId, SampleId};
use iota_model::Backend;
use iota_model::data::Corpus;
use iota_protocol::store_keys::trace_evidence_key;
use iota_protocol::{RunConfig, SharedStore, StoredObject, pb};
use tracing::{info, warn};

use super::EvidenceLog;
use crate::frame::RunContext;
use crate::inner_step::prove::{trace_object, trace_shown_step};
use crate::inner_step::step_trace::{KeptBefore, StepTrace};
use crate::inner_step::{StepEvidence, StepHeader, StepKnown};
use crate::miner::events::Output;

/// What a miner's trace is computed and signed with.
pub(crate) struct Tracer<'a, B: Backend> {
    pub be: &'a Arc<B>,
    pub cfg: &'a RunConfig,
    pub ctx: &'a RunContext,
    pub corpus: Option<&'a Arc<Corpus>>,
    pub signer: Option<&'a Identity>,
    /// A test adversary's own optimizer step, which its trace must show to
    /// bind to what it committed (`lazy_trace`).
    pub lazy: Option<Laziness>,
}

/// How a lazy adversary ran its optimizer steps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Laziness {
    /// On no weight gradients (`skip-weight-grad`, `skip-backward`).
    NoWeightGrads,
    /// Not at all (`skip-optimizer`).
    NoStep,
}

/// The trace of step `trace_step - 1` of the attempt `item` names, signed
/// and uploaded, and announced (`Stored`). Nothing is uploaded where the
/// step cannot be replayed (a state no longer kept), or the miner has no
/// key to sign with; a warning says why.
pub(crate) fn answer_trace<B: Backend>(
    log: &mut EvidenceLog,
    (epoch, item): (u64, &pb::WorkRef),
    me: PeerId,
    t: &Tracer<B>,
    (store, rt): (&SharedStore, &tokio::runtime::Handle),
    out: &mut Vec<Output>,
) {
    let key = (epoch, item.shard, item.first_sample, item.attempt);
    let skip = |why: &str| warn!(shard = key.1, first = key.2, attempt = key.3, why, "trace not uploaded");
    let Some(signer) = t.signer else { return skip("this miner has no key to sign a trace with") };
    let step = item.trace_step.saturating_sub(1);
    let (stage, ev) = match log.step_evidence_of(key) {
        Ok(x) => x,
        Err(why) => return skip(why),
    };
    let trace = match replay(t, (me, stage), &ev, step) {
        Ok(x) => x,
        Err(e) => return skip(&format!("{e:#}")),
    };
    let sig = signer.sign(&trace.signing_digest(t.ctx.run_id(), epoch, stage, &me.0));
    let object = trace_object(&trace.encode(), &sig);
    let obj_key = trace_evidence_key(epoch, &me, (key.1, key.2, key.3), step);
    let stored = StoredObject::of(&obj_key, &object, me);
    if let Err(e) = rt.block_on(store.put(&obj_key, object)) {
        warn!(key = obj_key, error = %e, "uploading a trace failed");
        return;
    }
    info!(epoch, step, key = obj_key, "trace of an inner step uploaded");
    out.push(Output::Report(pb::report::Kind::Stored(pb::Stored { epoch, stage, object: Some(stored.to_pb()) })));
}

/// The miner's replay of step `step` of `ev`, traced (and, for a test
/// adversary, made to show the optimizer step it ran).
fn replay<B: Backend>(
    t: &Tracer<B>,
    (me, stage): (PeerId, u32),
    ev: &StepEvidence,
    step: u32,
) -> anyhow::Result<StepTrace> {
    // The miner trusts its own frames and states: every signer its frames
    // name is a neighbour, every state its records name is committed.
    let signers = |pick: fn(&crate::inner_step::MbFrames) -> [u8; 32]| -> Vec<PeerId> {
        ev.frames.iter().map(|f| PeerId(pick(f))).collect()
    };
    let (up, down) = (signers(|f| f.input_signer), signers(|f| f.grad_signer));
    let states: Vec<[u8; 32]> = ev
        .headers
        .iter()
        .flat_map(|h| [h.weights_before, h.weights_after].into_iter().chain(h.mbs.iter().map(|m| m.weights)))
        .collect();
    let steps = Chain::of(ev.headers.iter().map(StepHeader::hash).collect::<Vec<_>>().iter());
    let completed = BTreeMap::new();
    let (seed, seq) = (t.cfg.train.seed, t.cfg.train.seq);
    let corpus = t.corpus.cloned();
    let data = move |shard: u32, index: u64, len: u32| {
        let mb = MicroBatchId { first: SampleId { epoch: 0, shard, index }, len };
        corpus.as_ref().map(|c| c.micro_batch(seed, mb, seq))
    };
    let known = StepKnown {
        ctx: t.ctx,
        miner: me,
        stage,
        steps: &steps,
        previous_steps: None,
        step_hashes: &states,
        epoch_starts: &states,
        attempt: (0, 0, 0),
        completed: &completed,
        upstream_miners: &up,
        downstream_miners: &down,
        data: &data,
        tolerance: 0.0,
    };
    let (trace, kept) = trace_shown_step(t.be, t.cfg, &known, ev, step)?;
    Ok(match t.lazy {
        None => trace,
        Some(l) => lazy_trace(t, stage, l, trace, &kept)?,
    })
}

/// A lazy adversary's trace: its micro-batches as the honest replay ran
/// them (its neighbours checked those), and the optimizer step as it ran
/// it, so the trace binds to what it committed.
fn lazy_trace<B: Backend>(
    t: &Tracer<B>,
    stage: u32,
    lazy: Laziness,
    mut trace: StepTrace,
    kept: &KeptBefore,
) -> anyhow::Result<StepTrace> {
    use iota_checks::hashes::weights_leaves;
    use iota_model::Stage;
    use iota_model::optim::AdamW;
    let specs = iota_core::StageSpec::split(&t.cfg.train.model, t.cfg.train.stages)?;
    let spec = specs.get(stage as usize).cloned().ok_or_else(|| anyhow::anyhow!("no such stage"))?;
    let mut st = Stage::with_params(t.be.clone(), &t.cfg.train.model, spec, &kept.weights)?;
    let mut opt = AdamW::<B> { m: t.be.upload(&kept.m), v: t.be.upload(&kept.v), t: trace.t_before };
    match lazy {
        Laziness::NoStep => trace.sum_squares.iter_mut().for_each(|x| *x = f64::NAN),
        Laziness::NoWeightGrads => {
            st.set_grads(&vec![0.0; kept.grads.len()])?;
            opt.step(&mut st, &t.cfg.train.adamw, t.cfg.train.schedule.at(trace.step));
        }
    }
    trace.w_after = weights_leaves(&st.params_host());
    trace.m_after = weights_leaves(&t.be.to_host(&opt.m));
    trace.v_after = weights_leaves(&t.be.to_host(&opt.v));
    Ok(trace)
}
