//! Answering an `EvidenceRequest`: each attempt's bundle built from the
//! log and uploaded to the run's store.

use std::collections::HashSet;
use std::sync::Arc;

use iota_core::PeerId;
use iota_core::wire::Direction;
use iota_protocol::fields::MAX_EVIDENCE_ITEMS;
use iota_protocol::store_keys::{evidence_key, step_evidence_key};
use iota_protocol::{SharedStore, StoredObject, pb};
use tracing::{info, warn};

use super::EvidenceLog;
use crate::miner::events::Output;
use crate::sent_frames::{SentFrameKey, SentFrames};

/// Uploads the evidence for each attempt `r` names and reports each object
/// (`Stored`). Attempts not kept are skipped with a warning; a request for
/// an epoch no longer kept is ignored.
pub(crate) fn answer(
    log: &mut EvidenceLog,
    r: &pb::EvidenceRequest,
    sent: Option<&Arc<SentFrames>>,
    me: PeerId,
    store: &SharedStore,
    rt: &tokio::runtime::Handle,
    out: &mut Vec<Output>,
) {
    let Some(stage) = log.kept(r.epoch).map(|e| e.stage) else {
        warn!(epoch = r.epoch, kept = ?log.epoch(), "evidence asked for an epoch no longer kept; ignored");
        return;
    };
    let Some(sent) = sent else {
        warn!(epoch = r.epoch, "evidence asked, but this miner does not record its sent frames");
        return;
    };
    let mut seen = HashSet::new();
    let mut uploaded = 0usize;
    for item in r.items.iter().take(MAX_EVIDENCE_ITEMS) {
        let key = (r.epoch, item.shard, item.first_sample, item.attempt);
        if !seen.insert((key, item.inner_step)) {
            continue;
        }
        let skip = |why: &str| warn!(shard = key.1, first = key.2, attempt = key.3, why, "evidence not uploaded");
        // A trace of an inner step is answered apart (`trace_answer`).
        if item.trace_step > 0 {
            continue;
        }
        let Some(info) = log.attempt(key) else {
            skip("the attempt is not kept (not computed here, or past the evidence bounds)");
            continue;
        };
        let fk =
            SentFrameKey { epoch: key.0, shard: key.1, first_sample: key.2, attempt: key.3, direction: info.output };
        let Some(frame) = sent.get(&fk) else {
            skip("the frame sent for it is not kept");
            continue;
        };
        // A middle stage's backward: the gradient frame it sent upstream.
        let sent_grad = info
            .has_backward
            .then(|| sent.get(&SentFrameKey { direction: Direction::ActivationGrad, ..fk }))
            .flatten()
            .map(|f| f.whole());
        let bytes = match log.bundle_showing(key, (frame.whole(), sent_grad), item.inner_step) {
            Ok(b) => b,
            Err(why) => {
                skip(why);
                continue;
            }
        };
        let name = if item.inner_step { step_evidence_key } else { evidence_key };
        let obj_key = name(r.epoch, &me, key.1, key.2, key.3);
        let object = StoredObject::of(&obj_key, &bytes, me);
        if let Err(e) = rt.block_on(store.put(&obj_key, bytes)) {
            warn!(key = obj_key, error = %e, "uploading evidence failed");
            continue;
        }
        uploaded = uploaded.saturating_add(1);
        out.push(Output::Report(pb::report::Kind::Stored(pb::Stored {
            epoch: r.epoch,
            stage,
            object: Some(object.to_pb()),
        })));
    }
    info!(epoch = r.epoch, asked = r.items.len(), uploaded, "evidence uploaded");
}
