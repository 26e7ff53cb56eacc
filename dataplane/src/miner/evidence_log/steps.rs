//! What an epoch's evidence keeps of its inner steps, so that a drawn
//! attempt's bundle can show the step its backward went into
//! (`iota_checks::inner_step`): the steps chain's records (the carried one
//! first, with the chain it ended), and per step of the epoch the
//! optimizer state it stepped from (a snapshot of m and v, kept and
//! spilled like the weights; its spill slots are past every weights
//! state's) and the neighbours that signed each of its micro-batches'
//! frames. The frames themselves and the weights states are the attempts'
//! and versions' the log keeps already.

use iota_core::commitment::Chain;

use super::spill::Snapshot;
use crate::inner_step::{MbFrames, OptimizerState, StepEvidence, StepHeader};

/// Spill slots of optimizer states start here (weights states count up from 0).
pub(super) const OPTIMIZER_SLOTS: usize = 1 << 24;

/// One step of the epoch.
struct StepState {
    t: u64,
    /// m then v.
    moments: Snapshot,
    /// Per micro-batch, in the record's order: who signed its input frame
    /// and its gradient frame (zeros where there is none).
    signers: Vec<([u8; 32], [u8; 32])>,
}

#[derive(Default)]
pub(super) struct StepLog {
    headers: Vec<StepHeader>,
    carried: bool,
    carried_before: Chain,
    states: Vec<StepState>,
}

impl StepLog {
    /// The record the epoch's optimizer state comes from, and the chain
    /// (the epoch before's) it ended.
    pub(super) fn carry(&mut self, header: StepHeader, before: Chain) {
        if self.headers.is_empty() {
            self.headers.push(header);
            self.carried = true;
            self.carried_before = before;
        }
    }

    pub(super) fn has_records(&self) -> bool {
        !self.headers.is_empty()
    }

    /// Steps of the epoch recorded.
    pub(super) fn len(&self) -> usize {
        self.states.len()
    }

    pub(super) fn push(&mut self, header: StepHeader, t: u64, moments: Snapshot, signers: Vec<([u8; 32], [u8; 32])>) {
        self.headers.push(header);
        self.states.push(StepState { t, moments, signers });
    }

    /// What a bundle shows for the attempt `(shard, first sample,
    /// attempt)`, with `sealed` steps committed: every committed record
    /// and, where the attempt is in a step, that step's optimizer state
    /// before, the weights states it read (`load` by hash) and its
    /// micro-batches' frames (`frames`: the input's and the gradient's).
    pub(super) fn evidence(
        &mut self,
        sealed: usize,
        (shard, first, attempt): (u32, u64, u32),
        mut load: impl FnMut(&[u8; 32]) -> Result<Vec<f32>, &'static str>,
        frames: impl Fn(u32, u64, u32) -> (Vec<u8>, Vec<u8>),
    ) -> Result<StepEvidence, &'static str> {
        let committed = sealed.saturating_add(usize::from(self.carried));
        let headers = self.headers.get(..committed).ok_or("the step records are not kept")?.to_vec();
        let (carried, carried_before) = (self.carried, self.carried_before);
        let own = headers.get(usize::from(carried)..).unwrap_or(&[]);
        let lists =
            |h: &StepHeader| h.mbs.iter().any(|m| (m.shard, m.first_sample, m.attempt) == (shard, first, attempt));
        let index = own.iter().position(lists);
        let header = index.and_then(|i| own.get(i)).cloned();
        let mut ev = StepEvidence { headers, carried, carried_before, ..Default::default() };
        let (Some(i), Some(header)) = (index, header) else { return Ok(ev) };
        ev.index = Some(u32::try_from(i).map_err(|_| "step index")?);
        // The weights states the step reads, once each, and the one it
        // left (a validator on another backend compares weights within a
        // tolerance, not hashes).
        let mut wanted = vec![header.weights_before];
        for h in header.mbs.iter().map(|m| m.weights).chain([header.weights_after]) {
            if !wanted.contains(&h) {
                wanted.push(h);
            }
        }
        for h in &wanted {
            ev.weights.push(load(h)?);
        }
        let state = self.states.get_mut(i).ok_or("the step's optimizer state is not kept")?;
        let moments = state.moments.load().map_err(|_| "the step's optimizer state was not kept")?;
        let (m, v) = moments.split_at(moments.len() / 2);
        ev.optimizer = OptimizerState { t: state.t, m: m.to_vec(), v: v.to_vec() };
        for (mb, (input_signer, grad_signer)) in header.mbs.iter().zip(&state.signers) {
            let (input, grad) = frames(mb.shard, mb.first_sample, mb.attempt);
            ev.frames.push(MbFrames { input, input_signer: *input_signer, grad, grad_signer: *grad_signer });
        }
        Ok(ev)
    }
}
