//! The body of every fuzz target, as plain functions: `fuzz/fuzz_targets/*`
//! call them under libFuzzer, and the integration test `fuzz_replay` runs
//! them over every committed seed and past crash input (`fuzz/seeds/`) on
//! every CI run. Each must never panic on any input; the assertions inside
//! are the properties the fuzzer hunts for violations of.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Mutex, OnceLock};
use std::task::{Context, Poll, Waker};

use iota_core::{Identity, PeerId, WireCodec};
use iota_dataplane::frame::{FrameLimits, RunContext, decode_frame, parse_header};
use iota_dataplane::miner::merge::local::flat_layout;
use iota_dataplane::miner::merge::{load_weights, read_parts};
use iota_model::checkpoint::{parse_safetensors, stage_params};
use iota_protocol::auth::{Audience, AuthPolicy, Verifier, open_server, signing_bytes};
use iota_protocol::client::{HEARTBEAT, REGISTER, REPORT, SUBSCRIBE, VALIDATE};
use iota_protocol::object_store::StoreFuture;
use iota_protocol::{MergeMethod, MergeSpec, ObjectStore, SharedStore, StoredObject, fields, pb};
use prost::Message;

use crate::fuzz_input::Bytes;

/// A target's body.
pub type Body = fn(&[u8]);

/// Every target by name (the seed folders are named after them).
pub const TARGETS: &[(&str, Body)] = &[
    ("frame_decode", frame_decode),
    ("codec_decode", codec_decode),
    ("control_request", control_request),
    ("store_objects", store_objects),
    ("safetensors", safetensors),
    ("orchestrator_events", orchestrator_events),
    ("signed_frame", signed_frame),
    ("evidence_bundle", evidence_bundle),
    ("run_config", crate::fuzz_config::run_config),
];

/// Frame decoding on arbitrary bytes: an accepted frame has a valid
/// signature and a payload of the promised length.
pub fn frame_decode(data: &[u8]) {
    static CTX: OnceLock<RunContext> = OnceLock::new();
    let ctx = CTX.get_or_init(|| {
        let c = RunContext::new(7, FrameLimits { max_payload: 1 << 20, max_dim: 1 << 16 });
        c.set_epoch_window(0, 3);
        c
    });
    let peer = Identity::from_seed([1; 32]).peer_id();
    if let Ok((h, payload)) = decode_frame(data, ctx, peer) {
        assert_eq!(payload.len() as u64, h.payload_len);
        assert!(h.verify_signature());
    }
    let _ = parse_header(data);
}

/// Wire codec decoding: accepted tensors have rows x cols finite values
/// (codec 4, the merge's sparse rows: `fuzz_sparse`).
pub fn codec_decode(data: &[u8]) {
    let mut b = Bytes(data);
    let (codec, rows, cols) = (b.u8(), b.u16() as usize, b.u16() as usize);
    if codec % 5 == 4 {
        // The merge's sparse rows: `rows` values, `cols` kept a block.
        return crate::fuzz_sparse::sparse_rows(rows, cols, b.0);
    }
    let Ok(codec) = WireCodec::from_id(codec % 4) else { return };
    if let Ok(v) = iota_model::codec::decode(codec, rows, cols, b.0) {
        assert_eq!(v.len(), rows * cols);
        assert!(v.iter().all(|x| x.is_finite()));
    }
    // The same bytes as a merge slice from a peer (decoded block by block
    // in parallel into place, the tail through a padded block).
    let len = (rows * cols) as u64;
    if let Ok(v) = iota_dataplane::miner::merge::decode_slice(codec, len, b.0) {
        assert_eq!(v.len() as u64, len);
        assert!(v.iter().all(|x| x.is_finite()));
    }
    reduce_as_the_reference(codec, len, b.0);
}

/// The bytes as two peers' contributions to a merge of `len` values (the
/// first two slices' worth; the first byte picks an outer lr that can
/// overflow): the streamed reduce an owner runs (the bf16 pair loop
/// among them) publishes the decode-first reference's bytes, or both
/// refuse.
fn reduce_as_the_reference(codec: WireCodec, len: u64, data: &[u8]) {
    use iota_core::merge::{BLOCK, OuterOpt};
    use iota_dataplane::slices::{reduce_partition_decoded, reduce_partition_published, update_hash};
    let Some(size) = codec.payload_bytes(len.div_ceil(BLOCK) as usize, BLOCK as usize) else { return };
    if len == 0 || len > 1 << 16 || data.len() < 2 * size {
        return;
    }
    let (a, rest) = data.split_at(size);
    let payloads = [Some(a), Some(&rest[..size])];
    let lr = if data[0] & 1 == 0 { 0.7 } else { 1.5 };
    let spec = MergeSpec { codec, outer: OuterOpt { lr, momentum: 0.0 }, ..MergeSpec::default() };
    let weights = [1.0, 3.0];
    let (mut m_ref, mut m_pub) = (vec![0.0f32; len as usize], vec![0.0f32; len as usize]);
    let want = reduce_partition_decoded(&spec, 1, len, &payloads, &weights, &mut m_ref);
    match (update_hash(codec, &want.update), reduce_partition_published(&spec, 1, len, &payloads, &weights, &mut m_pub))
    {
        (Ok((payload, hash)), Ok(p)) => {
            assert_eq!((&p.payload[..], p.hash), (&payload[..], hash), "{codec:?} {len}: published");
            assert_eq!((p.flagged, p.stats), (want.flagged, want.stats), "{codec:?} {len}");
        }
        (Err(_), Err(_)) => {}
        (a, b) => {
            panic!("{codec:?} {len}: the reference {:?}, the streamed reduce {:?}", a.map(|x| x.1), b.map(|x| x.hash))
        }
    }
}

/// The orchestrator's request path: a hostile envelope; the bytes as the
/// body of a correctly signed request (past the signature) through every
/// field rule; a client opening them as a server message.
pub fn control_request(data: &[u8]) {
    const NOW: u64 = 1_700_000_000_000;
    let Some((&sel, rest)) = data.split_first() else { return };
    let orch = Identity::from_seed([2; 32]);
    let aud = Audience { run_id: 7, orchestrator: orch.peer_id() };
    let v = Verifier::new(AuthPolicy::default(), aud, 0);
    if let Ok(s) = pb::Signed::decode(rest) {
        let _ = v.verify::<pb::RegisterRequest>(REGISTER, &s, NOW);
        let _ = v.verify::<pb::Report>(REPORT, &s, NOW);
    }
    let who = signer();
    let method = [REGISTER, HEARTBEAT, REPORT, VALIDATE][sel as usize % 4];
    // The signed envelope's own fields from the input too: the timestamp
    // (anywhere around the server's clock, or anything), the nonce (any
    // length), then the body.
    let mut b = Bytes(rest);
    let ts = match b.u8() % 4 {
        0 => NOW,
        1 => NOW.wrapping_add(b.u16() as u64 * 1000),
        2 => NOW.wrapping_sub(b.u16() as u64 * 1000),
        _ => b.u64(),
    };
    let nonce_len = if b.u8() % 8 == 0 { b.u8() as usize % 40 } else { 16 };
    let nonce = b.take(nonce_len).to_vec();
    let body = b.0;
    let sig = who.sign(&signing_bytes(&aud, method, ts, &nonce, body));
    let env = pb::Signed {
        peer_id: who.peer_id().0.to_vec(),
        timestamp_ms: ts,
        nonce: nonce.clone(),
        body: body.to_vec(),
        signature: sig.to_vec(),
    };
    // A second delivery of the same envelope is a replay.
    if v.verify::<pb::HeartbeatRequest>(method, &env, NOW).is_ok() && method == HEARTBEAT {
        assert!(v.verify::<pb::HeartbeatRequest>(method, &env, NOW).is_err(), "a replayed envelope was accepted");
    }
    let v = Verifier::new(AuthPolicy::default(), aud, 0);
    match sel % 4 {
        0 => {
            if let Ok((_, b)) = v.verify::<pb::RegisterRequest>(method, &env, NOW) {
                let _ = fields::register(&b);
            }
        }
        1 => {
            if let Ok((_, b)) = v.verify::<pb::HeartbeatRequest>(method, &env, NOW) {
                let _ = fields::heartbeat(&b);
            }
        }
        3 => {
            // What the service takes from a validator's report that passed
            // the rules: 32-byte miner ids, bounded asks.
            if let Ok((_, b)) = v.verify::<pb::ValidatorReport>(method, &env, NOW)
                && fields::validator_report(&b).is_ok()
            {
                match b.kind {
                    Some(pb::validator_report::Kind::Ask(a)) => {
                        assert!(a.miner.len() == 32 && (1..=fields::MAX_EVIDENCE_ITEMS).contains(&a.items.len()))
                    }
                    Some(pb::validator_report::Kind::Verdict(v)) => {
                        assert!(v.miner.len() == 32 && v.reason.len() <= fields::MAX_REASON_LEN);
                        assert!(v.evidence_hash.is_empty() || v.evidence_hash.len() == 32);
                    }
                    Some(pb::validator_report::Kind::Done(_)) => {}
                    // The service maps each stage's hash to 32 bytes.
                    Some(pb::validator_report::Kind::MergeVote(v)) => {
                        assert!(v.reason.len() <= fields::MAX_REASON_LEN);
                        assert!(v.merged.len() <= fields::MAX_VOTE_STAGES);
                        assert!(v.merged.iter().all(|st| st.weights_hash.len() == 32));
                    }
                    // What the service maps to peer ids and a hash.
                    Some(pb::validator_report::Kind::MergeAudit(a)) => {
                        assert!(a.hash.is_empty() || a.hash.len() == 32);
                        for ids in [&a.missing, &a.flagged] {
                            assert!(ids.len() <= fields::MAX_AUDIT_MISSING && ids.iter().all(|m| m.len() == 32));
                        }
                    }
                    None => panic!("an empty validator report passed the rules"),
                }
            }
        }
        _ => {
            if let Ok((peer, b)) = v.verify::<pb::Report>(method, &env, NOW)
                && fields::report(&b).is_ok()
                && let Some(pb::report::Kind::Stored(st)) = &b.kind
            {
                // What the service makes of an announcement that passed.
                let o = StoredObject::from_pb(st.object.as_ref().unwrap(), Some(peer));
                assert!(o.is_ok_and(|o| o.values == 0 || o.size == 4 * o.values));
            }
        }
    }
    if let Ok(m) = pb::ServerSigned::decode(rest) {
        let _ = open_server::<pb::Command>(&aud, &who.peer_id(), SUBSCRIBE, &nonce, m.seq, &m);
    }
}

fn signer() -> &'static Identity {
    static ID: OnceLock<Identity> = OnceLock::new();
    ID.get_or_init(|| Identity::from_seed([3; 32]))
}

/// An object store in memory whose operations complete at once.
#[derive(Default)]
struct MemStore(Mutex<HashMap<String, Vec<u8>>>);

impl ObjectStore for MemStore {
    fn put<'a>(&'a self, key: &'a str, data: Vec<u8>) -> StoreFuture<'a, ()> {
        self.0.lock().unwrap().insert(key.to_string(), data);
        Box::pin(std::future::ready(Ok(())))
    }
    fn get<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Vec<u8>> {
        let r = self.0.lock().unwrap().get(key).cloned().ok_or_else(|| std::io::ErrorKind::NotFound.into());
        Box::pin(std::future::ready(r))
    }
    fn list<'a>(&'a self, prefix: &'a str) -> StoreFuture<'a, Vec<String>> {
        let mut keys: Vec<String> = self.0.lock().unwrap().keys().filter(|k| k.starts_with(prefix)).cloned().collect();
        keys.sort();
        Box::pin(std::future::ready(Ok(keys)))
    }
}

/// Runs a future over `MemStore` (ready at the first poll).
fn at_once<F: Future>(f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    match f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(v) => v,
        Poll::Pending => unreachable!("MemStore completes at once"),
    }
}

/// Store objects and their announcements, both hostile: up to 8 objects
/// with fuzzer-chosen keys, bytes and announced fields (size, hash right or
/// wrong, offset, values), through `StoredObject::from_pb`, then
/// `read_parts` over a fuzzer-chosen range and `load_weights` of a small
/// stage. A value is only ever taken from a part whose bytes match its
/// announcement. What is left is a contribution's witness
/// (`contribution_witnesses`).
pub fn store_objects(data: &[u8]) {
    let mut b = Bytes(data);
    let mem = std::sync::Arc::new(MemStore::default());
    let store: SharedStore = mem.clone();
    let writer = PeerId([4; 32]);
    let mut announced = Vec::new();
    for i in 0..(b.u8() % 9) {
        let n = b.u8() as usize;
        let bytes = b.take(n).to_vec();
        let key = format!("epoch-000000/stage-000/weights/{i}-{}.f32", b.u8());
        let honest = b.u8();
        let o = pb::StoredObject {
            key: key.clone(),
            size: if honest & 1 == 0 { bytes.len() as u64 } else { b.u64() },
            hash: if honest & 2 == 0 { blake3::hash(&bytes).as_bytes().to_vec() } else { b.take(32).to_vec() },
            offset: if honest & 4 == 0 { b.u16() as u64 } else { b.u64() },
            values: if honest & 8 == 0 { bytes.len() as u64 / 4 } else { b.u64() },
            writer: Vec::new(),
            work: 0,
        };
        at_once(store.put(&key, bytes)).unwrap();
        if let Ok(o) = StoredObject::from_pb(&o, Some(writer)) {
            assert!(o.values == 0 || o.size == 4 * o.values);
            announced.push(o);
        }
    }
    let (offset, len) = (b.u16() as u64, b.u16() as u64 % 4096);
    if let Ok(r) = at_once(read_parts(&store, &announced, offset, len)) {
        assert!(r.covered <= len);
        assert_eq!(r.values.len() as u64, len);
        assert!(r.values.iter().all(|v| v.is_finite()));
        for bad in &r.bad {
            assert!(announced.contains(&bad.object));
        }
    }
    let layout = flat_layout(1 + b.u8() as usize);
    let (got, bad) = at_once(load_weights(&store, &announced, &layout));
    if let Ok(w) = got {
        assert_eq!(w.len(), layout.total());
        assert!(w.iter().all(|v| v.is_finite()));
    }
    assert!(bad.iter().all(|b| announced.contains(&b.object)));
    let _ = mem;
    contribution_witnesses(b.0);
}

/// The rest of a `store_objects` input as a merge contribution's stored
/// witness (`.witness`), dense (`IOTACWT1`) or sparse (`IOTASWT1`), of a
/// small stage, held against commitments the fuzzer picks: refused or
/// judged, never a panic.
fn contribution_witnesses(data: &[u8]) {
    use iota_core::commitment::Chain;
    use iota_dataplane::contribution::{Bound, ContributionWitness, WitnessLimits, check_contribution};
    use iota_dataplane::sparse_contribution::{EpochBound, SparseBound, SparseWitness, check_sparse_contribution};
    let mut b = Bytes(data);
    let weights = 1 + u64::from(b.u16());
    let start = u64::from(b.u16()) % weights;
    let range = start..(start + 1 + u64::from(b.u16())).min(weights);
    let limits = WitnessLimits { weights, partition: range.end - range.start, max_steps: 4 };
    let pick = |b: &mut Bytes| -> [u8; 32] { b.take(32).try_into().unwrap_or([0; 32]) };
    let committed = Chain { len: u64::from(b.u8()), head: pick(&mut b) };
    let starts = [pick(&mut b)];
    let (backlog, payload_hash) = (pick(&mut b), pick(&mut b));
    // A run's density keeps 1 to SPARSE_BLOCK values a block.
    let kept = 1 + usize::from(b.u16()) % iota_core::codec::SPARSE_BLOCK;
    let decay = f32::from(b.u8()) / 128.0;
    let dense = b.u8() % 2 == 0;
    let rest = b.take(usize::MAX);
    if dense {
        if let Ok(w) = ContributionWitness::decode(rest, limits) {
            let bound = Bound { committed: &committed, starts: &starts, codec: WireCodec::Bf16, range, payload_hash };
            let _ = check_contribution(&w, &bound);
        }
    } else if let Ok(w) = SparseWitness::decode(rest, limits) {
        let now = EpochBound { committed: &committed, starts: &starts, backlog };
        let before = Some(EpochBound { committed: &committed, starts: &starts, backlog });
        let _ = check_sparse_contribution(&w, &SparseBound { now, before, range, payload_hash, kept, decay });
    }
}

/// Safetensors parsing of arbitrary bytes, alone and into a stage layout.
pub fn safetensors(data: &[u8]) {
    let _ = parse_safetensors(data);
    let layout = flat_layout(16);
    if let Ok(p) = stage_params(&layout, data) {
        assert_eq!(p.len(), 16);
    }
}

pub use crate::fuzz_orchestrator::{orchestrator_events, orchestrator_run};

/// A frame from a participant of a merge, signed with its real key, with
/// header fields and payload the fuzzer chooses (each field either the one
/// the merge plan expects or a raw value), through `decode_frame` and then
/// its consumer: a butterfly replica mid-merge (`Merge::frame`, then a
/// verdict for whatever it holds) for `WeightSlice` frames, the CPU
/// backend's `decode_wire` for activations and gradients. Whatever a
/// replica accepts, its merged weights stay finite.
pub fn signed_frame(data: &[u8]) {
    signed_frame_run(data);
}

/// [`signed_frame`], returning whether the replica finished its merge (so a
/// test can see that the seeds reach the end of the consumer).
pub fn signed_frame_run(data: &[u8]) -> bool {
    use iota_core::merge::{MergePlan, Participant};
    use iota_core::wire::{Direction, FrameHeader, MAX_DIMS, PROTOCOL_VERSION};
    use iota_dataplane::frame::prefix_bytes;
    use iota_dataplane::miner::merge::{Butterfly, Merge};
    use iota_dataplane::pool::{BufferPool, HostPool};
    use iota_dataplane::transport::ReceivedFrame;
    use iota_model::{Backend, CpuBackend};

    const PARAMS: u64 = 600;
    let mut b = Bytes(data);
    let sender = signer();
    let me = PeerId([0x77; 32]);
    let plan = MergePlan::new(
        0,
        0,
        vec![Participant { peer: sender.peer_id(), work: 3 }, Participant { peer: me, work: 5 }],
        PARAMS,
        7,
        1 + b.u8() as u32 % 2,
    );
    let raw = b.u16();
    // Bit i set: field i takes a raw fuzzer value instead of the plan's.
    let raw_bit = |bit: u32| raw & (1 << bit) != 0;
    let k = b.u8() as usize % plan.partitions.len();
    let part = plan.partitions[k].clone();
    let blocks = part.len.div_ceil(256);
    let direction = match b.u8() % 8 {
        0 => Direction::Activation,
        1 => Direction::ActivationGrad,
        2 => Direction::Control,
        _ => Direction::WeightSlice,
    };
    let codec = if raw_bit(0) { b.u8() } else { WireCodec::F32.id() };
    let ndim = if raw_bit(1) { b.u8() % 6 } else { 2 };
    let mut shape = [0u32; MAX_DIMS];
    shape[0] = blocks as u32;
    shape[1] = 256;
    if raw_bit(2) {
        for d in &mut shape {
            *d = b.u16() as u32;
        }
    }
    let kind = if raw_bit(3) { b.u8() as u32 } else { (b.u8() % 2) as u32 };
    let (first_sample, shard) = if raw_bit(4) { (b.u64(), b.u8() as u32) } else { (part.offset, k as u32) };
    let attempt = if raw_bit(5) { b.u8() as u32 } else { part.generation };
    let epoch = if raw_bit(6) { b.u8() as u32 % 4 } else { 0 };
    let stage = if raw_bit(7) { b.u8() as u16 } else { 0 };
    let want_len = (blocks * 256 * 4) as usize;
    let mut payload = b.take(b.0.len()).to_vec();
    if !raw_bit(8) {
        // The length the plan expects, the fuzzer's bytes first.
        payload.resize(want_len, 0);
    }
    let mut h = FrameHeader {
        version: PROTOCOL_VERSION,
        direction,
        codec,
        ndim,
        stage,
        run_id: 7,
        epoch,
        shard,
        first_sample,
        samples: kind,
        attempt,
        seq_no: raw as u64,
        shape,
        payload_len: payload.len() as u64,
        payload_hash: *blake3::hash(&payload).as_bytes(),
        answers: [raw as u8; 32],
        sender: [0; 32],
        signature: [0; 64],
    };
    h.sign(sender);
    let mut bytes = prefix_bytes(&h);
    bytes.extend_from_slice(&payload);

    static CTX: OnceLock<RunContext> = OnceLock::new();
    let ctx = CTX.get_or_init(|| {
        let c = RunContext::new(7, FrameLimits { max_payload: 1 << 20, max_dim: 1 << 16 });
        c.set_epoch_window(0, 1);
        c
    });
    let Ok((h, payload)) = decode_frame(&bytes, ctx, sender.peer_id()) else { return false };
    assert!(h.verify_signature());
    match h.direction {
        Direction::Control => false,
        Direction::Activation | Direction::ActivationGrad => {
            if let (Some((rows, cols)), Some(c)) = (h.rows_cols(), h.wire_codec())
                && let Ok(buf) = CpuBackend::new().decode_wire(c, rows, cols, payload)
            {
                assert!(buf.iter().all(|v| v.is_finite()));
            }
            false
        }
        Direction::WeightSlice => {
            static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
            let rt = RT.get_or_init(|| tokio::runtime::Builder::new_current_thread().build().unwrap());
            let spec = MergeSpec {
                method: MergeMethod::Butterfly,
                slices_per_replica: plan.partitions.len() as u32 / 2,
                codec: WireCodec::F32,
                stage_params: vec![PARAMS],
                ..MergeSpec::default()
            };
            let store: SharedStore = std::sync::Arc::new(MemStore::default());
            let ctx = std::sync::Arc::new(RunContext::new(7, FrameLimits::default()));
            let mut bf = Butterfly::new(me, spec, store, rt.handle().clone(), ctx);
            let layout = flat_layout(PARAMS as usize);
            let theta: Vec<f32> = (0..PARAMS).map(|i| i as f32 / 64.0).collect();
            let local: Vec<f32> = theta.iter().map(|t| t - 0.01).collect();
            let mut out = Vec::new();
            bf.epoch_started(0, 0, &theta);
            bf.contribute(0, 0, &layout, &local, 5, &mut out).unwrap();
            let pc = pb::PhaseChange {
                epoch: 0,
                phase: pb::Phase::Merging as i32,
                merge_plan: Some(iota_protocol::plan_to_pb(&plan)),
                ..Default::default()
            };
            bf.merging(&pc, 0, &layout, &mut out).unwrap();
            let pool = HostPool::new(1 << 22);
            let Some(mut buf) = pool.try_take(payload.len()) else { return false };
            buf[..payload.len()].copy_from_slice(payload);
            let _ = bf.frame(ReceivedFrame { header: h.clone(), payload: buf, peer: sender.peer_id() }, &mut out);
            // Accept whatever hash this replica reported for the partition,
            // or the frame's own, as the orchestrator might.
            let reported = out.iter().find_map(|o| match o {
                iota_dataplane::miner::events::Output::Report(pb::report::Kind::SliceDone(d)) => Some(d.hash.clone()),
                _ => None,
            });
            for kk in 0..plan.partitions.len() {
                // Other partitions keep their previous weights (the all-zero
                // hash), so one frame can finish the merge.
                let hash = match (kk == k, raw_bit(9)) {
                    (true, true) => h.payload_hash.to_vec(),
                    (true, false) => reported.clone().unwrap_or(vec![0; 32]),
                    (false, _) => vec![0; 32],
                };
                let v = pb::SliceVerdict {
                    epoch: 0,
                    stage: 0,
                    partition: kk as u32,
                    generation: plan.partitions[kk].generation,
                    hash,
                    writer: sender.peer_id().0.to_vec(),
                };
                let _ = bf.verdict(v, &mut out);
            }
            match bf.take_merged() {
                Some((_, w)) => {
                    assert_eq!(w.len(), PARAMS as usize);
                    assert!(w.iter().all(|v| v.is_finite()), "a hostile frame made the merge non-finite");
                    true
                }
                None => false,
            }
        }
    }
}

/// An evidence bundle a miner uploaded (hostile bytes; its size and hash
/// matched its announcement, nothing else is known), decoded under
/// input-chosen limits. A bundle that decodes respects every limit, and
/// the format is canonical: it encodes back to exactly the input.
pub fn evidence_bundle(data: &[u8]) {
    use iota_dataplane::evidence_bundle::{BundleLimits, EvidenceBundle};
    let mut b = Bytes(data);
    let lim = BundleLimits { max_frame: b.u16() as u64, weights: b.u8() as u64, max_steps: b.u8() as u64 % 16 };
    let bytes = b.0;
    if let Ok(e) = EvidenceBundle::decode(bytes, lim) {
        assert_eq!(e.weights.len() as u64, lim.weights);
        assert!(e.step_hashes.len() as u64 <= lim.max_steps);
        assert!(e.output_frame.len() as u64 <= lim.max_frame);
        assert!(e.input_frame.as_ref().is_none_or(|f| f.len() as u64 <= lim.max_frame));
        if let Some(bw) = &e.backward {
            assert!(bw.received.len() as u64 <= lim.max_frame && bw.sent.len() as u64 <= lim.max_frame);
            assert!(bw.weights.as_ref().is_none_or(|w| w.len() as u64 == lim.weights));
        }
        let again = e.encode();
        assert!(again == bytes, "the bundle format is not canonical");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hostile bf16 contributions (any bit pattern: NaN, infinities,
    /// subnormals, values near f32's range, mixed with ordinary ones) of
    /// lengths around the block size: the streamed reduce publishes the
    /// reference's bytes or both refuse (`reduce_as_the_reference` panics
    /// otherwise), the fuzz target's property on inputs it may not reach.
    #[test]
    fn hostile_bf16_contributions_reduce_as_the_reference() {
        let mut rng = iota_core::Rng::new(17);
        for case in 0..300u32 {
            let len = 1 + (rng.next_u64() % 700) as usize;
            let size = WireCodec::Bf16.payload_bytes(len.div_ceil(256), 256).unwrap();
            let mut data = Vec::with_capacity(2 * size);
            for _ in 0..size {
                // Mostly small values; one in 16 any bit pattern.
                let word = if rng.next_u64().is_multiple_of(16) {
                    rng.next_u64() as u16
                } else {
                    iota_core::codec::f32_to_bf16(rng.normal() * 0.01)
                };
                data.extend_from_slice(&word.to_le_bytes());
            }
            data[0] = case as u8;
            reduce_as_the_reference(WireCodec::Bf16, len as u64, &data);
        }
    }
}
