//! The butterfly replica's state machine fed by hand, where a whole merge
//! (`merge::local`) cannot reach the state: a replica restarted between
//! its stage's uploads and the plan.

use super::*;
use crate::fileio::FileIo;
use crate::frame::FrameLimits;
use crate::local_store::LocalDirStore;
use iota_core::Identity;
use iota_core::merge::Participant;
use iota_protocol::plan_to_pb;

/// A replica that started the epoch again (a restart) after its upload,
/// handed a plan that names it, holds nothing to merge: it sends nothing,
/// reports nothing and fails nothing (the plan's other owners cover its
/// partitions), where it used to end its worker with an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_restarted_after_the_uploads_sits_out_the_plan_that_names_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = LocalDirStore::shared(dir.path(), FileIo::start(false)).unwrap();
    let (me, other) = (Identity::generate().peer_id(), Identity::generate().peer_id());
    let ctx = Arc::new(RunContext::new(7, FrameLimits::default()));
    ctx.set_epoch_window(1, 1);
    let n = 4 * BLOCK as usize;
    let layout = super::super::local::flat_layout(n);
    let participants = vec![Participant { peer: me, work: 3 }, Participant { peer: other, work: 3 }];
    let plan = MergePlan::new(1, 0, participants, n as u64, 9, 2);
    assert!(plan.is_participant(&me));
    let phase = pb::PhaseChange {
        epoch: 1,
        phase: pb::Phase::Merging as i32,
        merge_plan: Some(plan_to_pb(&plan)),
        ..Default::default()
    };
    let rt = tokio::runtime::Handle::current();
    let merged = tokio::task::spawn_blocking(move || {
        let mut b = Butterfly::new(me, MergeSpec::default(), store, rt, ctx);
        b.epoch_started(1, 0, &vec![0.5; n]);
        let mut out = Vec::new();
        b.merging(&phase, 0, &layout, &mut out).expect("no error for a plan without a contribution");
        b.tick(&mut out).unwrap();
        (out.len(), b.take_merged().is_some())
    })
    .await
    .unwrap();
    assert_eq!(merged, (0, false), "it sent or merged something without a contribution");
}
