//! A worker's stage fitted to its stated memory, and the merge behind
//! compute landing as the next epoch ends.

use super::*;

/// A worker told its memory refuses an assigned stage its memory plan does
/// not hold, with a typed error (the miner stops on it), before allocating
/// the stage; with enough memory it takes the stage.
#[test]
fn a_worker_refuses_a_stage_its_stated_memory_does_not_hold() {
    use iota_core::memory_plan::ComputeBackend;
    use iota_dataplane::miner::worker::StageDoesNotFit;
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let _g = rt.enter();
    let dir = tempfile::tempdir().unwrap();
    let store = LocalDirStore::shared(dir.path(), FileIo::start(true)).unwrap();
    let be = Arc::new(CpuBackend::new());
    let worker = |memory: u64| {
        let ctx = Arc::new(RunContext::new(RUN, FrameLimits::default()));
        let me = Identity::from_seed([9; 32]).peer_id();
        Worker::new(be.clone(), me, run_config(), None, store.clone(), rt.handle().clone(), PeerDirectory::new(), ctx)
            .with_memory(Some((memory, ComputeBackend::Cpu)))
    };
    let assign = || Input::Command(pb::command::Kind::Assign(pb::Assignment { stage: 1, ..Default::default() }));
    let mut small = worker(64 << 10);
    let err = small.handle(assign(), &mut Vec::new()).unwrap_err();
    let fit = err.downcast_ref::<StageDoesNotFit>().expect("a typed refusal");
    assert_eq!(fit.0.stage, 1);
    assert!(format!("{err:#}").contains("needs"), "{err:#}");
    assert!(small.stage().is_none(), "nothing was allocated");
    let mut roomy = worker(1 << 30);
    roomy.handle(assign(), &mut Vec::new()).unwrap();
    assert_eq!(roomy.stage().unwrap().spec().index, 1);
}

/// A merge that records what the worker hands it and, when handed a plan,
/// finishes at once with `result` (the merge behind compute's landing is
/// the worker's arithmetic; this isolates it from the butterfly's).
struct RecordingMerge {
    seen: Arc<parking_lot::Mutex<MergeLog>>,
    result: Vec<f32>,
    merged: Option<(u64, Vec<f32>)>,
}

#[derive(Default)]
struct MergeLog {
    /// (epoch, the merge's reference point)
    started: Vec<(u64, Vec<f32>)>,
    /// (epoch, the weights contributed)
    contributed: Vec<(u64, Vec<f32>)>,
}

impl iota_dataplane::miner::merge::Merge for RecordingMerge {
    fn epoch_started(&mut self, epoch: u64, _stage: u32, params: &[f32]) {
        self.seen.lock().started.push((epoch, params.to_vec()));
    }
    fn contribute(
        &mut self,
        epoch: u64,
        _stage: u32,
        _layout: &ParamLayout,
        params: &[f32],
        _work: u64,
        _out: &mut Vec<Output>,
    ) -> anyhow::Result<()> {
        self.seen.lock().contributed.push((epoch, params.to_vec()));
        Ok(())
    }
    fn merging(
        &mut self,
        p: &pb::PhaseChange,
        _stage: u32,
        _layout: &ParamLayout,
        _out: &mut Vec<Output>,
    ) -> anyhow::Result<()> {
        let plan = iota_protocol::plan_from_pb(p.merge_plan.as_ref().unwrap()).map_err(anyhow::Error::msg)?;
        self.merged = Some((plan.epoch, self.result.clone()));
        Ok(())
    }
    fn take_merged(&mut self) -> Option<(u64, Vec<f32>)> {
        self.merged.take()
    }
}

#[test]
fn the_merge_behind_compute_lands_as_the_next_epoch_ends_keeping_what_each_replica_trained() {
    let mut cfg = run_config();
    cfg.spec.epochs = 3;
    cfg.spec.merge.overlap = true;
    let mut s = Swarm::with_config(None, cfg);
    let logs: Vec<_> = (0..s.miners.len()).map(|_| Arc::new(parking_lot::Mutex::new(MergeLog::default()))).collect();
    // Each stage's "merged" weights: its start weights, halved.
    let merged: Vec<Vec<f32>> = s.miners.iter().map(|m| m.start.iter().map(|x| x * 0.5).collect()).collect();
    for (i, m) in s.miners.iter_mut().enumerate() {
        m.w.set_merge(Box::new(RecordingMerge { seen: logs[i].clone(), result: merged[i].clone(), merged: None }));
    }
    let params = |s: &Swarm, i: usize| s.miners[i].w.stage().unwrap().params_host();
    let phase = |s: &mut Swarm, p: pb::PhaseChange| {
        for i in 0..s.miners.len() {
            s.command(i, pb::command::Kind::Phase(p.clone()));
        }
    };
    let change = |epoch: u64, phase: pb::Phase, weights_from: u64| pb::PhaseChange {
        epoch,
        phase: phase as i32,
        weights_from,
        ..Default::default()
    };
    // Epoch 0 (its Training phase came with the assignment): nothing to land.
    s.train(0);
    s.train(1);
    let w0: Vec<Vec<f32>> = (0..3).map(|i| params(&s, i)).collect();
    phase(&mut s, change(0, pb::Phase::Uploading, 0));
    for i in 0..3 {
        let log = logs[i].lock();
        assert_eq!(
            log.started,
            vec![(0, s.miners[i].start.clone())],
            "stage {i}: merge 0 starts from the seed's weights"
        );
        assert_eq!(log.contributed, vec![(0, w0[i].clone())], "stage {i}: contributes what it trained");
        assert_eq!(params(&s, i), w0[i]);
    }
    // Epoch 1 trains while merge 0 runs; its result, coming mid-training,
    // is held, not applied.
    let plan = iota_core::merge::MergePlan::bounded(
        0,
        0,
        vec![iota_core::merge::Participant { peer: s.miners[0].id, work: 1 }],
        1024,
        RUN,
        1,
        1 << 20,
        iota_core::merge::BLOCK,
    );
    let with_plan =
        pb::PhaseChange { merge_plan: Some(iota_protocol::plan_to_pb(&plan)), ..change(1, pb::Phase::Training, 0) };
    phase(&mut s, with_plan);
    for (i, w) in w0.iter().enumerate() {
        assert!(params(&s, i) == *w, "stage {i}: the merged weights wait for the epoch's end");
    }
    s.train_in(1, 2);
    s.train_in(1, 3);
    let w1: Vec<Vec<f32>> = (0..3).map(|i| params(&s, i)).collect();
    assert!(w1[0] != w0[0], "epoch 1 trained");
    // Epoch 1 ends: each replica lands merge 0 (merged + what it trained
    // since epoch 1 started) and merge 1 starts from merge 0's weights.
    phase(&mut s, change(1, pb::Phase::Uploading, 1));
    for i in 0..3 {
        let landed: Vec<f32> = merged[i].iter().zip(&w1[i]).zip(&w0[i]).map(|((m, w), s0)| m + (w - s0)).collect();
        assert!(params(&s, i) == landed, "stage {i}: landed weights");
        let log = logs[i].lock();
        assert!(log.started.last() == Some(&(1, merged[i].clone())), "stage {i}: merge 1's reference point");
        assert!(log.contributed.last() == Some(&(1, landed)), "stage {i}: contributes the landed weights");
    }
}
