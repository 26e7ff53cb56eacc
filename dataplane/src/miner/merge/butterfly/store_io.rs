//! What a replica writes to and reads from the object store in a merge:
//! a partition writer's merged slice and momentum (announced only once
//! stored), contributions peers left there, and the `PlantObjects`
//! adversary's objects.

use std::sync::atomic::Ordering;

use anyhow::{Context, Result};
use bytes::Bytes;
use iota_core::PeerId;
use iota_protocol::store_keys::{contrib_prefix, momentum_parts_prefix, part_name, weights_parts_prefix};
use iota_protocol::{StoredObject, pb};
use tracing::warn;

use super::super::f32_bytes;
use super::super::parts::read_parts;
use super::encode_contribution;
use super::slices::{KIND_CONTRIBUTION, slice_msg};
use super::{Butterfly, MergeFault};
use crate::frame::decode_frame;
use crate::miner::events::Output;

impl Butterfly {
    /// Partition `k`'s outer momentum after the previous merge (zeros
    /// without one): read once from the store, then kept for a second reduce.
    pub(super) fn momentum_for(&mut self, k: usize, offset: u64, len: u64, out: &mut Vec<Output>) -> Result<Vec<f32>> {
        if self.spec.outer.momentum == 0.0 {
            // No outer momentum: zeros, which need no copy kept for a
            // second reduce.
            return Ok(vec![0.0; len as usize]);
        }
        if let Some(m) = self.momentum_prev.get(&k) {
            return Ok(m.clone());
        }
        let m = if self.epoch == 0 || self.spec.outer.momentum == 0.0 {
            vec![0.0; len as usize]
        } else {
            let r = self.rt.block_on(read_parts(&self.store, &self.momentum_objects, offset, len))?;
            for b in &r.bad {
                warn!(key = %b.object.key, writer = %b.object.writer, reason = %b.reason, "stored momentum rejected");
                out.push(b.report(self.epoch - 1, self.stage));
            }
            if r.covered < len {
                warn!(k, covered = r.covered, len, "outer momentum partly missing in the store; zeros used");
            }
            r.values
        };
        self.momentum_prev.insert(k, m.clone());
        Ok(m)
    }

    /// The writer's part: stores partition `k`'s merged slice (and its outer
    /// momentum, if the run keeps one) and announces what it stored.
    pub(super) fn store_partition(
        &mut self,
        k: usize,
        part: &iota_core::merge::Partition,
        v: &pb::SliceVerdict,
        keep: bool,
        slice: &[f32],
        out: &mut Vec<Output>,
    ) -> Result<()> {
        let name = part_name(part.offset, part.len);
        let wkey = format!("{}{name}", weights_parts_prefix(self.epoch, self.stage));
        let bytes = f32_bytes(slice);
        // Announce only what was stored: a step that fails still sends
        // its outputs, and an announced object that never reached the
        // store would stall every reader of it.
        let announced = StoredObject::part(&wkey, &bytes, part.offset, self.me);
        self.rt.block_on(self.store.put(&wkey, self.stored_bytes(bytes))).with_context(|| format!("storing {wkey}"))?;
        self.announce(announced, out);
        // Without outer momentum every reader (owners, auditors) uses
        // zeros and reads none: storing them would double the merge's
        // writes for nothing.
        if self.spec.outer.momentum == 0.0 {
            return Ok(());
        }
        let momentum = if keep {
            Some(self.momentum_for(k, part.offset, part.len, out)?)
        } else {
            self.results.get(&k).filter(|r| r.hash[..] == v.hash[..]).map(|r| r.momentum.clone())
        };
        match momentum {
            Some(m) => {
                let mkey = format!("{}{name}", momentum_parts_prefix(self.epoch, self.stage));
                let bytes = f32_bytes(&m);
                let announced = StoredObject::part(&mkey, &bytes, part.offset, self.me);
                self.rt
                    .block_on(self.store.put(&mkey, self.stored_bytes(bytes)))
                    .with_context(|| format!("storing {mkey}"))?;
                self.announce(announced, out);
            }
            None => warn!(k, "writer without the accepted momentum; the next epoch starts it from zero"),
        }
        Ok(())
    }

    /// Tells the orchestrator what this writer has stored (called after the
    /// put succeeded: outputs leave once the step ends, even a failed one).
    fn announce(&self, o: StoredObject, out: &mut Vec<Output>) {
        out.push(Output::Report(pb::report::Kind::Stored(pb::Stored {
            epoch: self.epoch,
            stage: self.stage,
            object: Some(o.to_pb()),
        })));
    }

    /// The bytes this writer really stores: a `LyingWriter` stores others
    /// than it announced.
    fn stored_bytes(&self, mut bytes: Vec<u8>) -> Vec<u8> {
        if self.fault == Some(MergeFault::LyingWriter)
            && let Some(b) = bytes.first_mut()
        {
            *b ^= 0x40;
        }
        bytes
    }

    /// The `PlantObjects` adversary (a test tool, never on by default).
    pub(super) fn plant(&self, out: &mut Vec<Output>) {
        let stages = self.spec.stage_params.len().max(2) as u32;
        for stage in (0..stages).filter(|s| *s != self.stage) {
            let prefixes = [
                weights_parts_prefix(self.epoch, stage),
                momentum_parts_prefix(self.epoch, stage),
                momentum_parts_prefix(self.epoch.saturating_sub(1), stage),
            ];
            for prefix in prefixes {
                let planted: [(String, Vec<u8>, pb::StoredObject); 3] = [
                    // 2^62 values in no bytes, and in 4 bytes.
                    (
                        format!("{prefix}000000000000-4611686018427387904.f32"),
                        Vec::new(),
                        pb::StoredObject { values: 1 << 62, ..Default::default() },
                    ),
                    (
                        format!("{prefix}000000000000-4611686018427387905.f32"),
                        vec![0; 4],
                        pb::StoredObject { values: (1 << 62) + 1, size: 4, ..Default::default() },
                    ),
                    // 4 values whose bytes are not the ones announced.
                    (format!("{prefix}{}", part_name(0, 4)), f32_bytes(&[1e30; 4]), {
                        StoredObject::part("x", &f32_bytes(&[0.0; 4]), 0, self.me).to_pb()
                    }),
                ];
                for (key, bytes, announced) in planted {
                    if let Err(e) = self.rt.block_on(self.store.put(&key, bytes)) {
                        warn!(key, error = %e, "planting failed");
                    }
                    let object = pb::StoredObject { key, hash: vec![0x5a; 32], writer: Vec::new(), ..announced };
                    out.push(Output::Report(pb::report::Kind::Stored(pb::Stored {
                        epoch: self.epoch,
                        stage,
                        object: Some(object),
                    })));
                }
            }
        }
    }

    /// Reads contributions left in the store by participants that could not
    /// reach us.
    pub(super) fn poll_store(&mut self) -> Result<()> {
        let Some(plan) = self.plan.clone() else { return Ok(()) };
        for k in plan.owned_by(&self.me).collect::<Vec<_>>() {
            let have = self.contribs.get(&k).map(|c| c.len()).unwrap_or(0);
            if have >= plan.participants.len() {
                continue;
            }
            // Contributions are whole signed frames: the signature is
            // checked before anything in them is parsed.
            let prefix = format!("{}{k:06}/", contrib_prefix(self.epoch, self.stage));
            let keys = match self.rt.block_on(self.store.list(&prefix)) {
                Ok(keys) => keys,
                Err(e) => {
                    warn!(prefix, error = %e, "listing stored contributions failed; retrying later");
                    continue;
                }
            };
            for key in keys {
                let Some(hex) = key.rsplit('/').next().and_then(|n| n.strip_suffix(".frame")) else { continue };
                let Some(from) = PeerId::from_hex(hex).filter(|p| plan.is_participant(p)) else { continue };
                if self.contribs.get(&k).is_some_and(|c| c.contains_key(&from)) {
                    continue;
                }
                let bytes = self.rt.block_on(self.store.get(&key))?;
                match decode_frame(&bytes, &self.ctx, from) {
                    Ok((h, payload)) => {
                        if let Some(m) = slice_msg(&h, from, payload) {
                            self.stats.store_fallbacks.fetch_add(1, Ordering::Relaxed);
                            self.contributions_from_store = self.contributions_from_store.saturating_add(1);
                            self.accept(m, false);
                        }
                    }
                    Err(e) => warn!(key, error = %e, "stored contribution rejected"),
                }
            }
        }
        Ok(())
    }

    /// Stores this replica's contributions to the partitions `r` names,
    /// signed, each with the witness that binds it to its committed
    /// weights (a validated run), for a validator's audit.
    pub(super) fn store_contributions(&mut self, r: &pb::ContributionRequest, out: &mut Vec<Output>) -> Result<()> {
        let Some(plan) = self.plan.as_ref() else { return Ok(()) };
        if r.epoch != self.epoch || r.stage != self.stage || !plan.is_participant(&self.me) {
            return Ok(());
        }
        for &k in r.partitions.iter().take(4096) {
            let k = k as usize;
            let (Some(part), Some(payload)) = (plan.partitions.get(k), self.encoded.get(&k)) else { continue };
            if self.withholds(plan, k) {
                continue;
            }
            let meta = self.meta(k, part.offset, part.len, KIND_CONTRIBUTION, 0);
            let payload = match (self.fault, self.delta.as_ref()) {
                (Some(MergeFault::FramingSender), Some(delta)) => {
                    let range = part.offset as usize..(part.offset + part.len) as usize;
                    let tripled: Vec<f32> = delta[range].iter().map(|d| 3.0 * d).collect();
                    Bytes::from(encode_contribution(&self.spec, &tripled)?)
                }
                _ => payload.clone(),
            };
            out.push(Output::Store { key: self.fallback_key(k, &self.me), meta, payload });
            if let Some((items, last)) = self.bound.as_ref().filter(|(_, l)| l.len() == self.theta_prev.len()) {
                let range = part.offset as usize..(part.offset + part.len) as usize;
                let bytes = if self.spec.sparse_density > 0.0 {
                    // Its backlog too, and the epoch before's that left it.
                    let Some(w) = self.feedback.witness(self.epoch, range) else { continue };
                    w.encode()
                } else {
                    iota_checks::contribution::ContributionWitness::of(&self.theta_prev, last, items, range).encode()
                };
                let key = self.fallback_key(k, &self.me).replace(".frame", ".witness");
                out.push(Output::StoreRaw { key, bytes: Bytes::from(bytes) });
            }
        }
        Ok(())
    }
}
