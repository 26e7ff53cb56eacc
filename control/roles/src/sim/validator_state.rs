//! A simulated validator: an identity and the real validator round
//! (`validation::round::ValidatorCore`), whose evidence checks the
//! simulator answers with what each miner really did.

use iota_core::{Identity, PeerId};

use crate::validation::round::ValidatorCore;

/// A set of peers hashed by their first eight bytes (a peer id is a public
/// key: its bytes are as good as a hash, and cheaper than hashing them).
pub(super) type PeerSet = std::collections::HashSet<PeerId, std::hash::BuildHasherDefault<PeerIdHasher>>;
/// A map keyed by peers, hashed the same way.
pub(super) type PeerMap<V> = std::collections::HashMap<PeerId, V, std::hash::BuildHasherDefault<PeerIdHasher>>;

#[derive(Default)]
pub(super) struct PeerIdHasher(u64);

impl std::hash::Hasher for PeerIdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8).take(1) {
            let mut b = [0u8; 8];
            b[..chunk.len()].copy_from_slice(chunk);
            self.0 = self.0.rotate_left(17) ^ u64::from_le_bytes(b);
        }
    }
}

/// A merge audit, as a simulated validator needs it: which partition of
/// which plan, and its participants then.
#[derive(Debug)]
pub(super) struct AuditAsk {
    pub(super) epoch: u64,
    pub(super) stage: u32,
    pub(super) partition: u32,
    pub(super) generation: u32,
    pub(super) offset: u64,
    /// The id of the context (plan) it was read under.
    pub(super) context: Vec<u8>,
    pub(super) participants: Vec<PeerId>,
    /// The participants an audit finds flagged or unbound (their modes').
    pub(super) flagged: Vec<PeerId>,
    pub(super) unbound: Vec<PeerId>,
}

pub(super) struct SimValidator {
    pub(super) peer: PeerId,
    pub(super) core: ValidatorCore,
    /// Registered and subscribed (it then heartbeats and ticks its round).
    pub(super) joined: bool,
    /// When its last report reaches the orchestrator (they arrive in the
    /// order sent).
    pub(super) last_sent_ms: u64,
}

/// Validator `j`'s identity in a run of `seed`: a function of both, so the
/// run's spec (which lists the validators' stakes) is one too.
pub(super) fn validator_peer(seed: u64, j: usize) -> PeerId {
    let mut h = blake3::Hasher::new();
    h.update(b"iota sim validator");
    h.update(&seed.to_le_bytes());
    h.update(&(j as u64).to_le_bytes());
    Identity::from_seed(*h.finalize().as_bytes()).peer_id()
}

/// The hash of a partition's honest update (what honest owners report).
pub(super) fn slice_hash(partition: u32) -> [u8; 32] {
    let mut h = [1u8; 32];
    h[..4].copy_from_slice(&partition.to_le_bytes());
    h
}

/// The hash of a stage's honestly merged weights in `epoch`.
pub(super) fn merged_hash(epoch: u64, stage: u32) -> [u8; 32] {
    let mut h = [7u8; 32];
    h[..8].copy_from_slice(&epoch.to_le_bytes());
    h[8..12].copy_from_slice(&stage.to_le_bytes());
    h
}
