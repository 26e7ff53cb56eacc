//! Evidence asks: a validator names attempts of one miner it drew; the
//! orchestrator relays the first ask of each to the miner and hands stored
//! evidence to every validator that asked (PROTOCOL.md, "Validation"). Of
//! one attempt per miner a validator asks the inner steps too: relayed the
//! same way, once, and its object (which shows them) goes to every asker.
//! A validator whose recompute of one of those steps failed may then ask
//! the miner's signed trace of it (once per miner a round), which turns
//! the failure into a proof (PROTOCOL.md, "A failed step as a proof").

use std::collections::{BTreeMap, BTreeSet};

use iota_core::PeerId;
use iota_wire::store_keys::{parse_trace_key, upload_prefix};
use iota_wire::{StoredObject, pb};

use super::validating::stored_cmd;
use super::validation_state::{MAX_WORK_ITEMS, WorkKey};
use super::{MbStatus, Orchestrator, Out, Refusal};
use crate::validation::sample::SampleRate;

impl Orchestrator {
    /// A validator asks for the evidence of attempts of one miner.
    pub(super) fn on_evidence_ask(
        &mut self,
        validator: PeerId,
        (epoch, miner): (u64, PeerId),
        (items, inner_step): (Vec<WorkKey>, Option<WorkKey>),
        out: &mut Vec<Out>,
    ) -> Result<(), Refusal> {
        self.open_round(&validator, epoch)?;
        let stage = self.miners.get(&miner).map(|m| m.stage).ok_or(Refusal::Unknown(miner))?;
        // Only attempts the miner completed this epoch: a validator cannot
        // make a miner upload arbitrary objects.
        // Each completed attempt with the miner downstream of it on its
        // pathway (None at the tail).
        let mbs = &self.mbs;
        let completed: BTreeMap<WorkKey, Option<PeerId>> = self
            .done_index
            .of(self.epoch, self.counters.completed, mbs, miner)
            .iter()
            .filter_map(|seq| mbs.get(seq))
            .filter_map(|r| match &r.status {
                MbStatus::Done { attempt, pathway, .. } if pathway.get(stage as usize) == Some(&miner) => {
                    let downstream = pathway.get(stage as usize + 1).copied();
                    Some(((r.mb.shard, r.mb.first_sample, *attempt), downstream))
                }
                _ => None,
            })
            .collect();
        if let Some(bad) = items.iter().find(|k| !completed.contains_key(k)) {
            return Err(Refusal::Invalid(format!("miner {miner} completed no attempt {bad:?} in epoch {epoch}")));
        }
        if let Some(k) = inner_step.filter(|k| !items.contains(k)) {
            return Err(Refusal::Invalid(format!("the inner steps of {k:?} asked without the attempt")));
        }
        let r = self.validation.round.as_mut().expect("checked open");
        // A validator asks for its draw and nothing more: as many of the
        // miner's attempts as the run's sample rate draws from them. A
        // validator asking for more (every attempt of every miner) would
        // make miners upload for it what honest validators then wait
        // behind. Beyond it, only the attempts it already asked of the
        // miner downstream on their pathway: what that miner sent this one
        // (its gradient) is held against what this one received (both
        // ends of a lane, `validation::lanes`); at most one such attempt
        // per attempt asked downstream.
        let rate =
            SampleRate { rate: self.spec.validation.rate, min_per_miner: self.spec.validation.min_per_miner as usize };
        let draw = rate.count(completed.len().min(MAX_WORK_ITEMS));
        let asked_downstream = |k: &WorkKey| {
            completed
                .get(k)
                .copied()
                .flatten()
                .is_some_and(|d| r.asked.get(&(d, *k)).is_some_and(|vs| vs.contains(&validator)))
        };
        let lo = (miner, (0, 0, 0));
        let hi = (miner, (u32::MAX, u64::MAX, u32::MAX));
        let already: BTreeSet<WorkKey> =
            r.asked.range(lo..=hi).filter(|(_, vs)| vs.contains(&validator)).map(|((_, k), _)| *k).collect();
        let fresh: BTreeSet<&WorkKey> = items.iter().filter(|k| !already.contains(k)).collect();
        let own = |k: &&WorkKey| !asked_downstream(k);
        let counted = already.iter().filter(own).count().saturating_add(fresh.iter().filter(|k| own(k)).count());
        if counted > draw {
            return Err(Refusal::Invalid(format!(
                "validator {validator} asked for {counted} attempts of miner {miner} in epoch {epoch} beyond those \
                 it asked of their downstream miners; its draw is {draw} (the run's sample rate of the miner's {} \
                 completed attempts)",
                completed.len()
            )));
        }
        // The inner steps of one attempt per miner: what a step's object
        // adds (AdamW's state and a few weights states) is asked once.
        if let Some(k) = inner_step
            && r.step_asked.range(lo..=hi).any(|((_, other), vs)| *other != k && vs.contains(&validator))
        {
            return Err(Refusal::Invalid(format!(
                "validator {validator} asked the inner steps of another attempt of miner {miner} in epoch {epoch}; \
                 one per miner a round"
            )));
        }
        let mut request = Vec::new();
        for k in items {
            let key = (miner, k);
            let stored = r.evidence.contains_key(&key) || r.step_evidence.contains_key(&key);
            let askers = r.asked.entry(key).or_default();
            // The first ask goes to the miner; so does a validator's second
            // ask for evidence not yet stored (the request, or the miner's
            // upload, was lost: a validator asks again once, half-way to
            // its evidence timeout). Either object answers a plain ask.
            let plain = askers.is_empty() || (!stored && askers.contains(&validator));
            askers.insert(validator);
            let (ask, object) = if inner_step == Some(k) {
                let steppers = r.step_asked.entry(key).or_default();
                let stored = r.step_evidence.get(&key);
                let ask = steppers.is_empty() || (stored.is_none() && steppers.contains(&validator));
                steppers.insert(validator);
                (ask.then_some(true), stored)
            } else {
                (plain.then_some(false), r.step_evidence.get(&key).or_else(|| r.evidence.get(&key)))
            };
            if let Some(inner_step) = ask {
                request.push(pb::WorkRef { shard: k.0, first_sample: k.1, attempt: k.2, inner_step, trace_step: 0 });
            }
            if let Some(o) = object {
                out.push(Out { to: validator, cmd: pb::command::Kind::Stored(stored_cmd(epoch, stage, o)) });
            }
        }
        if !request.is_empty() {
            out.push(Out {
                to: miner,
                cmd: pb::command::Kind::EvidenceRequest(pb::EvidenceRequest { epoch, items: request }),
            });
        }
        Ok(())
    }

    /// A validator asks for the miner's signed trace of inner step `step`
    /// of attempt `key`, whose step object it asked for and which is
    /// stored: relayed to the miner once per (attempt, step), handed to
    /// every validator that asked once stored. One trace per miner and
    /// validator a round.
    pub(super) fn on_trace_ask(
        &mut self,
        validator: PeerId,
        (epoch, miner): (u64, PeerId),
        (key, step): (WorkKey, u32),
        out: &mut Vec<Out>,
    ) -> Result<(), Refusal> {
        self.open_round(&validator, epoch)?;
        let stage = self.miners.get(&miner).map(|m| m.stage).ok_or(Refusal::Unknown(miner))?;
        let r = self.validation.round.as_mut().expect("checked open");
        if !r.step_asked.get(&(miner, key)).is_some_and(|vs| vs.contains(&validator)) {
            return Err(Refusal::Invalid(format!(
                "a trace of attempt {key:?} of miner {miner} asked by a validator that did not ask its inner steps"
            )));
        }
        if !r.step_evidence.contains_key(&(miner, key)) {
            return Err(Refusal::Invalid(format!(
                "a trace of attempt {key:?} asked before its inner steps are stored"
            )));
        }
        let lo = (miner, (0, 0, 0), 0);
        let hi = (miner, (u32::MAX, u64::MAX, u32::MAX), u32::MAX);
        if r.trace_asked.range(lo..=hi).any(|(k, vs)| *k != (miner, key, step) && vs.contains(&validator)) {
            return Err(Refusal::Invalid(format!(
                "validator {validator} asked another trace of miner {miner} in epoch {epoch}; one per miner a round"
            )));
        }
        let askers = r.trace_asked.entry((miner, key, step)).or_default();
        // The first ask goes to the miner, and a validator's second one
        // while nothing is stored (a request or an upload lost).
        let stored = r.trace_evidence.get(&(miner, key, step));
        let relay = askers.is_empty() || (stored.is_none() && askers.contains(&validator));
        askers.insert(validator);
        if let Some(o) = stored {
            out.push(Out { to: validator, cmd: pb::command::Kind::Stored(stored_cmd(epoch, stage, o)) });
        }
        if relay {
            let item = pb::WorkRef {
                shard: key.0,
                first_sample: key.1,
                attempt: key.2,
                inner_step: true,
                trace_step: step.saturating_add(1),
            };
            out.push(Out {
                to: miner,
                cmd: pb::command::Kind::EvidenceRequest(pb::EvidenceRequest { epoch, items: vec![item] }),
            });
        }
        Ok(())
    }
}

/// The attempt an evidence key names, and whether its object shows the
/// inner steps.
fn evidence_name(key: &str, epoch: u64, miner: &PeerId) -> Option<(WorkKey, bool)> {
    iota_wire::store_keys::parse_any_evidence_key(key, epoch, miner)
}

impl Orchestrator {
    pub(super) fn is_evidence_key(&self, key: &str) -> bool {
        key.contains("/evidence/")
    }

    /// Whether `peer` (a miner) may write `key`: evidence it was asked for.
    pub(super) fn may_write_evidence(&self, peer: &PeerId, key: &str) -> bool {
        let Some(r) = self.validation.round.as_ref().filter(|r| r.epoch == self.epoch) else { return false };
        if let Some((k, step)) = parse_trace_key(key, r.epoch, peer) {
            return r.trace_asked.contains_key(&(*peer, k, step));
        }
        evidence_name(key, r.epoch, peer).is_some_and(|(k, step)| match step {
            true => r.step_asked.contains_key(&(*peer, k)),
            false => r.asked.contains_key(&(*peer, k)),
        })
    }

    /// Whether `peer` (a validator) may read `key`: announced evidence.
    pub(super) fn may_read_evidence(&self, peer: &PeerId, key: &str) -> bool {
        self.is_validator(peer)
            && self.validation.round.as_ref().is_some_and(|r| {
                let mut all = r.evidence.values().chain(r.step_evidence.values()).chain(r.trace_evidence.values());
                all.any(|o| o.key == key)
            })
    }

    /// A miner announced the evidence it was asked for: recorded, and
    /// handed to every validator that asked.
    pub(super) fn on_evidence_stored(
        &mut self,
        peer: PeerId,
        epoch: u64,
        stage: u32,
        obj: StoredObject,
        out: &mut Vec<Out>,
    ) -> Result<(), Refusal> {
        let not_yours = |why: &str| Refusal::NotYours(format!("object {}: {why}", obj.key));
        let r = self
            .validation
            .round
            .as_mut()
            .filter(|r| r.epoch == epoch && obj.key.starts_with(&upload_prefix(epoch)))
            .ok_or_else(|| not_yours("no validation round of that epoch is open"))?;
        if obj.is_part() {
            return Err(not_yours("evidence is one object, not a part"));
        }
        if let Some((k, step)) = parse_trace_key(&obj.key, epoch, &peer) {
            let askers = r.trace_asked.get(&(peer, k, step)).ok_or_else(|| not_yours("nobody asked for that trace"))?;
            for v in askers {
                out.push(Out { to: *v, cmd: pb::command::Kind::Stored(stored_cmd(epoch, stage, &obj)) });
            }
            r.trace_evidence.insert((peer, k, step), obj);
            return Ok(());
        }
        let (k, step) =
            evidence_name(&obj.key, epoch, &peer).ok_or_else(|| not_yours("not the announcer's evidence key"))?;
        let askers = r.asked.get(&(peer, k)).ok_or_else(|| not_yours("nobody asked for that evidence"))?;
        let steppers = r.step_asked.get(&(peer, k));
        if step && steppers.is_none() {
            return Err(not_yours("nobody asked for that attempt's inner steps"));
        }
        if obj.is_part() {
            return Err(not_yours("evidence is one object, not a part"));
        }
        // The object that shows the inner steps answers every asker; the
        // plain one, those that did not ask for them.
        for v in askers.iter().filter(|v| step || !steppers.is_some_and(|s| s.contains(v))) {
            out.push(Out { to: *v, cmd: pb::command::Kind::Stored(stored_cmd(epoch, stage, &obj)) });
        }
        match step {
            true => r.step_evidence.insert((peer, k), obj),
            false => r.evidence.insert((peer, k), obj),
        };
        Ok(())
    }
}

#[cfg(test)]
mod key_tests {
    use super::*;

    #[test]
    fn evidence_keys_parse_back_to_their_attempt_only() {
        let m = PeerId([5; 32]);
        let k = iota_wire::store_keys::evidence_key(3, &m, 2, 640, 1);
        assert_eq!(evidence_name(&k, 3, &m), Some(((2, 640, 1), false)));
        let step = iota_wire::store_keys::step_evidence_key(3, &m, 2, 640, 1);
        assert_eq!(evidence_name(&step, 3, &m), Some(((2, 640, 1), true)), "the one showing the inner steps");
        assert_eq!(iota_wire::store_keys::parse_evidence_key(&step, 3, &m), None, "not a plain evidence key");
        assert_eq!(evidence_name(&k, 4, &m), None, "another epoch");
        assert_eq!(evidence_name(&k, 3, &PeerId([6; 32])), None, "another miner's");
        for bad in [format!("{k}x"), k.replace(".evidence", ".f32"), k.replace("-001", "-1"), k.replace("000002-", "")]
        {
            assert_eq!(evidence_name(&bad, 3, &m), None, "{bad}");
        }
    }
}
