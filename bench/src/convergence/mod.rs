//! convergence: does the swarm's training algorithm learn as well as one
//! process on the same tokens? From one seed and one data order it trains:
//!
//! - one process at the swarm's global batch (every replica's micro-batches
//!   of a step accumulated into one optimizer step): the baseline;
//! - synchronous data parallel: R replicas, each on its own micro-batches,
//!   gradients averaged every step (the ideal the merges approximate; the
//!   same computation as the baseline up to float summation order);
//! - the swarm's algorithm at merge intervals H: R replicas each taking H
//!   AdamW steps on their own micro-batches, then the merge the miners run
//!   (pseudo-gradients through the merge codec, the butterfly's partitions,
//!   the reduce rule and outer optimizer of `reduce_partition`);
//! - the swarm's own interval with the bottleneck off, and with the f32
//!   boundary codec, to separate what those cost.
//!
//! Replica r takes micro-batches `step * R * A + r * A ..` (A = grad_accum),
//! which are exactly the micro-batches the baseline accumulates in that
//! step, so every variant sees the same tokens in the same order. It runs
//! in one process (the pipeline's stages in sequence, each boundary through
//! the wire codec), so it measures the algorithm and not the schedule: the
//! real swarm's staleness (a stage forwarding the next micro-batch before
//! stepping) is what `iota-bench swarm` adds on top, and what the `delayD`
//! variants model (each stage's gradient taken on its weights of D_s steps
//! before, as weight stashing takes it).

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use iota_core::PeerId;
use iota_core::codec::WireCodec;
use iota_core::merge::Participant;
use iota_dataplane::miner::merge::{encode_slice, reduce_partition};
use iota_dataplane::sparse::{ErrorFeedback, SPARSE_BLOCK, decode_sparse};
use iota_model::CpuBackend;
use iota_model::data::Corpus;
use iota_model::train::{Accumulated, Pipeline, TrainConfig};
use iota_protocol::MergeSpec;

mod moments;
mod orth_merge;
mod pathways;
mod report;
mod variant;
use moments::average_inner_moments;
use pathways::{PathwayDraw, delayed_weights, mixed_grads, stage_delays};
pub use report::{Outcome, plot_svg};
use report::{print_table, write_new};
use variant::default_runs;
pub use variant::{MergeRamp, Variant};

#[derive(clap::Args)]
pub struct Args {
    /// The swarm's settings (model, stages, replicas, epochs, micro-batches,
    /// batch, lr, codec, bottleneck, data, merge codec, rule, outer optimizer):
    /// the merge interval of the swarm itself is one epoch, i.e.
    /// micro-batches / (replicas x grad-accum) inner steps.
    #[command(flatten)]
    run: iota_control::cli::RunArgs,
    /// Merge intervals (inner steps per merge) to try besides the swarm's own.
    #[arg(long, value_delimiter = ',', default_value = "1,8,32,128")]
    intervals: Vec<u64>,
    /// Variants to run, comma-separated, in order (default: one, sync, the
    /// swarm at each interval and at its own, and the swarm's own interval
    /// with no bottleneck and with the f32 codec). Names: one, sync,
    /// one-replica-batch (one process at a replica's batch, R times the
    /// steps), hN (pathways mixed across replicas, as the orchestrator
    /// routes), hN-fixed (each replica its own pathway), hN-no-bottleneck,
    /// hN-f32, hN-overlap[D] (the merge landing D steps late), hN-delayD
    /// (pipelining's delayed gradients: D steps late at the head, none at
    /// the tail) and hN-delayD-predict (the same with weight prediction), hN-delayD-recompute
    /// (delayed stages run their backward on their current weights), hN-delayD-fromN (the
    /// delay only from global step N on); any swarm name whose merge lands
    /// at once, then -ramp (merge intervals doubling from 1 up to H) or
    /// -syncN (a merge after each of the first N steps, then every H),
    /// then -avg-moments (the inner optimizer's moments averaged
    /// at each merge too, e.g. h24-delay1-from8-ramp-avg-moments);
    /// and one process with another stage boundary:
    /// one-no-bottleneck (exact f32) or one-STYLE-bWIDTH-CODEC, e.g.
    /// one-residual-b2-int4 (STYLE linear or residual).
    #[arg(long, value_delimiter = ',')]
    runs: Vec<String>,
    /// Validation batches for the final loss. 256 unless told: on 16
    /// (8,192 tokens of `tiny`'s batches) the same seed's runs moved by
    /// 2-3% against each other, more than the differences asked about
    /// (docs/BENCHMARKS.md, "Indices coded Elias-Fano").
    #[arg(long, default_value_t = 256)]
    val_batches: u64,
    /// Points on the loss curve: a validation loss every this many global steps.
    #[arg(long, default_value_t = 12)]
    curve_every: u64,
    /// Validation batches for each curve point.
    #[arg(long, default_value_t = 4)]
    curve_batches: u64,
    /// Folder for the curve plot (SVG) and the results (JSON); files are
    /// named by the time of the run, nothing there is overwritten.
    #[arg(long, default_value = "runs/convergence")]
    out: PathBuf,
    /// Percent of steps on which mixed-pathway variants (hN, hN-delayD..)
    /// draw mixed pathways; the others keep each replica on its own
    /// pathway. 100 is what the orchestrator does; less asks what a router
    /// that mixed only as often as CLASP needs would save.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u8).range(0..=100))]
    mix_percent: u8,
    /// -avg-moments variants average only the momentum of the matrices
    /// Muon updates (with --optimizer muon), not the AdamW moments of the
    /// embedding, LM head and norms: a fraction of the traffic.
    #[arg(long)]
    avg_muon_momentum_only: bool,
    /// An experiment, for every swarm variant of the run: at each merge the
    /// mean pseudo-gradient of every matrix Muon updates is orthogonalised
    /// again and given the replicas' mean norm (`orth_merge.rs`).
    #[arg(long)]
    orth_merge: bool,
    /// An experiment, for every swarm variant of the run: each replica's
    /// pseudo-gradient goes to the merge as the sparse codec writes it
    /// (`iota_checks::sparse`: this fraction of each block's largest values,
    /// two bits each and a 16-bit index), what it drops kept and added to
    /// the next (error feedback). E.g. 0.015625 (1/64).
    #[arg(long)]
    sparse_merge: Option<f32>,
    /// With --sparse-merge: each replica keeps what it has not sent in its
    /// own weights (it moves onto the merged weights less its residual, so
    /// its next pseudo-gradient carries it) instead of adding it to its next
    /// contribution: no progress waits a whole merge to count locally.
    #[arg(long)]
    sparse_local: bool,
    /// With --sparse-merge: the run's last merge sends each replica's
    /// pseudo-gradient and its whole backlog with the merge codec alone,
    /// so the final model holds everything trained.
    #[arg(long)]
    sparse_flush_last: bool,
}

/// What the harness knows of the run: the per-replica training settings,
/// the replica count and the merge the swarm would run.
#[derive(Clone, Debug)]
pub struct Setup {
    /// One replica's trainer settings (its batch, grad_accum, steps and schedule).
    pub train: TrainConfig,
    pub replicas: usize,
    pub merge: MergeSpec,
    pub seed: u64,
    /// Mixed-pathway variants draw mixed pathways on this share of their
    /// steps (100: all, as the orchestrator routes); the rest keep every
    /// replica on its own.
    pub mix_percent: u8,
    /// `-avg-moments` averages only the momentum of Muon's matrices.
    pub avg_muon_momentum_only: bool,
    /// Muon's matrices merge by their orthogonalised mean pseudo-gradient.
    pub orth_merge: bool,
    /// Pseudo-gradients through the sparse codec at this density, with
    /// error feedback (None: the merge codec alone).
    pub sparse_merge: Option<f32>,
    /// The residual stays in each replica's weights (`--sparse-local`).
    pub sparse_local: bool,
    /// The last merge sends the backlog densely (`--sparse-flush-last`).
    pub sparse_flush_last: bool,
    /// The backlog's decay per merge (`--sparse-decay`).
    pub sparse_decay: f32,
}

/// Trains one variant; its validation loss every `curve_every` global steps
/// and at the end.
pub fn train_variant(
    setup: &Setup,
    variant: &Variant,
    corpus: &Corpus,
    curve_every: u64,
    curve_batches: u64,
    val_batches: u64,
) -> Result<Outcome> {
    let be = Arc::new(CpuBackend::new());
    let r = setup.replicas;
    let steps = setup.train.steps;
    let tokens_per_global_step = (r * setup.train.tokens_per_step()) as u64;
    let t0 = Instant::now();
    let mut curve = Vec::new();
    let mut trainer = Trainer::new(be, setup, variant)?;
    for step in 1..=steps {
        trainer.step(corpus)?;
        if curve_every > 0 && step % curve_every == 0 && step < steps {
            curve.push((step * tokens_per_global_step, trainer.eval(corpus, curve_batches)?));
        }
    }
    let final_loss = trainer.eval(corpus, val_batches)?;
    curve.push((steps * tokens_per_global_step, final_loss));
    if let Mode::Swarm { sim, .. } = &trainer.mode
        && setup.sparse_merge.is_some()
    {
        let (sent, dense) = sim.sent_bytes;
        println!(
            "    {}: contributions {:.1} MB sparse against {:.1} MB with the merge codec alone ({:.1}x fewer)",
            variant.name(),
            sent as f64 / 1e6,
            dense as f64 / 1e6,
            dense as f64 / sent.max(1) as f64
        );
    }
    let cost = match variant {
        Variant::Boundary(b) => Some(b.cost(setup.train.model.d_model)),
        _ => None,
    };
    Ok(Outcome {
        wire_bytes_per_token: cost.map(|c| c.0),
        compression: cost.map(|c| c.1),
        name: variant.name(),
        final_loss,
        curve,
        seconds: t0.elapsed().as_secs_f64(),
        tokens: steps * tokens_per_global_step,
        merges: trainer.merges,
    })
}

// One per trainer: the size of its largest variant costs nothing.
#[allow(clippy::large_enum_variant)]
enum Mode {
    One(Pipeline<CpuBackend>),
    Sync(Vec<Pipeline<CpuBackend>>),
    Swarm {
        replicas: Vec<Pipeline<CpuBackend>>,
        merged: Pipeline<CpuBackend>,
        sim: MergeSim,
        interval: u64,
        mixed: bool,
        /// Inner steps a merge takes to land (0: at once).
        overlap: u64,
        /// Overlapped: the merge in flight (its result per stage, and each
        /// replica's weights per stage when it started).
        pending: Option<PendingMerge>,
        /// Pipelining's delay per stage (steps), predicted weights or not,
        /// and each replica's recent weights, newest first: [replica][age][stage].
        delays: Vec<u64>,
        predict: bool,
        /// The global step pipelining's delay starts at (0: the first).
        delay_from: u64,
        /// Delayed stages run their backward on their current weights.
        recompute: bool,
        /// The inner moments are averaged at each merge.
        average_moments: bool,
        ramp: MergeRamp,
        history: Vec<VecDeque<Vec<Vec<f32>>>>,
    },
}

/// A merge whose result lands some steps after it started.
struct PendingMerge {
    /// The global step after which it lands.
    lands_after: u64,
    merged: Vec<Vec<f32>>,
    /// [replica][stage]
    started_from: Vec<Vec<Vec<f32>>>,
}

struct Trainer {
    mode: Mode,
    /// Optimizer steps of a one-process trainer per global step: R at a
    /// replica's batch (the same tokens in R times the steps), else 1.
    one_steps: usize,
    setup: Setup,
    step: u64,
    merges: u64,
}

impl Trainer {
    fn new(be: Arc<CpuBackend>, setup: &Setup, variant: &Variant) -> Result<Trainer> {
        let r = setup.replicas;
        let mut train = setup.train.clone();
        let mode = match variant {
            Variant::OneProcess => {
                train.grad_accum *= r;
                Mode::One(Pipeline::new(be, train)?)
            }
            Variant::Boundary(b) => {
                train.grad_accum *= r;
                train.codec = b.apply(&mut train.model);
                Mode::One(Pipeline::new(be, train)?)
            }
            Variant::OneProcessReplicaBatch => {
                train.steps *= r as u64;
                train.schedule.total = train.steps;
                train.schedule.warmup = (train.steps / 20).clamp(1, 100);
                Mode::One(Pipeline::new(be, train)?)
            }
            Variant::SyncDataParallel => {
                Mode::Sync((0..r).map(|_| Pipeline::new(be.clone(), train.clone())).collect::<Result<_>>()?)
            }
            Variant::Swarm {
                interval,
                bottleneck,
                f32_codec,
                mixed,
                overlap,
                delay,
                predict,
                delay_from,
                recompute,
                average_moments,
                ramp,
            } => {
                if !bottleneck {
                    train.model.bottleneck = 0;
                }
                if *f32_codec {
                    train.codec = WireCodec::F32;
                }
                let mut replicas: Vec<_> =
                    (0..r).map(|_| Pipeline::new(be.clone(), train.clone())).collect::<Result<_>>()?;
                if *recompute {
                    for st in replicas.iter_mut().flat_map(|p| p.stages_mut().iter_mut()) {
                        st.set_weight_stashing(false);
                        st.set_recompute(true);
                    }
                }
                let merged = Pipeline::new(be.clone(), train.clone())?;
                let sim = MergeSim::new(&merged, setup);
                Mode::Swarm {
                    replicas,
                    merged,
                    sim,
                    interval: *interval,
                    mixed: *mixed,
                    overlap: *overlap,
                    pending: None,
                    delays: stage_delays(*delay, train.stages),
                    predict: *predict,
                    delay_from: *delay_from,
                    recompute: *recompute,
                    average_moments: *average_moments,
                    ramp: *ramp,
                    history: (0..r).map(|_| VecDeque::new()).collect(),
                }
            }
        };
        let one_steps = if *variant == Variant::OneProcessReplicaBatch { r } else { 1 };
        Ok(Trainer { mode, one_steps, setup: setup.clone(), step: 0, merges: 0 })
    }

    /// One global step: every replica's micro-batches of it.
    fn step(&mut self, corpus: &Corpus) -> Result<()> {
        let r = self.setup.replicas as u64;
        let a = self.setup.train.grad_accum as u64;
        let first = self.step * r * a;
        match &mut self.mode {
            Mode::One(p) => {
                for _ in 0..self.one_steps {
                    p.train_step(corpus)?;
                }
            }
            Mode::Sync(replicas) => {
                let mut total = Accumulated::default();
                for (i, p) in replicas.iter_mut().enumerate() {
                    p.zero_grads();
                    let acc = p.accumulate_micro_batches(corpus, first + i as u64 * a, a, 1.0 / (r * a) as f32)?;
                    total.loss_sum += acc.loss_sum;
                    total.tokens += acc.tokens;
                    total.wire_bytes += acc.wire_bytes;
                }
                // The all-reduce: every replica steps on the sum of the
                // (already 1/(R A)-scaled) gradients, summed in replica order.
                let stages = replicas[0].stages().len();
                for s in 0..stages {
                    let mut sum = replicas[0].stages()[s].grads_host();
                    for p in &replicas[1..] {
                        for (x, g) in sum.iter_mut().zip(p.stages()[s].grads_host()) {
                            *x += g;
                        }
                    }
                    for p in replicas.iter_mut() {
                        p.stages_mut()[s].set_grads(&sum)?;
                    }
                }
                for p in replicas.iter_mut() {
                    p.apply_step(total);
                }
            }
            Mode::Swarm {
                replicas,
                merged,
                sim,
                interval,
                mixed,
                overlap,
                pending,
                delays,
                predict,
                delay_from,
                recompute,
                average_moments,
                ramp,
                history,
            } => {
                if *mixed {
                    let undelayed = vec![0; delays.len()];
                    let now_delays = if self.step < *delay_from { &undelayed } else { &*delays };
                    let current = delayed_weights(replicas, history, now_delays, *predict)?;
                    let backward_at = recompute.then_some(current.as_slice());
                    let draw =
                        PathwayDraw { seed: self.setup.seed, step: self.step, mix_percent: self.setup.mix_percent };
                    mixed_grads(replicas, corpus, first, a, draw, backward_at)?;
                    for (p, now) in replicas.iter_mut().zip(current) {
                        for (s, w) in now.into_iter().enumerate() {
                            if let Some(w) = w {
                                p.stages_mut()[s].set_params(&w)?;
                            }
                        }
                        p.apply_step(Accumulated::default());
                    }
                } else {
                    for (i, p) in replicas.iter_mut().enumerate() {
                        p.zero_grads();
                        let acc = p.accumulate_micro_batches(corpus, first + i as u64 * a, a, 1.0 / a as f32)?;
                        p.apply_step(acc);
                    }
                }
                let done = self.step + 1;
                let last = done == self.setup.train.steps;
                let boundary = ramp.merges_after(done, *interval) || last;
                // A merge that started earlier lands first (at a boundary
                // at the latest): every replica keeps what it trained meanwhile.
                if pending.as_ref().is_some_and(|p| p.lands_after <= done || boundary) {
                    land(pending.take().expect("checked"), replicas, merged)?;
                }
                if boundary {
                    let mut next = sim.reduce(replicas, merged, self.merges, last)?;
                    if self.setup.orth_merge {
                        orth_merge::orthogonalise_merge(merged, replicas, &mut next);
                    }
                    if *overlap > 0 && !last {
                        let started_from =
                            replicas.iter().map(|p| p.stages().iter().map(|s| s.params_host()).collect()).collect();
                        *pending = Some(PendingMerge { lands_after: done + *overlap, merged: next, started_from });
                    } else {
                        for (s, theta) in next.iter().enumerate() {
                            merged.stages_mut()[s].set_params(theta)?;
                            for (i, p) in replicas.iter_mut().enumerate() {
                                p.stages_mut()[s].set_params(&sim.replica_weights(i, s, theta))?;
                            }
                        }
                        if *average_moments {
                            average_inner_moments(replicas, self.setup.avg_muon_momentum_only);
                        }
                        // The epoch's end drained the pipeline.
                        history.iter_mut().for_each(VecDeque::clear);
                    }
                    self.merges += 1;
                }
            }
        }
        self.step += 1;
        Ok(())
    }

    /// Validation loss of the model the run has now: the one process's, a
    /// sync replica's (all equal), or the swarm's last merged weights.
    fn eval(&mut self, corpus: &Corpus, batches: u64) -> Result<f32> {
        match &mut self.mode {
            Mode::One(p) => p.eval(corpus, batches),
            Mode::Sync(replicas) => replicas[0].eval(corpus, batches),
            Mode::Swarm { merged, .. } => merged.eval(corpus, batches),
        }
    }
}

/// Applies a merge that ran behind compute: the merged weights become the
/// model, and each replica moves onto them with what it trained since the
/// merge started (merged + own now - own then).
fn land(p: PendingMerge, replicas: &mut [Pipeline<CpuBackend>], merged: &mut Pipeline<CpuBackend>) -> Result<()> {
    for (s, theta) in p.merged.iter().enumerate() {
        merged.stages_mut()[s].set_params(theta)?;
        for (rep, then) in replicas.iter_mut().zip(&p.started_from) {
            let now = rep.stages()[s].params_host();
            let moved: Vec<f32> = theta.iter().zip(&now).zip(&then[s]).map(|((m, n), t)| m + (n - t)).collect();
            rep.stages_mut()[s].set_params(&moved)?;
        }
    }
    Ok(())
}

/// The merge every miner of a stage runs, in one process: each replica's
/// pseudo-gradient (last merged weights minus its own) cut into the
/// butterfly's partitions and encoded with the merge codec, each partition
/// reduced as an honest owner reduces it (`reduce_partition`), the merged
/// weights put back into every replica. Adam moments stay per replica, as
/// on the miners.
struct MergeSim {
    spec: MergeSpec,
    seed: u64,
    /// Outer momentum per stage.
    momentum: Vec<Vec<f32>>,
    /// With `Setup::sparse_merge`: its density, and per replica and stage
    /// what its sparse contributions have not sent yet.
    sparse: Option<(f32, Vec<Vec<ErrorFeedback>>)>,
    /// `Setup::sparse_local`.
    sparse_local: bool,
    /// `Setup::sparse_flush_last`.
    flush_last: bool,
    /// `Setup::sparse_decay`.
    decay: f32,
    /// Bytes of contributions sent, and what the merge codec alone would
    /// have sent.
    pub sent_bytes: (u64, u64),
}

impl MergeSim {
    fn new(merged: &Pipeline<CpuBackend>, setup: &Setup) -> MergeSim {
        let sizes: Vec<usize> = merged.stages().iter().map(|s| s.layout().total()).collect();
        let feedback = || sizes.iter().map(|&n| ErrorFeedback::new(n)).collect();
        MergeSim {
            spec: setup.merge.clone(),
            seed: setup.seed,
            momentum: sizes.iter().map(|&n| vec![0.0; n]).collect(),
            sparse: setup.sparse_merge.map(|d| (d, (0..setup.replicas).map(|_| feedback()).collect())),
            sparse_local: setup.sparse_local,
            flush_last: setup.sparse_flush_last,
            decay: setup.sparse_decay,
            sent_bytes: (0, 0),
        }
    }

    /// What replica `i` holds of stage `s` after a merge to `theta`: the
    /// merged weights, less what it has not sent where it keeps that in
    /// its own weights (`--sparse-local`).
    fn replica_weights(&self, i: usize, s: usize, theta: &[f32]) -> Vec<f32> {
        match (&self.sparse, self.sparse_local) {
            (Some((_, feedback)), true) => theta.iter().zip(feedback[i][s].residual()).map(|(t, r)| t - r).collect(),
            _ => theta.to_vec(),
        }
    }

    /// The merged weights of every stage: the replicas' pseudo-gradients
    /// against the last merged weights (`merged`), reduced.
    fn reduce(
        &mut self,
        replicas: &[Pipeline<CpuBackend>],
        merged: &Pipeline<CpuBackend>,
        k: u64,
        last: bool,
    ) -> Result<Vec<Vec<f32>>> {
        let mut out = Vec::new();
        let spec = &self.spec.clone();
        let r = replicas.len();
        let participants: Vec<Participant> =
            (0..r).map(|i| Participant { peer: PeerId([i as u8 + 1; 32]), work: 1 }).collect();
        for s in 0..merged.stages().len() {
            let theta_prev = merged.stages()[s].params_host();
            let locals: Vec<Vec<f32>> = replicas.iter().map(|p| p.stages()[s].params_host()).collect();
            let n = theta_prev.len() as u64;
            let plan = spec.plan(k, s as u32, participants.clone(), n, self.seed);
            let weights = plan.weights();
            let mut theta_next = theta_prev.clone();
            for part in &plan.partitions {
                let range = part.offset as usize..(part.offset + part.len) as usize;
                let mut payloads: Vec<Vec<u8>> = Vec::new();
                for pp in &plan.participants {
                    let i = participants.iter().position(|q| q.peer == pp.peer).expect("planned participant");
                    let delta: Vec<f32> =
                        theta_prev[range.clone()].iter().zip(&locals[i][range.clone()]).map(|(g, l)| g - l).collect();
                    let dense = encode_slice(spec.codec, &delta)?;
                    self.sent_bytes.1 += dense.len() as u64;
                    let Some((density, feedback)) = self.sparse.as_mut() else {
                        self.sent_bytes.0 += dense.len() as u64;
                        payloads.push(dense);
                        continue;
                    };
                    if last && self.flush_last {
                        let backlog = feedback[i][s].flush(range.start, &delta)?;
                        let dense = encode_slice(spec.codec, &backlog)?;
                        self.sent_bytes.0 += dense.len() as u64;
                        payloads.push(dense);
                        continue;
                    }
                    // What the sparse codec sends, as the reduce reads it.
                    let sparse = match self.sparse_local {
                        true => feedback[i][s].encode_kept(range.start, &delta, *density)?,
                        false => {
                            feedback[i][s].decay(range.clone(), self.decay);
                            feedback[i][s].encode(range.start, &delta, *density)?
                        }
                    };
                    self.sent_bytes.0 += sparse.len() as u64;
                    let sent = decode_sparse(&sparse, delta.len(), SPARSE_BLOCK)?;
                    payloads.push(encode_slice(spec.codec, &sent)?);
                }
                let refs: Vec<Option<&[u8]>> = payloads.iter().map(|p| Some(p.as_slice())).collect();
                let reduced =
                    reduce_partition(spec, k, part.len, &refs, &weights, &mut self.momentum[s][range.clone()]);
                if !reduced.flagged.is_empty() {
                    bail!("merge {k} stage {s}: an honest replica's contribution was flagged: {:?}", reduced.flagged);
                }
                for (t, u) in theta_next[range].iter_mut().zip(&reduced.update) {
                    *t -= u;
                }
            }
            out.push(theta_next);
        }
        Ok(out)
    }
}

pub fn run(a: Args) -> Result<()> {
    let cfg = a.run.run_config()?;
    if let Some(note) = a.run.optimizer_note(&cfg) {
        println!("{note}");
    }
    let corpus = iota_dataplane::corpus::load_corpus(&cfg, a.run.data_path()?.as_deref())?;
    let setup = Setup {
        train: cfg.train.clone(),
        replicas: cfg.spec.replicas as usize,
        merge: cfg.spec.merge.clone(),
        seed: cfg.train.seed,
        mix_percent: a.mix_percent,
        avg_muon_momentum_only: a.avg_muon_momentum_only,
        orth_merge: a.orth_merge,
        sparse_merge: a.sparse_merge,
        sparse_local: a.sparse_local,
        sparse_flush_last: a.sparse_flush_last,
        // The run's `--sparse-decay` (the swarm's setting).
        sparse_decay: cfg.spec.merge.sparse_decay,
    };
    let own = (cfg.spec.micro_batches_per_epoch / (setup.replicas * setup.train.grad_accum) as u64).max(1);
    let variants: Vec<Variant> = if a.runs.is_empty() {
        default_runs(&a.intervals, own)
    } else {
        a.runs.iter().map(|s| Variant::parse(s)).collect::<Result<_>>()?
    };
    println!(
        "convergence: {} in {} stages, {} replicas x batch {} x seq {} (grad_accum {}), {} global steps ({} tokens), \
         codec {}, merge {} {} outer lr {} momentum {} (warm-up {} merges); the swarm merges every {own} inner steps",
        a.run.model,
        setup.train.stages,
        setup.replicas,
        setup.train.batch,
        setup.train.seq,
        setup.train.grad_accum,
        setup.train.steps,
        setup.train.steps * (setup.replicas * setup.train.tokens_per_step()) as u64,
        setup.train.codec.name(),
        setup.merge.codec.name(),
        setup.merge.rule.name(),
        setup.merge.outer.lr,
        setup.merge.outer.momentum,
        setup.merge.outer_momentum_warmup,
    );
    if setup.avg_muon_momentum_only {
        println!("  -avg-moments averages only the momentum of Muon's matrices (--avg-muon-momentum-only)");
    }
    if setup.orth_merge {
        println!("  Muon's matrices merge by their orthogonalised mean pseudo-gradient (--orth-merge)");
    }
    if let Some(d) = setup.sparse_merge {
        let kept =
            if setup.sparse_local { ", the residual kept in each replica's weights (--sparse-local)" } else { "" };
        println!(
            "  pseudo-gradients through the sparse codec at density {d} with error feedback (--sparse-merge){kept}"
        );
    }
    if setup.mix_percent < 100 {
        println!("  mixed pathways on {}% of the steps (--mix-percent)", setup.mix_percent);
    }
    let mut outcomes: Vec<Outcome> = Vec::new();
    for (i, v) in variants.iter().enumerate() {
        let o = train_variant(&setup, v, &corpus, a.curve_every, a.curve_batches, a.val_batches)?;
        println!(
            "  [{}/{}] {:<40} validation loss {:.4}  ({:.1} s, {} merges)",
            i + 1,
            variants.len(),
            o.name,
            o.final_loss,
            o.seconds,
            o.merges
        );
        outcomes.push(o);
    }
    print_table(&outcomes);
    std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    let stamp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_secs();
    let svg_path = a.out.join(format!("convergence-{stamp}.svg"));
    let json_path = a.out.join(format!("convergence-{stamp}.json"));
    write_new(&svg_path, plot_svg(&outcomes, &a.run.model).as_bytes())?;
    write_new(&json_path, &serde_json::to_vec_pretty(&outcomes)?)?;
    println!("  curves: {}\n  results: {}", svg_path.display(), json_path.display());
    Ok(())
}

#[cfg(test)]
mod orth_merge_tests;
#[cfg(test)]
mod tests;
