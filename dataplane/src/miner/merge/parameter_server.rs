//! The parameter-server merge: every replica uploads its weights to the
//! object store, one aggregator averages them, everyone downloads the result.

use std::collections::BTreeMap;

use anyhow::{Context, Result, bail};
use iota_core::{ParamLayout, PeerId};
use iota_model::checkpoint::{parse_safetensors, stage_bytes, stage_params};
use iota_protocol::store_keys::{merged_key, upload_prefix};
use iota_protocol::{SharedStore, pb};
use tracing::info;

use super::Merge;
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

    /// The work-weighted mean of every upload (plain mean if nobody worked),
    /// summed in f64 in key order so the result is the same bytes however
    /// often it is computed.
    pub fn aggregate(&mut self, epoch: u64, stage: u32, layout: &ParamLayout) -> Result<String> {
        let dir = Self::stage_dir(epoch, stage);
        let merged = merged_key(epoch, stage);
        let keys: Vec<String> = self
            .rt
            .block_on(self.store.list(&dir))?
            .into_iter()
            .filter(|k| *k != merged && k.ends_with(".safetensors"))
            .collect();
        if keys.is_empty() {
            bail!("no uploads under {dir}");
        }
        let mut parts = Vec::with_capacity(keys.len());
        for k in &keys {
            let bytes = self.rt.block_on(self.store.get(k))?;
            let work: f64 =
                parse_safetensors(&bytes)?.metadata.get("iota.work").and_then(|w| w.parse().ok()).unwrap_or(0.0);
            parts.push((work, stage_params(layout, &bytes).with_context(|| format!("upload {k}"))?));
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
        let meta = BTreeMap::from([("iota.merged_from".to_string(), keys.len().to_string())]);
        self.rt.block_on(self.store.put(&merged, stage_bytes(layout, &params, meta)?))?;
        info!(epoch, stage, replicas = keys.len(), "merged");
        Ok(merged)
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
        let meta = BTreeMap::from([("iota.work".to_string(), work.to_string())]);
        let key = format!("{}{}.safetensors", Self::stage_dir(epoch, stage), self.me.to_hex());
        self.rt
            .block_on(self.store.put(&key, stage_bytes(layout, params, meta)?))
            .with_context(|| format!("uploading {key}"))?;
        out.push(Output::Report(pb::report::Kind::UploadDone(pb::UploadDone {
            epoch,
            stage,
            key,
            micro_batches: work,
        })));
        Ok(())
    }

    fn merging(&mut self, p: &pb::PhaseChange, stage: u32, layout: &ParamLayout, out: &mut Vec<Output>) -> Result<()> {
        if p.aggregator != self.me.0 {
            return Ok(());
        }
        let key = self.aggregate(p.epoch, stage, layout)?;
        out.push(Output::Report(pb::report::Kind::MergeDone(pb::MergeDone {
            epoch: p.epoch,
            stage,
            key,
            weights_hash: Vec::new(),
        })));
        Ok(())
    }

    fn fetch(&mut self, epoch: u64, stage: u32, layout: &ParamLayout) -> Result<Vec<f32>> {
        let key = merged_key(epoch, stage);
        let bytes = self.rt.block_on(self.store.get(&key)).with_context(|| format!("fetching merged weights {key}"))?;
        stage_params(layout, &bytes)
    }
}
