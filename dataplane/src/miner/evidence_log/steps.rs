//! What an epoch's evidence keeps of its inner steps, so that a drawn
//! attempt's bundle can show the step its backward went into
//! (`iota_checks::inner_step`): the steps chain's records (the carried one
//! first), and per step of the epoch the optimizer state it stepped from
//! (a snapshot of m and v, kept and spilled like the weights; the spill
//! files' slots are past every weights state's) and the neighbours that
//! signed each of its micro-batches' frames. The frames themselves and the
//! weights states are the attempts' and versions' already kept.

use iota_core::commitment::Chain;

use super::{EpochEvidence, MbKey, Snapshot};
use crate::inner_step::{MbFrames, OptimizerState, StepEvidence, StepHeader};

/// Spill slots of optimizer states start here (weights states count up from 0).
const OPTIMIZER_SLOTS: usize = 1 << 24;

/// One step of the epoch.
pub(super) struct StepState {
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
    /// The record the epoch's optimizer state comes from.
    pub(super) fn carry(&mut self, header: StepHeader, before: Chain) {
        if self.headers.is_empty() {
            self.headers.push(header);
            self.carried = true;
            self.carried_before = before;
        }
    }

    fn own(&self) -> &[StepHeader] {
        self.headers.get(usize::from(self.carried)..).unwrap_or(&[])
    }
}

impl EpochEvidence {
    /// Whether the epoch has a steps chain to show (a miner keeps one when
    /// its run has validators).
    pub(super) fn steps_kept(&self) -> bool {
        !self.steps.headers.is_empty()
    }

    /// An inner step about to be taken from the current weights state:
    /// its record, the optimizer state it steps from, and its
    /// micro-batches' frames' signers.
    pub(super) fn record_step(
        &mut self,
        header: StepHeader,
        optimizer: OptimizerState,
        signers: Vec<([u8; 32], [u8; 32])>,
        budget: usize,
        spill: Option<&super::SpillDir>,
    ) {
        // The step reads the current state: it must stay showable.
        if let Some(v) = self.versions.last_mut() {
            v.used = true;
        }
        let slot = OPTIMIZER_SLOTS.saturating_add(self.steps.states.len());
        let OptimizerState { t, mut m, v } = optimizer;
        m.extend_from_slice(&v);
        drop(v);
        let moments = self.keep(slot, m, budget, spill);
        self.steps.headers.push(header);
        self.steps.states.push(StepState { t, moments, signers });
    }

    /// What `key`'s bundle shows of its step: None where the attempt is
    /// in no step (the epoch's last accumulation) and the chain is empty.
    pub(super) fn step_evidence(&mut self, key: MbKey) -> Result<StepEvidence, &'static str> {
        let sealed = self.sealed.unwrap_or(self.step_hashes.len());
        let committed = sealed.saturating_add(usize::from(self.steps.carried));
        let headers = self.steps.headers.get(..committed).ok_or("the step records are not kept")?.to_vec();
        let carried = self.steps.carried;
        let (_, shard, first, attempt) = key;
        let own = self.steps.own().get(..sealed).unwrap_or(&[]);
        let index = own
            .iter()
            .position(|h| h.mbs.iter().any(|m| (m.shard, m.first_sample, m.attempt) == (shard, first, attempt)));
        let carried_before = self.steps.carried_before;
        let mut ev = StepEvidence { headers, carried, carried_before, ..Default::default() };
        let Some(i) = index else { return Ok(ev) };
        let header = own.get(i).ok_or("step")?.clone();
        ev.index = Some(u32::try_from(i).map_err(|_| "step index")?);
        // The weights states the step reads, once each.
        let mut wanted = vec![header.weights_before];
        for m in &header.mbs {
            if !wanted.contains(&m.weights) {
                wanted.push(m.weights);
            }
        }
        for h in &wanted {
            let v = self
                .versions
                .iter_mut()
                .rev()
                .find(|v| v.hash == *h)
                .ok_or("a weights state of the step is not kept")?;
            ev.weights.push(v.load().map_err(|_| "a weights state of the step was not kept")?);
        }
        let state = self.steps.states.get_mut(i).ok_or("the step's optimizer state is not kept")?;
        let moments = match &mut state.moments {
            Snapshot::Memory(x) => x.clone(),
            Snapshot::Disk(s) => s.load()?,
            Snapshot::None => return Err("the step's optimizer state was not kept"),
        };
        let half = moments.len() / 2;
        let (m, v) = moments.split_at(half);
        ev.optimizer = OptimizerState { t: state.t, m: m.to_vec(), v: v.to_vec() };
        let signers = state.signers.clone();
        for (mb, (input_signer, grad_signer)) in header.mbs.iter().zip(signers) {
            // A whole-model stage keeps no frames (it needs none); elsewhere
            // a frame not kept shows as none, and the step cannot be shown.
            let a = self.attempts.get(&(key.0, mb.shard, mb.first_sample, mb.attempt));
            let input = a.and_then(|a| a.input_frame.clone()).unwrap_or_default();
            let grad = a.and_then(|a| a.backward.as_ref()).map(|(f, _)| f.clone()).unwrap_or_default();
            ev.frames.push(MbFrames { input, input_signer, grad, grad_signer });
        }
        Ok(ev)
    }
}
