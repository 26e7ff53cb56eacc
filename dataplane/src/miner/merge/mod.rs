//! How the replicas of a stage combine their work at the end of an epoch.
//!
//! The worker drives a `Merge` with the phases, commands and frames it
//! receives. Two implementations:
//! - `Butterfly` (default, `butterfly/`): an all-reduce over the data
//!   plane, each partition reduced by two owners and checked by hash.
//! - `ParameterServer`: every replica uploads its weights to the object
//!   store, one aggregator averages them, everyone downloads the result.
//!   Simple and correct; the baseline the butterfly is measured against
//!   (`parameter_server.rs`).
//!
//! `parts.rs` reads announced objects (checked before parsing) and vectors
//! stored as part objects; `local.rs`
//! runs one stage's butterfly in process (tests, the bench).

mod butterfly;
pub mod local;
mod parameter_server;
mod parts;

use anyhow::{Context, Result};
use iota_core::ParamLayout;
use iota_protocol::manifest::from_pb_list;
use iota_protocol::{SharedStore, pb};
use tracing::warn;

pub use self::butterfly::{
    Butterfly, MergeFault, MergeStats, Published, Reduced, decode_slice, encode_slice, reduce_partition,
    reduce_partition_published, update_hash,
};
pub use self::parameter_server::ParameterServer;
pub use self::parts::{BadRead, PartsRead, f32_bytes, get_verified, load_weights, read_parts};
use super::events::Output;
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
    /// The orchestrator asks for this replica's contributions to some
    /// partitions, stored signed (a validator audits their reduce).
    fn contribution_request(&mut self, _r: &pb::ContributionRequest, _out: &mut Vec<Output>) -> Result<()> {
        Ok(())
    }
    /// A writer of the current merge stored (and announced) an object.
    fn stored(&mut self, _s: pb::Stored, _out: &mut Vec<Output>) -> Result<()> {
        Ok(())
    }
    /// The epoch's weights chain as its `UploadDone` commits it (a
    /// validated run; called before `contribute`): the contribution a
    /// merge sends must be the pseudo-gradient of its last weights, and an
    /// audited one is stored with the witness that shows it.
    fn bind(&mut self, _step_hashes: Vec<[u8; 32]>) {}
    /// With sparse contributions in a validated run: the hash of the
    /// backlog `epoch`'s contributions start from (after `contribute`), for
    /// the epoch's commitments.
    fn backlog_hash(&self, _epoch: u64) -> Option<[u8; 32]> {
        None
    }
    /// Where to keep large records of what it sent, for audits (the
    /// miner's evidence directory), in place of memory.
    fn keep_records_in(&mut self, _dir: std::path::PathBuf) {}
}

/// Loads a stage's weights from announced objects (see `load_weights`);
/// objects that fail their checks are reported (`out`) and skipped.
pub(crate) fn load_announced(
    rt: &tokio::runtime::Handle,
    store: &SharedStore,
    objects: &[pb::StoredObject],
    stage: u32,
    layout: &ParamLayout,
    epoch: u64,
    out: &mut Vec<Output>,
) -> Result<Vec<f32>> {
    let objects = from_pb_list(objects).map_err(|e| anyhow::anyhow!("weights objects: {e}"))?;
    let (got, bad) = rt.block_on(load_weights(store, &objects, layout));
    for b in bad {
        warn!(key = %b.object.key, writer = %b.object.writer, reason = %b.reason, "stored weights rejected");
        out.push(b.report(epoch, stage));
    }
    got.with_context(|| format!("loading the merged weights of epoch {epoch} stage {stage}"))
}
