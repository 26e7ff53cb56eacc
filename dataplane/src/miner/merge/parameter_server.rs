//! The parameter-server merge: every replica uploads its weights to the
//! object store, one aggregator averages them, everyone downloads the result.

use std::collections::BTreeMap;

use anyhow::{Context, Result, bail};
use iota_core::{ParamLayout, PeerId};
use iota_model::checkpoint::stage_bytes;
use iota_protocol::manifest::from_pb_list;
use iota_protocol::store_keys::{merged_key, upload_prefix};
use iota_protocol::{SharedStore, StoredObject, pb};
use tracing::{info, warn};

use super::{Merge, load_weights};
use crate::miner::events::Output;

pub struct ParameterServer {
    store: SharedStore,
    rt: tokio::runtime::Handle,
    me: PeerId,
}

impl ParameterServer {
    pub fn new(store: SharedStore, rt: tokio::runtime::Handle, me: PeerId) -> Self {
        ParameterServer { store, rt, me }
    }

    fn stage_dir(epoch: u64, stage: u32) -> String {
        format!("{}stage-{stage:03}/", upload_prefix(epoch))
    }

    /// The work-weighted mean of the announced uploads (plain mean if
    /// nobody worked), summed in f64 in the given order so the result is the
    /// same bytes however often it is computed. Each upload is checked
    /// against its announcement and must be finite; its weight is the work
    /// the orchestrator counted for its writer, never what the upload says.
    /// Uploads that fail are left out and reported.
    pub fn aggregate(
        &mut self,
        epoch: u64,
        stage: u32,
        layout: &ParamLayout,
        uploads: &[StoredObject],
        out: &mut Vec<Output>,
    ) -> Result<StoredObject> {
        let mut parts = Vec::with_capacity(uploads.len());
        for u in uploads {
            let (got, bad) = self.rt.block_on(load_weights(&self.store, std::slice::from_ref(u), layout));
            for b in bad {
                warn!(key = %b.object.key, writer = %b.object.writer, reason = %b.reason, "upload rejected");
                out.push(b.report(epoch, stage));
            }
            match got {
                Ok(p) => parts.push((u.work as f64, p)),
                Err(e) => warn!(key = %u.key, error = %format!("{e:#}"), "upload left out of the merge"),
            }
        }
        if parts.is_empty() {
            bail!("no usable upload for epoch {epoch} stage {stage}");
        }
        let total: f64 = parts.iter().map(|p| p.0).sum();
        let n = parts.len() as f64;
        let mut acc = vec![0.0f64; layout.total()];
        for (w, p) in &parts {
            let w = if total > 0.0 { *w / total } else { 1.0 / n };
            for (a, x) in acc.iter_mut().zip(p) {
                *a += w * *x as f64;
            }
        }
        let params: Vec<f32> = acc.iter().map(|&a| a as f32).collect();
        let meta = BTreeMap::from([("iota.merged_from".to_string(), parts.len().to_string())]);
        let merged = merged_key(epoch, stage);
        let bytes = stage_bytes(layout, &params, meta)?;
        let obj = StoredObject::of(&merged, &bytes, self.me);
        self.rt.block_on(self.store.put(&merged, bytes))?;
        info!(epoch, stage, replicas = parts.len(), "merged");
        Ok(obj)
    }
}

impl Merge for ParameterServer {
    fn epoch_started(&mut self, _epoch: u64, _stage: u32, _params: &[f32]) {}

    fn contribute(
        &mut self,
        epoch: u64,
        stage: u32,
        layout: &ParamLayout,
        params: &[f32],
        work: u64,
        out: &mut Vec<Output>,
    ) -> Result<()> {
        // Informative only: the aggregator weights by the orchestrator's count.
        let meta = BTreeMap::from([("iota.work".to_string(), work.to_string())]);
        let key = format!("{}{}.safetensors", Self::stage_dir(epoch, stage), self.me.to_hex());
        let bytes = stage_bytes(layout, params, meta)?;
        let object = Some(StoredObject::of(&key, &bytes, self.me).to_pb());
        self.rt.block_on(self.store.put(&key, bytes)).with_context(|| format!("uploading {key}"))?;
        out.push(Output::Report(pb::report::Kind::UploadDone(pb::UploadDone {
            epoch,
            stage,
            key,
            micro_batches: work,
            object,
            // Added by the worker.
            commitments: Vec::new(),
        })));
        Ok(())
    }

    fn merging(&mut self, p: &pb::PhaseChange, stage: u32, layout: &ParamLayout, out: &mut Vec<Output>) -> Result<()> {
        if p.aggregator != self.me.0 {
            return Ok(());
        }
        let uploads = from_pb_list(&p.uploads).map_err(|e| anyhow::anyhow!("upload objects: {e}"))?;
        let obj = self.aggregate(p.epoch, stage, layout, &uploads, out)?;
        out.push(Output::Report(pb::report::Kind::MergeDone(pb::MergeDone {
            epoch: p.epoch,
            stage,
            key: obj.key.clone(),
            weights_hash: Vec::new(),
            object: Some(obj.to_pb()),
            ..Default::default()
        })));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use iota_core::Identity;

    use super::*;
    use crate::fileio::FileIo;
    use crate::local_store::LocalDirStore;
    use crate::miner::merge::local::flat_layout;

    /// Stores an upload of `params` whose metadata claims `work_claim`, as
    /// a hostile replica may; returns its announcement with the work the
    /// orchestrator counted.
    fn upload(
        store: &SharedStore,
        rt: &tokio::runtime::Runtime,
        params: &[f32],
        work_claim: &str,
        counted: u64,
    ) -> StoredObject {
        let me = Identity::generate().peer_id();
        let layout = flat_layout(params.len());
        let meta = BTreeMap::from([("iota.work".to_string(), work_claim.to_string())]);
        let key = format!("epoch-000000/stage-000/{}.safetensors", me.to_hex());
        let bytes = stage_bytes(&layout, params, meta).unwrap();
        rt.block_on(store.put(&key, bytes.clone())).unwrap();
        StoredObject { work: counted, ..StoredObject::of(&key, &bytes, me) }
    }

    fn merge(store: &SharedStore, rt: &tokio::runtime::Runtime, ups: &[StoredObject]) -> (Vec<f32>, Vec<Output>) {
        let layout = flat_layout(3);
        let mut agg = ParameterServer::new(store.clone(), rt.handle().clone(), Identity::generate().peer_id());
        let mut out = Vec::new();
        let merged = agg.aggregate(0, 0, &layout, ups, &mut out).unwrap();
        let (got, bad) = rt.block_on(load_weights(store, &[merged], &layout));
        assert!(bad.is_empty());
        (got.unwrap(), out)
    }

    #[test]
    fn an_uploads_own_work_claim_and_non_finite_weights_change_nothing() {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let store = LocalDirStore::shared(dir.path(), FileIo::start(false)).unwrap();
        let a = upload(&store, &rt, &[1.0, 2.0, 3.0], "1", 1);
        let b = upload(&store, &rt, &[3.0, 6.0, 9.0], "3", 3);
        let (honest, out) = merge(&store, &rt, &[a.clone(), b.clone()]);
        assert_eq!(honest, vec![2.5, 5.0, 7.5], "weighted by the counted work 1 : 3");
        assert!(out.is_empty());
        // The same weights claiming infinite or overwhelming work: the
        // claim is ignored, the counted work weighs.
        for claim in ["inf", "1e300", "NaN", "-5"] {
            let c = upload(&store, &rt, &[3.0, 6.0, 9.0], claim, 3);
            let (got, _) = merge(&store, &rt, &[a.clone(), c]);
            assert_eq!(got, honest, "claim {claim}");
        }
        // An upload holding a NaN (or an infinity) is left out and reported.
        for poison in [f32::NAN, f32::INFINITY] {
            let n = upload(&store, &rt, &[0.0, poison, 0.0], "1", 1);
            let (got, out) = merge(&store, &rt, &[a.clone(), b.clone(), n.clone()]);
            assert_eq!(got, honest);
            assert_eq!(out.len(), 1);
            match &out[0] {
                Output::Report(pb::report::Kind::BadObject(r)) => {
                    assert_eq!(r.object.as_ref().unwrap().writer, n.writer.0.to_vec());
                    assert!(r.reason.contains("non-finite"), "{}", r.reason);
                }
                o => panic!("expected a bad-object report, got {o:?}"),
            }
        }
        // An upload whose bytes differ from its announcement: the same.
        let mut lie = upload(&store, &rt, &[9.0, 9.0, 9.0], "1", 1);
        lie.hash = a.hash;
        let (got, out) = merge(&store, &rt, &[a, b, lie]);
        assert_eq!((got, out.len()), (honest, 1));
    }
}
