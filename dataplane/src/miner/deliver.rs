//! The one path by which a miner hands a frame to a peer: over the data
//! plane, or, when that fails and the frame names a fallback key, into the
//! object store, signed, where its receiver looks for it.
//!
//! `PeerSenders` keeps one queue per peer, so a peer that cannot be reached
//! delays only its own frames (PROTOCOL.md, "Liveness"): a pipeline frame
//! (activation or gradient) that cannot be delivered is reported to the
//! orchestrator at once (`PeerFailed`, `UNREACHABLE`), which re-routes the
//! micro-batch, and after a failed dial the peer's next frames fail at once
//! for one connect timeout instead of each waiting for it.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use iota_core::PeerId;
use iota_core::wire::Direction;
use iota_protocol::{SharedStore, pb};
use tokio::sync::mpsc;
use tracing::{debug, warn};

use crate::frame::FrameMeta;
use crate::transport::Endpoint;

/// Frames queued for one peer before further ones fail at once.
const PEER_QUEUE: usize = 256;
/// Peers with a queue before idle queues are closed.
const MAX_QUEUES: usize = 1024;

/// Sends a frame; one that cannot be delivered and has a `fallback` key is
/// left in the object store, signed, where its receiver looks for it.
/// `network`: false skips the data plane (the peer is known unreachable).
/// True when the frame went over the data plane.
pub(crate) async fn deliver(
    ep: &Endpoint,
    store: &SharedStore,
    to: PeerId,
    meta: &FrameMeta,
    payload: Bytes,
    fallback: Option<String>,
) -> bool {
    deliver_via(ep, store, to, meta, payload, fallback, None, true).await
}

/// `shown`: what the endpoint records as sent instead of `payload` (the
/// `fabricated-evidence` test tool; None for every honest frame).
// The frame's parts as the queue holds them; a struct would only be
// unpacked here.
#[allow(clippy::too_many_arguments)]
async fn deliver_via(
    ep: &Endpoint,
    store: &SharedStore,
    to: PeerId,
    meta: &FrameMeta,
    payload: Bytes,
    fallback: Option<String>,
    shown: Option<Bytes>,
    network: bool,
) -> bool {
    let copy = fallback.is_some().then(|| payload.clone());
    let err = if network {
        match ep.send_showing(to, meta, payload, shown).await {
            Ok(_) => return true,
            Err(e) => e.to_string(),
        }
    } else {
        "the peer did not answer a moment ago".to_string()
    };
    match (fallback, copy) {
        (Some(key), Some(p)) => {
            warn!(peer = %to, error = %err, key, "frame not delivered; left in the object store");
            if let Err(e) = store.put(&key, ep.frame_bytes(meta, &p)).await {
                warn!(key, error = %e, "storing an undelivered frame failed");
            }
        }
        _ => warn!(peer = %to, error = %err, "frame not delivered; reported to the orchestrator"),
    }
    false
}

struct Item {
    meta: FrameMeta,
    payload: Bytes,
    fallback: Option<String>,
    shown: Option<Bytes>,
}

/// One send queue per peer (see the module comment).
pub(crate) struct PeerSenders {
    ep: Arc<Endpoint>,
    store: SharedStore,
    reports: mpsc::UnboundedSender<pb::report::Kind>,
    queues: HashMap<PeerId, mpsc::Sender<Item>>,
}

impl PeerSenders {
    /// `reports`: where `PeerFailed` reports go (the miner's report pump).
    pub(crate) fn new(
        ep: Arc<Endpoint>,
        store: SharedStore,
        reports: mpsc::UnboundedSender<pb::report::Kind>,
    ) -> PeerSenders {
        PeerSenders { ep, store, reports, queues: HashMap::new() }
    }

    /// Queues a frame for `to`; never waits. `shown`: see `deliver_via`.
    pub(crate) fn send(
        &mut self,
        to: PeerId,
        meta: FrameMeta,
        payload: Bytes,
        fallback: Option<String>,
        shown: Option<Bytes>,
    ) {
        if self.queues.len() >= MAX_QUEUES {
            self.queues.retain(|_, q| q.capacity() < q.max_capacity());
        }
        let q = self.queues.entry(to).or_insert_with(|| {
            let (tx, rx) = mpsc::channel(PEER_QUEUE);
            tokio::spawn(peer_task(self.ep.clone(), self.store.clone(), self.reports.clone(), to, rx));
            tx
        });
        if let Err(e) = q.try_send(Item { meta, payload, fallback, shown }) {
            let item = match e {
                mpsc::error::TrySendError::Full(i) | mpsc::error::TrySendError::Closed(i) => i,
            };
            warn!(peer = %to, "send queue full; frame reported undelivered");
            report_unreachable(&self.reports, to, &item.meta);
        }
    }
}

async fn peer_task(
    ep: Arc<Endpoint>,
    store: SharedStore,
    reports: mpsc::UnboundedSender<pb::report::Kind>,
    to: PeerId,
    mut rx: mpsc::Receiver<Item>,
) {
    let mut dead_until: Option<Instant> = None;
    while let Some(Item { meta, payload, fallback, shown }) = rx.recv().await {
        let known_dead = dead_until.is_some_and(|t| Instant::now() < t);
        let sent = deliver_via(&ep, &store, to, &meta, payload, fallback, shown, !known_dead).await;
        if sent {
            dead_until = None;
            continue;
        }
        if !known_dead {
            dead_until = Some(Instant::now() + ep.connect_timeout());
        }
        report_unreachable(&reports, to, &meta);
    }
    debug!(peer = %to, "send queue closed");
}

/// A pipeline frame that did not reach `to`: the orchestrator re-routes
/// its micro-batch (merge frames have the store fallback instead).
pub(crate) fn report_unreachable(reports: &mpsc::UnboundedSender<pb::report::Kind>, to: PeerId, meta: &FrameMeta) {
    if !matches!(meta.direction, Direction::Activation | Direction::ActivationGrad) {
        return;
    }
    let _ = reports.send(pb::report::Kind::PeerFailed(pb::PeerFailed {
        epoch: meta.epoch as u64,
        shard: meta.shard,
        first_sample: meta.first_sample,
        attempt: meta.attempt,
        peer: to.0.to_vec(),
        failure: pb::Failure::Unreachable as i32,
    }));
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use iota_core::{Identity, WireCodec};

    use super::*;
    use crate::fileio::FileIo;
    use crate::frame::{FrameLimits, RunContext};
    use crate::local_store::LocalDirStore;
    use crate::pool::HostPool;
    use crate::tls::PeerDirectory;
    use crate::transport::TransportConfig;

    fn meta() -> FrameMeta {
        FrameMeta {
            direction: Direction::Activation,
            codec: WireCodec::F32,
            stage: 0,
            epoch: 5,
            shard: 1,
            first_sample: 8,
            samples: 1,
            attempt: 2,
            shape: vec![4],
            answers: [0; 32],
        }
    }

    fn endpoint(seed: u8, ctx: &Arc<RunContext>) -> (Arc<Endpoint>, Arc<PeerDirectory>) {
        let dir = PeerDirectory::new();
        let ep = Endpoint::bind(
            "127.0.0.1:0".parse().unwrap(),
            Identity::from_seed([seed; 32]),
            dir.clone(),
            ctx.clone(),
            HostPool::new(1 << 20),
            TransportConfig::default(),
        )
        .unwrap();
        (Arc::new(ep), dir)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_dead_peer_delays_only_its_own_frames_and_is_reported() {
        let ctx = Arc::new(RunContext::new(77, FrameLimits::default()));
        ctx.set_epoch_window(5, 6);
        let (a, dir_a) = endpoint(1, &ctx);
        let (b, dir_b) = endpoint(2, &ctx);
        dir_a.insert(b.peer_id(), Some(b.local_addr().unwrap()));
        dir_b.insert(a.peer_id(), Some(a.local_addr().unwrap()));
        // A peer whose port swallows every packet: its dial can only time out.
        let hole = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let dead = Identity::from_seed([3; 32]).peer_id();
        dir_a.insert(dead, Some(hole.local_addr().unwrap()));
        a.set_connect_timeout(Duration::from_secs(3));
        let store_dir = tempfile::tempdir().unwrap();
        let store = LocalDirStore::shared(store_dir.path(), FileIo::start(false)).unwrap();
        let (tx, mut reports) = mpsc::unbounded_channel();
        let mut senders = PeerSenders::new(a.clone(), store, tx);
        // The dead peer's frame first, then the live one's.
        senders.send(dead, meta(), Bytes::from(vec![0u8; 16]), None, None);
        senders.send(b.peer_id(), meta(), Bytes::from(vec![1u8; 16]), None, None);
        let got = tokio::time::timeout(Duration::from_secs(30), b.recv()).await.unwrap().unwrap();
        assert_eq!(&got.payload[..], &[1u8; 16][..]);
        // It arrived while the dead peer's dial was still pending.
        assert!(reports.try_recv().is_err(), "the live peer's frame waited for the dead one");
        // Then the dead peer is reported, naming it and the micro-batch.
        let r = tokio::time::timeout(Duration::from_secs(30), reports.recv()).await.unwrap().unwrap();
        let pb::report::Kind::PeerFailed(f) = r else { panic!("expected PeerFailed, got {r:?}") };
        assert_eq!((f.peer.clone(), f.failure()), (dead.0.to_vec(), pb::Failure::Unreachable));
        assert_eq!((f.epoch, f.shard, f.first_sample, f.attempt), (5, 1, 8, 2));
        // Its next frame fails at once (no second dial): reported before a
        // frame sent after it to the live peer is even queued behind it.
        senders.send(dead, meta(), Bytes::from(vec![0u8; 16]), None, None);
        let r = tokio::time::timeout(Duration::from_millis(2_500), reports.recv()).await;
        assert!(r.is_ok_and(|r| r.is_some()), "a known-dead peer's frame waited for another dial");
    }
}
