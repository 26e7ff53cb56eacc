//! Store objects announced by their writers: who may announce what, the
//! records readers are handed, and reports of objects that did not match.
//!
//! Any miner can write any key of a shared store, so a reader never lists
//! the store or trusts a name: it reads the keys in these records and checks
//! each object's size and hash before parsing it. An announcement is
//! accepted only from the miner the merge asked to write that object: the
//! verdict's writer of a butterfly partition (its merged slice and
//! momentum), a replica for its own upload, the aggregator for the merged
//! stage. Anything else is refused as `NotYours`, which the service logs
//! with the announcer.

use iota_core::PeerId;
use iota_wire::store_keys::{
    contrib_prefix, merged_key, momentum_parts_prefix, part_name, upload_prefix, weights_parts_prefix,
};
use iota_wire::{MergeMethod, StoredObject, pb};

use super::state::{BadObjectRecord, MAX_BAD_OBJECTS, StageObjects};
use super::{Orchestrator, Out, Refusal};

impl Orchestrator {
    fn stage_objects(&mut self, epoch: u64, stage: u32) -> &mut StageObjects {
        self.objects.entry(epoch).or_default().entry(stage).or_default()
    }

    pub(super) fn objects_of(&self, epoch: u64, stage: u32) -> Option<&StageObjects> {
        self.objects.get(&epoch)?.get(&stage)
    }

    /// Keeps the records of the epoch the current weights come from and
    /// later ones.
    pub(super) fn prune_objects(&mut self) {
        let keep_from = self.weights_epoch().unwrap_or(self.epoch).min(self.epoch.saturating_sub(1));
        self.objects.retain(|&e, _| e >= keep_from);
    }

    /// A `Stored` report: a butterfly writer stored a merged slice or its
    /// momentum.
    pub(super) fn on_stored(
        &mut self,
        peer: PeerId,
        epoch: u64,
        stage: u32,
        obj: StoredObject,
        out: &mut Vec<Out>,
    ) -> Result<(), Refusal> {
        let not_yours = |why: &str| Refusal::NotYours(format!("object {}: {why}", obj.key));
        let bm = self
            .butterfly
            .get(&stage)
            .filter(|m| m.plan.epoch == epoch)
            .ok_or_else(|| not_yours("no butterfly merge of that epoch and stage is in progress"))?;
        let k = bm
            .plan
            .partitions
            .iter()
            .position(|p| p.offset == obj.offset && p.len == obj.values && obj.is_part())
            .ok_or_else(|| not_yours("its range is not a partition of the merge plan"))?;
        if bm.verdicts.get(k).and_then(|v| v.as_ref()).is_none_or(|v| v.writer != peer) {
            return Err(not_yours("the announcer is not the partition's writer"));
        }
        let name = part_name(obj.offset, obj.values);
        let weights = obj.key == format!("{}{name}", weights_parts_prefix(epoch, stage));
        if !weights && obj.key != format!("{}{name}", momentum_parts_prefix(epoch, stage)) {
            return Err(not_yours("not the key of that partition's weights or momentum"));
        }
        let participants: Vec<PeerId> = bm.plan.participants.iter().map(|p| p.peer).filter(|p| *p != peer).collect();
        let so = self.stage_objects(epoch, stage);
        if weights {
            so.weights.insert(obj.offset, obj.clone());
            // Replicas that never got the accepted update read it from here.
            let cmd = pb::Stored { epoch, stage, object: Some(obj.to_pb()) };
            for to in participants {
                out.push(Out { to, cmd: pb::command::Kind::Stored(cmd.clone()) });
            }
        } else {
            so.momentum.insert(obj.offset, obj);
        }
        Ok(())
    }

    /// Whether `peer` may write `key` now: the rule behind a presigned PUT
    /// (a miner holds no store credentials, so this is the only way it
    /// writes). It is the announcement rule, asked before the put:
    ///
    /// - its own undelivered butterfly contribution to a partition of its
    ///   stage's current plan: `contrib/KKKKKK/<own hex>.frame`;
    /// - the merged slice and momentum of a partition whose current verdict
    ///   names it the writer;
    /// - its own upload, and the merged stage if it is the aggregator
    ///   (parameter server).
    pub fn may_write(&self, peer: PeerId, key: &str) -> Result<(), Refusal> {
        if self.may_write_step_proof(&peer, key) {
            return Ok(());
        }
        let m = self.miners.get(&peer).ok_or(Refusal::Unknown(peer))?;
        let (epoch, stage) = (self.epoch, m.stage);
        // The butterfly merge's keys are its own epoch's: behind the next
        // epoch's training (`merge.overlap`) that is the one before.
        let merging = self.merge_epoch(stage);
        let not_yours = |why: &str| Refusal::NotYours(format!("key {key}: {why}"));
        if self.may_write_evidence(&peer, key) {
            return Ok(());
        }
        if let Some(rest) = key.strip_prefix(&contrib_prefix(merging, stage)) {
            let epoch = merging;
            let bm = self.butterfly.get(&stage).filter(|b| b.plan.epoch == epoch);
            let plan = &bm.ok_or_else(|| not_yours("no butterfly merge of this stage is in progress"))?.plan;
            let (k, name) = rest.split_once('/').ok_or_else(|| not_yours("not a contribution key"))?;
            let k_ok = k.len() == 6 && k.parse::<usize>().is_ok_and(|k| k < plan.partitions.len());
            // Its contribution, and the witness that binds it to its
            // weights chain (`iota_checks::contribution`).
            let own = name == format!("{}.frame", peer.to_hex()) || name == format!("{}.witness", peer.to_hex());
            if !k_ok || !own || !plan.is_participant(&peer) {
                return Err(not_yours("a participant writes its own contribution to a planned partition only"));
            }
            return Ok(());
        }
        for prefix in [weights_parts_prefix(merging, stage), momentum_parts_prefix(merging, stage)] {
            let Some(name) = key.strip_prefix(&prefix) else { continue };
            let bm = self.butterfly.get(&stage).filter(|b| b.plan.epoch == merging);
            let bm = bm.ok_or_else(|| not_yours("no butterfly merge of this stage is in progress"))?;
            let k = bm.plan.partitions.iter().position(|p| part_name(p.offset, p.len) == name);
            let writer = k.and_then(|k| bm.verdicts.get(k)?.as_ref()).map(|v| v.writer);
            return if writer == Some(peer) {
                Ok(())
            } else {
                Err(not_yours("only the writer of the partition's verdict stores its slice and momentum"))
            };
        }
        let ps = self.spec.merge.method == MergeMethod::ParameterServer;
        let own_upload = format!("{}stage-{stage:03}/{}.safetensors", upload_prefix(epoch), peer.to_hex());
        if ps && key == own_upload {
            return Ok(());
        }
        if ps && key == merged_key(epoch, stage) && self.aggregator(stage) == Some(peer) {
            return Ok(());
        }
        Err(not_yours("not a key this miner is asked to write now"))
    }

    /// The epoch of `stage`'s butterfly merge in progress: the current
    /// epoch's, or the previous one's running behind training
    /// (`merge.overlap`); the current epoch when none runs.
    fn merge_epoch(&self, stage: u32) -> u64 {
        self.butterfly.get(&stage).map(|b| b.plan.epoch).filter(|e| self.merge_is_current(*e)).unwrap_or(self.epoch)
    }

    /// Whether `peer` may list `prefix`: the contributions left for its
    /// own stage's current merge (what a partition owner polls for).
    pub fn may_list(&self, peer: PeerId, prefix: &str) -> Result<(), Refusal> {
        let m = self.miners.get(&peer).ok_or(Refusal::Unknown(peer))?;
        if prefix.starts_with(&contrib_prefix(self.merge_epoch(m.stage), m.stage)) {
            Ok(())
        } else {
            Err(Refusal::NotYours(format!("prefix {prefix}: a miner lists its own stage's contributions only")))
        }
    }

    /// Whether `peer` may read `key`: any member may read any object of
    /// the run, since every read is checked against an announcement before
    /// it is used; reading grants nothing else.
    pub fn may_read(&self, peer: PeerId, key: &str) -> Result<(), Refusal> {
        // Validators read the prepared corpus too (they recompute from it).
        if self.may_read_evidence(&peer, key) || (key.starts_with("data/") && self.is_validator(&peer)) {
            return Ok(());
        }
        // Validators read merged weights and momentum (to evaluate merges
        // and audit them) and the contributions an audit asks for.
        let merge_object = ["/weights/", "/momentum/", "/contrib/"].iter().any(|p| key.contains(p));
        if self.is_validator(&peer) && key.starts_with("epoch-") && merge_object {
            return Ok(());
        }
        self.known(&peer)
    }

    /// Whether every partition of a butterfly merge has its merged slice
    /// announced for exactly its range.
    pub(super) fn stage_stored(&self, stage: u32, bm: &iota_core::merge::StageMerge) -> bool {
        let stored = self.objects_of(bm.plan.epoch, stage).map(|so| &so.weights);
        bm.plan.partitions.iter().all(|p| stored.and_then(|w| w.get(&p.offset)).is_some_and(|o| o.values == p.len))
    }

    /// The object a parameter-server upload announced: the replica's own key.
    pub(super) fn check_upload(&self, peer: PeerId, epoch: u64, stage: u32, obj: &StoredObject) -> Result<(), Refusal> {
        let own = format!("{}stage-{stage:03}/{}.safetensors", upload_prefix(epoch), peer.to_hex());
        if obj.key != own || obj.is_part() {
            return Err(Refusal::NotYours(format!("object {}: a replica uploads to {own} only", obj.key)));
        }
        Ok(())
    }

    pub(super) fn record_upload(&mut self, peer: PeerId, epoch: u64, stage: u32, obj: StoredObject) {
        self.stage_objects(epoch, stage).uploads.insert(peer, obj);
    }

    /// The object the aggregator's merge announced.
    pub(super) fn record_merged(&mut self, epoch: u64, stage: u32, obj: Option<StoredObject>) -> Result<(), Refusal> {
        let obj = obj.ok_or_else(|| Refusal::Invalid("a parameter-server merge must announce its object".into()))?;
        if obj.key != merged_key(epoch, stage) || obj.is_part() {
            return Err(Refusal::NotYours(format!(
                "object {}: the merged stage is {}",
                obj.key,
                merged_key(epoch, stage)
            )));
        }
        self.stage_objects(epoch, stage).merged = Some(obj);
        Ok(())
    }

    /// A reader says an object it was handed does not match.
    pub(super) fn on_bad_object(
        &mut self,
        peer: PeerId,
        epoch: u64,
        stage: u32,
        obj: StoredObject,
        reason: String,
        out: &mut Vec<Out>,
    ) -> Result<(), Refusal> {
        let so = self.objects_of(epoch, stage);
        let recorded = so.into_iter().flat_map(|s| {
            s.weights.values().chain(s.momentum.values()).chain(s.uploads.values()).chain(s.merged.iter())
        });
        let Some(rec) = recorded.into_iter().find(|r| r.key == obj.key && r.hash == obj.hash) else {
            return Err(Refusal::Invalid(format!("object {} is not one this orchestrator handed out", obj.key)));
        };
        let writer = rec.writer;
        // A repeat of the same report changes nothing; a report about the
        // object a new writer stored under the same key is a new one.
        if self.bad_objects.iter().any(|b| b.key == obj.key && b.reporter == peer && b.writer == writer) {
            return Ok(());
        }
        if self.bad_objects.len() >= MAX_BAD_OBJECTS {
            self.bad_objects.remove(0);
        }
        self.counters.bad_objects += 1;
        let key = obj.key.clone();
        self.bad_objects.push(BadObjectRecord { epoch, stage, key: obj.key, writer, reporter: peer, reason });
        self.rewrite_bad_slice(peer, epoch, stage, &key, writer, out);
        Ok(())
    }

    /// A participant of a merge in progress could not use the merged slice
    /// its writer stored: its records are dropped (nobody else is handed
    /// them, and the stage is not stored until they are replaced) and the
    /// writing moves to a participant that holds the slice.
    fn rewrite_bad_slice(
        &mut self,
        reporter: PeerId,
        epoch: u64,
        stage: u32,
        key: &str,
        writer: PeerId,
        out: &mut Vec<Out>,
    ) {
        let Some(bm) = self.butterfly.get(&stage).filter(|m| m.plan.epoch == epoch) else { return };
        if !bm.plan.is_participant(&reporter) || !key.starts_with(&weights_parts_prefix(epoch, stage)) {
            return;
        }
        let Some(k) = bm.plan.partitions.iter().position(|p| key.ends_with(&part_name(p.offset, p.len))) else {
            return;
        };
        let offset = bm.plan.partitions[k].offset;
        let mut mo = Vec::new();
        let Some(bm) = self.butterfly.get_mut(&stage) else { return };
        if bm.move_writer(k as u32, writer, &[reporter], &mut mo).is_none() {
            return;
        }
        let so = self.stage_objects(epoch, stage);
        so.weights.retain(|o, r| *o != offset || r.writer != writer);
        so.momentum.retain(|o, r| *o != offset || r.writer != writer);
        self.counters.rewritten_slices += 1;
        self.merge_outs(stage, mo, out);
    }

    /// Every bad-object report the run keeps (for validators and `status`).
    pub fn bad_objects(&self) -> &[BadObjectRecord] {
        &self.bad_objects
    }

    /// What a stage's current weights are stored as (the merge of the
    /// previous epoch; after the run, its result); empty before the first
    /// merge.
    pub fn stage_weights(&self, stage: u32) -> Vec<StoredObject> {
        match self.weights_epoch() {
            Some(e) => self.merged_objects(e, stage),
            None => Vec::new(),
        }
    }

    /// The objects of a stage's merged weights after `epoch`'s merge.
    pub(super) fn merged_objects(&self, epoch: u64, stage: u32) -> Vec<StoredObject> {
        let Some(so) = self.objects_of(epoch, stage) else { return Vec::new() };
        match self.spec.merge.method {
            MergeMethod::Butterfly => so.weights.values().cloned().collect(),
            MergeMethod::ParameterServer => so.merged.iter().cloned().collect(),
        }
    }

    pub(super) fn weights_manifest(&self, stage: u32) -> Vec<pb::StoredObject> {
        self.stage_weights(stage).iter().map(StoredObject::to_pb).collect()
    }

    /// The outer momentum a butterfly merge of this epoch starts from.
    pub(super) fn momentum_manifest(&self, stage: u32) -> Vec<pb::StoredObject> {
        let Some(prev) = self.weights_epoch() else { return Vec::new() };
        self.objects_of(prev, stage)
            .map(|so| so.momentum.values().map(StoredObject::to_pb).collect())
            .unwrap_or_default()
    }

    /// The uploads an aggregator averages, each weighted by the work this
    /// orchestrator counted for its writer (never the upload's own claim).
    pub(super) fn uploads_manifest(&self, stage: u32) -> Vec<pb::StoredObject> {
        let Some(so) = self.objects_of(self.epoch, stage) else { return Vec::new() };
        let ups = self.uploads.get(&stage);
        so.uploads
            .iter()
            .filter(|(p, _)| ups.is_some_and(|u| u.contains_key(p)))
            .filter(|(p, _)| self.miners.get(p).is_some_and(|m| m.merges(self.epoch)))
            .map(|(p, o)| {
                let work = self.miners.get(p).map_or(0, |m| m.work);
                pb::StoredObject { work, ..o.to_pb() }
            })
            .collect()
    }
}
