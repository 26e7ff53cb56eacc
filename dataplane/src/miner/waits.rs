//! Which neighbour each routed micro-batch waits on, and since when, so a
//! neighbour that is overdue with its input is reported (PROTOCOL.md,
//! "Liveness"). Bounded by the routes the worker holds.

use std::collections::HashMap;

use iota_core::PeerId;
use iota_protocol::pb;
use tracing::debug;

use super::events::Output;
use super::evidence_log::MbKey;

/// A wait for a neighbour's frame.
struct Wait {
    on: PeerId,
    since: std::time::Instant,
    reported: bool,
}

/// Per routed micro-batch: the neighbour whose input it waits for.
#[derive(Default)]
pub(super) struct Waits {
    waits: HashMap<MbKey, Wait>,
}

impl Waits {
    /// Which neighbour each routed micro-batch waits on now, and since when:
    /// the previous stage for the activation, then (past the tail) the next
    /// stage for the gradient; the head waits for the gradient at once.
    /// `inbound`: the micro-batches whose activation arrived.
    pub(super) fn track(&mut self, s: usize, routes: &HashMap<MbKey, pb::Route>, inbound: &HashMap<MbKey, [u8; 32]>) {
        let now = std::time::Instant::now();
        self.waits.retain(|k, _| routes.contains_key(k));
        for (k, r) in routes {
            let next = r.pathway.get(s + 1);
            let on = if s == 0 || inbound.contains_key(k) { next } else { r.pathway.get(s - 1) };
            let Some(on) = on.and_then(|p| <[u8; 32]>::try_from(p.as_slice()).ok()).map(PeerId) else { continue };
            match self.waits.get(k) {
                Some(w) if w.on == on => {}
                _ => {
                    self.waits.insert(*k, Wait { on, since: now, reported: false });
                }
            }
        }
    }

    /// Tells the orchestrator which neighbours are overdue with their input
    /// (after the route's `overdue_ms`, or half the route timeout), once per
    /// wait.
    pub(super) fn report_overdue(
        &mut self,
        routes: &HashMap<MbKey, pb::Route>,
        route_timeout_ms: u64,
        out: &mut Vec<Output>,
    ) {
        let default = route_timeout_ms / 2;
        for (k, w) in self.waits.iter_mut().filter(|(_, w)| !w.reported) {
            let Some(r) = routes.get(k) else { continue };
            let overdue = if r.overdue_ms > 0 { r.overdue_ms.min(default) } else { default };
            if w.since.elapsed() < std::time::Duration::from_millis(overdue) {
                continue;
            }
            w.reported = true;
            debug!(peer = %w.on, shard = r.shard, first = r.first_sample, "input overdue; reported");
            out.push(Output::Report(pb::report::Kind::PeerFailed(pb::PeerFailed {
                epoch: r.epoch,
                shard: r.shard,
                first_sample: r.first_sample,
                attempt: r.attempt,
                peer: w.on.0.to_vec(),
                failure: pb::Failure::NoInput as i32,
            })));
        }
    }
}
