//! The validator's side of a merge audit, its I/O: it keeps the latest
//! `Command.merge_audit_context`s (`AuditContexts`); on
//! `Command.merge_audit`, with the context it names, it reads the stage's outer momentum and polls the store for every
//! participant's contribution (which the orchestrator asked each of them
//! to store), recomputes the partition
//! (`validation::merge_audit::recompute_partition`) and answers
//! `Validate(MergeAuditResult)`: the hash, or who never stored a
//! contribution of theirs in time.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use iota_core::PeerId;
use iota_core::commitment::Chain;
use iota_dataplane::contribution::{Bound, ContributionWitness, WitnessLimits, check_contribution};
use iota_dataplane::miner::merge::read_parts;
use iota_dataplane::sparse_contribution::{EpochBound, SparseBound, SparseWitness, check_sparse_contribution};
use iota_protocol::client::ControlClient;
use iota_protocol::manifest::from_pb_list;
use iota_protocol::store_keys::contrib_prefix;
use iota_protocol::{MergeSpec, SharedStore, pb, plan_from_pb};
use tracing::{info, warn};

use crate::validation::merge_audit::{AuditFinding, recompute_partition};

/// How long a validator waits for the participants to store their
/// contributions before it names the missing ones.
pub const CONTRIBUTION_WAIT: Duration = Duration::from_secs(10);
/// The wait for one partition's contributions: `CONTRIBUTION_WAIT`, plus
/// the time every participant's slice takes to reach the store at the
/// rate evidence is allowed (`EVIDENCE_UPLOAD_BYTES_PER_S`): an honest
/// sender of a large stage is not named missing for its size.
pub fn contribution_wait(spec: &MergeSpec, plan: &iota_core::merge::MergePlan, partition: u32) -> Duration {
    let len = plan.partitions.get(partition as usize).map_or(0, |p| p.len);
    let slice = spec.contribution_bytes(len).unwrap_or(u64::MAX);
    let bytes = slice.saturating_mul(plan.participants.len() as u64);
    let ms = bytes.saturating_mul(1000) / crate::validation::round::EVIDENCE_UPLOAD_BYTES_PER_S;
    CONTRIBUTION_WAIT + Duration::from_millis(ms.min(3_600_000))
}

/// Participants an audit reads at most (a stage's replicas).
const MAX_AUDIT_PARTICIPANTS: usize = 1024;
/// Between two looks in the store.
const POLL: Duration = Duration::from_millis(200);

/// What every audit of one stage merge's plan shares (a
/// `MergeAuditContext`, its plan parsed).
#[derive(Debug)]
pub struct AuditContext {
    pub plan: iota_core::merge::MergePlan,
    pub momentum: Vec<pb::StoredObject>,
    pub committed: Vec<pb::ParticipantChain>,
    pub starts: Vec<Vec<u8>>,
    /// Sparse runs: the hashes the epoch before may have started from.
    pub starts_before: Vec<Vec<u8>>,
    /// The audited epoch (`seed_start`) or the one before it
    /// (`seed_start_before`, sparse runs) started from the run seed's
    /// weights, whose hash the validator adds itself.
    pub seed_start: bool,
    pub seed_start_before: bool,
}

impl AuditContext {
    /// Whether the seed's weights start an epoch the audit holds a sender
    /// against: the orchestrator says so for the audited epoch or, with
    /// sparse contributions, the one before it.
    pub fn needs_seed(&self) -> bool {
        self.seed_start || self.seed_start_before
    }

    /// The hashes the audited epoch (`before`: the one before) may have
    /// started from, with the seed's (`initial`) where the orchestrator
    /// says it started from the seed (epoch 0, and every epoch after merges
    /// that were all rolled back). An empty list without the flag is an
    /// unknown start, which judges nobody.
    fn starts(&self, before: bool, initial: Option<[u8; 32]>) -> Vec<[u8; 32]> {
        let (list, seeded) = match before {
            true => (&self.starts_before, self.seed_start_before),
            false => (&self.starts, self.seed_start),
        };
        let seed = initial.filter(|_| seeded);
        list.iter().filter_map(|h| h.as_slice().try_into().ok()).chain(seed).collect()
    }

    pub fn from_pb(c: pb::MergeAuditContext) -> Result<AuditContext, String> {
        let plan = plan_from_pb(c.plan.as_ref().ok_or("a context without a plan")?).map_err(|e| e.to_string())?;
        Ok(AuditContext {
            plan,
            momentum: c.momentum,
            committed: c.committed,
            starts: c.starts,
            starts_before: c.starts_before,
            seed_start: c.seed_start,
            seed_start_before: c.seed_start_before,
        })
    }
}

/// Contexts a validator keeps (a few per stage: a plan is replaced when a
/// participant is planned out).
const MAX_AUDIT_CONTEXTS: usize = 64;

/// The latest audit contexts the orchestrator sent, by id (bounded: the
/// oldest goes first).
#[derive(Default)]
pub struct AuditContexts {
    by_id: BTreeMap<Vec<u8>, Arc<Result<AuditContext, String>>>,
    order: VecDeque<Vec<u8>>,
}

impl AuditContexts {
    /// Keeps a context (one whose plan does not parse is kept as its
    /// error: the audits naming it answer with it).
    pub fn insert(&mut self, c: pb::MergeAuditContext) {
        if c.id.len() != 32 || self.by_id.contains_key(&c.id) {
            return;
        }
        let id = c.id.clone();
        if self.order.len() >= MAX_AUDIT_CONTEXTS
            && let Some(old) = self.order.pop_front()
        {
            self.by_id.remove(&old);
        }
        self.by_id.insert(id.clone(), Arc::new(AuditContext::from_pb(c)));
        self.order.push_back(id);
    }

    pub fn get(&self, id: &[u8]) -> Option<Arc<Result<AuditContext, String>>> {
        self.by_id.get(id).cloned()
    }
}

/// Runs one audit and sends its answer; returns the time it computed
/// (reading the momentum and recomputing, not waiting for the store).
/// `context`: the one the audit names, if this validator holds it.
pub async fn audit(
    ma: pb::MergeAudit,
    context: Option<Arc<Result<AuditContext, String>>>,
    spec: MergeSpec,
    run_id: u64,
    store: SharedStore,
    mut client: ControlClient,
    initial: Option<[u8; 32]>,
) -> Duration {
    let mut busy = Duration::ZERO;
    let (epoch, stage, generation) = (ma.epoch, ma.stage, ma.generation);
    let mut unbound = Vec::new();
    let result = match context.as_deref() {
        Some(Ok(ctx)) if (ctx.plan.epoch, ctx.plan.stage) != (epoch, stage) => {
            Err("the audit's context is another merge's".into())
        }
        Some(Ok(ctx)) => {
            let wait = contribution_wait(&spec, &ctx.plan, ma.partition);
            let deadline = Instant::now() + wait;
            let found = recompute(&ma, ctx, &spec, run_id, &store, wait, &mut busy).await;
            if matches!(found, Ok(AuditFinding::Recomputed(..))) && !ctx.committed.is_empty() {
                let witnessed = Witnessed { ma: &ma, ctx, spec: &spec, initial, deadline };
                unbound = witnessed.unbound(&store, &mut busy).await;
            }
            found
        }
        Some(Err(e)) => Err(format!("the audit's plan: {e}")),
        None => Err("an audit whose context never came".into()),
    };
    let mut answer = pb::MergeAuditResult { epoch, stage, partition: ma.partition, generation, ..Default::default() };
    match result {
        Ok(AuditFinding::Recomputed(h, flagged)) => {
            info!(epoch, stage, partition = ma.partition, flagged = flagged.len(), "merge partition audited");
            answer.hash = h.to_vec();
            answer.flagged = flagged.iter().map(|p| p.0.to_vec()).collect();
            answer.unbound = unbound.iter().map(|p| p.0.to_vec()).collect();
        }
        Ok(AuditFinding::Contradicting(headers)) => {
            warn!(
                epoch,
                stage,
                partition = ma.partition,
                senders = headers.len(),
                "stored merge contributions are not the ones their owners reduced"
            );
            answer.reason = format!("{} stored contribution(s) differ from what the owners reduced", headers.len());
            answer.contradicting = headers;
        }
        Ok(AuditFinding::Missing(ps)) => {
            warn!(epoch, stage, partition = ma.partition, missing = ps.len(), "merge contributions never stored");
            answer.missing = ps.iter().map(|p| p.0.to_vec()).collect();
            answer.reason = format!("{} contribution(s) not stored in time", ps.len());
        }
        Err(why) => {
            warn!(epoch, stage, partition = ma.partition, why = %why, "merge audit not possible");
            answer.reason = why.chars().filter(|c| (' '..='~').contains(c)).take(256).collect();
        }
    }
    if let Err(e) = client.validate(pb::validator_report::Kind::MergeAudit(answer)).await {
        warn!(error = %e, "sending a merge audit failed");
    }
    busy
}

/// Most items of a weights chain a witness may carry.
const MAX_WITNESS_STEPS: u64 = 1 << 20;

/// What the participants' witnesses of an audited partition are held
/// against (`iota_checks::contribution`).
struct Witnessed<'a> {
    ma: &'a pb::MergeAudit,
    ctx: &'a AuditContext,
    spec: &'a MergeSpec,
    /// The seed's weights hash, where the audited epoch or the one before
    /// started from them (`AuditContext::needs_seed`).
    initial: Option<[u8; 32]>,
    deadline: Instant,
}

impl Witnessed<'_> {
    /// The participants whose stored contribution is not the slice of
    /// their committed weights' pseudo-gradient, or whose witness never
    /// came by the deadline (a participant stores it with its frame).
    async fn unbound(&self, store: &SharedStore, busy: &mut Duration) -> Vec<PeerId> {
        let k = self.ma.partition;
        let plan = &self.ctx.plan;
        let Some(part) = plan.partitions.get(k as usize) else { return Vec::new() };
        let (starts, starts_before) = (self.ctx.starts(false, self.initial), self.ctx.starts(true, self.initial));
        if starts.is_empty() {
            // No start recorded to hold them against: nobody is judged.
            return Vec::new();
        }
        let reported: BTreeMap<PeerId, [u8; 32]> = self
            .ma
            .reported
            .iter()
            .filter_map(|r| {
                Some((PeerId(r.sender.as_slice().try_into().ok()?), r.payload_hash.as_slice().try_into().ok()?))
            })
            .collect();
        let limits = WitnessLimits { weights: plan.params, partition: part.len, max_steps: MAX_WITNESS_STEPS };
        let prefix = format!("{}{k:06}/", contrib_prefix(plan.epoch, plan.stage));
        let mut unbound = Vec::new();
        for c in self.ctx.committed.iter().take(MAX_AUDIT_PARTICIPANTS) {
            let Ok(peer) = c.peer.as_slice().try_into().map(PeerId) else { continue };
            let (Some(chain), Some(payload_hash)) = (c.weights.as_ref(), reported.get(&peer)) else { continue };
            let Ok(head) = chain.head.as_slice().try_into() else { continue };
            let committed = iota_core::commitment::Chain { len: chain.len, head };
            let key = format!("{prefix}{}.witness", peer.to_hex());
            let bytes = loop {
                match store.get(&key).await {
                    Ok(b) => break Some(b),
                    Err(_) if Instant::now() < self.deadline => tokio::time::sleep(POLL).await,
                    Err(_) => break None,
                }
            };
            let t = Instant::now();
            let range = part.offset..part.offset.saturating_add(part.len);
            let verdict = match bytes {
                None => Err("no witness stored".to_string()),
                Some(b) if self.spec.sparse_density > 0.0 => {
                    let held = Held { committed, chain: c, starts: &starts, starts_before: &starts_before };
                    held.check_sparse(&b, limits, self.spec, range, *payload_hash)
                }
                Some(b) => {
                    let bound = Bound {
                        committed: &committed,
                        starts: &starts,
                        codec: self.spec.codec,
                        range,
                        payload_hash: *payload_hash,
                    };
                    ContributionWitness::decode(&b, limits).and_then(|w| check_contribution(&w, &bound))
                }
            };
            *busy += t.elapsed();
            if let Err(why) = verdict {
                warn!(epoch = plan.epoch, stage = plan.stage, partition = k, %peer, why, "merge contribution not bound to its weights");
                unbound.push(peer);
            }
        }
        unbound
    }
}

/// One sparse sender's commitments as the audit context gives them.
struct Held<'a> {
    committed: iota_core::commitment::Chain,
    chain: &'a pb::ParticipantChain,
    starts: &'a [[u8; 32]],
    starts_before: &'a [[u8; 32]],
}

impl Held<'_> {
    /// `iota_checks::sparse_contribution`: the contribution against the
    /// committed weights and backlog, the backlog against the epoch before.
    fn check_sparse(
        &self,
        witness: &[u8],
        limits: WitnessLimits,
        spec: &MergeSpec,
        range: std::ops::Range<u64>,
        payload_hash: [u8; 32],
    ) -> Result<(), String> {
        let hash = |b: &[u8]| <[u8; 32]>::try_from(b).map_err(|_| "no backlog hash committed".to_string());
        let backlog = hash(&self.chain.backlog)?;
        // The epoch before, where it committed a chain and a backlog then.
        let before_chain = self.chain.before.as_deref().and_then(|b| {
            let w = b.weights.as_ref()?;
            Some((Chain { len: w.len, head: w.head.as_slice().try_into().ok()? }, hash(&b.backlog).ok()?))
        });
        let before = before_chain.as_ref().map(|(committed, backlog)| EpochBound {
            committed,
            starts: self.starts_before,
            backlog: *backlog,
        });
        let (_, kept) = spec.contribution_shape(range.end.saturating_sub(range.start));
        let bound = SparseBound {
            now: EpochBound { committed: &self.committed, starts: self.starts, backlog },
            before,
            range,
            payload_hash,
            kept,
            decay: spec.sparse_decay,
        };
        SparseWitness::decode(witness, limits).and_then(|w| check_sparse_contribution(&w, &bound))
    }
}

/// A read error that says the object is not there for this reader (never
/// stored, or not granted: S3 answers 403 for a missing key to a reader
/// without the right to list), not that the store failed.
fn not_there(e: &std::io::Error) -> bool {
    matches!(e.kind(), std::io::ErrorKind::NotFound | std::io::ErrorKind::PermissionDenied)
}

async fn recompute(
    ma: &pb::MergeAudit,
    ctx: &AuditContext,
    spec: &MergeSpec,
    run_id: u64,
    store: &SharedStore,
    wait: Duration,
    busy: &mut Duration,
) -> Result<AuditFinding, String> {
    let t0 = Instant::now();
    let (k, plan) = (ma.partition, &ctx.plan);
    let part = plan.partitions.get(k as usize).ok_or_else(|| format!("partition {k} is not in the plan"))?;
    if part.len > plan.params || plan.participants.len() > MAX_AUDIT_PARTICIPANTS {
        return Err("the audited partition is out of bounds".into());
    }
    let momentum = if plan.epoch == 0 || spec.outer.momentum == 0.0 {
        vec![0.0f32; part.len as usize]
    } else {
        let objects = from_pb_list(&ctx.momentum).map_err(|e| format!("momentum objects: {e}"))?;
        let r = read_parts(store, &objects, part.offset, part.len).await.map_err(|e| format!("momentum: {e}"))?;
        if !r.bad.is_empty() {
            return Err(format!("{} momentum part(s) do not match their announcement", r.bad.len()));
        }
        // Owners use zeros where the momentum is missing; so does the audit.
        r.values
    };
    *busy += t0.elapsed();
    // What the owners reported reducing (malformed entries are skipped:
    // without them the audit recomputes from what is stored, as before).
    let reported: BTreeMap<PeerId, [u8; 32]> = ma
        .reported
        .iter()
        .take(MAX_AUDIT_PARTICIPANTS)
        .filter_map(|r| {
            Some((PeerId(r.sender.as_slice().try_into().ok()?), r.payload_hash.as_slice().try_into().ok()?))
        })
        .collect();
    let prefix = format!("{}{k:06}/", contrib_prefix(plan.epoch, plan.stage));
    let deadline = Instant::now() + wait;
    let mut frames: BTreeMap<PeerId, Vec<u8>> = BTreeMap::new();
    // Participants whose frame the store failed to read (an outage, not a
    // missing object): at the deadline the audit is not possible rather
    // than their contribution withheld.
    let mut unreadable: BTreeMap<PeerId, String> = BTreeMap::new();
    loop {
        for p in &plan.participants {
            if frames.contains_key(&p.peer) {
                continue;
            }
            match store.get(&format!("{prefix}{}.frame", p.peer.to_hex())).await {
                Ok(bytes) => {
                    unreadable.remove(&p.peer);
                    frames.insert(p.peer, bytes);
                }
                Err(e) if not_there(&e) => {
                    unreadable.remove(&p.peer);
                }
                Err(e) => {
                    unreadable.insert(p.peer, e.to_string());
                }
            }
        }
        let mut m = momentum.clone(); // the reduce updates it in place
        let t = Instant::now();
        let found = recompute_partition(spec, run_id, plan, k, &frames, &reported, &mut m)?;
        *busy += t.elapsed();
        match found {
            AuditFinding::Missing(ps) if Instant::now() < deadline => {
                // A frame that is there but not the sender's may yet be
                // replaced: look again.
                for p in ps {
                    frames.remove(&p);
                }
                tokio::time::sleep(POLL).await;
            }
            AuditFinding::Missing(ps) => {
                if let Some((p, why)) = ps.iter().find_map(|p| unreadable.get(p).map(|w| (p, w))) {
                    return Err(format!("the store failed reading {p}'s contribution: {why}"));
                }
                return Ok(AuditFinding::Missing(ps));
            }
            found => return Ok(found),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io;
    use std::sync::Arc;

    use iota_core::Identity;
    use iota_core::merge::{MergePlan, Participant};
    use iota_protocol::ObjectStore;
    use iota_protocol::object_store::StoreFuture;

    use super::*;

    /// A store that answers every read of a participant's frame with that
    /// participant's error kind (NotFound for those not listed).
    struct FailingStore(BTreeMap<String, io::ErrorKind>);

    impl ObjectStore for FailingStore {
        fn put<'a>(&'a self, _: &'a str, _: Vec<u8>) -> StoreFuture<'a, ()> {
            Box::pin(std::future::ready(Ok(())))
        }
        fn get<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Vec<u8>> {
            let kind =
                self.0.iter().find(|(hex, _)| key.contains(hex.as_str())).map_or(io::ErrorKind::NotFound, |k| *k.1);
            Box::pin(std::future::ready(Err(io::Error::new(kind, "test store"))))
        }
        fn list<'a>(&'a self, _: &'a str) -> StoreFuture<'a, Vec<String>> {
            Box::pin(std::future::ready(Ok(Vec::new())))
        }
    }

    /// The seed's weights start an epoch where the orchestrator says so
    /// (epoch 0, and after merges that were all rolled back), for the
    /// audited epoch and the one before alike; an empty list without its
    /// flag is an unknown start and judges nobody, in any epoch.
    #[test]
    fn the_seed_starts_an_epoch_only_where_the_orchestrator_says_so() {
        let ctx = |epoch, starts: Vec<Vec<u8>>, starts_before: Vec<Vec<u8>>, seeds: (bool, bool)| AuditContext {
            plan: MergePlan::new(epoch, 0, vec![Participant { peer: PeerId([1; 32]), work: 1 }], 100, 7, 1),
            momentum: Vec::new(),
            committed: Vec::new(),
            starts,
            starts_before,
            seed_start: seeds.0,
            seed_start_before: seeds.1,
        };
        let seed = Some([5u8; 32]);
        let first = ctx(0, Vec::new(), Vec::new(), (true, false));
        assert!(first.needs_seed());
        assert_eq!(first.starts(false, seed), vec![[5; 32]]);
        assert!(first.starts(true, seed).is_empty());
        // Epoch 1 after epoch 0's merge was rolled back: both started from the seed.
        let rolled = ctx(1, Vec::new(), Vec::new(), (true, true));
        assert_eq!(rolled.starts(false, seed), vec![[5; 32]]);
        assert_eq!(rolled.starts(true, seed), vec![[5; 32]]);
        // Starts the orchestrator could not name (no merge reported): unknown, not the seed.
        let unknown = ctx(4, Vec::new(), Vec::new(), (false, false));
        assert!(!unknown.needs_seed());
        assert!(unknown.starts(false, seed).is_empty(), "an unknown start judges nobody");
        assert!(unknown.starts(true, seed).is_empty(), "an unknown start judges nobody");
        // Once merges are kept, the recorded starts stand alone.
        let kept = ctx(3, vec![vec![7; 32]], vec![vec![6; 32]], (false, false));
        assert!(!kept.needs_seed());
        assert_eq!(kept.starts(true, seed), vec![[6; 32]]);
        assert_eq!(kept.starts(false, seed), vec![[7; 32]]);
        // A flag without the seed's hash at hand adds nothing.
        assert!(rolled.starts(false, None).is_empty());
    }

    /// A contribution the store could not read (an outage) is not one its
    /// sender withheld: the audit is not possible, and names nobody.
    #[tokio::test]
    async fn a_store_outage_is_not_a_withheld_contribution() {
        let ids: Vec<PeerId> = (0..3).map(|i| Identity::from_seed([60 + i; 32]).peer_id()).collect();
        let ps = ids.iter().map(|p| Participant { peer: *p, work: 1 }).collect();
        let plan = MergePlan::new(0, 1, ps, 3000, 7, 2);
        let ma = pb::MergeAudit { partition: 1, ..Default::default() };
        let ctx = Arc::new(AuditContext {
            plan,
            momentum: Vec::new(),
            committed: Vec::new(),
            starts: Vec::new(),
            starts_before: Vec::new(),
            seed_start: false,
            seed_start_before: false,
        });
        let spec = MergeSpec::default();
        let run = |failures: Vec<(usize, io::ErrorKind)>| {
            let store: SharedStore =
                Arc::new(FailingStore(failures.into_iter().map(|(i, k)| (ids[i].to_hex(), k)).collect()));
            let (ma, ctx, spec) = (ma.clone(), ctx.clone(), spec.clone());
            async move {
                let mut busy = Duration::ZERO;
                recompute(&ma, &ctx, &spec, 7, &store, Duration::ZERO, &mut busy).await
            }
        };
        // Never stored, or not readable by this validator: withheld.
        let all = run(vec![(1, io::ErrorKind::PermissionDenied)]).await;
        assert!(matches!(&all, Ok(AuditFinding::Missing(m)) if m.len() == 3), "{all:?}");
        // The store failed on one of them: no finding at all.
        for kind in [io::ErrorKind::TimedOut, io::ErrorKind::Other, io::ErrorKind::ConnectionReset] {
            let r = run(vec![(2, kind)]).await;
            assert!(matches!(&r, Err(why) if why.contains("store failed")), "{kind:?}: {r:?}");
        }
    }
}

/// The wait for stored contributions grows with what must be stored.
#[test]
fn the_wait_for_contributions_follows_the_partition_size() {
    use iota_core::merge::{MergePlan, Participant};
    let ps = |n: u8| (0..n).map(|i| Participant { peer: PeerId([i + 1; 32]), work: 1 }).collect::<Vec<_>>();
    let spec = MergeSpec { codec: iota_core::WireCodec::F32, ..MergeSpec::default() };
    let small = MergePlan::new(0, 0, ps(2), 4096, 1, 1);
    assert!(contribution_wait(&spec, &small, 0) < CONTRIBUTION_WAIT + Duration::from_millis(10));
    // Two slices of 12.5 M f32 values (50 MB each) at 12.5 MB/s: 8 s more.
    let big = MergePlan::new(0, 0, ps(2), 25_000_000, 1, 1);
    let len = big.partitions[0].len;
    let want = Duration::from_millis(2 * len.div_ceil(256) * 256 * 4 * 1000 / 12_500_000);
    assert_eq!(contribution_wait(&spec, &big, 0), CONTRIBUTION_WAIT + want);
    assert!(want >= Duration::from_secs(7), "{want:?}");
    assert_eq!(contribution_wait(&spec, &big, 99), CONTRIBUTION_WAIT, "no such partition: no allowance");
}
