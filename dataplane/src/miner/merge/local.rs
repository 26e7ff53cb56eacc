//! One stage's merge run on its own, in process: R replicas, each with a
//! QUIC endpoint on 127.0.0.1 and its `Butterfly` on a thread, and the
//! orchestrator's `StageMerge` as the coordinator. The tests check the
//! merge's results with it and `iota-bench butterfly` measures it; the
//! parameter-server baseline runs through the same store.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use iota_core::layout::Init;
use iota_core::merge::{MergeOut, Mismatch, Participant, PartitionOf, SignedContribution, SliceReport, StageMerge};
use iota_core::{Identity, ParamEntry, ParamLayout, PeerId};
use iota_protocol::{MergeSpec, SharedStore, StoredObject, pb, plan_to_pb};
use tokio::sync::mpsc;
use tracing::warn;

use super::{Butterfly, Merge, MergeFault, MergeStats};
use crate::fileio::FileIo;
use crate::frame::{FrameLimits, RunContext};
use crate::local_store::LocalDirStore;
use crate::miner::deliver::deliver;
use crate::miner::events::Output;
use crate::pool::HostPool;
use crate::tls::PeerDirectory;
use crate::transport::{Endpoint, ReceivedFrame, TransportConfig};

/// One replica's part in a local merge.
#[derive(Clone, Debug)]
pub struct LocalReplica {
    /// Its weights after training (theta_local).
    pub params: Vec<f32>,
    pub work: u64,
    pub fault: Option<MergeFault>,
    /// Crashes as the plan reaches it (never sends anything).
    pub dies_on_plan: bool,
    /// Cut off from every peer (no one can dial it, it can dial no one):
    /// all its slices go through the object store.
    pub isolated: bool,
}

#[derive(Debug)]
pub struct LocalMergeReport {
    /// Each replica's merged weights (None: it died or was planned out).
    pub merged: Vec<Option<Vec<f32>>>,
    /// Replicas the merge planned out (died, equivocated, flagged).
    pub planned_out: Vec<PeerId>,
    pub sent_bytes: Vec<u64>,
    pub recv_bytes: Vec<u64>,
    /// Each replica's seconds in the merge's phases (`MergeStats::phase_secs`).
    pub phase_secs: Vec<[f64; 4]>,
    pub store_fallbacks: u64,
    /// Frames the replicas' endpoints refused, all reasons.
    pub frames_refused: u64,
    pub elapsed: Duration,
    pub mismatches: Vec<Mismatch>,
    pub peers: Vec<PeerId>,
    /// The merged weights and momentum as their writers announced them
    /// (what a newcomer, or the next merge, is handed).
    pub weights_objects: Vec<StoredObject>,
    pub momentum_objects: Vec<StoredObject>,
}

enum ToReplica {
    Plan(pb::PhaseChange),
    Verdict(pb::SliceVerdict),
    Stored(pb::Stored),
    Frame(Box<ReceivedFrame>),
    Tick,
    /// The merge is over (for a replica it planned out).
    End,
}

enum ToCoordinator {
    Report(PeerId, pb::report::Kind),
    Died(PeerId),
}

/// A one-tensor layout of `n` values (the merge only sees a flat vector).
pub fn flat_layout(n: usize) -> ParamLayout {
    ParamLayout {
        entries: vec![ParamEntry {
            name: "flat".into(),
            shape: vec![n],
            offset: 0,
            init: Init::Const(0.0),
            decay: false,
        }],
    }
}

/// Runs one butterfly merge of `replicas` (all starting the epoch from
/// `theta_prev`) for `epoch` of stage 0, with the object store in `store_dir`;
/// `momentum`: the previous merge's announced momentum parts.
pub async fn run_local_butterfly(
    spec: MergeSpec,
    epoch: u64,
    theta_prev: Arc<Vec<f32>>,
    replicas: Vec<LocalReplica>,
    store_dir: &Path,
    timeout: Duration,
    momentum: &[StoredObject],
) -> Result<LocalMergeReport> {
    run_local_butterfly_with_limits(
        spec,
        epoch,
        theta_prev,
        replicas,
        store_dir,
        timeout,
        momentum,
        FrameLimits::default(),
    )
    .await
}

/// `run_local_butterfly` with every replica's endpoint refusing frames
/// past `limits`.
// The harness's inputs, each needed; a struct would only be unpacked here.
#[allow(clippy::too_many_arguments)]
pub async fn run_local_butterfly_with_limits(
    spec: MergeSpec,
    epoch: u64,
    theta_prev: Arc<Vec<f32>>,
    replicas: Vec<LocalReplica>,
    store_dir: &Path,
    timeout: Duration,
    momentum: &[StoredObject],
    limits: FrameLimits,
) -> Result<LocalMergeReport> {
    let (r, n) = (replicas.len(), theta_prev.len() as u64);
    let ctx = Arc::new(RunContext::new(7, limits));
    ctx.set_epoch_window(epoch as u32, epoch as u32);
    let store = LocalDirStore::shared(store_dir, FileIo::start(false))?;
    let eps = bind_endpoints(&replicas, &ctx)?;
    let peers: Vec<PeerId> = eps.iter().map(|ep| ep.peer_id()).collect();
    let (co_tx, mut co_rx) = mpsc::unbounded_channel::<ToCoordinator>();
    let t0 = Instant::now();
    let participants: Vec<Participant> =
        replicas.iter().zip(&peers).map(|(rep, p)| Participant { peer: *p, work: rep.work }).collect();
    let (mut to_replica, mut threads, mut stats) = (Vec::new(), Vec::new(), Vec::new());
    let shared = ReplicaShared { spec: spec.clone(), epoch, theta_prev, store, ctx: ctx.clone(), co_tx };
    // Moved to the replicas' threads, not copied (a copy of every replica's
    // weights is no part of a merge, and would be timed as one).
    for (rep, ep) in replicas.into_iter().zip(&eps) {
        let (tx, thread, st) = spawn_replica(rep, ep.clone(), &shared);
        to_replica.push(tx);
        threads.push(thread);
        stats.push(st);
    }
    drop(shared);
    let ticks = spawn_ticks(to_replica.clone());
    let mut co = Coordinator {
        sm: StageMerge::new(spec.plan(epoch, 0, participants, n, 1234)),
        index: peers.iter().enumerate().map(|(i, p)| (*p, i)).collect(),
        to_replica,
        epoch,
        momentum: momentum.to_vec(),
        run_id: ctx.run_id(),
        weights_objects: Vec::new(),
        momentum_objects: Vec::new(),
    };
    co.send_plan();
    let deadline = Instant::now() + timeout;
    while !co.sm.complete() {
        let left = deadline.saturating_duration_since(Instant::now());
        let msg = tokio::time::timeout(left, co_rx.recv()).await.context("local merge timed out")?;
        let Some(msg) = msg else { bail!("coordinator channel closed") };
        co.on_message(msg);
    }
    let elapsed = t0.elapsed();
    // A replica planned out is still waiting for input.
    ticks.abort();
    let frames_refused = eps.iter().map(|ep| ep.stats().rejected_total()).sum();
    for tx in &co.to_replica {
        let _ = tx.send(ToReplica::End);
    }
    co.to_replica.clear();
    for ep in &eps {
        ep.close();
    }
    let mut merged = Vec::new();
    for t in threads {
        merged.push(tokio::task::spawn_blocking(move || t.join()).await?.map_err(|_| anyhow::anyhow!("panicked"))??);
    }
    let planned_out: Vec<PeerId> = peers.iter().copied().filter(|p| !co.sm.plan.is_participant(p)).collect();
    if let Some(i) = (0..r).find(|i| merged[*i].is_none() && !planned_out.contains(&peers[*i])) {
        bail!("replica {i} was not planned out and did not finish its merge");
    }
    Ok(LocalMergeReport {
        merged,
        planned_out,
        sent_bytes: stats.iter().map(|s| s.sent_bytes.load(Ordering::Relaxed)).collect(),
        recv_bytes: stats.iter().map(|s| s.recv_bytes.load(Ordering::Relaxed)).collect(),
        phase_secs: stats.iter().map(|s| s.phase_secs()).collect(),
        store_fallbacks: stats.iter().map(|s| s.store_fallbacks.load(Ordering::Relaxed)).sum(),
        frames_refused,
        elapsed,
        mismatches: co.sm.mismatches.clone(),
        peers,
        weights_objects: co.weights_objects,
        momentum_objects: co.momentum_objects,
    })
}

/// One endpoint per replica on 127.0.0.1, each in the shared peer
/// directory unless the replica is isolated (it knows no one and is known
/// to no one).
fn bind_endpoints(replicas: &[LocalReplica], ctx: &Arc<RunContext>) -> Result<Vec<Arc<Endpoint>>> {
    let dir = PeerDirectory::new();
    let mut eps = Vec::new();
    for rep in replicas {
        let own_dir = if rep.isolated { PeerDirectory::new() } else { dir.clone() };
        let mut tc = TransportConfig::default();
        if rep.isolated {
            tc.connect_timeout = Duration::from_millis(300);
        }
        let id = Identity::generate();
        let ep =
            Arc::new(Endpoint::bind("127.0.0.1:0".parse()?, id, own_dir, ctx.clone(), HostPool::new(1 << 30), tc)?);
        if !rep.isolated {
            dir.insert(ep.peer_id(), Some(ep.local_addr()?));
        }
        eps.push(ep);
    }
    Ok(eps)
}

/// What every replica of the local merge shares.
struct ReplicaShared {
    spec: MergeSpec,
    epoch: u64,
    theta_prev: Arc<Vec<f32>>,
    store: SharedStore,
    ctx: Arc<RunContext>,
    co_tx: mpsc::UnboundedSender<ToCoordinator>,
}

type ReplicaThread = std::thread::JoinHandle<Result<Option<Vec<f32>>>>;

/// One replica: its frames in and out (tasks), and its `Butterfly` on a
/// thread that returns its merged weights (None: planned out or died).
fn spawn_replica(
    rep: LocalReplica,
    ep: Arc<Endpoint>,
    shared: &ReplicaShared,
) -> (mpsc::UnboundedSender<ToReplica>, ReplicaThread, Arc<MergeStats>) {
    let me = ep.peer_id();
    let (tx, mut rx) = mpsc::unbounded_channel::<ToReplica>();
    // Frames in.
    {
        let (ep, tx) = (ep.clone(), tx.clone());
        tokio::spawn(async move {
            while let Some(f) = ep.recv().await {
                if tx.send(ToReplica::Frame(Box::new(f))).is_err() {
                    return;
                }
            }
        });
    }
    // Frames and reports out.
    let (out_tx, mut out_rx) = mpsc::unbounded_channel::<Output>();
    {
        let (ep, co_tx, store) = (ep.clone(), shared.co_tx.clone(), shared.store.clone());
        tokio::spawn(async move {
            while let Some(o) = out_rx.recv().await {
                match o {
                    Output::Frame { to, meta, payload, fallback } => {
                        let _ = deliver(&ep, &store, to, &meta, payload, fallback).await;
                    }
                    // Pipeline frames of a test tool: none in a merge.
                    Output::FabricatedFrame { .. } => {}
                    Output::Report(k) => {
                        let _ = co_tx.send(ToCoordinator::Report(me, k));
                    }
                    Output::Store { key, meta, payload } => {
                        let _ = store.put(&key, ep.frame_bytes(&meta, &payload)).await;
                    }
                    Output::StoreRaw { key, bytes } => {
                        let _ = store.put(&key, bytes.to_vec()).await;
                    }
                }
            }
        });
    }
    let rt = tokio::runtime::Handle::current();
    let mut b = Butterfly::new(me, shared.spec.clone(), shared.store.clone(), rt, shared.ctx.clone());
    b.fault = rep.fault;
    let stats = b.stats.clone();
    let (theta_prev, co_tx, epoch) = (shared.theta_prev.clone(), shared.co_tx.clone(), shared.epoch);
    let thread = std::thread::spawn(move || -> Result<Option<Vec<f32>>> {
        let layout = flat_layout(theta_prev.len());
        b.epoch_started(epoch, 0, &theta_prev);
        let mut out = Vec::new();
        b.contribute(epoch, 0, &layout, &rep.params, rep.work, &mut out)?;
        out.clear(); // UploadDone: the coordinator built the plan already
        while let Some(m) = rx.blocking_recv() {
            let r = match m {
                ToReplica::Plan(p) => {
                    if rep.dies_on_plan {
                        let _ = co_tx.send(ToCoordinator::Died(me));
                        return Ok(None);
                    }
                    b.merging(&p, 0, &layout, &mut out)
                }
                ToReplica::Verdict(v) => b.verdict(v, &mut out),
                ToReplica::Stored(st) => b.stored(st, &mut out),
                ToReplica::Frame(f) => b.frame(*f, &mut out),
                ToReplica::Tick => b.tick(&mut out),
                ToReplica::End => return Ok(None),
            };
            if let Err(e) = r {
                warn!(error = %format!("{e:#}"), "local merge replica");
            }
            for o in out.drain(..) {
                let _ = out_tx.send(o);
            }
            if let Some((_, w)) = b.take_merged() {
                return Ok(Some(w));
            }
        }
        // The merge ended without this replica (planned out): checked by
        // the caller against the plan.
        Ok(None)
    });
    (tx, thread, stats)
}

/// Ticks to every replica, until the merge is over (all are gone).
fn spawn_ticks(txs: Vec<mpsc::UnboundedSender<ToReplica>>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut iv = tokio::time::interval(Duration::from_millis(200));
        loop {
            iv.tick().await;
            // Every replica gets its tick (no short-circuit).
            let delivered = txs.iter().filter(|t| t.send(ToReplica::Tick).is_ok()).count();
            if delivered == 0 {
                return;
            }
        }
    })
}

/// The orchestrator's part of one stage's merge, in process: the
/// `StageMerge`, and what it sends the replicas.
struct Coordinator {
    sm: StageMerge,
    index: BTreeMap<PeerId, usize>,
    to_replica: Vec<mpsc::UnboundedSender<ToReplica>>,
    epoch: u64,
    momentum: Vec<StoredObject>,
    run_id: u64,
    weights_objects: Vec<StoredObject>,
    momentum_objects: Vec<StoredObject>,
}

impl Coordinator {
    fn send_to_participants(&self, m: impl Fn() -> ToReplica) {
        for p in &self.sm.plan.participants {
            let _ = self.to_replica[self.index[&p.peer]].send(m());
        }
    }

    fn send_plan(&self) {
        self.send_to_participants(|| {
            ToReplica::Plan(pb::PhaseChange {
                epoch: self.epoch,
                phase: pb::Phase::Merging as i32,
                aggregator: Vec::new(),
                upload_prefix: String::new(),
                merge_plan: Some(plan_to_pb(&self.sm.plan)),
                weights: Vec::new(),
                momentum: self.momentum.iter().map(StoredObject::to_pb).collect(),
                uploads: Vec::new(),
                weights_from: 0,
            })
        });
    }

    fn apply(&self, outs: Vec<MergeOut>) {
        for o in outs {
            match o {
                MergeOut::Plan => self.send_plan(),
                MergeOut::Equivocated(liar) => warn!(%liar, "a replica equivocated; it is planned out"),
                MergeOut::Flawed(bad) => warn!(%bad, "two owners flagged a replica's contribution; it is planned out"),
                MergeOut::Missing { partition, sender, .. } => {
                    warn!(partition, %sender, "an owner misses a replica's contribution")
                }
                // The local harness turns no audits on.
                MergeOut::Audit { .. } | MergeOut::AuditFlags { .. } | MergeOut::Colluded(_) | MergeOut::Deviant(_) => {
                }
                MergeOut::Verdict(v) => self.send_to_participants(|| {
                    ToReplica::Verdict(pb::SliceVerdict {
                        epoch: self.epoch,
                        stage: 0,
                        partition: v.partition,
                        generation: v.generation,
                        hash: v.hash.to_vec(),
                        writer: v.writer.0.to_vec(),
                    })
                }),
            }
        }
    }

    fn on_message(&mut self, msg: ToCoordinator) {
        let mut outs = Vec::new();
        match msg {
            ToCoordinator::Died(p) => self.sm.drop_participants(&[p], &mut outs),
            ToCoordinator::Report(p, pb::report::Kind::SliceDone(d)) => {
                if let Ok(h) = <[u8; 32]>::try_from(d.hash.as_slice()) {
                    // As the orchestrator does: the headers handed on must
                    // be signed contributions to the partition.
                    let to = PartitionOf::of(&self.sm.plan, self.run_id, d.partition);
                    let contributions: Vec<SignedContribution> = to
                        .iter()
                        .flat_map(|to| d.contributions.iter().filter_map(|c| SignedContribution::check(c, to).ok()))
                        .collect();
                    let flagged =
                        d.flagged.iter().filter_map(|f| <[u8; 32]>::try_from(f.as_slice()).ok().map(PeerId)).collect();
                    let report = SliceReport { hash: h, contributions, flagged };
                    self.sm.slice_done(p, d.partition, d.generation, &report, &mut outs);
                }
            }
            ToCoordinator::Report(p, pb::report::Kind::MergeDone(d)) => {
                if let Ok(h) = <[u8; 32]>::try_from(d.weights_hash.as_slice()) {
                    self.sm.merge_done(p, h);
                }
            }
            ToCoordinator::Report(p, pb::report::Kind::Stored(st)) => self.on_stored(p, st),
            ToCoordinator::Report(..) => {}
        }
        self.apply(outs);
    }

    /// As the orchestrator does: only the partition's writer may announce
    /// its slice; the weights go to the other replicas.
    fn on_stored(&mut self, p: PeerId, st: pb::Stored) {
        let Some(o) = st.object.as_ref().and_then(|o| StoredObject::from_pb(o, Some(p)).ok()) else { return };
        let writer = self.sm.plan.partitions.iter().position(|q| q.offset == o.offset && q.len == o.values);
        if writer.and_then(|k| self.sm.verdicts.get(k)?.as_ref()).is_none_or(|v| v.writer != p) {
            return;
        }
        if o.key.contains("/weights/") {
            self.weights_objects.retain(|w| w.offset != o.offset);
            self.weights_objects.push(o);
            for (q, i) in &self.index {
                if *q != p {
                    let _ = self.to_replica[*i].send(ToReplica::Stored(st.clone()));
                }
            }
        } else {
            self.momentum_objects.retain(|w| w.offset != o.offset);
            self.momentum_objects.push(o);
        }
    }
}
