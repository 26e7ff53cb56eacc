//! What a vote names of the evidence it judged.

/// BLAKE3 over the hashes of the evidence objects a vote judged, in the
/// order judged (None: it judged none).
pub(super) fn evidence_hash(hashes: &[[u8; 32]]) -> Option<[u8; 32]> {
    if hashes.is_empty() {
        return None;
    }
    let mut h = blake3::Hasher::new();
    for x in hashes {
        h.update(x);
    }
    Some(*h.finalize().as_bytes())
}
