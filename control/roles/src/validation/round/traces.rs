//! A failed inner step proven before the vote (PROTOCOL.md, "A failed
//! step as a proof"): the round asks the miner's signed trace of the step
//! whose recompute failed, hands the trace to the shell to prove
//! (`Action::Prove`), and votes with the proof (`proved`). Without a
//! trace within half the round's evidence timeout from the ask, or with
//! one that proves nothing (it does not bind, or agrees with the
//! validator's own), the vote goes without a proof, as before.

use iota_core::PeerId;
use iota_wire::StoredObject;

use super::{Action, CheckJob, ProveJob, Round, ValidatorCore, Verdicts, WorkKey};
use crate::validation::round_io::TraceWait;

impl Verdicts {
    /// Waits for the trace of `step` of `job`'s step object: the ask.
    pub(super) fn ask_trace(&mut self, job: &CheckJob, step: u32, reason: String) -> Action {
        self.trace = Some(TraceWait { job: Box::new(job.clone()), step, reason, asked_ms: None, proving: false });
        let (epoch, miner, key) = (job.epoch, job.miner, job.key);
        Action::Ask { epoch, miner, items: vec![key], inner_step: Some(key), trace: Some(step) }
    }
}

impl Round {
    /// The trace object `obj` of `miner` came: proven if it is the one
    /// waited for.
    pub(super) fn trace_arrived(
        &mut self,
        miner: PeerId,
        (key, step): (WorkKey, u32),
        obj: StoredObject,
    ) -> Vec<Action> {
        let Some(v) = self.drawn.get_mut(&miner).filter(|v| !v.voted) else { return Vec::new() };
        let Some(t) = v.trace.as_mut().filter(|t| !t.proving && t.job.key == key && t.step == step) else {
            return Vec::new();
        };
        t.proving = true;
        vec![Action::Prove(Box::new(ProveJob { job: (*t.job).clone(), step, trace: obj }))]
    }

    /// Votes, without a proof, the miners whose trace did not come within
    /// half the round's evidence timeout of its ask; whether any was voted.
    pub(super) fn traces_overdue(&mut self, now: u64, out: &mut Vec<Action>) -> bool {
        let allowance = self.timeout_ms / 2;
        let mut late = Vec::new();
        for (miner, v) in self.drawn.iter_mut().filter(|(_, v)| !v.voted) {
            let Some(t) = v.trace.as_mut().filter(|t| !t.proving) else { continue };
            let asked = *t.asked_ms.get_or_insert(now);
            if now.saturating_sub(asked) > allowance {
                late.push((*miner, format!("{}; no trace of inner step {} within {allowance} ms", t.reason, t.step)));
            }
        }
        let any = !late.is_empty();
        for (miner, reason) in late {
            self.vote_guilty(miner, reason, Vec::new(), out);
        }
        any
    }
}

impl ValidatorCore {
    /// The shell's proof of `p`: `Ok(bytes)`, a `StepProof` that holds
    /// (the vote carries it); `Err(why)`, none (the trace does not bind,
    /// is not signed, or agrees with the validator's own): the vote goes
    /// without a proof, naming why.
    pub fn proved(&mut self, p: &ProveJob, result: Result<Vec<u8>, String>) -> Vec<Action> {
        let mut out = Vec::new();
        let Some(r) = self.round.as_mut().filter(|r| r.epoch == p.job.epoch) else { return out };
        let miner = p.job.miner;
        let Some(t) = r.drawn.get_mut(&miner).and_then(|v| v.trace.take()) else { return out };
        match result {
            Ok(proof) => {
                let reason = format!("{} (proven from its trace of inner step {})", t.reason, t.step);
                r.vote_guilty_proven(miner, reason, (Vec::new(), proof), &mut out);
            }
            Err(why) => {
                let reason = format!("{}; its trace of inner step {} proves nothing: {why}", t.reason, t.step);
                r.vote_guilty(miner, reason, Vec::new(), &mut out);
            }
        }
        self.finish(&mut out);
        out
    }
}
