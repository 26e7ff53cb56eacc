//! The honest miner's side of the protocol, as the simulator acts it:
//! routes carried through their pathways, uploads, merge reports and
//! stored slices (the adversary modes bend it in `cheating.rs`).

use std::rc::Rc;

use iota_core::PeerId;
use iota_core::merge::MergePlan;
use iota_wire::store_keys::{momentum_parts_prefix, part_name, weights_parts_prefix};
use iota_wire::{MbRef, StoredObject, pb, plan_from_pb};

use super::evidence::heads;
use super::validator_state::merged_hash;
use super::{Happening, World};
use crate::orchestrator::{Event, Ms};

impl World {
    pub(super) fn reach_miner(&mut self, i: usize, cmd: pb::command::Kind) {
        let me = self.miners[i].peer;
        match cmd {
            pb::command::Kind::Route(r) => {
                let path: Vec<usize> = r
                    .pathway
                    .iter()
                    .filter_map(|b| <[u8; 32]>::try_from(b.as_slice()).ok())
                    .filter_map(|p| self.index.get(&PeerId(p)).copied())
                    .collect();
                // The head drives it; the rest act on their frames.
                if path.first() != Some(&i) || path.len() != r.pathway.len() {
                    return;
                }
                let mb = MbRef { epoch: r.epoch, shard: r.shard, first_sample: r.first_sample };
                let Some(extra) = self.pathway_faults(&path, mb, &r) else { return };
                let hops: Ms = (0..2 * path.len()).map(|_| self.delay()).sum();
                let t = self.now + 2 * self.cfg.stage_ms * path.len() as Ms + hops + extra;
                let tail = *path.last().unwrap_or(&i);
                self.at(t, Happening::Finished { head: i, tail, mb, attempt: r.attempt, path });
            }
            pb::command::Kind::Phase(p) => self.on_phase(i, me, p),
            pb::command::Kind::Verdict(v) => self.on_verdict(i, me, v),
            pb::command::Kind::EvidenceRequest(r) => self.upload_evidence(i, me, r),
            pb::command::Kind::ContributionRequest(r) => self.store_contributions(i, me, r),
            // Not even queued (`acts_on`, in miner_commands.rs).
            _ => {}
        }
    }

    fn on_phase(&mut self, i: usize, me: PeerId, mut p: pb::PhaseChange) {
        let Some(stage) = self.o.miner(&me).map(|m| m.stage) else { return };
        if p.phase == pb::Phase::Uploading as i32 {
            let key = format!("{}stage-{stage:03}/{}.safetensors", p.upload_prefix, me.to_hex());
            let work = self.o.miner(&me).map_or(0, |m| m.work);
            let commitments = vec![heads(&me, p.epoch, work)];
            let ev = Event::UploadDone { peer: me, epoch: p.epoch, stage, key, work, object: None, commitments };
            self.send_after(i, self.cfg.store_ms, ev);
        } else if let Some(plan) = p.merge_plan.take().and_then(|pl| self.parsed_phase_plan(pl)) {
            for k in plan.owned_by(&me).collect::<Vec<_>>() {
                let ev = self.slice_report(i, &plan, k);
                self.send_after(i, self.cfg.store_ms, ev);
            }
        }
    }

    /// `pl` parsed: the last one's parse when it is the same plan.
    fn parsed_phase_plan(&mut self, pl: pb::MergePlan) -> Option<Rc<MergePlan>> {
        if let Some((sent, parsed)) = &self.phase_plan
            && *sent == pl
        {
            return Some(Rc::clone(parsed));
        }
        let parsed = Rc::new(plan_from_pb(&pl).ok()?);
        self.phase_plan = Some((pl, Rc::clone(&parsed)));
        Some(parsed)
    }

    fn on_verdict(&mut self, i: usize, me: PeerId, v: pb::SliceVerdict) {
        // What it needs of the current plan (not a copy of it: a plan of R
        // participants is heard R times per partition).
        let Some(plan) = self.o.merge_plan(v.stage).filter(|p| p.is_participant(&me)) else { return };
        let partitions = plan.partitions.len();
        let Some(part) = plan.partitions.get(v.partition as usize).map(|p| (p.offset, p.len)) else { return };
        if v.writer == me.0.to_vec() {
            let (offset, len) = part;
            let name = part_name(offset, len);
            let bytes = vec![v.partition as u8; len as usize * 4];
            for prefix in [weights_parts_prefix(v.epoch, v.stage), momentum_parts_prefix(v.epoch, v.stage)] {
                let object = StoredObject::part(&format!("{prefix}{name}"), &bytes, offset, me);
                self.send_after(
                    i,
                    self.cfg.store_ms,
                    Event::Stored { peer: me, epoch: v.epoch, stage: v.stage, object },
                );
            }
        }
        let heard = &mut self.miners[i].verdicts;
        if heard.0 != v.epoch {
            *heard = (v.epoch, Default::default());
        }
        if heard.1.insert(v.partition) && heard.1.len() == partitions {
            let ev = Event::MergeDone {
                peer: me,
                epoch: v.epoch,
                stage: v.stage,
                key: String::new(),
                weights_hash: self.merged_report(i, merged_hash(v.epoch, v.stage)).to_vec(),
                object: None,
                from_store: (0, 0),
            };
            self.send_after(i, 2 * self.cfg.store_ms, ev);
        }
    }
}
