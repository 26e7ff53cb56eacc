//! The records of a worker's inner steps (`iota_checks::inner_step`), kept
//! only in a run with validators: per step, the micro-batches whose
//! backwards it accumulated (each with the hash of the weights its forward
//! ran on, and the neighbours that signed its frames), the weights and the
//! optimizer state before and after. The worker commits each record's
//! hash (`Commitments::step`) and hands the record to its evidence log.

use std::collections::HashMap;

use iota_core::commitment::Chain;

use crate::inner_step::{OptimizerState, StepHeader, StepMb};
use crate::miner::evidence_log::{MAX_ATTEMPTS, MbKey};

/// Who signed a micro-batch's input frame and its gradient frame.
pub(super) type Signers = ([u8; 32], [u8; 32]);

#[derive(Default)]
pub(super) struct StepRecorder {
    /// The hash of the weights in place.
    weights: [u8; 32],
    /// The optimizer state in place, as a host copy, and its hash.
    optimizer: OptimizerState,
    optimizer_hash: [u8; 32],
    /// The weights each micro-batch in flight was forwarded with.
    forwarded: HashMap<MbKey, [u8; 32]>,
    /// The accumulation so far, in the order the backwards ran.
    pending: Vec<(StepMb, Signers)>,
    /// The record of the last step on this stage (the next epoch carries
    /// its optimizer state in), the epoch whose steps chain it was last
    /// put on, and that chain just before it (what shows it ended there).
    last: Option<StepHeader>,
    last_epoch: u64,
    last_before: Chain,
}

impl StepRecorder {
    /// A stage was assigned: a fresh optimizer of `n` weights, and no step
    /// taken on it.
    pub(super) fn assigned(&mut self, n: usize) {
        self.optimizer = OptimizerState::fresh(n);
        self.optimizer_hash = self.optimizer.hash();
        self.last = None;
        self.forwarded.clear();
        self.pending.clear();
    }

    /// `epoch`'s training starts on weights with hash `weights`. Returns
    /// the record its steps chain is to be led by (the last step before
    /// it) with the chain it ended (what a validator holds it against),
    /// or None, where the optimizer starts fresh: no step yet, or the last
    /// record is not on the epoch before's chain (the miner sat an epoch
    /// out: `carry_lost` then, and the caller resets its optimizer).
    pub(super) fn epoch_started(&mut self, epoch: u64, weights: [u8; 32]) -> (Option<(StepHeader, Chain)>, bool) {
        self.weights = weights;
        self.forwarded.clear();
        self.pending.clear();
        match self.last.clone() {
            Some(h) if self.last_epoch.checked_add(1) == Some(epoch) => (Some((h, self.last_before)), false),
            Some(_) => (None, true),
            None => (None, false),
        }
    }

    /// The record carried in was put first on `epoch`'s steps chain.
    pub(super) fn carried(&mut self, epoch: u64) {
        self.last_epoch = epoch;
        self.last_before = Chain::default();
    }

    /// The weights were replaced during training (a late merge).
    pub(super) fn weights_replaced(&mut self, weights: [u8; 32]) {
        self.weights = weights;
    }

    /// A forward of `key` ran on the weights in place.
    pub(super) fn forwarded(&mut self, key: MbKey) {
        if self.forwarded.len() < MAX_ATTEMPTS {
            self.forwarded.insert(key, self.weights);
        }
    }

    /// A forward abandoned (its backward will not come).
    pub(super) fn dropped(&mut self, key: &MbKey) {
        self.forwarded.remove(key);
    }

    /// The backward of `key`, a micro-batch of `samples`, went into the
    /// accumulation; `prev` and `next` are its pathway's neighbours.
    pub(super) fn finished(&mut self, key: MbKey, samples: u32, prev: Option<&[u8]>, next: Option<&[u8]>) {
        let (_, shard, first_sample, attempt) = key;
        let weights = self.forwarded.remove(&key).unwrap_or(self.weights);
        let id = |p: Option<&[u8]>| p.and_then(|p| <[u8; 32]>::try_from(p).ok()).unwrap_or([0; 32]);
        self.pending.push((StepMb { shard, first_sample, samples, attempt, weights }, (id(prev), id(next))));
    }

    /// The step counted `step` was taken (or, by a lazy test miner, not):
    /// the weights it left hash to `weights`, the optimizer state is
    /// `optimizer`. Returns its record, the optimizer state it stepped
    /// from, and its micro-batches' signers.
    /// `epoch` and `chain_before` say where its record goes: that epoch's
    /// steps chain, as it stands before.
    pub(super) fn stepped(
        &mut self,
        (epoch, chain_before): (u64, Chain),
        step: u64,
        weights: [u8; 32],
        optimizer: OptimizerState,
    ) -> (StepHeader, OptimizerState, Vec<Signers>) {
        let (mbs, signers) = std::mem::take(&mut self.pending).into_iter().unzip();
        let optimizer_after = optimizer.hash();
        let header = StepHeader {
            step,
            mbs,
            weights_before: self.weights,
            weights_after: weights,
            optimizer_before: self.optimizer_hash,
            optimizer_after,
        };
        let before = std::mem::replace(&mut self.optimizer, optimizer);
        self.optimizer_hash = optimizer_after;
        self.weights = weights;
        self.last = Some(header.clone());
        (self.last_epoch, self.last_before) = (epoch, chain_before);
        (header, before, signers)
    }
}
