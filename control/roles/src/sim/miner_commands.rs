//! Which commands a simulated miner acts on: the simulator queues only
//! those (in a file of its own: `sim.rs` reads it, and `miners.rs`, which
//! acts on them, reads `sim.rs`).

use iota_core::PeerId;
use iota_wire::pb;

/// Whether miner `to` acts on `cmd` when it arrives (`reach_miner`, in
/// `miners.rs`, drops the rest; the two must agree): what it would drop
/// is not queued. The `Stored` notices (each merged partition's, to each
/// of the stage's participants) and the routes' other stages were each
/// allocated, queued, popped and dropped.
pub(super) fn acts_on(to: &PeerId, cmd: &pb::command::Kind) -> bool {
    use pb::command::Kind;
    match cmd {
        // Only the head drives a route.
        Kind::Route(r) => r.pathway.first().is_some_and(|head| head.as_slice() == to.0),
        Kind::Phase(_) | Kind::Verdict(_) | Kind::EvidenceRequest(_) | Kind::ContributionRequest(_) => true,
        _ => false,
    }
}
