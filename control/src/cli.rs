//! Command-line settings of a run (shared by `orchestrator` and `swarm`), and
//! the TOML config file that can provide them.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::Args;
use iota_core::{BottleneckStyle, ModelConfig, WireCodec};
use iota_model::data::TokenizerKind;
use iota_model::optim::{AdamWConfig, LrSchedule};
use iota_model::train::TrainConfig;

use iota_model::run_dir::{self, Claim};
use iota_protocol::run_config::StoreAccess;
use iota_protocol::{RunConfig, RunSpec};
pub use schedule::{Cadence, Schedule};

mod merge_args;
pub mod schedule;
mod stage_split;

pub use stage_split::{stage_layers, stage_note};

#[derive(Args, Clone, Debug)]
pub struct RunArgs {
    /// Model preset (tiny, small, 125m, 1b, 1.5b, 15b).
    #[arg(long, default_value = "small")]
    pub model: String,
    /// Pipeline stages.
    #[arg(long, default_value_t = 3)]
    pub stages: u32,
    /// Miners per stage (data-parallel replicas, merged every epoch).
    #[arg(long, default_value_t = 2)]
    pub replicas: u32,
    /// Epochs to train (the run's length is epochs x micro-batches); each
    /// ends with the replicas of every stage merging (more often under
    /// `--schedule loss`).
    #[arg(long, default_value_t = 3)]
    pub epochs: u64,
    /// Micro-batches per epoch (over all replicas).
    #[arg(long, default_value_t = 48)]
    pub micro_batches: u64,
    /// How the run trades loss at equal tokens against speed. loss: the
    /// replicas merge every 2 inner steps (the run's epochs x micro-batches
    /// cut into epochs of 2 x replicas x grad-accum) with one micro-batch
    /// per pathway in flight. throughput: a merge at the end of each
    /// --micro-batches epoch, 2 micro-batches per replica in flight. auto:
    /// loss for a swarm of CPU miners on this machine (`swarm
    /// --miner-device cpu`), where merges are cheap and the miners keep the
    /// cores busy anyway; throughput for GPU miners (a stage idles without
    /// a full pipeline), for `orchestrator` (miners on other machines,
    /// merges over the network) and with validators (each epoch has a
    /// floor of recomputed samples per miner). `small`, 3x2, 288
    /// micro-batches, 2-core VM: loss lands 0.8-1.3% above one process at
    /// equal tokens, throughput 4.4-4.9%, at 0.7x and 1x the speed
    /// (docs/BENCHMARKS.md, "The default schedule"). Each epoch settles
    /// the same emission, so loss pays out over more epochs. A run
    /// directory made before this setting resumes with `--schedule
    /// throughput`.
    #[arg(long, default_value = "auto")]
    pub schedule: String,
    /// Where the miners compute when the command starts them itself on this
    /// machine (`swarm`, the benchmarks), which `--schedule auto` decides
    /// from; `None` when they join from elsewhere (`orchestrator`).
    #[arg(skip)]
    pub local_miner_device: Option<String>,
    /// Sequences per micro-batch.
    #[arg(long, default_value_t = 8)]
    pub batch: usize,
    /// Tokens per sequence (default: 128, or the model's max_seq if smaller).
    #[arg(long)]
    pub seq: Option<usize>,
    /// Micro-batches each miner accumulates per optimizer step.
    #[arg(long, default_value_t = 1)]
    pub grad_accum: usize,
    /// Peak learning rate (warm-up then cosine decay).
    #[arg(long, default_value_t = 2e-3)]
    pub lr: f32,
    /// Optimizer steps of linear learning-rate warm-up (default: a
    /// twentieth of the run's steps, between 1 and 100).
    #[arg(long)]
    pub warmup_steps: Option<u64>,
    /// Inner optimizer of every miner: auto, adamw, nadam (Adam with a
    /// Nesterov look-ahead on the first moment), or muon (the blocks'
    /// matrices take Muon's orthogonalised momentum, scaled to AdamW's step
    /// size; embeddings, LM head and norms keep AdamW). auto: Muon where
    /// its Newton-Schulz steps add at most 10% to the slowest stage's step
    /// (counted from the model and the tokens per step: `small` at the
    /// defaults), else AdamW; the run's first lines say which and why.
    /// Muon learns more per token (`small`: the swarm's gap to one process
    /// halved; docs/BENCHMARKS.md, convergence).
    #[arg(long, default_value = "auto")]
    pub optimizer: String,
    /// beta1 of each stage's inner optimizer, head first, comma-separated
    /// (a shorter list repeats its last value; default 0.9 everywhere).
    #[arg(long, value_delimiter = ',')]
    pub stage_beta1: Vec<f32>,
    /// The learning rate's multiplier at each stage, head first,
    /// comma-separated (a shorter list repeats its last value; default 1
    /// everywhere): e.g. `0.5,0.75,1` for smaller steps where pipelining
    /// delays the gradients most.
    #[arg(long, value_delimiter = ',')]
    pub stage_lr: Vec<f32>,
    /// Muon's momentum (default 0.95), between 0 and 1: a replica's
    /// momentum holds the noise of its share of the batch, which Muon's
    /// orthogonalisation raises; a longer momentum averages more of it.
    #[arg(long)]
    pub muon_momentum: Option<f32>,
    /// Weight prediction: each stage forwards a micro-batch on its weights
    /// extrapolated by the optimizer steps the micro-batches ahead of it
    /// will take, and runs its backward on them, so pipelining's delayed
    /// gradients are taken near the weights they are applied to (costs one
    /// copy of the stage's weights, plus one per micro-batch in flight
    /// instead of one per weights version). Not yet with validators.
    #[arg(long)]
    pub predict_weights: bool,
    /// Wire codec at stage boundaries: int8, int4, bf16, f32.
    #[arg(long, default_value = "int8")]
    pub codec: String,
    /// Bottleneck width at boundaries (default: the preset's; 0 = off).
    #[arg(long)]
    pub bottleneck: Option<usize>,
    /// Blocks per pipeline stage. even: the layers cut as evenly as they
    /// go, earlier stages taking the remainder. balanced: by each stage's
    /// FLOPs at this --seq, the tail's LM head counted, so the slowest
    /// stage is as fast as a split allows (`1.5b` in 3 stages at seq 1024
    /// with the GPT-2 vocabulary: 6,6,4, the slowest stage 1.02x the mean
    /// instead of 1.13x; at Llama 3's 128k vocabulary 7,7,2, 1.04x instead
    /// of 1.36x). balanced:GIB: the same among the splits whose every
    /// stage fits a GIB card on a CUDA miner holding the run's micro-batches
    /// in flight (recomputing activations where it must; `1.5b` at Llama
    /// 3's vocabulary, batch 4 x 1024, 16 GiB: 6,7,3). Or the counts, head
    /// first (`7,7,2`).
    /// With a card per miner a pipeline runs at its
    /// slowest stage's pace; miners sharing one device share its time
    /// whatever the split. Blocks moved to the head and body move their
    /// memory too (`iota-bench scale --plan-only --stage-layers ...` shows
    /// both). A split equal to the even one is the even one (same run id).
    #[arg(long, default_value = "even", value_name = "even|balanced|balanced:GIB|N,N,..")]
    pub stage_layers: String,
    /// Bottleneck style: linear (default) or residual (a SwiGLU branch in
    /// the encoder and the decoder; docs/ARCHITECTURE.md, "The bottleneck").
    #[arg(long, default_value = "linear")]
    pub bottleneck_style: String,
    /// Training corpus (text, .jsonl, .bin shards); default: a generated toy corpus.
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Train on the corpus `iota-control data prepare` wrote into the run's
    /// store (its bucket with --bucket, else RUN_DIR/store): miners and
    /// validators fetch it from there, check it and cache it, and need no
    /// --data of their own.
    #[arg(long, conflicts_with = "data")]
    pub prepared_data: bool,
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Run directory: run.json (the run's settings), state database, object
    /// store, keys, logs. The same settings resume the run there; other
    /// settings are refused, naming what differs (see --new-run).
    #[arg(long, default_value = "runs/swarm")]
    pub run_dir: PathBuf,
    /// Start a new run in --run-dir even though it holds another one: the
    /// old run's state, store, logs and run.json move into RUN_DIR/archive-N
    /// first (nothing is deleted; miner keys stay).
    #[arg(long)]
    pub new_run: bool,
    /// Keep the run's objects in an S3-compatible bucket instead of
    /// RUN_DIR/store. Only the orchestrator holds the credentials
    /// (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY in its environment);
    /// miners get presigned URLs for the keys they may touch and need no
    /// --store.
    #[arg(long, value_name = "s3://BUCKET/PREFIX")]
    pub bucket: Option<String>,
    /// The S3 service's URL (MinIO, R2, s3s-fs, ...); default: AWS itself.
    #[arg(long, value_name = "URL", requires = "bucket")]
    pub s3_endpoint: Option<String>,
    /// The bucket's region.
    #[arg(long, default_value = "us-east-1", requires = "bucket")]
    pub s3_region: String,
    /// Path-style addressing (URL/BUCKET/KEY), which MinIO and s3s-fs need.
    #[arg(long, requires = "bucket")]
    pub s3_path_style: bool,
    /// Micro-batches in the pipeline at once (default: --schedule's, one
    /// per replica for loss, 2 per replica for throughput). A trade-off:
    /// more keeps every stage busy, but each stage then steps before
    /// earlier micro-batches' gradients return, and those delayed
    /// gradients cost loss (`small`, 3x2, 144 steps, Muon, a merge every
    /// 4 inner steps: 1 per replica +1.7-2.1% against one process at equal
    /// tokens, 2 per replica +3.4%; docs/BENCHMARKS.md, "The default
    /// schedule"). The run's first steps go out one per pathway
    /// (--pipeline-warmup-steps).
    #[arg(long)]
    pub max_in_flight: Option<u32>,
    /// Optimizer steps at the start of the run with at most one
    /// micro-batch per pathway in flight (--replicas of them), before the
    /// pipeline fills to --max-in-flight (default: the learning rate's
    /// warm-up; 0: none). Pipelining's delayed gradients cost most while
    /// the learning rate warms up (`small`: a delay in the first 8 of 144
    /// steps costs 6 of its 8.6 points; docs/BENCHMARKS.md, convergence).
    /// A run directory made before this setting existed resumes with
    /// `--pipeline-warmup-steps 0`.
    #[arg(long)]
    pub pipeline_warmup_steps: Option<u64>,
    /// Seconds before an unfinished micro-batch is re-routed.
    #[arg(long, default_value_t = spec_default().route_timeout_ms / 1000)]
    pub route_timeout_s: u64,
    /// Seconds of silence before a miner counts as unhealthy.
    #[arg(long, default_value_t = spec_default().heartbeat_timeout_ms / 1000)]
    pub heartbeat_timeout_s: u64,
    /// Issues of a micro-batch that fail with nobody to blame before it is
    /// counted as dropped (failures pinned on a miner do not count: the
    /// micro-batch goes to another replica).
    #[arg(long, default_value_t = spec_default().max_attempts)]
    pub max_attempts: u32,
    /// A miner that fails this many micro-batches in a row (no delivery in
    /// between) is benched for the rest of the epoch: no routes, out of the
    /// merge; benched in 3 epochs, it is removed from the run.
    #[arg(long, default_value_t = spec_default().bench_after_failures)]
    pub bench_after_failures: u32,
    /// Miners a stage takes at most (replicas plus spares; default four
    /// times --replicas). Registrations past it are refused, so a flood of
    /// fresh identities cannot grow the orchestrator without bound.
    #[arg(long)]
    pub max_miners_per_stage: Option<u32>,
    /// Seconds a registered miner has to open its command stream; until it
    /// does it is not counted, routed or announced, then it is forgotten.
    #[arg(long, default_value_t = spec_default().registration_timeout_ms / 1000)]
    pub registration_timeout_s: u64,
    /// A validator of the run and its stake, as PEER_HEX:STAKE (repeat
    /// for each; `iota-control validator` prints its key). Validators
    /// recompute a sample of every miner's work after each epoch and vote;
    /// more than half the stake convicts. Default: none (nobody checks).
    #[arg(long = "validator", value_name = "PEER_HEX:STAKE")]
    pub validator_stakes: Vec<String>,
    /// Fraction of each miner's micro-batches each validator recomputes.
    #[arg(long, default_value_t = spec_default().validation.rate)]
    pub validation_rate: f64,
    /// ... and at least this many per miner per epoch.
    #[arg(long, default_value_t = spec_default().validation.min_per_miner)]
    pub validation_min_samples: u32,
    /// Convictions after which a miner is ejected (its identity refused).
    #[arg(long, default_value_t = spec_default().validation.strikes_to_eject)]
    pub strikes_to_eject: u32,
    /// Seconds validators may hold an epoch's merge (and the next epoch's start, judging the merge).
    #[arg(long, default_value_t = spec_default().validation.timeout_ms / 1000)]
    pub validation_timeout_s: u64,
    /// Validators roll a merge back when the merged model's held-out loss
    /// exceeds the last kept one's or the late training loss by more than
    /// this fraction (or is not finite); with sparse contributions, the
    /// last kept one's alone (a sparse merge applies part of the replicas'
    /// progress at a time).
    #[arg(long, default_value_t = spec_default().validation.rollback_loss_jump)]
    pub rollback_loss_jump: f64,
    /// Held-out micro-batches a validator evaluates each merged model on.
    #[arg(long, default_value_t = spec_default().validation.eval_batches)]
    pub eval_batches: u32,
    /// Validators skip recomputing the inner steps drawn attempts went into
    /// (skipped weight gradients or optimizer steps then go unseen).
    #[arg(long)]
    pub no_inner_step_checks: bool,
    /// Inner steps per kept optimizer state (2 stage-sized snapshots on a
    /// miner's disk); a validator replays at most this many steps a check.
    #[arg(long, default_value_t = spec_default().validation.step_window)]
    pub step_window: u32,
    /// Seconds the upload or merge phase may take before moving on without laggards.
    #[arg(long, default_value_t = spec_default().phase_timeout_ms / 1000)]
    pub phase_timeout_s: u64,
    /// How replicas merge each epoch: butterfly (all-reduce over the data
    /// plane, two owners per slice) or parameter-server (upload, one
    /// aggregator averages; the baseline).
    #[arg(long, default_value = "butterfly")]
    pub merge: String,
    /// Codec of the butterfly's pseudo-gradient slices: bf16, int8 (per
    /// 256-value block), f32, or sparse: each contribution as the largest
    /// --sparse-density of every 16,384 values (about 8 bits each: an
    /// Elias-Fano coded index and 2 bits; 38.5x fewer bytes than bf16 at
    /// 1/20), what it leaves kept by the sender and added to its next
    /// (error feedback); merged updates then go in bf16. With validators,
    /// each replica commits to its backlog and an audited contribution is
    /// held against it and against the merge before that left it.
    #[arg(long, default_value = "bf16")]
    pub merge_codec: String,
    /// With --merge-codec sparse: the share of each block's values a
    /// contribution keeps, in (0, 1].
    #[arg(long, default_value_t = iota_protocol::run_spec::DEFAULT_SPARSE_DENSITY)]
    pub sparse_density: f32,
    /// With --merge-codec sparse: what a replica held back is multiplied by
    /// this before it joins its next contribution (1 keeps it whole).
    #[arg(long, default_value_t = iota_protocol::run_spec::DEFAULT_SPARSE_DECAY)]
    pub sparse_decay: f32,
    /// Butterfly reduce rule: centered-clip (robust to a Byzantine replica),
    /// trimmed-mean, or mean (not robust).
    #[arg(long, default_value = "centered-clip")]
    pub merge_rule: String,
    /// Outer learning rate on the merged pseudo-gradient: 1 unless told
    /// (with momentum 0, plain averaging), 1.5 with --merge-codec sparse
    /// (a sparse merge applies part of each replica's progress now and the
    /// rest later; the larger step makes up for it).
    #[arg(long)]
    pub outer_lr: Option<f32>,
    /// Outer Nesterov momentum (DiLoCo uses 0.9 with outer lr 0.7).
    #[arg(long, default_value_t = 0.0)]
    pub outer_momentum: f32,
    /// Merges over which the outer momentum rises linearly from 0.5 to
    /// --outer-momentum (IOTA warms it from 0.5 to 0.9); 0 = no warm-up.
    #[arg(long, default_value_t = spec_default().merge.outer_momentum_warmup)]
    pub outer_momentum_warmup: u64,
    /// Butterfly partitions per replica, at least (more: smaller messages,
    /// finer re-plans). A large stage gets more, so that every slice fits
    /// --max-slice-mib.
    #[arg(long, default_value_t = spec_default().merge.slices_per_replica)]
    pub slices_per_replica: u32,
    /// Largest butterfly slice on the wire, in MiB (4 KiB to 128 MiB as a
    /// fraction): the merge plan cuts each stage into partitions whose encoded
    /// slices fit one frame, so none is refused for its size or goes through
    /// the object store for it.
    #[arg(long, default_value_t = spec_default().merge.max_slice_bytes as f64 / (1u64 << 20) as f64)]
    pub max_slice_mib: f64,
    /// Mbit/s each way a miner is assumed to have to the object store: a
    /// contribution one owner claims missing is waited for this long before
    /// its sender is planned out of the merge (3 s plus one slice up and
    /// down at this rate). Lower it for miners on slow uplinks.
    #[arg(long, default_value_t = spec_default().merge.store_mbit)]
    pub store_mbit: u32,
    /// Merge behind compute: each epoch's butterfly merge runs while the
    /// next epoch trains, and replicas land it (merged weights plus what
    /// they trained since) when that epoch ends, so GPUs do not idle during
    /// the exchange. Loss at equal tokens on `small`: within 0.2% of the
    /// synchronous merge in the real swarm, 1-2% in the in-process replay
    /// (docs/BENCHMARKS.md); not yet with validators or the parameter
    /// server. Off: every epoch waits for its merge.
    #[arg(long)]
    pub merge_overlap: bool,
    /// Merge more often early in the run: the first epoch is one inner step
    /// per replica (replicas x grad-accum micro-batches), each next epoch
    /// twice the last, until one would reach --micro-batches; the run's
    /// micro-batches stay epochs x micro-batches (so it has more, shorter
    /// epochs, and merges, at the start). Replicas drift apart fastest
    /// while the learning rate warms up: on `small` 0.3-0.55% lower loss at
    /// equal tokens for four more merges (docs/BENCHMARKS.md, "Merging more
    /// often early in the run"); off by default because at large models
    /// the first epochs would be mostly merging. Not yet with
    /// --merge-overlap.
    #[arg(long)]
    pub merge_ramp: bool,
}

impl RunArgs {
    /// The run configuration these settings describe (loads the corpus once
    /// to fix the number of data shards). A run on prepared data needs
    /// `run_config_from_store`.
    /// What `--optimizer auto` chose for `cfg` and why (`None` when the
    /// optimizer was named), for the run's first lines.
    pub fn optimizer_note(&self, cfg: &RunConfig) -> Option<String> {
        (self.optimizer == "auto").then(|| cfg.train.auto_optimizer_note(self.stages as usize))
    }

    /// How the run cuts the model, when that is worth a line (`stage_note`).
    pub fn stage_note(&self, cfg: &RunConfig) -> Option<String> {
        stage_note(&self.stage_layers, cfg)
    }

    /// `--schedule` as these settings resolve it.
    pub fn cadence(&self) -> Result<Cadence> {
        schedule::resolve(&schedule::Asked {
            schedule: &self.schedule,
            local_miner_device: self.local_miner_device.as_deref(),
            validated: !self.validator_stakes.is_empty(),
            epochs: self.epochs,
            micro_batches: self.micro_batches,
            replicas: self.replicas,
            grad_accum: self.grad_accum.max(1) as u64,
        })
    }

    /// What `--schedule` made of the run, for its first lines.
    pub fn schedule_note(&self, cfg: &RunConfig) -> Result<String> {
        let cadence = self.cadence()?;
        let mut note = schedule::note(&cadence, self.epochs, self.micro_batches, cfg.spec.max_in_flight);
        let v = &cfg.spec.validation;
        let per_miner = cfg.spec.micro_batches_per_epoch.div_ceil(cfg.spec.replicas.max(1) as u64);
        if !v.validators.is_empty() && cadence.schedule == Schedule::Loss && v.min_per_miner as u64 >= per_miner {
            // Said, not refused: a small validated run may want exactly this.
            note.push_str(&format!(
                "\nnote: validators recompute at least {} micro-batches per miner and epoch (--validation-min-samples), \
                 and a loss epoch gives a miner about {per_miner}: they will recompute all of its work",
                v.min_per_miner
            ));
        }
        Ok(note)
    }

    pub fn run_config(&self) -> Result<RunConfig> {
        anyhow::ensure!(!self.prepared_data, "--prepared-data: the corpus is read from the run's store");
        let mut cfg = self.unfixed_config()?;
        let data = self.data_path()?;
        iota_dataplane::corpus::fix_shards(&mut cfg, data.as_deref())?;
        self.finish(cfg, data.as_deref())
    }

    /// The run configuration, its corpus from `store` when the run trains
    /// on prepared data (else as `run_config`).
    pub async fn run_config_from_store(&self, store: &dyn iota_protocol::ObjectStore) -> Result<RunConfig> {
        if !self.prepared_data {
            return self.run_config();
        }
        let mut cfg = self.unfixed_config()?;
        let (m, tokens) = iota_dataplane::prepared_corpus::fetch(store, None, cfg.train.tokenizer, None)
            .await
            .context("--prepared-data: reading the corpus `iota-control data prepare` wrote into the run's store")?;
        println!("training on the prepared corpus: {} tokens in {} chunks", m.corpus.tokens, m.chunks.len());
        let c = iota_model::data::Corpus::new(tokens, cfg.train.seq, cfg.max_shards, cfg.val_fraction)
            .map_err(anyhow::Error::msg)?;
        iota_dataplane::corpus::fix_shards_of(&mut cfg, c)?;
        self.finish(cfg, None)
    }

    fn finish(&self, mut cfg: RunConfig, data: Option<&std::path::Path>) -> Result<RunConfig> {
        cfg.spec.run_id = run_id(&settings(&cfg, data, self.bucket.as_deref())?);
        cfg.validate()?;
        Ok(cfg)
    }

    /// Everything but the corpus's shard count and id and the run id.
    fn unfixed_config(&self) -> Result<RunConfig> {
        let mut model = ModelConfig::preset(&self.model)?;
        let tokenizer = if model.vocab_real <= 256 { TokenizerKind::Byte } else { TokenizerKind::Gpt2 };
        model.vocab_real = tokenizer.vocab_real();
        model.vocab_size = tokenizer.vocab_padded();
        if let Some(b) = self.bottleneck {
            model.bottleneck = b;
        }
        model.bottleneck_style = BottleneckStyle::parse(&self.bottleneck_style)
            .with_context(|| format!("unknown --bottleneck-style '{}' (linear, residual)", self.bottleneck_style))?;
        let codec = WireCodec::parse(&self.codec)
            .with_context(|| format!("unknown codec '{}' (int8, int4, bf16, f32)", self.codec))?;
        if self.replicas == 0 || self.stages == 0 || self.micro_batches == 0 {
            bail!("--stages, --replicas and --micro-batches must be positive");
        }
        let cadence = self.cadence()?;
        let total = cadence.epochs.saturating_mul(cadence.micro_batches_per_epoch);
        let steps = (total / (self.replicas as u64 * self.grad_accum.max(1) as u64)).max(1);
        let seq = self.seq.unwrap_or(model.max_seq.min(128));
        let held = (self.max_in_flight.unwrap_or(cadence.default_max_in_flight) as usize)
            .div_ceil(self.replicas.max(1) as usize);
        model.stage_layers = stage_layers(&self.stage_layers, &model, self.stages as usize, (self.batch, seq, held))?;
        let mut train = TrainConfig {
            model,
            tokenizer,
            stages: self.stages as usize,
            batch: self.batch,
            seq,
            grad_accum: self.grad_accum,
            steps,
            schedule: LrSchedule {
                peak: self.lr,
                warmup: self.warmup_steps.unwrap_or((steps / 20).clamp(1, 100)).clamp(1, steps),
                total: steps,
                min_ratio: 0.1,
            },
            adamw: AdamWConfig {
                stage_beta1: self.stage_beta1.clone(),
                stage_lr: self.stage_lr.clone(),
                predict_weights: self.predict_weights,
                muon_momentum: self.muon_momentum,
                ..AdamWConfig::default()
            },
            codec,
            seed: self.seed,
        };
        if let Some(mu) = self.muon_momentum
            && !(mu > 0.0 && mu < 1.0)
        {
            bail!("--muon-momentum {mu}: Muon's momentum is between 0 and 1 (exclusive)");
        }
        // The pipeline's stages run on their own miners, at the slowest one's pace.
        train.choose_optimizer(&self.optimizer, self.stages as usize)?;
        let merge = self.merge_spec(&train.model)?;
        let spec = RunSpec {
            // Derived from all the other settings below, once they are known.
            run_id: 0,
            stages: self.stages,
            replicas: self.replicas,
            epochs: cadence.epochs,
            micro_batches_per_epoch: cadence.micro_batches_per_epoch,
            batch: self.batch as u32,
            n_shards: 1,
            max_in_flight: self.max_in_flight.unwrap_or(cadence.default_max_in_flight),
            pipeline_warmup_micro_batches: self.pipeline_warmup_steps.unwrap_or(train.schedule.warmup)
                * self.replicas as u64
                * train.grad_accum.max(1) as u64,
            ramp_first_epoch: if self.merge_ramp { self.replicas as u64 * train.grad_accum.max(1) as u64 } else { 0 },
            route_timeout_ms: self.route_timeout_s * 1000,
            heartbeat_timeout_ms: self.heartbeat_timeout_s * 1000,
            max_attempts: self.max_attempts,
            phase_timeout_ms: self.phase_timeout_s * 1000,
            merge,
            miners_per_stage_cap: self.max_miners_per_stage.unwrap_or(0),
            registration_timeout_ms: self.registration_timeout_s * 1000,
            bench_after_failures: self.bench_after_failures,
            validation: self.validation()?,
        };
        let store = if self.bucket.is_some() { StoreAccess::Granted } else { StoreAccess::Directory };
        let cfg = RunConfig { store, corpus_in_store: self.prepared_data, ..RunConfig::new(spec, train) };
        Ok(cfg)
    }

    /// The run's validators and how they sample (`--validator`, ...).
    pub fn validation(&self) -> Result<iota_protocol::ValidationSpec> {
        let validators = self
            .validator_stakes
            .iter()
            .map(|v| {
                let (peer, stake) =
                    v.split_once(':').with_context(|| format!("--validator {v}: want PEER_HEX:STAKE"))?;
                let peer = iota_core::PeerId::from_hex(peer)
                    .with_context(|| format!("--validator {v}: the peer is not 64 hex characters"))?;
                let stake: u64 =
                    stake.parse().with_context(|| format!("--validator {v}: the stake is not a number"))?;
                Ok(iota_protocol::ValidatorStake { peer, stake })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(iota_protocol::ValidationSpec {
            validators,
            rate: self.validation_rate,
            min_per_miner: self.validation_min_samples,
            strikes_to_eject: self.strikes_to_eject,
            timeout_ms: self.validation_timeout_s.saturating_mul(1000),
            rollback_loss_jump: self.rollback_loss_jump,
            eval_batches: self.eval_batches,
            bind_contributions: true,
            check_inner_steps: !self.no_inner_step_checks,
            step_window: self.step_window,
        })
    }

    /// The corpus file or folder, canonical (None: the generated toy corpus).
    pub fn data_path(&self) -> Result<Option<PathBuf>> {
        self.data
            .as_ref()
            .map(|p| std::fs::canonicalize(p).with_context(|| format!("cannot read {}", p.display())))
            .transpose()
    }

    /// The run's bucket (`--bucket`), with the credentials from the
    /// environment; made if it does not exist yet. None: the run's store
    /// is `RUN_DIR/store`.
    pub async fn s3_store(&self) -> Result<Option<std::sync::Arc<crate::s3_store::S3Store>>> {
        let Some(url) = &self.bucket else { return Ok(None) };
        use crate::s3_store::{S3Location, S3Secret, S3Store};
        let loc = S3Location::parse(url, self.s3_endpoint.clone(), self.s3_region.clone(), self.s3_path_style)?;
        let store = S3Store::new(loc, S3Secret::from_env()?);
        store.ensure_bucket().await.with_context(|| format!("reaching the bucket of {url}"))?;
        Ok(Some(std::sync::Arc::new(store)))
    }

    /// The run's local object store: `RUN_DIR/store`, absolute.
    pub fn store_dir(&self) -> Result<PathBuf> {
        std::path::absolute(self.run_dir.join("store")).with_context(|| format!("locating {}", self.run_dir.display()))
    }

    /// Makes `--run-dir` hold this run: a fresh directory records its
    /// settings; the same settings resume; other settings (or state of a run
    /// whose settings are unknown) are refused unless `--new-run`, which
    /// archives the old run first. Creates the object store folder (unless
    /// the run's objects live in a bucket).
    pub fn claim_run_dir(&self, cfg: &RunConfig) -> Result<()> {
        let settings = settings(cfg, self.data_path()?.as_deref(), self.bucket.as_deref())?;
        // A store holding only a prepared corpus (`data prepare --out
        // RUN_DIR/store`) is this run's input, not a previous run's files.
        let only_corpus = self.prepared_data && self.bucket.is_none() && {
            let names: Vec<_> = std::fs::read_dir(self.store_dir()?)
                .map(|d| d.flatten().map(|e| e.file_name()).collect())
                .unwrap_or_default();
            names.iter().all(|n| n == "data")
        };
        let run_files: Vec<&str> = RUN_FILES.iter().copied().filter(|f| !(only_corpus && *f == "store")).collect();
        let claim = run_dir::claim(&self.run_dir, &settings, &run_files, self.new_run).map_err(|e| {
            // The schedule `auto` chose is the likeliest difference from a
            // run made before it existed; say how to resume that one.
            if self.cadence().is_ok_and(|c| c.auto && c.schedule == Schedule::Loss) {
                anyhow::anyhow!(
                    "{e:#}\n(--schedule auto took `loss` here, {} inner steps an epoch; a run made before \
                     --schedule existed resumes with --schedule throughput)",
                    schedule::LOSS_MERGE_STEPS
                )
            } else {
                e
            }
        })?;
        match claim {
            Claim::Fresh | Claim::Same => {}
            Claim::Archived(to) => {
                eprintln!("note: the previous run in {} moved into {}", self.run_dir.display(), to.display())
            }
        }
        if self.bucket.is_some() {
            return Ok(());
        }
        let store = self.store_dir()?;
        std::fs::create_dir_all(&store).with_context(|| format!("creating {}", store.display()))
    }
}

/// Files of a run inside its directory (besides `run.json`); miner keys
/// (`keys/`) are identities, not run state, and stay.
const RUN_FILES: &[&str] = &["state.sqlite*", "store", "logs"];

/// The settings that define a run: its whole configuration except what is
/// derived from them (the run id), where the corpus was read from, and the
/// bucket its objects live in (when not the run directory's store: a run
/// resumed on another bucket would find none of its weights).
/// The run's defaults, which the flags take theirs from (one place defines
/// them: `RunSpec::default()`).
fn spec_default() -> RunSpec {
    RunSpec::default()
}

fn settings(cfg: &RunConfig, data: Option<&std::path::Path>, bucket: Option<&str>) -> Result<serde_json::Value> {
    let mut v = serde_json::to_value(cfg)?;
    if let Some(m) = v.as_object_mut() {
        if let Some(spec) = m.get_mut("spec").and_then(|s| s.as_object_mut()) {
            spec.remove("run_id");
        }
        m.insert("data".into(), serde_json::to_value(data)?);
        // Only when set: the settings of directory runs stay as they were.
        if let Some(b) = bucket {
            m.insert("bucket".into(), b.into());
        }
    }
    Ok(v)
}

/// The run's configuration back from its saved settings (`run.json`):
/// the run id is the settings' hash again.
pub fn config_from_settings(settings: &serde_json::Value) -> Result<RunConfig> {
    let mut v = settings.clone();
    let id = run_id(settings);
    let m = v.as_object_mut().context("run.json is not an object")?;
    m.remove("data");
    m.remove("bucket");
    m.get_mut("spec")
        .and_then(|s| s.as_object_mut())
        .context("run.json has no spec")?
        .insert("run_id".into(), id.into());
    serde_json::from_value(v).context("run.json does not hold a run's settings")
}

/// A run's id: the first 8 bytes of the BLAKE3 hash of its settings, so two
/// runs with different settings never share an id (or state, or keys in the
/// store).
fn run_id(settings: &serde_json::Value) -> u64 {
    let h = blake3::hash(settings.to_string().as_bytes());
    u64::from_le_bytes(h.as_bytes()[..8].try_into().expect("8 bytes"))
}

/// Expands `--config-file PATH` into flags: each TOML key `k = v` becomes
/// `--k v` placed right after the subcommand, so flags given on the command
/// line (later) override the file.
pub fn expand_config_file(args: Vec<String>) -> Result<Vec<String>> {
    let Some(pos) = args.iter().position(|a| a == "--config-file" || a.starts_with("--config-file=")) else {
        return Ok(args);
    };
    let (path, drop_n) = match args[pos].split_once('=') {
        Some((_, p)) => (p.to_string(), 1),
        None => (args.get(pos + 1).cloned().context("--config-file needs a path")?, 2),
    };
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    let table: toml::Table = text.parse().with_context(|| format!("{path} is not valid TOML"))?;
    let mut flags = Vec::new();
    for (k, v) in table {
        let value = match v {
            toml::Value::String(s) => s,
            toml::Value::Integer(i) => i.to_string(),
            toml::Value::Float(f) => f.to_string(),
            toml::Value::Boolean(b) => b.to_string(),
            other => bail!("{path}: key '{k}' has an unsupported value {other}"),
        };
        flags.push(format!("--{}", k.replace('_', "-")));
        flags.push(value);
    }
    let mut out: Vec<String> = args[..pos].to_vec();
    out.extend(args[pos + drop_n..].iter().cloned());
    // After the program name and subcommand.
    let at = out.len().min(2);
    out.splice(at..at, flags);
    Ok(out)
}

#[cfg(test)]
mod tests;
