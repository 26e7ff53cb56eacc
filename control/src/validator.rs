//! The validator process (`iota-control validator`): the shell around
//! [`ValidatorCore`]. It registers as one of the run's validators,
//! follows its command stream, asks for evidence, reads each evidence
//! object from the run's store, checks it on the CPU reference
//! ([`Checker`]), and sends its votes (the `Validate` RPC). It holds no
//! store credentials: on a bucket it reads through grants, like a miner.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context, Result};
use iota_core::{Identity, PeerId};
use iota_dataplane::miner::worker::weights_hash;
use iota_protocol::client::ControlClient;
use iota_protocol::{RunConfig, SharedStore, StoredObject, pb};
use tokio::sync::mpsc;
use tracing::{info, warn};

use crate::validation::check::Checker;
use crate::validation::lanes::LaneRecord;
use crate::validation::merge_reports;
use crate::validation::round::{Action, CheckJob, ProveJob, ValidatorCore};
use crate::validation::sample::SampleRate;
use crate::validation::train_loss;
use crate::validator_prove::{read_retrying, spawn_prove, store_step_proof};

#[derive(Clone, Debug)]
pub struct ValidatorOptions {
    /// Orchestrator URL, e.g. `https://127.0.0.1:7100`.
    pub orchestrator: String,
    /// The orchestrator's identity, pinned (None: trust the first to answer).
    pub orchestrator_key: Option<PeerId>,
    pub insecure_plaintext: bool,
    /// CA certificates (PEM) for an orchestrator with a CA-issued
    /// certificate (None: its identity certificate, key pinned).
    pub tls_ca: Option<std::path::PathBuf>,
    /// The run's object store directory, when it is one on this machine.
    pub store: Option<PathBuf>,
    /// The run's corpus (None: the generated toy corpus).
    pub data: Option<PathBuf>,
    /// This validator's secret sampling seed (miners cannot predict its draw).
    pub seed: u64,
    /// A miner that has not delivered the evidence drawn from it this long
    /// after the round opened is voted guilty.
    pub evidence_timeout: Duration,
    pub heartbeat: Duration,
    /// Test tool: a dishonest validator that votes every miner it checked
    /// guilty, whatever its checks found (never set by the command line).
    pub accuse_everyone: bool,
    /// Test tool: a hostile validator that, besides its draw, asks for the
    /// evidence of every attempt of every miner of each epoch (the
    /// `ask-flood` mode; never set by the command line).
    pub ask_flood: bool,
    /// Test tool: a lazy validator that checks nothing and, as each
    /// epoch's work comes, sends as its weights what an honest round over
    /// honest miners gives (every miner's completed attempts), the weights
    /// a copier of the others' consensus would send (the `copy-weights`
    /// mode; never set by the command line).
    pub copy_weights: bool,
    /// Test tool: votes to roll back the merges of these epochs, whatever
    /// their held-out loss (so tests can follow a run past a rollback;
    /// never set by the command line).
    pub roll_back_epochs: Vec<u64>,
}

impl ValidatorOptions {
    pub fn local(orchestrator: String, seed: u64) -> ValidatorOptions {
        ValidatorOptions {
            orchestrator,
            orchestrator_key: None,
            insecure_plaintext: false,
            tls_ca: None,
            store: None,
            data: None,
            seed,
            evidence_timeout: Duration::from_secs(30),
            heartbeat: Duration::from_millis(500),
            accuse_everyone: false,
            ask_flood: false,
            copy_weights: false,
            roll_back_epochs: Vec::new(),
        }
    }
}

/// A sampling seed nobody else knows (a validator's default).
pub fn random_seed() -> u64 {
    let mut b = [0u8; 8];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut b).expect("the system's random source");
    u64::from_le_bytes(b)
}

/// What a validator did, returned when the run ends.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ValidatorSummary {
    pub peer: Option<PeerId>,
    pub rounds: u64,
    pub checked: u64,
    pub guilty_votes: Vec<(u64, PeerId, String)>,
    pub cleared_votes: u64,
    /// Merged models it voted to roll back, by epoch.
    pub rollback_votes: Vec<u64>,
    /// The held-out loss of each merged model it evaluated (epoch, loss).
    pub merge_losses: Vec<(u64, f32)>,
    /// Time spent checking evidence (decoding and recomputing) and
    /// evaluating merged models.
    pub check_time: Duration,
    /// The weights it sent with each round's end (epoch, weights in the
    /// order of the epoch's work).
    pub weights: Vec<(u64, Vec<f32>)>,
    /// Merge partitions it audited (answered).
    pub merge_audits: u64,
    /// Its evidence asks the orchestrator refused.
    pub asks_refused: u64,
}

enum Input {
    Command(pb::command::Kind),
    Checked(Box<CheckJob>, Result<(), String>, LaneRecord, Duration),
    /// The object of a check could not be read from the store.
    Unreadable(Box<CheckJob>),
    /// A merge audit answered, after this long (waiting for the
    /// contributions included).
    MergeAudited(Duration),
    /// A merged model evaluated.
    MergeEvaluated(MergeEvaluation),
    /// A failed inner step's proof built (or why not).
    Proved(Box<ProveJob>, Result<Vec<u8>, String>),
}

/// A merged model evaluated: its held-out loss (or why it could not be
/// had), and the seed model's when asked for.
struct MergeEvaluation {
    epoch: u64,
    loss: Result<f32, String>,
    seed_loss: Option<f32>,
    /// Each stage's weights hash, of the merged model as loaded (empty
    /// where it could not be).
    stage_hashes: BTreeMap<u32, [u8; 32]>,
    /// Participants whose reported merged weights are not the merge.
    false_reports: Vec<merge_reports::FalseReport>,
    /// Time the evaluation took.
    took: Duration,
}

/// Validates the run at `opts.orchestrator` until it is done (or `stop`).
pub async fn run(opts: ValidatorOptions, id: Identity, stop: Arc<AtomicBool>) -> Result<ValidatorSummary> {
    let me = id.peer_id();
    let (client, run_id, cfg, store) = join(&opts, Arc::new(id)).await?;
    let corpus =
        Arc::new(iota_dataplane::corpus::load_run_corpus_async(&cfg, opts.data.as_deref(), &*store, None).await?);
    let checker = Arc::new(parking_lot::Mutex::new(Checker::new(cfg.clone(), run_id, Some(corpus))?));
    let finished = Arc::new(AtomicBool::new(false));
    let (in_tx, in_rx) = mpsc::channel::<Input>(1024);
    let cmd_task = iota_protocol::client::follow_commands(
        client.clone(),
        finished.clone(),
        iota_protocol::client::Rejoin::Validator { device: "cpu".into() },
        in_tx.clone(),
        Input::Command,
    );
    let run_done = Arc::new(AtomicBool::new(false));
    let hb_task = spawn_heartbeats(client.clone(), opts.heartbeat, finished.clone(), run_done.clone());
    let mut shell = Shell {
        core: validator_core(&opts, &cfg, run_id),
        summary: ValidatorSummary { peer: Some(me), ..ValidatorSummary::default() },
        last_good: None,
        train_tails: BTreeMap::new(),
        started: std::time::Instant::now(),
        audit_contexts: Default::default(),
        reads: Arc::new(tokio::sync::Semaphore::new(EVIDENCE_IN_MEMORY)),
        opts,
        run_id,
        cfg,
        client,
        store,
        checker,
        in_tx,
    };
    let result = shell.follow(in_rx, &stop, &run_done).await;
    finished.store(true, Ordering::SeqCst);
    cmd_task.abort();
    hb_task.abort();
    result.map(|()| shell.summary)
}

/// Connects, registers as a validator, and opens the run's store.
async fn join(opts: &ValidatorOptions, id: Arc<Identity>) -> Result<(ControlClient, u64, RunConfig, SharedStore)> {
    let me = id.peer_id();
    let mut client = iota_dataplane::miner::connect(
        &opts.orchestrator,
        id,
        opts.orchestrator_key,
        opts.insecure_plaintext,
        opts.tls_ca.as_deref(),
    )
    .await?;
    let reply = client.register_validator("cpu".into()).await.context("registering as a validator")?;
    let cfg = RunConfig::from_json(&reply.run_config_json).context("the orchestrator's run config")?;
    info!(validator = %me, run = reply.run_id, "registered as a validator");
    let store = iota_dataplane::granted_store::open_run_store(
        cfg.store,
        opts.store.as_deref(),
        &client,
        opts.tls_ca.as_deref(),
    )?;
    Ok((client, reply.run_id, cfg, store))
}

/// The sans-IO round for this run: its sampling rate, evidence timeout and
/// stage sizes (a bigger stage's evidence takes longer to upload: the
/// rounds wait for it, as an honest miner's slow upload is not withheld
/// evidence).
fn validator_core(opts: &ValidatorOptions, cfg: &RunConfig, run_id: u64) -> ValidatorCore {
    let v = &cfg.spec.validation;
    let rate = SampleRate { rate: v.rate, min_per_miner: v.min_per_miner as usize };
    let timeout = opts.evidence_timeout.as_millis() as u64;
    let stage_params = cfg.train.model.stage_param_counts(cfg.spec.stages as usize).unwrap_or_default();
    ValidatorCore::new(run_id, cfg.spec.stages, opts.seed, rate, timeout)
        .with_stage_params(&stage_params, cfg.spec.validation.validators.len())
        .with_inner_steps(v.check_inner_steps)
        .with_step_proofs(v.check_inner_steps)
}

/// Heartbeats keep the validator counted as live (the merge waits only for
/// live validators); a reply saying the run is over sets `run_done`.
fn spawn_heartbeats(
    mut client: ControlClient,
    every: Duration,
    finished: Arc<AtomicBool>,
    run_done: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut iv = tokio::time::interval(every);
        while !finished.load(Ordering::SeqCst) {
            iv.tick().await;
            if let Ok(r) = client.heartbeat(0, 0, 0.0, &[]).await
                && r.phase == pb::Phase::Done as i32
            {
                run_done.store(true, Ordering::SeqCst);
            }
        }
    })
}

/// The validator's loop state around its sans-IO round.
struct Shell {
    opts: ValidatorOptions,
    run_id: u64,
    cfg: RunConfig,
    client: ControlClient,
    store: SharedStore,
    checker: Arc<parking_lot::Mutex<Checker>>,
    /// Evidence objects held in memory at once, at most.
    reads: Arc<tokio::sync::Semaphore>,
    in_tx: mpsc::Sender<Input>,
    core: ValidatorCore,
    summary: ValidatorSummary,
    /// The held-out loss of the last merged model it kept (first: the seed
    /// model's, measured with the first check).
    last_good: Option<f32>,
    /// Each epoch's tails' losses near its end, as they reported them (in
    /// the epoch's work; the round re-checks a sample of the reports).
    train_tails: BTreeMap<u64, Vec<(PeerId, f32)>>,
    /// The round's evidence timeout runs on a monotonic clock: a wall clock
    /// stepped forward (NTP on a fresh machine) must not make every miner's
    /// evidence overdue at once.
    started: std::time::Instant,
    /// The plans (with momentum and chains) merge audits name.
    audit_contexts: crate::merge_auditor::AuditContexts,
}

impl Shell {
    fn elapsed_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// Feeds the round its inputs and ticks, and carries out its actions,
    /// until the run is done or `stop` is set.
    async fn follow(
        &mut self,
        mut in_rx: mpsc::Receiver<Input>,
        stop: &AtomicBool,
        run_done: &AtomicBool,
    ) -> Result<()> {
        let mut tick = tokio::time::interval(Duration::from_millis(250));
        loop {
            if stop.load(Ordering::SeqCst) || run_done.load(Ordering::SeqCst) {
                return Ok(());
            }
            let actions = tokio::select! {
                Some(input) = in_rx.recv() => self.on_input(input).await,
                _ = tick.tick() => self.core.tick(self.elapsed_ms()),
            };
            self.act_all(actions).await;
        }
    }

    async fn on_input(&mut self, input: Input) -> Vec<Action> {
        match input {
            Input::Command(pb::command::Kind::EpochWork(w)) => self.on_epoch_work(&w),
            Input::Command(pb::command::Kind::Stored(st)) => {
                match st.object.as_ref().map(|o| StoredObject::from_pb(o, None)) {
                    Some(Ok(o)) => self.core.on_evidence(st.epoch, o),
                    _ => Vec::new(),
                }
            }
            Input::Command(pb::command::Kind::MergeAuditContext(c)) => {
                self.audit_contexts.insert(c);
                Vec::new()
            }
            Input::Command(pb::command::Kind::MergeAudit(ma)) => {
                let (spec, store, client, in_tx) =
                    (self.cfg.spec.merge.clone(), self.store.clone(), self.client.clone(), self.in_tx.clone());
                let run_id = self.run_id;
                let context = self.audit_contexts.get(&ma.context);
                // The seed's weights are the start of an epoch the
                // orchestrator says began from them (epoch 0, or after
                // merges all rolled back: the audited one, or with sparse
                // contributions the one before it).
                let initial = match context.as_deref() {
                    Some(Ok(c)) if c.needs_seed() => self.checker.lock().initial_hash(c.plan.stage).ok(),
                    _ => None,
                };
                tokio::spawn(async move {
                    let took = crate::merge_auditor::audit(ma, context, spec, run_id, store, client, initial).await;
                    let _ = in_tx.send(Input::MergeAudited(took)).await;
                });
                Vec::new()
            }
            Input::MergeAudited(took) => {
                self.summary.merge_audits += 1;
                self.summary.check_time += took;
                Vec::new()
            }
            Input::Command(pb::command::Kind::MergeCheck(mc)) => {
                let first = self.last_good.is_none();
                evaluate_merge(mc, &self.cfg, &self.store, &self.checker, first, &self.in_tx);
                Vec::new()
            }
            Input::Command(_) => Vec::new(),
            Input::MergeEvaluated(e) => {
                self.on_merge_evaluated(e).await;
                Vec::new()
            }
            Input::Checked(job, res, lanes, took) => {
                self.summary.checked += 1;
                self.summary.check_time += took;
                self.core.checked_lanes(&job, res, lanes)
            }
            Input::Unreadable(job) => self.core.unreadable(&job),
            Input::Proved(p, result) => self.core.proved(&p, result),
        }
    }

    /// A new round: the epoch's work, its tails' late losses kept for the
    /// merge's judgement.
    fn on_epoch_work(&mut self, w: &pb::EpochWork) -> Vec<Action> {
        self.summary.rounds += 1;
        let last_stage = self.cfg.spec.stages.saturating_sub(1);
        self.train_tails.insert(w.epoch, train_loss::late_tail_losses(w, last_stage));
        while self.train_tails.len() > 4 {
            self.train_tails.pop_first();
        }
        if self.opts.copy_weights {
            return vec![copied_weights(w)];
        }
        let mut actions = self.core.on_work(self.elapsed_ms(), w).unwrap_or_else(|e| {
            warn!(epoch = w.epoch, error = %e, "epoch work refused");
            Vec::new()
        });
        if self.opts.ask_flood {
            actions.extend(flood_asks(w));
        }
        actions
    }

    /// A merged model evaluated: guilty votes for false merge reports, then
    /// the vote to keep the merge or roll it back.
    async fn on_merge_evaluated(&mut self, e: MergeEvaluation) {
        let MergeEvaluation { epoch, loss, seed_loss, stage_hashes, false_reports, took } = e;
        for f in &false_reports {
            self.vote_false_report(epoch, f).await;
        }
        self.summary.check_time += took;
        // Against the better of the last model it kept (the seed's at
        // first) and the epoch's own training loss (not with sparse
        // contributions: `train_loss::rollback_base`): a merge far worse
        // than the models it merged is suspect. Tails this validator found
        // guilty (of lying about their loss, say) are left out of the
        // training loss.
        let trained =
            self.train_tails.get(&epoch).and_then(|t| train_loss::baseline(t, &self.core.found_guilty(epoch)));
        let sparse = self.cfg.spec.merge.sparse_density > 0.0;
        let base = train_loss::rollback_base(self.last_good.or(seed_loss), trained, sparse);
        let jump = self.cfg.spec.validation.rollback_loss_jump;
        let (rollback, reason) = match &loss {
            Err(why) => (true, format!("the merged model cannot be evaluated: {why}")),
            Ok(l) if !l.is_finite() => (true, format!("held-out loss {l}")),
            Ok(_) if self.opts.roll_back_epochs.contains(&epoch) => (true, "a test told this validator to".into()),
            Ok(l) if base.is_some_and(|b| f64::from(*l) > f64::from(b) * (1.0 + jump)) => {
                (true, format!("held-out loss {l} after {}", base.unwrap_or(f32::NAN)))
            }
            Ok(_) => (false, String::new()),
        };
        let l = loss.unwrap_or(f32::NAN);
        self.summary.merge_losses.push((epoch, l));
        // What it loaded, whatever it votes: the orchestrator records the
        // stake's hash as each stage's start.
        let merged = stage_hashes
            .iter()
            .map(|(s, h)| pb::StageStart { stage: *s, weights_hash: h.to_vec(), weights_from: 0 })
            .collect();
        if rollback {
            warn!(epoch, reason = %reason, "voting to roll the merge back");
            self.summary.rollback_votes.push(epoch);
        } else {
            self.last_good = Some(l);
            self.core.merge_kept(epoch, stage_hashes);
        }
        let reason: String = reason.chars().filter(|c| (' '..='~').contains(c)).take(256).collect();
        // A loss that is no number to record (an infinity) goes as NaN.
        let measured = if l.is_finite() && l >= 0.0 { l } else { f32::NAN };
        let vote = pb::MergeVote { epoch, rollback, loss: measured, reason, merged };
        if let Err(e) = self.client.validate(pb::validator_report::Kind::MergeVote(vote)).await {
            warn!(error = %e, "merge vote failed");
        }
    }

    /// A guilty vote on a participant whose merge report is false.
    async fn vote_false_report(&mut self, epoch: u64, f: &merge_reports::FalseReport) {
        let reason = merge_reports::reason(f);
        warn!(epoch, miner = %f.peer, reason = %reason, "voting guilty: a false merge report");
        self.summary.guilty_votes.push((epoch, f.peer, reason.clone()));
        let v = pb::Verdict {
            epoch,
            miner: f.peer.0.to_vec(),
            check: pb::Check::Merge as i32,
            guilty: true,
            samples: 0,
            evidence_hash: Vec::new(),
            reason,
            proof: Vec::new(),
            step_proof_hash: Vec::new(),
        };
        if let Err(e) = self.client.validate(pb::validator_report::Kind::Verdict(v)).await {
            warn!(error = %e, "merge report verdict failed");
        }
    }

    /// Carries out the round's actions (a dishonest validator's test tool
    /// turns its clearing votes into guilty ones here).
    async fn act_all(&mut self, actions: Vec<Action>) {
        for mut a in actions {
            if let Action::Vote { guilty, reason, .. } = &mut a
                && self.opts.accuse_everyone
                && !*guilty
            {
                *guilty = true;
                *reason = "accused regardless (a dishonest validator, test tool)".into();
            }
            let ask = matches!(a, Action::Ask { .. });
            let shared = (&self.checker, &self.reads);
            if let Err(e) = act(a, &mut self.client, &self.store, shared, &self.in_tx, &mut self.summary).await {
                self.summary.asks_refused += u64::from(ask);
                warn!(error = %e, "validator action failed");
            }
        }
    }
}

/// Loads every stage's merged weights from the store (each object checked
/// against its announcement) and measures the model's held-out loss off
/// the loop; the result comes back as `Input::MergeEvaluated`.
fn evaluate_merge(
    mc: pb::MergeCheck,
    cfg: &RunConfig,
    store: &SharedStore,
    checker: &Arc<parking_lot::Mutex<Checker>>,
    with_seed: bool,
    in_tx: &mpsc::Sender<Input>,
) {
    let (cfg, store, checker, in_tx) = (cfg.clone(), store.clone(), checker.clone(), in_tx.clone());
    tokio::spawn(async move {
        let epoch = mc.epoch;
        let mut weights = Vec::new();
        let mut failed = None;
        let specs = iota_core::StageSpec::split(&cfg.train.model, cfg.train.stages).unwrap_or_default();
        for (s, spec) in specs.iter().enumerate() {
            let layout = iota_core::ParamLayout::for_stage(&cfg.train.model, spec);
            let objects: Vec<StoredObject> = mc
                .stages
                .iter()
                .filter(|w| w.stage as usize == s)
                .flat_map(|w| w.objects.iter().filter_map(|o| StoredObject::from_pb(o, None).ok()))
                .collect();
            match iota_dataplane::miner::merge::load_weights(&store, &objects, &layout).await.0 {
                Ok(w) => weights.push(w),
                Err(e) => {
                    failed = Some(format!("stage {s}: {e:#}"));
                    break;
                }
            }
        }
        let evaluated = tokio::task::spawn_blocking(move || {
            let c = checker.lock();
            let t0 = std::time::Instant::now();
            let batches = cfg.spec.validation.eval_batches;
            let seed_loss =
                if with_seed { c.initial_weights().ok().and_then(|w| c.held_out_loss(&w, batches).ok()) } else { None };
            let (loss, stage_hashes) = match failed {
                Some(why) => (Err(why), BTreeMap::new()),
                None => {
                    let hashes = weights.iter().enumerate().map(|(s, w)| (s as u32, weights_hash(w))).collect();
                    (c.held_out_loss(&weights, batches), hashes)
                }
            };
            (loss, seed_loss, stage_hashes, t0.elapsed())
        })
        .await;
        let (loss, seed_loss, stage_hashes, took) = evaluated.unwrap_or_else(|e| {
            (Err(format!("the evaluation failed to run: {e}")), None, BTreeMap::new(), Duration::ZERO)
        });
        let false_reports = merge_reports::false_reports(&mc.stages, &stage_hashes);
        let evaluation = MergeEvaluation { epoch, loss, seed_loss, stage_hashes, false_reports, took };
        let _ = in_tx.send(Input::MergeEvaluated(evaluation)).await;
    });
}

/// The `copy_weights` test tool's answer to an epoch's work: no check,
/// and the weights an honest round over honest miners would send.
fn copied_weights(w: &pb::EpochWork) -> Action {
    let miners: Vec<PeerId> = w.miners.iter().filter_map(|m| m.peer.as_slice().try_into().ok().map(PeerId)).collect();
    let total: usize = w.miners.iter().map(|m| m.items.len()).sum();
    let weights = w.miners.iter().map(|m| m.items.len() as f32 / total.max(1) as f32).collect();
    let miners_hash = crate::validation::sample::work_miners_hash(w.epoch, &miners);
    Action::Done { epoch: w.epoch, weights, miners_hash }
}

/// The `ask_flood` test tool: an ask for every attempt of every miner of
/// the epoch, 256 to an ask (the orchestrator serves none past this
/// validator's draw).
fn flood_asks(w: &pb::EpochWork) -> Vec<Action> {
    let mut asks = Vec::new();
    for m in &w.miners {
        let Ok(miner) = <[u8; 32]>::try_from(m.peer.as_slice()).map(PeerId) else { continue };
        let items: Vec<(u32, u64, u32)> =
            m.items.iter().filter_map(|i| i.mb.as_ref()).map(|r| (r.shard, r.first_sample, r.attempt)).collect();
        for chunk in items.chunks(256) {
            asks.push(Action::Ask { epoch: w.epoch, miner, items: chunk.to_vec(), inner_step: None, trace: None });
        }
    }
    asks
}

/// Evidence objects a validator holds in memory at once (one being
/// checked, one read ahead): a bundle carries a stage's whole weights,
/// 230 MB for a `125m` head and 2 GB for a `1.5b` stage, and a round's
/// announcements arrive together; the checks run one at a time anyway.
const EVIDENCE_IN_MEMORY: usize = 2;

async fn act(
    a: Action,
    client: &mut ControlClient,
    store: &SharedStore,
    (checker, reads): (&Arc<parking_lot::Mutex<Checker>>, &Arc<tokio::sync::Semaphore>),
    in_tx: &mpsc::Sender<Input>,
    summary: &mut ValidatorSummary,
) -> Result<()> {
    use pb::validator_report::Kind;
    match a {
        Action::Ask { epoch, miner, items, inner_step, trace } => {
            let items = items
                .into_iter()
                .map(|k @ (shard, first_sample, attempt)| pb::WorkRef {
                    shard,
                    first_sample,
                    attempt,
                    inner_step: inner_step == Some(k),
                    trace_step: trace.filter(|_| inner_step == Some(k)).map_or(0, |s| s.saturating_add(1)),
                })
                .collect();
            client.validate(Kind::Ask(pb::EvidenceAsk { epoch, miner: miner.0.to_vec(), items })).await?;
        }
        Action::Check(job) => {
            // Read and recompute off the loop: a recompute is a stage's
            // forward on the CPU.
            let (store, checker, in_tx, reads) = (store.clone(), checker.clone(), in_tx.clone(), reads.clone());
            tokio::spawn(async move {
                // Held until the check is done (the semaphore is never closed).
                let Ok(_room) = reads.acquire_owned().await else { return };
                let bytes = match read_retrying(&store, &job.object.key).await {
                    Ok(bytes) => bytes,
                    Err(e) => {
                        // A failing read is no proof against the miner: asked
                        // again, or judged by the evidence timeout.
                        warn!(key = job.object.key, error = %e, "an evidence object cannot be read; asking again");
                        let _ = in_tx.send(Input::Unreadable(job)).await;
                        return;
                    }
                };
                let job2 = job.clone();
                let res = tokio::task::spawn_blocking(move || {
                    let mut checker = checker.lock();
                    let t0 = std::time::Instant::now();
                    let (r, lanes) = checker.check_lanes(&job2, &bytes);
                    (r, lanes, t0.elapsed())
                })
                .await
                .unwrap_or_else(|e| {
                    (Err(format!("the check failed to run: {e}")), LaneRecord::default(), Duration::ZERO)
                });
                let _ = in_tx.send(Input::Checked(job, res.0, res.1, res.2)).await;
            });
        }
        Action::Prove(p) => {
            let in_tx = in_tx.clone();
            spawn_prove(*p, store, checker, move |p, result| {
                tokio::spawn(async move {
                    let _ = in_tx.send(Input::Proved(Box::new(p), result)).await;
                });
            });
        }
        Action::Vote { epoch, miner, guilty, samples, evidence_hash, reason, proof, step_proof } => {
            // A step proof is stored (it can be megabytes); the verdict
            // names its hash.
            let step_proof_hash = match (step_proof.is_empty(), summary.peer) {
                (false, Some(me)) => store_step_proof(store, (epoch, me, miner), step_proof).await,
                _ => Vec::new(),
            };
            if guilty {
                warn!(epoch, miner = %miner, reason = %reason, "voting guilty");
                summary.guilty_votes.push((epoch, miner, reason.clone()));
            } else {
                summary.cleared_votes += 1;
            }
            let v = pb::Verdict {
                epoch,
                miner: miner.0.to_vec(),
                check: pb::Check::Recompute as i32,
                guilty,
                samples,
                evidence_hash: evidence_hash.map(|h| h.to_vec()).unwrap_or_default(),
                reason: reason.chars().filter(|c| (' '..='~').contains(c)).take(256).collect(),
                proof,
                step_proof_hash,
            };
            client.validate(Kind::Verdict(v)).await?;
        }
        Action::Done { epoch, weights, miners_hash } => {
            info!(epoch, rated = weights.len(), "validation round done");
            summary.weights.push((epoch, weights.clone()));
            let done = pb::ValidationDone { epoch, weights, miners_hash: miners_hash.to_vec() };
            client.validate(Kind::Done(done)).await?;
        }
    }
    Ok(())
}
