//! The one path by which a miner hands a frame to a peer: over the data
//! plane, or, when that fails and the frame names a fallback key, into the
//! object store, signed, where its receiver looks for it.

use bytes::Bytes;
use iota_core::PeerId;
use iota_protocol::SharedStore;
use tracing::warn;

use crate::frame::FrameMeta;
use crate::transport::Endpoint;

/// Sends a frame; one that cannot be delivered and has a `fallback` key is
/// left in the object store, signed, where its receiver looks for it.
pub(crate) async fn deliver(
    ep: &Endpoint,
    store: &SharedStore,
    to: PeerId,
    meta: &FrameMeta,
    payload: Bytes,
    fallback: Option<String>,
) {
    let copy = fallback.is_some().then(|| payload.clone());
    let Err(e) = ep.send(to, meta, payload).await else { return };
    match (fallback, copy) {
        (Some(key), Some(p)) => {
            warn!(peer = %to, error = %e, key, "frame not delivered; left in the object store");
            if let Err(e) = store.put(&key, ep.frame_bytes(meta, &p)).await {
                warn!(key, error = %e, "storing an undelivered frame failed");
            }
        }
        _ => warn!(peer = %to, error = %e, "frame not delivered; the orchestrator will re-route"),
    }
}
