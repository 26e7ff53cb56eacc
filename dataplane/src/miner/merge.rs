//! How the replicas of a stage combine their work at the end of an epoch.
//!
//! The worker drives a `Merge` with the phases, commands and frames it
//! receives. Two implementations:
//! - `Butterfly` (default, `butterfly.rs`): an all-reduce over the data
//!   plane, each partition reduced by two owners and checked by hash.
//! - `ParameterServer`: every replica uploads its weights to the object
//!   store, one aggregator averages them, everyone downloads the result.
//!   Simple and correct; the baseline the butterfly is measured against.

use std::collections::BTreeMap;

use anyhow::{Context, Result, bail};
use iota_control::orchestrator::{merged_key, parse_part_name, upload_prefix};
use iota_control::pb;
use iota_core::{ParamLayout, PeerId};
use iota_model::checkpoint::{parse_safetensors, stage_bytes, stage_params};
use tracing::info;

use super::worker::Output;
use crate::store::ObjectStore;
use crate::transport::ReceivedFrame;

pub trait Merge: Send {
    /// The weights every replica of the stage holds as `epoch` starts (the
    /// merge's reference point, theta_prev).
    fn epoch_started(&mut self, epoch: u64, stage: u32, params: &[f32]);
    /// Uploading phase: this replica's trained weights and its work count.
    /// Reports `UploadDone` (for the butterfly: "ready, nothing uploaded").
    fn contribute(
        &mut self,
        epoch: u64,
        stage: u32,
        layout: &ParamLayout,
        params: &[f32],
        work: u64,
        out: &mut Vec<Output>,
    ) -> Result<()>;
    /// Merging phase (sent again when the butterfly plan changes).
    fn merging(&mut self, p: &pb::PhaseChange, stage: u32, layout: &ParamLayout, out: &mut Vec<Output>) -> Result<()>;
    /// The orchestrator accepted a partition's result.
    fn verdict(&mut self, _v: pb::SliceVerdict, _out: &mut Vec<Output>) -> Result<()> {
        Ok(())
    }
    /// A `WeightSlice` frame from a peer.
    fn frame(&mut self, _f: ReceivedFrame, _out: &mut Vec<Output>) -> Result<()> {
        Ok(())
    }
    /// Time passed (retries, store fallbacks).
    fn tick(&mut self, _out: &mut Vec<Output>) -> Result<()> {
        Ok(())
    }
    /// The merged weights of `epoch`, once, as soon as this replica has them.
    fn take_merged(&mut self) -> Option<(u64, Vec<f32>)> {
        None
    }
    /// Downloads the merged weights of `epoch` (a replica that missed the
    /// merge, or a newcomer).
    fn fetch(&mut self, epoch: u64, stage: u32, layout: &ParamLayout) -> Result<Vec<f32>>;
}

/// Reads `[offset, offset + len)` of a vector stored as part objects under
/// `prefix` (names from `part_name`). Returns the values and how many of
/// them were covered by some part (the rest are zero).
pub async fn read_range(store: &ObjectStore, prefix: &str, offset: u64, len: u64) -> Result<(Vec<f32>, u64)> {
    let mut out = vec![0.0f32; len as usize];
    let mut covered = 0u64;
    let end = offset + len;
    for key in store.list(prefix).await.unwrap_or_default() {
        let Some((o, l)) = parse_part_name(&key) else { continue };
        let (lo, hi) = (o.max(offset), (o + l).min(end));
        if lo >= hi {
            continue;
        }
        let bytes = store.get(&key).await.with_context(|| format!("reading {key}"))?;
        if bytes.len() as u64 != l * 4 {
            bail!("part {key} holds {} bytes, its name says {} values", bytes.len(), l);
        }
        for i in lo..hi {
            let b = ((i - o) * 4) as usize;
            out[(i - offset) as usize] = f32::from_le_bytes(bytes[b..b + 4].try_into().unwrap());
        }
        covered += hi - lo;
    }
    Ok((out, covered))
}

/// Little-endian f32 bytes of `x` (the part objects' format).
pub fn f32_bytes(x: &[f32]) -> Vec<u8> {
    x.iter().flat_map(|v| v.to_le_bytes()).collect()
}

pub struct ParameterServer {
    store: ObjectStore,
    rt: tokio::runtime::Handle,
    me: PeerId,
}

impl ParameterServer {
    pub fn new(store: ObjectStore, rt: tokio::runtime::Handle, me: PeerId) -> Self {
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
