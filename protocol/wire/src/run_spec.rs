//! What a run is: shape of the swarm, epoch length, timeouts.
//!
//! One way to build a run's settings: start from the defaults and set what
//! differs (`RunSpec { stages: 2, ..RunSpec::default() }`). The defaults
//! live here alone: `iota-control`'s flags take theirs from
//! `RunSpec::default()`, and tests and benches spell out only what they
//! change, so a new setting touches its definition (here), its flag, where
//! it acts, and its test.

use iota_core::WireCodec;
use iota_core::merge::{BLOCK, MergePlan, OuterOpt, Participant, ReduceRule};
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunSpec {
    pub run_id: u64,
    pub stages: u32,
    /// Miners per stage needed before the first epoch starts.
    pub replicas: u32,
    pub epochs: u64,
    pub micro_batches_per_epoch: u64,
    /// Samples per micro-batch.
    pub batch: u32,
    /// Data shards micro-batches are spread over (see `micro_batch`).
    pub n_shards: u32,
    /// Micro-batches in the pipeline at once (1 = strictly sequential).
    pub max_in_flight: u32,
    /// Micro-batches at the start of the run (counted over all epochs)
    /// issued with at most one per pathway in flight (`replicas`, if
    /// `max_in_flight` is larger): pipelining's delayed gradients cost
    /// most in the first steps, while the learning rate warms up
    /// (docs/BENCHMARKS.md, convergence). Left out of the settings when 0,
    /// so runs saved before it existed keep their run id.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub pipeline_warmup_micro_batches: u64,
    /// The merge ramp: the run's first epoch has this many micro-batches,
    /// each next one twice the last, until one would be as long as
    /// `micro_batches_per_epoch`; from there epochs have their full length.
    /// The run's micro-batches stay `epochs x micro_batches_per_epoch`, so
    /// it merges more often early (its last epoch may be shorter). 0: off.
    /// Replicas drift apart fastest while the learning rate warms up
    /// (docs/BENCHMARKS.md, "Merging more often early in the run"). Left
    /// out of the settings when off, so runs saved before it existed keep
    /// their run id.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub ramp_first_epoch: u64,
    /// A micro-batch not finished this long after issue is re-routed.
    pub route_timeout_ms: u64,
    /// A miner silent this long is unhealthy.
    pub heartbeat_timeout_ms: u64,
    /// Issues of one micro-batch before it is counted as dropped.
    pub max_attempts: u32,
    /// Uploading or merging longer than this moves on without the laggards.
    pub phase_timeout_ms: u64,
    /// How the replicas of a stage merge at the end of an epoch.
    #[serde(default)]
    pub merge: MergeSpec,
    /// Miners a stage takes at most (replicas plus spares); registrations
    /// past it are refused. 0 = four times `replicas`.
    #[serde(default)]
    pub miners_per_stage_cap: u32,
    /// A registration whose miner has not opened its command stream this
    /// long after is forgotten.
    #[serde(default = "default_registration_timeout_ms")]
    pub registration_timeout_ms: u64,
    /// A miner that fails this many micro-batches with no delivery in
    /// between is benched for the rest of the epoch (PROTOCOL.md,
    /// "Liveness").
    #[serde(default = "default_bench_after_failures")]
    pub bench_after_failures: u32,
    /// Who validates the run's work and how (PROTOCOL.md, "Validation").
    /// Left out when it is the default (no validators), so a run without
    /// validators has the settings, and the run id, it had before
    /// validation existed: its run directory still resumes.
    #[serde(default, skip_serializing_if = "ValidationSpec::is_default")]
    pub validation: ValidationSpec,
}

impl Default for RunSpec {
    /// The run `iota-control swarm` makes with no flags (its flags default
    /// to these), less what the launcher derives from the model and the
    /// corpus (`run_id`, `n_shards`, the stages' parameter counts).
    fn default() -> Self {
        RunSpec {
            run_id: 0,
            stages: 1,
            replicas: 1,
            epochs: 1,
            micro_batches_per_epoch: 32,
            batch: 8,
            n_shards: 1,
            max_in_flight: 1,
            pipeline_warmup_micro_batches: 0,
            ramp_first_epoch: 0,
            route_timeout_ms: 30_000,
            heartbeat_timeout_ms: 10_000,
            max_attempts: 3,
            phase_timeout_ms: 300_000,
            merge: MergeSpec::butterfly(),
            miners_per_stage_cap: 0,
            registration_timeout_ms: default_registration_timeout_ms(),
            bench_after_failures: default_bench_after_failures(),
            validation: ValidationSpec::default(),
        }
    }
}

/// One validator of the run and its stake.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ValidatorStake {
    pub peer: iota_core::PeerId,
    pub stake: u64,
}

/// Sampled recompute and verdicts (PROTOCOL.md, "Validation").
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ValidationSpec {
    /// The run's validators with their stakes; empty: nobody checks the
    /// work and the merge never waits for verdicts.
    pub validators: Vec<ValidatorStake>,
    /// Fraction of each miner's micro-batches a validator recomputes.
    pub rate: f64,
    /// At least this many per miner per epoch (all of them if it did fewer).
    pub min_per_miner: u32,
    /// Convictions after which a miner is ejected (its identity refused).
    pub strikes_to_eject: u32,
    /// How long the validators may hold an epoch's merge.
    pub timeout_ms: u64,
    /// A merged model whose held-out loss exceeds the last good one's by
    /// more than this fraction is rolled back.
    pub rollback_loss_jump: f64,
    /// Held-out micro-batches a validator evaluates a merged model on.
    pub eval_batches: u32,
    /// Merge audits hold each stored contribution against the weights its
    /// sender committed to (PROTOCOL.md, "Contributions bound to the
    /// weights chain"). Off only where a test exercises what stands behind
    /// it alone (the held-out loss's rollback of a poisoned merge).
    #[serde(default = "yes", skip_serializing_if = "is_yes")]
    pub bind_contributions: bool,
    /// Miners commit every inner step and show the steps a drawn attempt
    /// went into, which validators recompute (PROTOCOL.md, "Inner steps
    /// recomputed"). Off only for runs that cannot afford a miner's
    /// optimizer snapshots (see `step_window`).
    #[serde(default = "yes", skip_serializing_if = "is_yes")]
    pub check_inner_steps: bool,
    /// A miner keeps AdamW's state (m and v, two stage-sized snapshots)
    /// at every `step_window`-th inner step of an epoch only; a drawn step
    /// is shown from the last kept state before it and the validator
    /// replays up to `step_window` steps, checking each. 1 keeps every
    /// step's state: at `small` with ~100 steps an epoch that filled a
    /// 35 GB disk shared by six miners.
    #[serde(default = "default_step_window", skip_serializing_if = "is_default_step_window")]
    pub step_window: u32,
}

/// `ValidationSpec::step_window` unless a run sets it.
pub const DEFAULT_STEP_WINDOW: u32 = 8;

fn default_step_window() -> u32 {
    DEFAULT_STEP_WINDOW
}

fn is_default_step_window(w: &u32) -> bool {
    *w == DEFAULT_STEP_WINDOW
}

fn yes() -> bool {
    true
}

fn is_yes(b: &bool) -> bool {
    *b
}

impl Default for ValidationSpec {
    fn default() -> Self {
        ValidationSpec {
            validators: Vec::new(),
            rate: 0.03,
            min_per_miner: 4,
            strikes_to_eject: 2,
            timeout_ms: 60_000,
            rollback_loss_jump: 0.5,
            eval_batches: 4,
            bind_contributions: true,
            check_inner_steps: true,
            step_window: DEFAULT_STEP_WINDOW,
        }
    }
}

impl ValidationSpec {
    pub fn is_default(&self) -> bool {
        *self == ValidationSpec::default()
    }

    pub fn stake_of(&self, p: &iota_core::PeerId) -> Option<u64> {
        self.validators.iter().find(|v| v.peer == *p).map(|v| v.stake)
    }
}

fn default_registration_timeout_ms() -> u64 {
    30_000
}

pub fn default_bench_after_failures() -> u32 {
    2
}

/// How often a miner queued for a place in a full run registers again
/// (keeping its place; the orchestrator drops one silent for 12 of these).
pub const QUEUE_RETRY_MS: u64 = 5_000;

/// Validators a run lists at most.
pub const MAX_VALIDATORS: usize = 64;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum MergeMethod {
    /// Everyone uploads to the store, one aggregator averages (the baseline).
    ParameterServer,
    /// Butterfly all-reduce over the data plane, two owners per partition.
    Butterfly,
}

impl MergeMethod {
    pub fn parse(s: &str) -> Option<MergeMethod> {
        match s {
            "butterfly" => Some(MergeMethod::Butterfly),
            "parameter-server" | "ps" => Some(MergeMethod::ParameterServer),
            _ => None,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MergeSpec {
    pub method: MergeMethod,
    /// Butterfly partitions per participant.
    pub slices_per_replica: u32,
    /// Codec of pseudo-gradient slices and merged updates on the wire.
    pub codec: WireCodec,
    pub rule: ReduceRule,
    pub outer: OuterOpt,
    /// Merges over which the outer momentum rises from 0.5 to its setting
    /// (0: from the first merge). Left out of the settings when 0, so runs
    /// saved before it existed keep their run id.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub outer_momentum_warmup: u64,
    /// Parameter count of every stage (the butterfly plan splits these).
    pub stage_params: Vec<u64>,
    /// Largest payload of one merge frame (bytes): the plan cuts a stage
    /// into partitions whose slices, encoded with `codec`, fit it, so no
    /// receiver refuses a slice for its size and none goes through the store
    /// for it. Left out of the settings at its default, so runs saved before
    /// it existed keep their run id.
    #[serde(default = "default_max_slice_bytes", skip_serializing_if = "is_default_max_slice_bytes")]
    pub max_slice_bytes: u64,
    /// The merge behind compute: the butterfly merge of epoch E runs while
    /// epoch E+1 trains, and each replica lands it at the end of E+1
    /// (merged weights plus what the replica trained since; see PROTOCOL.md,
    /// "The merge behind compute"). The last epoch's merge is synchronous.
    /// Left out of the settings when off, so runs saved before it existed
    /// keep their run id.
    #[serde(default, skip_serializing_if = "is_false")]
    pub overlap: bool,
    /// The bandwidth (Mbit/s, each way) a miner is assumed to have to the
    /// object store, when the orchestrator waits for the owners to read a
    /// contribution claimed missing from the store before it plans its
    /// sender out (PROTOCOL.md, "the store's patience"): swarms on slow
    /// uplinks set it lower and wait longer. Left out of the settings at
    /// its default, so runs saved before it existed keep their run id.
    #[serde(default = "default_store_mbit", skip_serializing_if = "is_default_store_mbit")]
    pub store_mbit: u32,
    /// Contributions through the sparse codec (`WireCodec::SparseTopK`):
    /// this share of each block's values, the largest, with error feedback
    /// at the sender (PROTOCOL.md, "Sparse contributions"); merged updates
    /// and stored slices stay in `codec`. 0: contributions in `codec`.
    /// Left out of the settings when 0, so runs saved before it existed
    /// keep their run id.
    #[serde(default, skip_serializing_if = "is_zero_f32")]
    pub sparse_density: f32,
    /// With sparse contributions: each replica's backlog is multiplied by
    /// this before it joins the next contribution (error feedback that
    /// fades, as SparseLoCo's; 1: kept whole). Left out of the settings at
    /// its default.
    #[serde(default = "default_sparse_decay", skip_serializing_if = "is_default_sparse_decay")]
    pub sparse_decay: f32,
}

fn is_zero_f32(v: &f32) -> bool {
    *v == 0.0
}

/// 1/20: the density the merge codec's default (`--merge-codec sparse`
/// unless `--sparse-density` says otherwise): 820 of each 16,384 values,
/// 38.5x fewer bytes than bf16, and in the replay at 96 merges no more
/// loss than the bf16 merge (docs/BENCHMARKS.md).
pub const DEFAULT_SPARSE_DENSITY: f32 = 1.0 / 20.0;

/// 1.5: the outer learning rate of a run with sparse contributions unless
/// told (the bf16 merge's is 1). A sparse merge applies part of each
/// replica's progress and the rest later, faded; a larger outer step
/// makes up for it (the replay: 1.5 beats 1, 1.25 and 1.75).
pub const SPARSE_OUTER_LR: f32 = 1.5;

/// 0.95: the backlog's decay per merge SparseLoCo uses, and the best of
/// 0.5-1 in the replay (docs/BENCHMARKS.md).
pub const DEFAULT_SPARSE_DECAY: f32 = 0.95;

fn default_sparse_decay() -> f32 {
    DEFAULT_SPARSE_DECAY
}

fn is_default_sparse_decay(v: &f32) -> bool {
    *v == DEFAULT_SPARSE_DECAY
}

/// 100 Mbit/s: what evidence uploads are sized for.
pub const DEFAULT_STORE_MBIT: u32 = 100;

fn default_store_mbit() -> u32 {
    DEFAULT_STORE_MBIT
}

fn is_default_store_mbit(v: &u32) -> bool {
    *v == DEFAULT_STORE_MBIT
}

fn is_false(v: &bool) -> bool {
    !*v
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

/// 64 MiB: a quarter of a miner's default receive pool (256 MiB), so
/// contributions from several replicas are read at once, and an eighth of
/// the data plane's frame limit.
pub const DEFAULT_MAX_SLICE_BYTES: u64 = 64 << 20;
/// The bounds a run may set `max_slice_bytes` within: at least one block
/// of f32 values; at most half a default receive pool.
pub const MAX_SLICE_BYTES_RANGE: std::ops::RangeInclusive<u64> = 4096..=128 << 20;

fn default_max_slice_bytes() -> u64 {
    DEFAULT_MAX_SLICE_BYTES
}

fn is_default_max_slice_bytes(v: &u64) -> bool {
    *v == DEFAULT_MAX_SLICE_BYTES
}

impl MergeSpec {
    /// The swarm's merge unless told otherwise: the butterfly, bf16 slices,
    /// centered clipping, plain averaging (`MergeSpec::default()` is the
    /// parameter server, what runs saved before the butterfly used).
    pub fn butterfly() -> MergeSpec {
        MergeSpec {
            method: MergeMethod::Butterfly,
            rule: ReduceRule::CenteredClip { tau_factor: 2.0, iters: 3 },
            ..MergeSpec::default()
        }
    }

    /// The outer optimizer of the merge that ends epoch `epoch`.
    pub fn outer_at(&self, epoch: u64) -> OuterOpt {
        self.outer.at_merge(self.outer_momentum_warmup, epoch)
    }

    /// Longest partition (values) whose slice, encoded with the merge
    /// codec as whole blocks, fits `max_slice_bytes`.
    pub fn max_partition_len(&self) -> u64 {
        let block_bytes = self.codec.row_bytes(BLOCK as usize) as u64;
        (self.max_slice_bytes / block_bytes).max(1) * BLOCK
    }

    /// What partition boundaries are multiples of: sparse contributions'
    /// blocks (`SPARSE_BLOCK`), so every epoch's plan cuts a stage's sparse
    /// blocks, and a sender's backlog, in the same places whoever takes
    /// part (an auditor holds a backlog against the epoch before's over
    /// the same blocks); else the dense codecs' `BLOCK`.
    pub fn partition_block(&self) -> u64 {
        if self.sparse_density > 0.0 { iota_core::codec::SPARSE_BLOCK as u64 } else { BLOCK }
    }

    /// The codec contributions are sent in.
    pub fn contribution_codec(&self) -> WireCodec {
        if self.sparse_density > 0.0 { WireCodec::SparseTopK } else { self.codec }
    }

    /// The frame shape `[rows, cols]` of a contribution to a partition of
    /// `len` values: `[blocks, BLOCK]` in a dense codec, `[sparse blocks,
    /// values kept per block]` in the sparse one.
    pub fn contribution_shape(&self, len: u64) -> (usize, usize) {
        if self.sparse_density > 0.0 {
            let rows = len.div_ceil(iota_core::codec::SPARSE_BLOCK as u64);
            let k = iota_core::codec::sparse_kept(iota_core::codec::SPARSE_BLOCK, self.sparse_density);
            (usize::try_from(rows).unwrap_or(usize::MAX), k)
        } else {
            (usize::try_from(len.div_ceil(BLOCK)).unwrap_or(usize::MAX), BLOCK as usize)
        }
    }

    /// Bytes of a contribution to a partition of `len` values (None: it
    /// overflows).
    pub fn contribution_bytes(&self, len: u64) -> Option<u64> {
        let (rows, cols) = self.contribution_shape(len);
        self.contribution_codec().payload_bytes(rows, cols).map(|b| b as u64)
    }

    /// The butterfly plan of one stage's merge under this spec.
    pub fn plan(&self, epoch: u64, stage: u32, participants: Vec<Participant>, params: u64, seed: u64) -> MergePlan {
        MergePlan::bounded(
            epoch,
            stage,
            participants,
            params,
            seed,
            self.slices_per_replica,
            self.max_partition_len(),
            self.partition_block(),
        )
    }
}

impl Default for MergeSpec {
    /// The parameter server averaging exactly (what runs saved before the
    /// butterfly existed used).
    fn default() -> Self {
        MergeSpec {
            method: MergeMethod::ParameterServer,
            slices_per_replica: 1,
            codec: WireCodec::Bf16,
            rule: ReduceRule::Mean,
            outer: OuterOpt::AVERAGE,
            outer_momentum_warmup: 0,
            stage_params: Vec::new(),
            max_slice_bytes: DEFAULT_MAX_SLICE_BYTES,
            overlap: false,
            store_mbit: DEFAULT_STORE_MBIT,
            sparse_density: 0.0,
            sparse_decay: DEFAULT_SPARSE_DECAY,
        }
    }
}

/// The most samples a run may address (epochs x micro-batches x batch):
/// 2^48, about 10^17 tokens at 1,024 tokens each, so that a micro-batch's
/// global number and its first sample never overflow.
pub const MAX_RUN_SAMPLES: u64 = 1 << 48;

impl RunSpec {
    /// Micro-batches the run issues in all.
    pub fn total_micro_batches(&self) -> u64 {
        self.epochs.saturating_mul(self.micro_batches_per_epoch)
    }

    /// Epochs of the merge ramp, shorter than a full one.
    fn ramp_epochs(&self) -> u64 {
        let (first, full) = (self.ramp_first_epoch, self.micro_batches_per_epoch);
        if first == 0 {
            return 0;
        }
        let mut k = 0;
        while k < 63 && first.checked_shl(k).is_some_and(|len| len >> k == first && len < full) {
            k += 1;
        }
        k as u64
    }

    /// Micro-batches issued before epoch `epoch` starts (past the run's
    /// end, as if it went on with full epochs).
    pub fn epoch_start(&self, epoch: u64) -> u64 {
        let (first, full, ramp) = (self.ramp_first_epoch, self.micro_batches_per_epoch, self.ramp_epochs());
        // first x (2^k - 1): the ramp's epochs before epoch k.
        let ramped = |k: u64| first.saturating_mul((1u64 << k) - 1);
        if epoch <= ramp { ramped(epoch) } else { ramped(ramp).saturating_add((epoch - ramp).saturating_mul(full)) }
    }

    /// Micro-batches of epoch `epoch` (0 past the run's end).
    pub fn epoch_len(&self, epoch: u64) -> u64 {
        let total = self.total_micro_batches();
        self.epoch_start(epoch.saturating_add(1)).min(total) - self.epoch_start(epoch).min(total)
    }

    /// Epochs the run has: `epochs`, plus the merge ramp's extra ones.
    pub fn epoch_count(&self) -> u64 {
        let (total, ramp) = (self.total_micro_batches(), self.ramp_epochs());
        let in_ramp = self.epoch_start(ramp);
        if total <= in_ramp {
            return (0..=ramp).find(|&e| self.epoch_start(e) >= total).unwrap_or(ramp);
        }
        ramp + (total - in_ramp).div_ceil(self.micro_batches_per_epoch)
    }

    /// Micro-batches in flight at once while issuing micro-batch `seq` of
    /// `epoch`.
    pub fn max_in_flight_at(&self, epoch: u64, seq: u64) -> u32 {
        let issued_before = self.epoch_start(epoch).saturating_add(seq);
        if issued_before < self.pipeline_warmup_micro_batches {
            self.max_in_flight.min(self.replicas.max(1))
        } else {
            self.max_in_flight
        }
    }

    /// Miners a stage takes at most.
    pub fn max_miners_per_stage(&self) -> u32 {
        if self.miners_per_stage_cap == 0 { 4 * self.replicas } else { self.miners_per_stage_cap }
    }

    /// Miners the run takes at most.
    pub fn max_miners(&self) -> u64 {
        self.stages as u64 * self.max_miners_per_stage() as u64
    }

    pub fn validate(&self) -> Result<(), String> {
        if self.stages == 0 || self.replicas == 0 || self.epochs == 0 || self.micro_batches_per_epoch == 0 {
            return Err("stages, replicas, epochs and micro_batches_per_epoch must be positive".into());
        }
        if self.batch == 0 || self.n_shards == 0 || self.max_in_flight == 0 || self.max_attempts == 0 {
            return Err("batch, n_shards, max_in_flight and max_attempts must be positive".into());
        }
        // Micro-batches are numbered globally (`micro_batch`) and their
        // samples addressed by that number times the batch: both must fit.
        let samples =
            self.epochs.checked_mul(self.micro_batches_per_epoch).and_then(|n| n.checked_mul(self.batch as u64));
        if samples.is_none_or(|n| n > MAX_RUN_SAMPLES) {
            return Err(format!(
                "epochs x micro_batches_per_epoch x batch ({} x {} x {}) must be at most {MAX_RUN_SAMPLES} samples",
                self.epochs, self.micro_batches_per_epoch, self.batch
            ));
        }
        if self.merge.method == MergeMethod::Butterfly && self.merge.stage_params.len() != self.stages as usize {
            return Err("a butterfly merge needs the parameter count of every stage".into());
        }
        if self.miners_per_stage_cap != 0 && self.miners_per_stage_cap < self.replicas {
            return Err("a stage's miner cap must be at least its replicas".into());
        }
        if !matches!(self.merge.codec, WireCodec::F32 | WireCodec::Bf16 | WireCodec::Int8Row) {
            return Err("merge codec must be f32, bf16 or int8".into());
        }
        let d = self.merge.sparse_density;
        if !(d == 0.0 || (d.is_finite() && d > 0.0 && d <= 1.0)) {
            return Err(format!("merge: the sparse contributions' density {d} must be in (0, 1]"));
        }
        if !(0.0..=1.0).contains(&self.merge.sparse_decay) {
            return Err(format!("merge: the sparse backlog's decay {} must be in [0, 1]", self.merge.sparse_decay));
        }
        if d > 0.0 && self.merge.method != MergeMethod::Butterfly {
            return Err("merge: sparse contributions need the butterfly merge".into());
        }
        if !MAX_SLICE_BYTES_RANGE.contains(&self.merge.max_slice_bytes) {
            return Err(format!(
                "merge: max_slice_bytes must be within {} to {} bytes",
                MAX_SLICE_BYTES_RANGE.start(),
                MAX_SLICE_BYTES_RANGE.end()
            ));
        }
        let v = &self.validation;
        if self.merge.overlap && self.ramp_first_epoch != 0 {
            // The ramp's epochs can be shorter than the pipeline; an
            // overlapped merge landing across several of them is not built.
            return Err("the merge ramp and the merge behind compute (overlap) do not go together yet".into());
        }
        if self.merge.overlap && self.merge.method != MergeMethod::Butterfly {
            return Err("merge: the merge behind compute (overlap) needs the butterfly merge".into());
        }
        if self.merge.overlap && !v.validators.is_empty() {
            // Validators check each attempt against the merged weights its
            // epoch started from; with the overlap every replica starts from
            // its own landed weights, which their evidence checks do not
            // cover yet.
            return Err(
                "merge: the merge behind compute (overlap) is not validated yet; run it without validators".into()
            );
        }
        if self.merge.sparse_density > 0.0 && self.merge.max_partition_len() < self.merge.partition_block() {
            return Err(format!(
                "merge: sparse contributions need partitions of at least {} values (max_slice_bytes is too small for one in {})",
                self.merge.partition_block(),
                self.merge.codec.name()
            ));
        }
        if !(0.0..=1.0).contains(&v.rate) || v.strikes_to_eject == 0 || v.timeout_ms == 0 || v.step_window == 0 {
            return Err(
                "validation: rate must be in [0, 1], strikes_to_eject, timeout_ms and step_window positive".into()
            );
        }
        if !(v.rollback_loss_jump.is_finite() && v.rollback_loss_jump > 0.0) || v.eval_batches == 0 {
            return Err("validation: rollback_loss_jump must be positive and eval_batches at least 1".into());
        }
        if v.validators.len() > MAX_VALIDATORS {
            return Err(format!("at most {MAX_VALIDATORS} validators"));
        }
        let mut peers: Vec<_> = v.validators.iter().map(|s| s.peer).collect();
        peers.sort();
        peers.dedup();
        if peers.len() != v.validators.len() || v.validators.iter().any(|s| s.stake == 0) {
            return Err("validation: each validator once, with a positive stake".into());
        }
        Ok(())
    }

    /// Address of micro-batch `seq` of `epoch`. Micro-batches are numbered
    /// globally (g = `epoch_start(epoch)` + seq) and addressed exactly as the
    /// single-process trainer does: shard g mod n_shards, samples from
    /// (g / n_shards) * batch. Sample ids carry epoch 0 (the data order does
    /// not restart each epoch; the run's epoch travels in frames and routes).
    pub fn micro_batch(&self, epoch: u64, seq: u64) -> MbRef {
        let g = self.epoch_start(epoch) + seq;
        MbRef {
            epoch,
            shard: (g % self.n_shards as u64) as u32,
            first_sample: (g / self.n_shards as u64) * self.batch as u64,
        }
    }
}

/// A micro-batch: the run epoch it belongs to and its samples' address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct MbRef {
    pub epoch: u64,
    pub shard: u32,
    pub first_sample: u64,
}

#[cfg(test)]
mod tests;
