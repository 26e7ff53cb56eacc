//! The run configuration: everything a miner needs to take part, handed out
//! by the orchestrator at registration (as JSON). It holds no host paths:
//! where a miner finds the corpus and the object store is its own business
//! (`iota-miner run --data --store`); the corpus is named by its content
//! (`corpus`), which the miner checks.

use anyhow::{Result, bail};
use iota_core::ids::CorpusId;
use iota_core::train_config::TrainConfig;
use serde::{Deserialize, Serialize};

use crate::run_spec::RunSpec;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunConfig {
    /// Shape of the swarm and the epochs (the orchestrator's view).
    pub spec: RunSpec,
    /// Model and optimisation (each miner's view). `train.stages` equals
    /// `spec.stages`; `train.steps` is the length of the LR schedule in
    /// optimizer steps of one miner.
    pub train: TrainConfig,
    /// Largest number of data shards the corpus is cut into (the corpus
    /// decides the actual number; `spec.n_shards` must equal it).
    pub max_shards: usize,
    /// Fraction of the corpus held out for validation.
    pub val_fraction: f64,
    /// The corpus's content (token count and hash): every role that loads
    /// the corpus checks it got the same tokens. Set by the launcher.
    #[serde(default)]
    pub corpus: Option<CorpusId>,
    /// How miners reach the object store (never where it is: no path, no
    /// credential). Left out of the JSON for a directory, so runs made
    /// before this field keep their run id.
    #[serde(default, skip_serializing_if = "StoreAccess::is_directory")]
    pub store: StoreAccess,
    /// The corpus is the one `iota-control data prepare` wrote into the
    /// run's store (`data/manifest.json`): every role fetches it from there
    /// and needs no copy of its own. Left out of the JSON when false, so
    /// earlier runs keep their run id.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub corpus_in_store: bool,
}

impl RunConfig {
    /// A run of `spec` training `train`, with the launcher's defaults for
    /// the rest (64 shards at most, 2% held out, a store directory, the
    /// corpus named once the launcher has loaded it).
    pub fn new(spec: RunSpec, train: TrainConfig) -> RunConfig {
        RunConfig {
            spec,
            train,
            max_shards: 64,
            val_fraction: 0.02,
            corpus: None,
            store: StoreAccess::Directory,
            corpus_in_store: false,
        }
    }
}

/// How miners reach the run's object store.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StoreAccess {
    /// A directory on the orchestrator's machine (one-machine runs): each
    /// miner names it with `--store DIR`.
    #[default]
    Directory,
    /// A bucket only the orchestrator holds credentials for: miners ask it
    /// for presigned URLs (the `Grant` RPC) and need no `--store`.
    Granted,
    /// A directory on the orchestrator's machine that the orchestrator
    /// serves itself (`served_grant`): miners elsewhere ask for grants as
    /// for a bucket; one on the same machine may open the directory with
    /// `--store DIR` instead.
    Served,
}

impl StoreAccess {
    pub fn is_directory(&self) -> bool {
        *self == StoreAccess::Directory
    }
}

impl RunConfig {
    pub fn validate(&self) -> Result<()> {
        self.spec.validate().map_err(anyhow::Error::msg)?;
        self.train.validate()?;
        if self.train.stages as u32 != self.spec.stages {
            bail!("train.stages {} != spec.stages {}", self.train.stages, self.spec.stages);
        }
        if !(0.0..1.0).contains(&self.val_fraction) || !(1..=1 << 20).contains(&self.max_shards) {
            bail!(
                "val_fraction {} must be in [0, 1) and max_shards {} in 1..={}",
                self.val_fraction,
                self.max_shards,
                1 << 20
            );
        }
        if self.train.batch as u32 != self.spec.batch {
            bail!("train.batch {} != spec.batch {}", self.train.batch, self.spec.batch);
        }
        if self.train.adamw.predict_weights && !self.spec.validation.validators.is_empty() {
            // A validator recomputes a forward on the committed weights of
            // its version; a predicted forward ran on weights no chain
            // commits to.
            bail!("weight prediction is not validated yet; run it without validators");
        }
        if !self.spec.micro_batches_per_epoch.is_multiple_of(self.train.grad_accum as u64) {
            bail!(
                "micro-batches per epoch ({}) must be a multiple of grad_accum ({})",
                self.spec.micro_batches_per_epoch,
                self.train.grad_accum
            );
        }
        // A miner steps after grad_accum micro-batches: each epoch of the
        // merge ramp must end on a step.
        if !self.spec.ramp_first_epoch.is_multiple_of(self.train.grad_accum as u64) {
            bail!(
                "the merge ramp's first epoch ({} micro-batches) must be a multiple of grad_accum ({})",
                self.spec.ramp_first_epoch,
                self.train.grad_accum
            );
        }
        Ok(())
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("run config serialises")
    }

    /// Parses and validates the orchestrator's run configuration. A
    /// setting this build does not know is refused by name, not ignored: a
    /// miner older than the run would otherwise train with the setting's
    /// default (an optimizer, a schedule) while the run means another.
    pub fn from_json(s: &str) -> Result<RunConfig> {
        let mut unknown = Vec::new();
        let mut de = serde_json::Deserializer::from_str(s);
        let c: RunConfig = serde_ignored::deserialize(&mut de, |path| unknown.push(path.to_string()))?;
        de.end()?;
        if !unknown.is_empty() {
            bail!(
                "the run uses settings this build of iota-rs does not know ({}): upgrade to the orchestrator's version",
                unknown.join(", ")
            );
        }
        c.validate()?;
        Ok(c)
    }
}
