//! How the replicas of a stage combine their work at the end of an epoch.
//!
//! `ParameterServer` is the first implementation: every replica uploads its
//! weights to the object store, one aggregator averages them, everyone
//! downloads the result. It is simple and correct, and the baseline the
//! butterfly all-reduce is measured against.

use std::collections::BTreeMap;

use anyhow::{Context, Result, bail};
use iota_control::orchestrator::{merged_key, upload_prefix};
use iota_core::{ParamLayout, PeerId};
use iota_model::checkpoint::{parse_safetensors, stage_bytes, stage_params};
use tracing::info;

use crate::store::ObjectStore;

pub trait Merge: Send {
    /// This replica's contribution for `epoch` (Uploading phase); returns
    /// the key reported to the orchestrator.
    fn contribute(
        &mut self,
        epoch: u64,
        stage: u32,
        me: PeerId,
        layout: &ParamLayout,
        params: &[f32],
        work: u64,
    ) -> Result<String>;
    /// Combines the stage's contributions (the aggregator, Merging phase);
    /// returns the key of the result.
    fn aggregate(&mut self, epoch: u64, stage: u32, layout: &ParamLayout) -> Result<String>;
    /// The merged weights every replica starts the next epoch from.
    fn fetch(&mut self, epoch: u64, stage: u32, layout: &ParamLayout) -> Result<Vec<f32>>;
}

pub struct ParameterServer {
    store: ObjectStore,
    rt: tokio::runtime::Handle,
}

impl ParameterServer {
    pub fn new(store: ObjectStore, rt: tokio::runtime::Handle) -> Self {
        ParameterServer { store, rt }
    }

    fn stage_dir(epoch: u64, stage: u32) -> String {
        format!("{}stage-{stage:03}/", upload_prefix(epoch))
    }
}

impl Merge for ParameterServer {
    fn contribute(
        &mut self,
        epoch: u64,
        stage: u32,
        me: PeerId,
        layout: &ParamLayout,
        params: &[f32],
        work: u64,
    ) -> Result<String> {
        let meta = BTreeMap::from([("iota.work".to_string(), work.to_string())]);
        let key = format!("{}{}.safetensors", Self::stage_dir(epoch, stage), me.to_hex());
        self.rt
            .block_on(self.store.put(&key, stage_bytes(layout, params, meta)?))
            .with_context(|| format!("uploading {key}"))?;
        Ok(key)
    }

    /// The work-weighted mean of every upload (plain mean if nobody worked),
    /// summed in f64 in key order so the result is the same bytes however
    /// often it is computed.
    fn aggregate(&mut self, epoch: u64, stage: u32, layout: &ParamLayout) -> Result<String> {
        let dir = Self::stage_dir(epoch, stage);
        let merged = merged_key(epoch, stage);
        let keys: Vec<String> = self.rt.block_on(self.store.list(&dir))?.into_iter().filter(|k| *k != merged).collect();
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

    fn fetch(&mut self, epoch: u64, stage: u32, layout: &ParamLayout) -> Result<Vec<f32>> {
        let key = merged_key(epoch, stage);
        let bytes = self.rt.block_on(self.store.get(&key)).with_context(|| format!("fetching merged weights {key}"))?;
        stage_params(layout, &bytes)
    }
}
