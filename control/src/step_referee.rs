//! The orchestrator's re-check of a validator's proof of a failed inner
//! step before its verdict counts (PROTOCOL.md, "A failed step as a
//! proof"): the proof is read from the run's store under the validator's
//! key for the epoch and miner, held to the hash the signed verdict names,
//! and `verify_step_proof` recomputes its one piece on the CPU reference
//! against what the run holds of the miner (its committed steps chain, the
//! miners around its stage, the corpus). A proof that holds convicts on
//! its own; one that does not refuses the verdict.

use std::path::PathBuf;
use std::sync::Arc;

use iota_core::PeerId;
use iota_dataplane::frame::{FrameLimits, RunContext};
use iota_dataplane::inner_step::StepKnown;
use iota_dataplane::inner_step::proof_bytes::ProofLimits;
use iota_dataplane::inner_step::prove::{StepProof, verify_step_proof};
use iota_model::data::Corpus;
use iota_model::{CpuBackend, segments_of};
use iota_protocol::store_keys::step_proof_key;
use iota_protocol::{RunConfig, SharedStore};

use crate::orchestrator::StepRefereeInputs;

/// What a re-check found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Rechecked {
    /// The proof holds: the verdict convicts on it.
    Held,
    /// It could not be read (why): the verdict counts as a vote.
    Unread(String),
}

/// What re-checks step proofs: the run's store, its settings and corpus.
pub struct StepReferee {
    store: SharedStore,
    cfg: RunConfig,
    /// The corpus file (None: the toy corpus, or the run's store when the
    /// run keeps its corpus there).
    data: Option<PathBuf>,
    corpus: tokio::sync::OnceCell<Option<Arc<Corpus>>>,
}

impl StepReferee {
    pub fn new(store: SharedStore, cfg: RunConfig, data: Option<PathBuf>) -> StepReferee {
        StepReferee { store, cfg, data, corpus: tokio::sync::OnceCell::new() }
    }

    /// The corpus, loaded on first use (None where it cannot be: proofs
    /// that need a head's tokens or a tail's targets then do not hold).
    async fn corpus(&self) -> Option<Arc<Corpus>> {
        self.corpus
            .get_or_init(|| async {
                let c = if self.cfg.corpus_in_store {
                    iota_dataplane::corpus::load_corpus_from_store(&self.cfg, &*self.store, None).await
                } else {
                    iota_dataplane::corpus::load_corpus(&self.cfg, self.data.as_deref())
                };
                c.map(Arc::new).map_err(|e| tracing::warn!(error = %e, "the referee has no corpus")).ok()
            })
            .await
            .clone()
    }

    fn limits(&self, stage: u32) -> Result<ProofLimits, String> {
        let model = &self.cfg.train.model;
        let specs = iota_core::StageSpec::split(model, self.cfg.train.stages).map_err(|e| e.to_string())?;
        let spec = specs.get(stage as usize).ok_or("no such stage")?;
        let layout = iota_core::ParamLayout::for_stage(model, spec);
        let weights = layout.total() as u64;
        let segments = segments_of(&layout, spec).len() as u64;
        let mbs = self.cfg.train.grad_accum.max(1) as u64;
        let rows = (self.cfg.spec.batch.max(1) as u64).saturating_mul(self.cfg.train.seq as u64);
        let leaves = weights.div_ceil(iota_dataplane::hashes::WEIGHTS_LEAF as u64).saturating_add(1);
        Ok(ProofLimits {
            weights,
            activations: rows.saturating_mul(model.d_model.max(model.bottleneck) as u64),
            max_headers: self.cfg.spec.micro_batches_per_epoch.saturating_add(2),
            max_mbs: mbs,
            max_frame: FrameLimits::default().max_payload.saturating_add(4096),
            max_trace: (mbs * segments * 96 + segments * 8 + leaves * 96).saturating_add(4096),
        })
    }

    /// `Ok(Held)` when the proof `validator` stored against `miner` for
    /// `epoch` is the one its verdict names (`hash`) and holds;
    /// `Ok(Unread(why))` when it cannot be read here (the verdict then
    /// counts as a vote: a store this orchestrator does not see, or a proof
    /// never stored, proves nothing either way); why not otherwise.
    pub async fn check(
        &self,
        (epoch, validator, miner, hash): (u64, PeerId, PeerId, [u8; 32]),
        inputs: StepRefereeInputs,
    ) -> Result<Rechecked, String> {
        let key = step_proof_key(epoch, &validator, &miner);
        let bytes = match self.store.get(&key).await {
            Ok(b) => b,
            Err(e) => return Ok(Rechecked::Unread(format!("the proof {key} cannot be read: {e}"))),
        };
        if *blake3::hash(&bytes).as_bytes() != hash {
            return Err(format!("the proof {key} is not the one the verdict names"));
        }
        let proof = StepProof::decode(&bytes, self.limits(inputs.stage)?).map_err(|e| format!("{e:#}"))?;
        if proof.epoch != epoch {
            return Err("a proof of another epoch".into());
        }
        let corpus = self.corpus().await;
        let (cfg, run_id) = (self.cfg.clone(), self.cfg.spec.run_id);
        let holds = tokio::task::spawn_blocking(move || {
            let ctx = RunContext::new(run_id, FrameLimits::default());
            let e = u32::try_from(epoch).map_err(|_| anyhow::anyhow!("an epoch past the frame's range"))?;
            ctx.set_epoch_window(e, e);
            let (seed, seq) = (cfg.train.seed, cfg.train.seq);
            let data = move |shard: u32, index: u64, len: u32| {
                let mb = iota_core::MicroBatchId { first: iota_core::SampleId { epoch: 0, shard, index }, len };
                corpus.as_ref().map(|c| c.micro_batch(seed, mb, seq))
            };
            let completed = std::collections::BTreeMap::new();
            let known = StepKnown {
                ctx: &ctx,
                miner,
                stage: inputs.stage,
                steps: &inputs.steps,
                previous_steps: None,
                step_hashes: &[],
                epoch_starts: &[],
                attempt: (0, 0, 0),
                completed: &completed,
                upstream_miners: &inputs.upstream,
                downstream_miners: &inputs.downstream,
                data: &data,
                tolerance: 0.0,
            };
            verify_step_proof(&Arc::new(CpuBackend::new()), &cfg, &known, &proof)
        })
        .await
        .map_err(|e| format!("the re-check failed to run: {e}"))?;
        match holds {
            Ok(true) => Ok(Rechecked::Held),
            Ok(false) => Err("its piece recomputes to what the miner claimed".into()),
            Err(e) => Err(format!("{e:#}")),
        }
    }
}

/// The step proof a verdict names: (epoch, miner, proof hash).
pub(crate) fn named_proof(kind: &iota_protocol::pb::validator_report::Kind) -> Option<(u64, PeerId, [u8; 32])> {
    let iota_protocol::pb::validator_report::Kind::Verdict(v) = kind else { return None };
    let hash = <[u8; 32]>::try_from(v.step_proof_hash.as_slice()).ok()?;
    let miner = <[u8; 32]>::try_from(v.miner.as_slice()).ok()?;
    Some((v.epoch, PeerId(miner), hash))
}

/// A verdict's stored step proof (`hash`) against `miner` for `epoch`,
/// from `validator`, re-checked: `Ok(true)`, it holds; `Ok(false)`, it
/// cannot be checked here (no referee, or the proof cannot be read: the
/// verdict counts as a vote); `Err`, it does not hold (the verdict is
/// refused).
pub(crate) async fn recheck(
    referee: Option<Arc<StepReferee>>,
    inputs: Option<StepRefereeInputs>,
    (epoch, validator, miner): (u64, PeerId, PeerId),
    hash: [u8; 32],
) -> Result<bool, String> {
    let Some(referee) = referee else {
        tracing::warn!(epoch, miner = %miner, "a step proof this orchestrator does not re-check: counted as a vote");
        return Ok(false);
    };
    let inputs = inputs.ok_or_else(|| format!("the run holds no committed steps of {miner} for epoch {epoch}"))?;
    match referee.check((epoch, validator, miner, hash), inputs).await? {
        Rechecked::Held => Ok(true),
        Rechecked::Unread(why) => {
            tracing::warn!(epoch, miner = %miner, why, "a step proof not re-checked: counted as a vote");
            Ok(false)
        }
    }
}
