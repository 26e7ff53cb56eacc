//! The rules every request body's fields must meet, the same for every
//! method that carries them. A broken rule is an `InvalidField` refusal whose
//! message names the field.

// Input from peers: no unchecked arithmetic or indexing (issue 21).
#![cfg_attr(not(test), deny(clippy::arithmetic_side_effects, clippy::indexing_slicing))]

use std::net::SocketAddr;

use iota_core::PeerId;

use crate::manifest::StoredObject;
use crate::object_store::check_key;
use crate::pb;
use crate::refusal::{Reason, Rejected};

/// Longest `device` string (bytes, printable ASCII).
pub const MAX_DEVICE_LEN: usize = 64;
/// Longest `data_addr` (an IP address and port).
pub const MAX_ADDR_LEN: usize = 64;
/// Largest throughput a miner may claim (tokens/s).
pub const MAX_TOKENS_PER_S: f64 = 1e9;
/// Largest in-flight count a miner may report.
pub const MAX_IN_FLIGHT: u32 = 1 << 16;
pub use crate::object_store::MAX_KEY_LEN;
/// Most tokens one loss report may cover.
pub const MAX_LOSS_TOKENS: u32 = 1 << 24;

/// Longest reason in a `BadObject` report.
pub const MAX_REASON_LEN: usize = 256;

/// An object announced in a report: the signer is the writer, so the
/// object may not name another.
fn announced(field: &str, o: &pb::StoredObject) -> Result<(), Rejected> {
    let unnamed = pb::StoredObject { writer: Vec::new(), ..o.clone() };
    StoredObject::from_pb(&unnamed, Some(PeerId([0; 32]))).map_err(|e| bad(field, e))?;
    Ok(())
}

fn bad(field: &str, why: impl std::fmt::Display) -> Rejected {
    Rejected::new(Reason::InvalidField, format!("field {field}: {why}"))
}

fn tokens_per_s(field: &str, v: f64) -> Result<(), Rejected> {
    if !v.is_finite() || !(0.0..=MAX_TOKENS_PER_S).contains(&v) {
        return Err(bad(field, format!("must be a number in [0, {MAX_TOKENS_PER_S:e}], got {v}")));
    }
    Ok(())
}

/// A data-plane address other miners can dial: `IP:PORT`, port not 0, the
/// IP neither unspecified, multicast nor broadcast.
pub fn data_addr(field: &str, s: &str) -> Result<SocketAddr, Rejected> {
    if s.is_empty() || s.len() > MAX_ADDR_LEN {
        return Err(bad(field, format!("must be IP:PORT of at most {MAX_ADDR_LEN} bytes")));
    }
    let a: SocketAddr = s.parse().map_err(|_| bad(field, "is not an IP:PORT socket address"))?;
    let ip = a.ip();
    let broadcast = matches!(ip, std::net::IpAddr::V4(v4) if v4.is_broadcast());
    if a.port() == 0 || ip.is_unspecified() || ip.is_multicast() || broadcast {
        return Err(bad(field, "must be a dialable unicast address with a port"));
    }
    Ok(a)
}

fn printable(field: &str, s: &str, max: usize) -> Result<(), Rejected> {
    if s.len() > max || !s.bytes().all(|b| (0x20..0x7f).contains(&b)) {
        return Err(bad(field, format!("must be at most {max} printable ASCII characters")));
    }
    Ok(())
}

fn hash32(field: &str, h: &[u8]) -> Result<(), Rejected> {
    if h.len() != 32 {
        return Err(bad(field, format!("must be 32 bytes, got {}", h.len())));
    }
    Ok(())
}

/// An object key, or a key prefix ending in '/' (merged butterfly weights
/// are a folder of part objects).
fn store_key(field: &str, k: &str) -> Result<(), Rejected> {
    let stem = k.strip_suffix('/').unwrap_or(k);
    if k.len() > MAX_KEY_LEN || check_key(stem).is_err() {
        return Err(bad(field, format!("must be a relative object key of at most {MAX_KEY_LEN} bytes")));
    }
    Ok(())
}

/// The role the body names (closed enum; unknown values refused).
pub fn role(r: i32) -> Result<pb::Role, Rejected> {
    match pb::Role::try_from(r) {
        Ok(pb::Role::Unspecified) | Err(_) => Err(bad("role", format!("unknown role {r}"))),
        Ok(role) => Ok(role),
    }
}

pub fn register(r: &pb::RegisterRequest) -> Result<(), Rejected> {
    let role = role(r.role)?;
    match role {
        pb::Role::Miner => {
            data_addr("data_addr", &r.data_addr)?;
        }
        pb::Role::Validator => {
            if !r.data_addr.is_empty() {
                return Err(bad("data_addr", "a validator has no data-plane address"));
            }
        }
        _ => {
            return Err(Rejected::new(
                Reason::WrongRole,
                format!("role {}: only miners and validators register", role.as_str_name()),
            ));
        }
    }
    tokens_per_s("tokens_per_s", r.tokens_per_s)?;
    if !r.compute.is_empty() && iota_core::memory_plan::ComputeBackend::parse(&r.compute).is_none() {
        return Err(bad("compute", "must be cpu, cuda-fp32 or cuda-bf16"));
    }
    printable("device", &r.device, MAX_DEVICE_LEN)
}

/// A heartbeat's `epoch` against the run's current one: a miner is in
/// the current epoch, or (its clock ahead of the orchestrator's news) the
/// next; anything later is a bad field, not a hint.
pub fn heartbeat_epoch(epoch: u64, current: u64) -> Result<(), Rejected> {
    if epoch > current.saturating_add(1) {
        return Err(bad("epoch", format!("{epoch} is past the run's epoch {current} + 1")));
    }
    Ok(())
}

pub fn heartbeat(h: &pb::HeartbeatRequest) -> Result<(), Rejected> {
    tokens_per_s("tokens_per_s", h.tokens_per_s)?;
    if h.in_flight > MAX_IN_FLIGHT {
        return Err(bad("in_flight", format!("must be at most {MAX_IN_FLIGHT}")));
    }
    crate::commitments_pb::from_pb(&h.commitments).map_err(|e| bad("commitments", e))?;
    Ok(())
}

/// Most contribution headers in one `SliceDone`: one per other
/// participant of a stage's merge.
pub const MAX_CONTRIBUTIONS: usize = 1024;

/// Most asks in one `Grant` request.
pub const MAX_GRANT_ASKS: usize = 16;

/// A `Grant` request: 1 to 16 asks, each a valid key (a prefix ending in
/// '/' for LIST, a whole key otherwise), a known access, and for a PUT a
/// size of at most the largest object the store takes.
pub fn grant(g: &pb::GrantRequest) -> Result<(), Rejected> {
    if g.asks.is_empty() || g.asks.len() > MAX_GRANT_ASKS {
        return Err(bad("asks", format!("must hold 1 to {MAX_GRANT_ASKS} asks")));
    }
    for a in &g.asks {
        match pb::Access::try_from(a.access) {
            Ok(pb::Access::List) => {
                if !a.key.ends_with('/') {
                    return Err(bad("asks.key", "a LIST names a prefix ending in '/'"));
                }
                store_key("asks.key", &a.key)?;
            }
            Ok(access @ (pb::Access::Get | pb::Access::Put)) => {
                if a.key.ends_with('/') {
                    return Err(bad("asks.key", "a GET or PUT names one object, not a prefix"));
                }
                store_key("asks.key", &a.key)?;
                if access == pb::Access::Put && a.size > crate::manifest::MAX_OBJECT_BYTES {
                    return Err(bad(
                        "asks.size",
                        format!("must be at most {} bytes", crate::manifest::MAX_OBJECT_BYTES),
                    ));
                }
            }
            _ => return Err(bad("asks.access", format!("unknown access {}", a.access))),
        }
    }
    Ok(())
}

pub fn report(r: &pb::Report) -> Result<(), Rejected> {
    use pb::report::Kind;
    match r.kind.as_ref().ok_or_else(|| bad("kind", "a report must say what it reports"))? {
        Kind::Loss(l) => {
            if !l.loss.is_finite() || l.loss < 0.0 {
                return Err(bad("loss.loss", "must be a finite non-negative number"));
            }
            if l.tokens == 0 || l.tokens > MAX_LOSS_TOKENS {
                return Err(bad("loss.tokens", format!("must be in [1, {MAX_LOSS_TOKENS}]")));
            }
        }
        Kind::BackwardDone(_) => {}
        // The butterfly's "ready" carries no key.
        // The butterfly's "ready" carries no key.
        Kind::UploadDone(u) => {
            if !u.key.is_empty() {
                store_key("upload_done.key", &u.key)?;
            }
            if let Some(o) = &u.object {
                announced("upload_done.object", o)?;
            }
            crate::commitments_pb::from_pb(&u.commitments).map_err(|e| bad("upload_done.commitments", e))?;
        }
        Kind::MergeDone(m) => {
            if !m.key.is_empty() {
                store_key("merge_done.key", &m.key)?;
            }
            if !m.weights_hash.is_empty() {
                hash32("merge_done.weights_hash", &m.weights_hash)?;
            }
            if let Some(o) = &m.object {
                announced("merge_done.object", o)?;
            }
        }
        Kind::SliceDone(d) => {
            hash32("slice_done.hash", &d.hash)?;
            if d.contributions.len() > MAX_CONTRIBUTIONS {
                return Err(bad("slice_done.contributions", format!("at most {MAX_CONTRIBUTIONS}")));
            }
            let want = iota_core::wire::header_len();
            if let Some(i) = d.contributions.iter().position(|c| c.len() != want) {
                return Err(bad("slice_done.contributions", format!("header {i} is not {want} bytes")));
            }
            if d.flagged.len() > MAX_CONTRIBUTIONS {
                return Err(bad("slice_done.flagged", format!("at most {MAX_CONTRIBUTIONS}")));
            }
            for f in &d.flagged {
                hash32("slice_done.flagged", f)?;
            }
        }
        Kind::ContributionsMissing(m) => {
            if m.senders.is_empty() || m.senders.len() > MAX_CONTRIBUTIONS {
                return Err(bad("contributions_missing.senders", format!("1 to {MAX_CONTRIBUTIONS}")));
            }
            for s in &m.senders {
                hash32("contributions_missing.senders", s)?;
            }
        }
        Kind::PeerFailed(f) => {
            hash32("peer_failed.peer", &f.peer)?;
            if !matches!(pb::Failure::try_from(f.failure), Ok(pb::Failure::Unreachable | pb::Failure::NoInput)) {
                return Err(bad("peer_failed.failure", "must be UNREACHABLE or NO_INPUT"));
            }
        }
        Kind::Stored(s) => {
            announced("stored.object", s.object.as_ref().ok_or_else(|| bad("stored.object", "missing"))?)?
        }
        Kind::BadObject(b) => {
            let o = b.object.as_ref().ok_or_else(|| bad("bad_object.object", "missing"))?;
            // As the orchestrator handed it on: the writer is named.
            StoredObject::from_pb(o, None).map_err(|e| bad("bad_object.object", e))?;
            printable("bad_object.reason", &b.reason, MAX_REASON_LEN)?;
        }
    }
    Ok(())
}

/// Most attempts one evidence ask or request names.
pub const MAX_EVIDENCE_ITEMS: usize = 256;

fn work_refs(field: &str, items: &[pb::WorkRef]) -> Result<(), Rejected> {
    if items.is_empty() || items.len() > MAX_EVIDENCE_ITEMS {
        return Err(bad(field, format!("must name 1 to {MAX_EVIDENCE_ITEMS} attempts")));
    }
    let traces = items.iter().filter(|w| w.trace_step > 0).count();
    if traces > 1 || (traces == 1 && items.len() != 1) {
        return Err(bad(field, "a trace is asked alone, of one attempt"));
    }
    if items.iter().any(|w| w.trace_step > 0 && !w.inner_step) {
        return Err(bad(field, "a trace is asked of an attempt asked with its inner steps"));
    }
    Ok(())
}

/// A validator's report (the `Validate` RPC).
/// Most miners one validator's weight vector may rate (an EpochWork lists
/// at most this many).
pub const MAX_WEIGHTS: usize = 65_536;

/// A validator's weights over an epoch's miners: empty (abstaining) or
/// finite, non-negative and not all zero. (Whether its length matches the
/// epoch's miners is the orchestrator's check.)
fn weight_vector(field: &'static str, w: &[f32]) -> Result<(), Rejected> {
    if w.is_empty() {
        return Ok(());
    }
    if w.len() > MAX_WEIGHTS {
        return Err(bad(field, "rates more miners than an epoch can have"));
    }
    if let Some((i, x)) = w.iter().enumerate().find(|(_, x)| !x.is_finite() || **x < 0.0) {
        return Err(bad(field, format!("weight {i} is {x}: weights must be finite and >= 0")));
    }
    if w.iter().all(|x| *x == 0.0) {
        return Err(bad(field, "all zero: to rate nobody, send no weights"));
    }
    Ok(())
}

pub fn validator_report(r: &pb::ValidatorReport) -> Result<(), Rejected> {
    use pb::validator_report::Kind;
    match r.kind.as_ref().ok_or_else(|| bad("kind", "a validator report must say what it reports"))? {
        Kind::Ask(a) => {
            hash32("ask.miner", &a.miner)?;
            work_refs("ask.items", &a.items)?;
        }
        Kind::Verdict(v) => {
            hash32("verdict.miner", &v.miner)?;
            if !matches!(pb::Check::try_from(v.check), Ok(pb::Check::Recompute | pb::Check::Merge)) {
                return Err(bad("verdict.check", "must be RECOMPUTE or MERGE"));
            }
            if !v.evidence_hash.is_empty() {
                hash32("verdict.evidence_hash", &v.evidence_hash)?;
            }
            printable("verdict.reason", &v.reason, MAX_REASON_LEN)?;
            if !v.proof.is_empty() {
                if !v.guilty || v.proof.len() != 2 {
                    return Err(bad("verdict.proof", "a guilty verdict's proof is two headers"));
                }
                if v.proof.iter().any(|h| h.is_empty() || h.len() > MAX_ARCHIVED_HEADER) {
                    return Err(bad("verdict.proof", "a header is at most 4096 bytes"));
                }
            }
            if !v.step_proof_hash.is_empty() {
                hash32("verdict.step_proof_hash", &v.step_proof_hash)?;
                if !v.guilty || !v.proof.is_empty() || v.check != pb::Check::Recompute as i32 {
                    return Err(bad(
                        "verdict.step_proof_hash",
                        "a step proof goes alone with a guilty recompute verdict",
                    ));
                }
            }
        }
        Kind::Done(d) => {
            weight_vector("done.weights", &d.weights)?;
            if !d.miners_hash.is_empty() {
                hash32("done.miners_hash", &d.miners_hash)?;
            }
        }
        Kind::MergeVote(v) => {
            printable("merge_vote.reason", &v.reason, MAX_REASON_LEN)?;
            // NaN says it could not measure; a loss is otherwise a finite
            // number, never negative.
            if !(v.loss.is_nan() || (v.loss.is_finite() && v.loss >= 0.0)) {
                return Err(bad("merge_vote.loss", format!("must be a finite loss >= 0 or NaN, got {}", v.loss)));
            }
            if v.merged.len() > MAX_VOTE_STAGES {
                return Err(bad("merge_vote.merged", format!("names more than {MAX_VOTE_STAGES} stages")));
            }
            let mut seen = std::collections::BTreeSet::new();
            for st in &v.merged {
                hash32("merge_vote.merged.weights_hash", &st.weights_hash)?;
                if !seen.insert(st.stage) {
                    return Err(bad("merge_vote.merged", format!("names stage {} twice", st.stage)));
                }
            }
        }
        Kind::MergeAudit(a) => {
            if !a.hash.is_empty() {
                hash32("merge_audit.hash", &a.hash)?;
            }
            if a.missing.len() > MAX_AUDIT_MISSING {
                return Err(bad("merge_audit.missing", "names more participants than a merge can have"));
            }
            for m in &a.missing {
                hash32("merge_audit.missing", m)?;
            }
            if a.flagged.len() > MAX_AUDIT_MISSING {
                return Err(bad("merge_audit.flagged", "names more participants than a merge can have"));
            }
            for m in &a.flagged {
                hash32("merge_audit.flagged", m)?;
            }
            if a.unbound.len() > MAX_AUDIT_MISSING {
                return Err(bad("merge_audit.unbound", "names more participants than a merge can have"));
            }
            for m in &a.unbound {
                hash32("merge_audit.unbound", m)?;
            }
            if a.contradicting.len() > MAX_AUDIT_MISSING {
                return Err(bad("merge_audit.contradicting", "names more participants than a merge can have"));
            }
            if a.contradicting.iter().any(|h| h.is_empty() || h.len() > MAX_ARCHIVED_HEADER) {
                return Err(bad("merge_audit.contradicting", "a header of 1 to 4096 bytes"));
            }
            printable("merge_audit.reason", &a.reason, MAX_REASON_LEN)?;
        }
    }
    Ok(())
}

/// Participants a merge audit may name as missing (a stage's replicas).
pub const MAX_AUDIT_MISSING: usize = 1024;
/// Bytes of one archived frame header a report may carry.
pub const MAX_ARCHIVED_HEADER: usize = 4096;
/// Stages a merge vote may give a hash for.
pub const MAX_VOTE_STAGES: usize = 1024;

#[cfg(test)]
mod tests {
    use super::*;

    fn reg(addr: &str, tps: f64, device: &str) -> pb::RegisterRequest {
        pb::RegisterRequest {
            role: pb::Role::Miner as i32,
            data_addr: addr.into(),
            tokens_per_s: tps,
            device: device.into(),
            ..Default::default()
        }
    }

    #[test]
    fn register_fields() {
        assert!(register(&reg("127.0.0.1:9000", 10.0, "cuda:0 (bf16 gemms)")).is_ok());
        assert!(register(&reg("[::1]:9000", 0.0, "cpu")).is_ok());
        for (r, field) in [
            (reg("", 1.0, "cpu"), "data_addr"),
            (reg("localhost:9000", 1.0, "cpu"), "data_addr"),
            (reg("127.0.0.1:0", 1.0, "cpu"), "data_addr"),
            (reg("0.0.0.0:9000", 1.0, "cpu"), "data_addr"),
            (reg("224.0.0.1:9000", 1.0, "cpu"), "data_addr"),
            (reg(&"1".repeat(512 << 10), 1.0, "cpu"), "data_addr"),
            (reg("127.0.0.1:9000", f64::NAN, "cpu"), "tokens_per_s"),
            (reg("127.0.0.1:9000", -1.0, "cpu"), "tokens_per_s"),
            (reg("127.0.0.1:9000", f64::INFINITY, "cpu"), "tokens_per_s"),
            (reg("127.0.0.1:9000", 1.0, &"x".repeat(512 << 10)), "device"),
            (reg("127.0.0.1:9000", 1.0, "gpu\n[ERROR] forged log line"), "device"),
            (pb::RegisterRequest { compute: "tpu".into(), ..reg("127.0.0.1:9000", 1.0, "cpu") }, "compute"),
        ] {
            let e = register(&r).unwrap_err();
            assert_eq!(e.reason, Reason::InvalidField);
            assert!(e.message.contains(field), "{field}: {}", e.message);
        }
        let mut v = reg("127.0.0.1:9000", 1.0, "cpu");
        v.role = pb::Role::Validator as i32;
        assert!(register(&v).unwrap_err().message.contains("data_addr"), "a validator has no data plane");
        v.data_addr.clear();
        assert!(register(&v).is_ok());
        v.role = pb::Role::Operator as i32;
        assert_eq!(register(&v).unwrap_err().reason, Reason::WrongRole);
        v.role = 99;
        assert!(register(&v).unwrap_err().message.contains("role"));
    }

    #[test]
    fn validator_report_fields() {
        use pb::validator_report::Kind;
        let item = pb::WorkRef { shard: 1, first_sample: 8, attempt: 0, inner_step: false, trace_step: 0 };
        let ask = |miner: Vec<u8>, n: usize| pb::ValidatorReport {
            kind: Some(Kind::Ask(pb::EvidenceAsk { epoch: 0, miner, items: vec![item; n] })),
        };
        assert!(validator_report(&ask(vec![1; 32], 4)).is_ok());
        assert!(validator_report(&ask(vec![1; 31], 4)).unwrap_err().message.contains("ask.miner"));
        assert!(validator_report(&ask(vec![1; 32], 0)).unwrap_err().message.contains("ask.items"));
        assert!(validator_report(&ask(vec![1; 32], MAX_EVIDENCE_ITEMS + 1)).unwrap_err().message.contains("ask.items"));
        let traced = |items: Vec<pb::WorkRef>| pb::ValidatorReport {
            kind: Some(Kind::Ask(pb::EvidenceAsk { epoch: 0, miner: vec![1; 32], items })),
        };
        let trace = pb::WorkRef { inner_step: true, trace_step: 3, ..item };
        assert!(validator_report(&traced(vec![trace])).is_ok());
        assert!(validator_report(&traced(vec![trace, item])).unwrap_err().message.contains("alone"));
        let bare = pb::WorkRef { inner_step: false, ..trace };
        assert!(validator_report(&traced(vec![bare])).unwrap_err().message.contains("inner steps"));
        let verdict = |check: i32, hash: Vec<u8>, reason: &str| pb::ValidatorReport {
            kind: Some(Kind::Verdict(pb::Verdict {
                epoch: 0,
                miner: vec![2; 32],
                check,
                guilty: true,
                samples: 4,
                evidence_hash: hash,
                reason: reason.into(),
                proof: Vec::new(),
                step_proof_hash: Vec::new(),
            })),
        };
        assert!(
            validator_report(&verdict(pb::Check::Recompute as i32, vec![3; 32], "recomputed output differs")).is_ok()
        );
        assert!(validator_report(&verdict(pb::Check::Recompute as i32, Vec::new(), "")).is_ok());
        // A proof: two headers, on a guilty verdict only.
        let with_proof = |guilty: bool, proof: Vec<Vec<u8>>| {
            let mut r = verdict(pb::Check::Recompute as i32, Vec::new(), "two frames");
            if let Some(Kind::Verdict(v)) = r.kind.as_mut() {
                (v.guilty, v.proof) = (guilty, proof);
            }
            validator_report(&r)
        };
        assert!(with_proof(true, vec![vec![1; 300], vec![2; 300]]).is_ok());
        for (guilty, proof) in [
            (false, vec![vec![1; 300], vec![2; 300]]),
            (true, vec![vec![1; 300]]),
            (true, vec![vec![1; 300]; 3]),
            (true, vec![vec![1; 300], Vec::new()]),
            (true, vec![vec![1; 300], vec![2; MAX_ARCHIVED_HEADER + 1]]),
        ] {
            assert!(with_proof(guilty, proof).unwrap_err().message.contains("verdict.proof"));
        }
        for (v, field) in [
            (verdict(0, Vec::new(), ""), "verdict.check"),
            (verdict(42, Vec::new(), ""), "verdict.check"),
            (verdict(1, vec![3; 5], ""), "verdict.evidence_hash"),
            (verdict(1, Vec::new(), "line\n[ERROR] forged"), "verdict.reason"),
            (verdict(1, Vec::new(), &"x".repeat(MAX_REASON_LEN + 1)), "verdict.reason"),
        ] {
            assert!(validator_report(&v).unwrap_err().message.contains(field), "{field}");
        }
        assert!(validator_report(&pb::ValidatorReport { kind: None }).is_err());
        let audit = |hash: Vec<u8>, missing: Vec<Vec<u8>>| pb::ValidatorReport {
            kind: Some(Kind::MergeAudit(pb::MergeAuditResult { hash, missing, ..Default::default() })),
        };
        assert!(validator_report(&audit(vec![5; 32], Vec::new())).is_ok());
        assert!(validator_report(&audit(Vec::new(), vec![vec![1; 32]])).is_ok(), "inconclusive, naming who withheld");
        assert!(validator_report(&audit(vec![5; 31], Vec::new())).unwrap_err().message.contains("merge_audit.hash"));
        assert!(validator_report(&audit(Vec::new(), vec![vec![1; 3]])).unwrap_err().message.contains("missing"));
        assert!(validator_report(&audit(Vec::new(), vec![vec![1; 32]; MAX_AUDIT_MISSING + 1])).is_err());
        let contradicting = |headers: Vec<Vec<u8>>| pb::ValidatorReport {
            kind: Some(Kind::MergeAudit(pb::MergeAuditResult { contradicting: headers, ..Default::default() })),
        };
        assert!(validator_report(&contradicting(vec![vec![1; 300]])).is_ok());
        assert!(validator_report(&contradicting(vec![Vec::new()])).is_err(), "empty");
        assert!(validator_report(&contradicting(vec![vec![1; MAX_ARCHIVED_HEADER + 1]])).is_err(), "too long");
        let merge_vote = |merged: Vec<pb::StageStart>| pb::ValidatorReport {
            kind: Some(Kind::MergeVote(pb::MergeVote {
                epoch: 0,
                rollback: false,
                loss: 2.0,
                reason: String::new(),
                merged,
            })),
        };
        let st = |stage: u32, n: usize| pb::StageStart { stage, weights_hash: vec![7; n], weights_from: 0 };
        assert!(validator_report(&merge_vote(Vec::new())).is_ok(), "a validator that could not load the merge");
        let with_loss = |loss: f32| pb::ValidatorReport {
            kind: Some(Kind::MergeVote(pb::MergeVote { epoch: 0, rollback: true, loss, ..Default::default() })),
        };
        assert!(validator_report(&with_loss(f32::NAN)).is_ok(), "could not measure");
        assert!(validator_report(&with_loss(0.0)).is_ok());
        for l in [-1.0, f32::INFINITY, f32::NEG_INFINITY] {
            assert!(validator_report(&with_loss(l)).unwrap_err().message.contains("merge_vote.loss"), "{l}");
        }
        assert!(validator_report(&merge_vote(vec![st(0, 32), st(1, 32)])).is_ok());
        for (bad_vote, why) in [
            (merge_vote(vec![st(0, 31)]), "weights_hash"),
            (merge_vote(vec![st(0, 0)]), "weights_hash"),
            (merge_vote(vec![st(1, 32), st(1, 32)]), "twice"),
            (merge_vote((0..=MAX_VOTE_STAGES as u32).map(|s| st(s, 32)).collect()), "stages"),
        ] {
            assert!(validator_report(&bad_vote).unwrap_err().message.contains(why), "{why}");
        }
        let done = |weights: Vec<f32>| pb::ValidatorReport {
            kind: Some(Kind::Done(pb::ValidationDone { epoch: 0, weights, miners_hash: Vec::new() })),
        };
        assert!(validator_report(&done(Vec::new())).is_ok(), "abstaining");
        assert!(validator_report(&done(vec![0.0, 0.7, 0.3])).is_ok());
        for w in [vec![0.5, f32::NAN], vec![0.5, -0.5], vec![f32::INFINITY], vec![0.0, 0.0], vec![0.1; MAX_WEIGHTS + 1]]
        {
            assert!(
                validator_report(&done(w.clone())).unwrap_err().message.contains("done.weights"),
                "{:?}",
                &w[..2.min(w.len())]
            );
        }
    }

    #[test]
    fn heartbeat_and_report_fields() {
        let hb = |tps: f64, n: u32| pb::HeartbeatRequest {
            epoch: 0,
            in_flight: n,
            tokens_per_s: tps,
            commitments: Vec::new(),
        };
        assert!(heartbeat(&hb(5.0, 3)).is_ok());
        for h in [hb(f64::NAN, 0), hb(-1.0, 0), hb(f64::INFINITY, 0), hb(1.0, u32::MAX)] {
            assert_eq!(heartbeat(&h).unwrap_err().reason, Reason::InvalidField);
        }
        assert!(heartbeat_epoch(0, 0).is_ok() && heartbeat_epoch(4, 3).is_ok() && heartbeat_epoch(2, 7).is_ok());
        for (epoch, current) in [(2, 0), (u64::MAX, 3), (u64::MAX, u64::MAX - 2)] {
            let e = heartbeat_epoch(epoch, current).unwrap_err();
            assert!(e.reason == Reason::InvalidField && e.message.contains("epoch"), "{epoch} {current}: {e:?}");
        }
        let loss = |l: f32, t: u32| pb::Report {
            kind: Some(pb::report::Kind::Loss(pb::LossReport { loss: l, tokens: t, ..Default::default() })),
        };
        assert!(report(&loss(2.5, 512)).is_ok());
        assert!(report(&loss(f32::NAN, 512)).is_err());
        assert!(report(&loss(2.5, 0)).is_err());
        assert!(report(&pb::Report { kind: None }).is_err());
        let up = |k: &str| pb::Report {
            kind: Some(pb::report::Kind::UploadDone(pb::UploadDone { key: k.into(), ..Default::default() })),
        };
        assert!(report(&up("epoch-000001/stage-000/x.safetensors")).is_ok());
        assert!(report(&up("../../etc/passwd")).unwrap_err().message.contains("upload_done.key"));
        assert!(report(&up("epoch-000001/stage-000/weights/")).is_ok());
        assert!(report(&up("epoch-000001//")).is_err());
        let slice = pb::Report {
            kind: Some(pb::report::Kind::SliceDone(pb::SliceDone { hash: vec![1; 31], ..Default::default() })),
        };
        assert!(report(&slice).unwrap_err().message.contains("slice_done.hash"));
        let header = vec![0u8; iota_core::wire::header_len()];
        let slice = |contributions: Vec<Vec<u8>>| pb::Report {
            kind: Some(pb::report::Kind::SliceDone(pb::SliceDone {
                hash: vec![1; 32],
                contributions,
                ..Default::default()
            })),
        };
        assert!(report(&slice(vec![header.clone(); 3])).is_ok());
        assert!(report(&slice(vec![header.clone(), vec![0; 7]])).unwrap_err().message.contains("header 1"));
        assert!(report(&slice(vec![header; MAX_CONTRIBUTIONS + 1])).unwrap_err().message.contains("at most"));
        let flagging = |flagged: Vec<Vec<u8>>| pb::Report {
            kind: Some(pb::report::Kind::SliceDone(pb::SliceDone { hash: vec![1; 32], flagged, ..Default::default() })),
        };
        assert!(report(&flagging(vec![vec![3; 32]])).is_ok());
        assert!(report(&flagging(vec![vec![3; 31]])).unwrap_err().message.contains("slice_done.flagged"));
        let missing = |senders: Vec<Vec<u8>>| pb::Report {
            kind: Some(pb::report::Kind::ContributionsMissing(pb::ContributionsMissing {
                senders,
                ..Default::default()
            })),
        };
        assert!(report(&missing(vec![vec![4; 32]])).is_ok());
        for bad in [Vec::new(), vec![vec![4; 33]], vec![vec![4; 32]; MAX_CONTRIBUTIONS + 1]] {
            assert!(report(&missing(bad)).unwrap_err().message.contains("contributions_missing.senders"));
        }
    }

    #[test]
    fn grant_asks() {
        let ask =
            |key: &str, access: pb::Access, size: u64| pb::GrantAsk { key: key.into(), access: access as i32, size };
        let req = |asks: Vec<pb::GrantAsk>| pb::GrantRequest { asks };
        let ok = [
            ask("epoch-000001/stage-000/a.safetensors", pb::Access::Put, 10),
            ask("epoch-000001/stage-000/a.safetensors", pb::Access::Get, 0),
            ask("epoch-000001/stage-000/contrib/000003/", pb::Access::List, 0),
        ];
        assert!(grant(&req(ok.to_vec())).is_ok());
        assert!(grant(&req(Vec::new())).unwrap_err().message.contains("asks"));
        assert!(grant(&req(vec![ok[1].clone(); MAX_GRANT_ASKS + 1])).is_err());
        let bad = [
            (ask("epoch-000001/stage-000/contrib/000003", pb::Access::List, 0), "asks.key"),
            (ask("epoch-000001/stage-000/", pb::Access::Get, 0), "asks.key"),
            (ask("../etc/passwd", pb::Access::Get, 0), "asks.key"),
            (ask("a", pb::Access::Put, crate::manifest::MAX_OBJECT_BYTES + 1), "asks.size"),
            (pb::GrantAsk { key: "a".into(), access: 7, size: 0 }, "asks.access"),
            (ask("a", pb::Access::Unspecified, 0), "asks.access"),
        ];
        for (a, field) in bad {
            let e = grant(&req(vec![ok[0].clone(), a.clone()])).unwrap_err();
            assert!(e.message.contains(field), "{a:?}: {}", e.message);
        }
    }
}
