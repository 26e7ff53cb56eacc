//! Where a run's objects live in the object store.

/// Object-store prefix where replicas upload their weights in `epoch`.
pub fn upload_prefix(epoch: u64) -> String {
    format!("epoch-{epoch:06}/")
}

/// Object-store prefix of a stage's merged weights after a butterfly merge
/// in `epoch`: one object per partition, `{offset:012}-{len:012}.f32`.
pub fn weights_parts_prefix(epoch: u64, stage: u32) -> String {
    format!("{}stage-{stage:03}/weights/", upload_prefix(epoch))
}

/// Object-store prefix of a stage's outer momentum after `epoch`'s merge.
pub fn momentum_parts_prefix(epoch: u64, stage: u32) -> String {
    format!("{}stage-{stage:03}/momentum/", upload_prefix(epoch))
}

/// Object-store prefix where a participant leaves a contribution it could
/// not deliver over the data plane (a whole signed frame per object).
pub fn contrib_prefix(epoch: u64, stage: u32) -> String {
    format!("{}stage-{stage:03}/contrib/", upload_prefix(epoch))
}

/// Name of the part object for `[offset, offset + len)`.
pub fn part_name(offset: u64, len: u64) -> String {
    format!("{offset:012}-{len:012}.f32")
}

/// Parses a part object's name back into (offset, len).
pub fn parse_part_name(name: &str) -> Option<(u64, u64)> {
    let stem = name.rsplit('/').next()?.strip_suffix(".f32")?;
    let (a, b) = stem.split_once('-')?;
    Some((a.parse().ok()?, b.parse().ok()?))
}

/// Object-store key of a stage's merged weights after `epoch`.
pub fn merged_key(epoch: u64, stage: u32) -> String {
    format!("{}stage-{stage:03}/merged.safetensors", upload_prefix(epoch))
}

/// Object-store prefix of the evidence a miner uploaded for `epoch`'s
/// sampled work (PROTOCOL.md, "Validation").
pub fn evidence_prefix(epoch: u64, miner: &iota_core::PeerId) -> String {
    format!("{}evidence/{}/", upload_prefix(epoch), miner.to_hex())
}

/// Object-store key of the evidence for one micro-batch attempt.
pub fn evidence_key(epoch: u64, miner: &iota_core::PeerId, shard: u32, first_sample: u64, attempt: u32) -> String {
    format!("{}{shard:06}-{first_sample:012}-{attempt:03}.evidence", evidence_prefix(epoch, miner))
}

/// Object-store key of the evidence for one attempt that also shows the
/// inner steps its backward went into (asked with `WorkRef.inner_step`).
pub fn step_evidence_key(epoch: u64, miner: &iota_core::PeerId, shard: u32, first_sample: u64, attempt: u32) -> String {
    format!("{}{shard:06}-{first_sample:012}-{attempt:03}.step.evidence", evidence_prefix(epoch, miner))
}

/// Object-store key of the signed trace of inner step `step` (among the
/// epoch's own records) of the attempt's step object (asked with
/// `WorkRef.trace_step`).
pub fn trace_evidence_key(
    epoch: u64,
    miner: &iota_core::PeerId,
    (shard, first_sample, attempt): (u32, u64, u32),
    step: u32,
) -> String {
    format!("{}{shard:06}-{first_sample:012}-{attempt:03}.trace-{step:06}.evidence", evidence_prefix(epoch, miner))
}

/// The attempt and the step a trace key of `miner` in `epoch` names; None
/// for any other key.
pub fn parse_trace_key(key: &str, epoch: u64, miner: &iota_core::PeerId) -> Option<((u32, u64, u32), u32)> {
    let stem = key.strip_prefix(&evidence_prefix(epoch, miner))?.strip_suffix(".evidence")?;
    let (stem, step) = stem.split_once(".trace-")?;
    let digits = |p: &str, n: usize| p.len() == n && p.bytes().all(|b| b.is_ascii_digit());
    let mut parts = stem.split('-');
    let (s, f, a) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() || !digits(s, 6) || !digits(f, 12) || !digits(a, 3) || !digits(step, 6) {
        return None;
    }
    Some(((s.parse().ok()?, f.parse().ok()?, a.parse().ok()?), step.parse().ok()?))
}

/// Object-store key of the proof `validator` stored of a failed inner step
/// of `miner` in `epoch` (its verdict names the proof's hash).
pub fn step_proof_key(epoch: u64, validator: &iota_core::PeerId, miner: &iota_core::PeerId) -> String {
    format!("{}proofs/{}/{}.step.proof", upload_prefix(epoch), validator.to_hex(), miner.to_hex())
}

/// The attempt (shard, first sample, attempt) an evidence key of `miner`
/// in `epoch` names; None for any other key (a step evidence key too).
pub fn parse_evidence_key(key: &str, epoch: u64, miner: &iota_core::PeerId) -> Option<(u32, u64, u32)> {
    parse_any_evidence_key(key, epoch, miner).filter(|(_, step)| !step).map(|(k, _)| k)
}

/// The attempt an evidence key of `miner` in `epoch` names, and whether it
/// is the one that shows the inner steps (`step_evidence_key`).
pub fn parse_any_evidence_key(key: &str, epoch: u64, miner: &iota_core::PeerId) -> Option<((u32, u64, u32), bool)> {
    let stem = key.strip_prefix(&evidence_prefix(epoch, miner))?.strip_suffix(".evidence")?;
    let (stem, step) = match stem.strip_suffix(".step") {
        Some(s) => (s, true),
        None => (stem, false),
    };
    let mut parts = stem.split('-');
    let (s, f, a) = (parts.next()?, parts.next()?, parts.next()?);
    let digits = |p: &str, n: usize| p.len() == n && p.bytes().all(|b| b.is_ascii_digit());
    if parts.next().is_some() || !digits(s, 6) || !digits(f, 12) || !digits(a, 3) {
        return None;
    }
    Some(((s.parse().ok()?, f.parse().ok()?, a.parse().ok()?), step))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trace_keys_parse_back_and_are_no_other_evidence() {
        let m = iota_core::PeerId([7; 32]);
        let key = trace_evidence_key(4, &m, (2, 640, 1), 17);
        assert_eq!(parse_trace_key(&key, 4, &m), Some(((2, 640, 1), 17)));
        assert_eq!(parse_trace_key(&key, 5, &m), None, "another epoch");
        assert_eq!(parse_trace_key(&key, 4, &iota_core::PeerId([8; 32])), None, "another miner");
        assert_eq!(parse_any_evidence_key(&key, 4, &m), None, "not an evidence key");
        assert_eq!(parse_trace_key(&step_evidence_key(4, &m, 2, 640, 1), 4, &m), None, "not a trace key");
        assert_eq!(parse_trace_key(&key.replace(".trace-", ".trace-9"), 4, &m), None, "a malformed step");
    }
}
