//! The hashes a miner's frames and commitments are made of (a validator
//! recomputes them from the evidence it is shown).

/// What the head's forward frame answers: the BLAKE3 hash of its input
/// tokens (u32 little-endian), so a pathway's chain starts at its data.
pub fn tokens_hash(tokens: &[u32]) -> [u8; 32] {
    let mut h = blake3::Hasher::new();
    for t in tokens {
        h.update(&t.to_le_bytes());
    }
    *h.finalize().as_bytes()
}

/// The BLAKE3 hash of a stage's weights (f32 little-endian), as the
/// weights chain commits to it after every inner step.
pub fn weights_hash(params: &[f32]) -> [u8; 32] {
    let mut h = blake3::Hasher::new();
    for chunk in params.chunks(16_384) {
        let bytes: Vec<u8> = chunk.iter().flat_map(|v| v.to_le_bytes()).collect();
        h.update(&bytes);
    }
    *h.finalize().as_bytes()
}
