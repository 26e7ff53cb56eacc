//! Deterministic sample addressing over a tokenised corpus.
//!
//! The training tokens are cut into equal shards; a validation span is kept
//! apart at the end. Sample `(epoch, shard, index)` is the window of seq+1
//! tokens at a position drawn from `(seed, epoch, shard, index)` inside its
//! shard: any process holding the corpus and the seed (a head stage, the
//! tail loading its own targets, a validator) gets the same tokens.

pub use iota_core::ids::CorpusId;
use iota_core::rng::derive;
use iota_core::{MicroBatchId, SampleId};

pub struct Corpus {
    id: CorpusId,
    tokens: Vec<u32>,
    shard_len: usize,
    shards: usize,
    val_start: usize,
}

impl Corpus {
    /// `val_fraction` of the tokens (at least two windows' worth when there
    /// is room) form the validation span; the rest is cut into at most
    /// `max_shards` shards of at least 4 windows each.
    pub fn new(tokens: Vec<u32>, seq: usize, max_shards: usize, val_fraction: f64) -> Result<Corpus, String> {
        let window = seq + 1;
        let need = 6 * window;
        if tokens.len() < need {
            return Err(format!("corpus has {} tokens; seq {seq} needs at least {need}", tokens.len()));
        }
        let val = ((tokens.len() as f64 * val_fraction) as usize).max(2 * window);
        let train = tokens.len() - val;
        let shards = (train / (4 * window)).clamp(1, max_shards.max(1));
        let shard_len = train / shards;
        Ok(Corpus { id: CorpusId::of(&tokens), val_start: tokens.len() - val, tokens, shard_len, shards })
    }

    /// The content this corpus was built from.
    pub fn id(&self) -> &CorpusId {
        &self.id
    }

    pub fn num_shards(&self) -> usize {
        self.shards
    }
    pub fn train_tokens(&self) -> usize {
        self.shard_len * self.shards
    }
    pub fn val_tokens(&self) -> usize {
        self.tokens.len() - self.val_start
    }

    fn window(&self, start: usize, len: usize, key: u64, seq: usize) -> &[u32] {
        let room = (len - seq) as u64; // windows of seq+1 tokens starting in [0, room)
        let off = start + (key % room) as usize;
        &self.tokens[off..off + seq + 1]
    }

    /// The seq+1 tokens of a training sample (inputs are `[..seq]`, targets `[1..]`).
    pub fn sample(&self, seed: u64, id: SampleId, seq: usize) -> &[u32] {
        let shard = id.shard as usize % self.shards;
        let key = derive(seed, &[id.epoch as u64, shard as u64, id.index]);
        self.window(shard * self.shard_len, self.shard_len, key, seq)
    }

    /// Inputs and targets of a micro-batch, `[len * seq]` each.
    pub fn micro_batch(&self, seed: u64, mb: MicroBatchId, seq: usize) -> (Vec<u32>, Vec<u32>) {
        let mut x = Vec::with_capacity(mb.len as usize * seq);
        let mut y = Vec::with_capacity(mb.len as usize * seq);
        for id in mb.samples() {
            let w = self.sample(seed, id, seq);
            x.extend_from_slice(&w[..seq]);
            y.extend_from_slice(&w[1..]);
        }
        (x, y)
    }

    /// Validation batch `i` (fixed for a seed, disjoint from training tokens).
    pub fn val_batch(&self, seed: u64, i: u64, batch: usize, seq: usize) -> (Vec<u32>, Vec<u32>) {
        let mut x = Vec::with_capacity(batch * seq);
        let mut y = Vec::with_capacity(batch * seq);
        for j in 0..batch as u64 {
            let key = derive(seed ^ 0x0076_616c, &[i, j]);
            let w = self.window(self.val_start, self.val_tokens(), key, seq);
            x.extend_from_slice(&w[..seq]);
            y.extend_from_slice(&w[1..]);
        }
        (x, y)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addressing_is_deterministic_and_inside_shards() {
        let tokens: Vec<u32> = (0..10_000).collect();
        let c = Corpus::new(tokens, 16, 8, 0.05).unwrap();
        assert_eq!(c.num_shards(), 8);
        let id = SampleId { epoch: 2, shard: 3, index: 41 };
        let a = c.sample(9, id, 16).to_vec();
        assert_eq!(a, c.sample(9, id, 16));
        assert_ne!(a, c.sample(10, id, 16));
        assert_eq!(a.len(), 17);
        // consecutive ids, inside shard 3, never in the validation span
        let lo = 3 * c.shard_len as u32;
        assert!(a.windows(2).all(|w| w[1] == w[0] + 1));
        assert!(a[0] >= lo && a[16] < lo + c.shard_len as u32);
        let (x, y) = c.micro_batch(9, MicroBatchId { first: id, len: 3 }, 16);
        assert_eq!(&x[..16], &a[..16]);
        assert_eq!(&y[..16], &a[1..]);
        let (vx, _) = c.val_batch(9, 0, 4, 16);
        assert!(vx.iter().all(|&t| t as usize >= c.val_start));
        assert!(Corpus::new(vec![0; 50], 16, 8, 0.05).is_err());
    }
}
