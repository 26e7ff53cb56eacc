//! Identifiers of training work.

use serde::{Deserialize, Serialize};

/// The address of one training sample: which epoch, which data shard, which
/// index inside that shard's sequence for the epoch. Together with the run
/// seed it fixes the sample's tokens, so any stage (and any validator) can load
/// the same tokens without them crossing the network.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct SampleId {
    pub epoch: u32,
    pub shard: u32,
    pub index: u64,
}

/// A micro-batch: `len` consecutive samples of one shard, starting at `first`.
/// Its `key()` is what a stage uses to find the activations it saved for the
/// backward pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct MicroBatchId {
    pub first: SampleId,
    pub len: u32,
}

impl MicroBatchId {
    pub fn samples(&self) -> impl Iterator<Item = SampleId> + '_ {
        (0..self.len as u64).map(move |i| SampleId { index: self.first.index + i, ..self.first })
    }

    /// A stable 64-bit key (used in maps and on the wire).
    pub fn key(&self) -> u64 {
        crate::rng::derive(
            0x6D62,
            &[self.first.epoch as u64, self.first.shard as u64, self.first.index, self.len as u64],
        )
    }
}

/// What identifies a corpus's content: its token count and the BLAKE3 hash
/// of its tokens (u32 little-endian). Two processes that loaded the same
/// corpus with the same tokenizer agree on it, wherever the file lives.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CorpusId {
    pub tokens: u64,
    pub blake3: String,
}

impl CorpusId {
    pub fn of(tokens: &[u32]) -> CorpusId {
        let mut h = blake3::Hasher::new();
        for chunk in tokens.chunks(1 << 14) {
            let bytes: Vec<u8> = chunk.iter().flat_map(|t| t.to_le_bytes()).collect();
            h.update(&bytes);
        }
        CorpusId { tokens: tokens.len() as u64, blake3: h.finalize().to_hex().to_string() }
    }
}
