//! What an epoch's evidence keeps of its inner steps, so that a drawn
//! attempt's bundle can show the step its backward went into
//! (`iota_checks::inner_step`): the steps chain's records (the carried one
//! first, with the chain it ended), and per step of the epoch the
//! neighbours that signed each of its micro-batches' frames and, at every
//! `validation.step_window`-th step, the optimizer state it stepped from
//! (a snapshot of m and v, kept and spilled like the weights; its spill
//! slots are past every weights state's). A drawn step is shown from the
//! last kept state before it, with every step between, which the
//! validator replays. The frames themselves and the weights states are
//! the attempts' and versions' the log keeps already.

use iota_core::commitment::Chain;

use super::spill::Snapshot;
use crate::inner_step::{MbFrames, OptimizerState, StepEvidence, StepHeader, shown_states};

/// Spill slots of optimizer states start here (weights states count up from 0).
pub(super) const OPTIMIZER_SLOTS: usize = 1 << 24;

/// One step of the epoch.
struct StepState {
    t: u64,
    /// m then v (`Snapshot::None` between kept states).
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

    /// Whether the next step's optimizer state is one to keep (every
    /// `window`-th of the epoch, from its first).
    pub(super) fn keeps_next(&self, window: usize) -> bool {
        self.states.len().is_multiple_of(window.max(1))
    }

    pub(super) fn push(&mut self, header: StepHeader, t: u64, moments: Snapshot, signers: Vec<([u8; 32], [u8; 32])>) {
        self.headers.push(header);
        self.states.push(StepState { t, moments, signers });
    }

    /// What a bundle shows for the attempt `(shard, first sample,
    /// attempt)`, with `sealed` steps committed and the optimizer state
    /// kept every `window` steps: every committed record and, where the
    /// attempt is in a step, the steps from the last kept state up to it
    /// (`StepEvidence::from`): that state, the weights states the replay
    /// needs shown (`load` by hash) and every micro-batch's frames
    /// (`frames`: the input's and the gradient's).
    pub(super) fn evidence(
        &mut self,
        (sealed, window): (usize, usize),
        (shard, first, attempt): (u32, u64, u32),
        mut load: impl FnMut(&[u8; 32]) -> Result<Vec<f32>, &'static str>,
        frames: impl Fn(u32, u64, u32) -> (Vec<u8>, Vec<u8>),
    ) -> Result<StepEvidence, &'static str> {
        let committed = sealed.saturating_add(usize::from(self.carried));
        let headers = self.headers.get(..committed).ok_or("the step records are not kept")?.to_vec();
        let (carried, carried_before) = (self.carried, self.carried_before);
        let own = headers.get(usize::from(carried)..).unwrap_or(&[]).to_vec();
        let lists =
            |h: &StepHeader| h.mbs.iter().any(|m| (m.shard, m.first_sample, m.attempt) == (shard, first, attempt));
        let index = own.iter().position(lists);
        let mut ev = StepEvidence { headers, carried, carried_before, ..Default::default() };
        let Some(i) = index else { return Ok(ev) };
        let from = i.saturating_sub(i % window.max(1));
        ev.index = Some(u32::try_from(i).map_err(|_| "step index")?);
        ev.from = u32::try_from(from).map_err(|_| "step index")?;
        let replayed = own.get(from..=i).ok_or("step")?;
        for h in shown_states(replayed) {
            ev.weights.push(load(&h)?);
        }
        let state = self.states.get_mut(from).ok_or("the step's optimizer state is not kept")?;
        let moments = state.moments.load().map_err(|_| "the step's optimizer state was not kept")?;
        let (m, v) = moments.split_at(moments.len() / 2);
        ev.optimizer = OptimizerState { t: state.t, m: m.to_vec(), v: v.to_vec() };
        for (header, state) in replayed.iter().zip(self.states.get(from..=i).unwrap_or(&[])) {
            for (mb, (input_signer, grad_signer)) in header.mbs.iter().zip(&state.signers) {
                let (input, grad) = frames(mb.shard, mb.first_sample, mb.attempt);
                ev.frames.push(MbFrames { input, input_signer: *input_signer, grad, grad_signer: *grad_signer });
            }
        }
        Ok(ev)
    }
}
