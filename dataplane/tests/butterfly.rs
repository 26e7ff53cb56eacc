//! The butterfly merge over real QUIC on 127.0.0.1: R replicas in process,
//! the orchestrator's `StageMerge` coordinating.

use std::sync::Arc;
use std::time::Duration;

use iota_core::merge::{OuterOpt, ReduceRule};
use iota_core::{Rng, WireCodec};
use iota_dataplane::fileio::FileIo;
use iota_dataplane::frame::FrameLimits;
use iota_dataplane::local_store::LocalDirStore;
use iota_dataplane::miner::merge::local::{
    LocalReplica, flat_layout, run_local_butterfly, run_local_butterfly_with_limits,
};
use iota_dataplane::miner::merge::{MergeFault, load_weights};
use iota_protocol::{MergeMethod, MergeSpec};

fn spec(rule: ReduceRule, codec: WireCodec, slices: u32) -> MergeSpec {
    MergeSpec { method: MergeMethod::Butterfly, slices_per_replica: slices, codec, rule, ..MergeSpec::default() }
}

/// theta_prev and R trained replicas near it.
fn replicas(r: usize, n: usize, seed: u64) -> (Arc<Vec<f32>>, Vec<LocalReplica>) {
    let mut rng = Rng::new(seed);
    let prev: Vec<f32> = (0..n).map(|_| rng.normal() * 0.05).collect();
    let drift: Vec<f32> = (0..n).map(|_| rng.normal() * 0.01).collect();
    let reps = (0..r)
        .map(|i| LocalReplica {
            params: prev.iter().zip(&drift).map(|(p, d)| p - d + rng.normal() * 0.003).collect(),
            work: 10 + i as u64,
            fault: None,
            dies_on_plan: false,
            isolated: false,
        })
        .collect();
    (Arc::new(prev), reps)
}

fn weighted_mean(reps: &[LocalReplica]) -> Vec<f32> {
    let total: f64 = reps.iter().map(|r| r.work as f64).sum();
    (0..reps[0].params.len())
        .map(|j| (reps.iter().map(|r| r.work as f64 * r.params[j] as f64).sum::<f64>() / total) as f32)
        .collect()
}

fn dist(a: &[f32], b: &[f32]) -> f64 {
    a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum::<f64>().sqrt()
}

fn max_abs(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

const TIMEOUT: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn butterfly_equals_the_mean_and_replicas_end_bitwise_identical() {
    let n = 10_007; // odd, and not a multiple of the 256-value block
    for r in [1usize, 2, 3, 5, 8] {
        for slices in [1u32, 2] {
            let dir = tempfile::tempdir().unwrap();
            let (prev, reps) = replicas(r, n, r as u64);
            let want = weighted_mean(&reps);
            let rep = run_local_butterfly(
                spec(ReduceRule::Mean, WireCodec::F32, slices),
                0,
                prev,
                reps,
                dir.path(),
                TIMEOUT,
                &[],
            )
            .await
            .unwrap();
            let merged: Vec<Vec<f32>> = rep.merged.into_iter().map(|m| m.unwrap()).collect();
            let err = max_abs(&merged[0], &want);
            assert!(err < 1e-6, "R={r} slices={slices}: max error {err}");
            assert!(merged.iter().all(|m| m == &merged[0]), "R={r}: replicas differ");
            assert!(rep.mismatches.is_empty());
            // Plain averaging keeps no outer momentum: none is stored.
            assert!(rep.momentum_objects.is_empty() && !rep.weights_objects.is_empty());
            println!("R={r} slices={slices}: sent {:?} received {:?}", rep.sent_bytes, rep.recv_bytes);
        }
    }
}

/// A stage several times larger than the receivers' frame limit: the plan
/// cuts it into partitions whose slices fit, so no frame is refused and
/// nothing goes through the store; the merge equals the unbounded one
/// bit for bit. The same merge planned without the bound (one partition
/// per replica) is refused by the same receivers, so the check can fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stage_larger_than_the_frame_limit_merges_in_slices_that_fit() {
    let n = 40_000; // 160 KB of f32: 8 times the limit
    let limit = 20_000u64;
    let tight = FrameLimits { max_payload: limit, ..FrameLimits::default() };
    let (prev, reps) = replicas(3, n, 11);
    let want = weighted_mean(&reps);
    let bounded = MergeSpec { max_slice_bytes: limit, ..spec(ReduceRule::Mean, WireCodec::F32, 1) };
    let dir = tempfile::tempdir().unwrap();
    let rep = run_local_butterfly_with_limits(bounded, 0, prev.clone(), reps.clone(), dir.path(), TIMEOUT, &[], tight)
        .await
        .unwrap();
    assert_eq!(rep.frames_refused, 0, "a slice was refused");
    assert_eq!(rep.store_fallbacks, 0, "a slice went through the store");
    let merged: Vec<Vec<f32>> = rep.merged.into_iter().map(|m| m.unwrap()).collect();
    assert!(merged.iter().all(|m| m == &merged[0]), "replicas differ");
    assert!(max_abs(&merged[0], &want) < 1e-6);
    // Partitioning does not change an element-wise mean: the same bits as
    // one partition per replica under no limit.
    let dir = tempfile::tempdir().unwrap();
    let free = run_local_butterfly(
        spec(ReduceRule::Mean, WireCodec::F32, 1),
        0,
        prev.clone(),
        reps.clone(),
        dir.path(),
        TIMEOUT,
        &[],
    )
    .await
    .unwrap();
    assert_eq!(free.merged[0].as_ref().unwrap(), &merged[0]);
    // Planned as before the bound existed, the receivers' limit refuses the
    // slices: a miner says so instead of merging.
    let unbounded = MergeSpec { max_slice_bytes: 1 << 27, ..spec(ReduceRule::Mean, WireCodec::F32, 1) };
    let dir = tempfile::tempdir().unwrap();
    let refused =
        run_local_butterfly_with_limits(unbounded, 0, prev, reps, dir.path(), Duration::from_secs(5), &[], tight).await;
    assert!(refused.is_err(), "a plan of slices over the frame limit cannot complete");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compressed_slices_stay_within_codec_error() {
    let n = 5_001;
    for codec in [WireCodec::Bf16, WireCodec::Int8Row] {
        let dir = tempfile::tempdir().unwrap();
        let (prev, reps) = replicas(4, n, 3);
        let want = weighted_mean(&reps);
        let delta_scale = dist(&prev, &want);
        let rep = run_local_butterfly(spec(ReduceRule::Mean, codec, 1), 0, prev, reps, dir.path(), TIMEOUT, &[])
            .await
            .unwrap();
        let merged: Vec<Vec<f32>> = rep.merged.into_iter().map(|m| m.unwrap()).collect();
        assert!(merged.iter().all(|m| m == &merged[0]), "{codec:?}: replicas differ");
        let rel = dist(&merged[0], &want) / delta_scale;
        // bf16: 2^-8 relative per value, twice (slices and update); int8: 1/127 of a block's max.
        assert!(rel < 0.03, "{codec:?}: error {rel} of the update's size");
    }
}

/// A replica sending a pseudo-gradient with a NaN in it, or a million
/// times too large: every honest owner flags it and leaves it out of its
/// reduce, whatever the rule, and the two other owners of a partition it
/// does not own flag it, so it is planned out; the merge is the honest
/// replicas' mean.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_or_nan_replica_is_flagged_planned_out_and_left_out_of_the_mean() {
    let n = 4_099;
    for fault in [MergeFault::HugeDelta, MergeFault::NanDelta] {
        for rule in [ReduceRule::CenteredClip { tau_factor: 2.0, iters: 3 }, ReduceRule::Mean] {
            let dir = tempfile::tempdir().unwrap();
            let (prev, mut reps) = replicas(5, n, 8);
            let honest = weighted_mean(&reps[1..]);
            let update = dist(&prev, &honest);
            reps[0].fault = Some(fault);
            let rep = run_local_butterfly(spec(rule, WireCodec::Bf16, 1), 0, prev, reps, dir.path(), TIMEOUT, &[])
                .await
                .unwrap();
            assert_eq!(rep.planned_out, vec![rep.peers[0]], "{fault:?} {rule:?}: the faulty replica is planned out");
            assert!(rep.merged[0].is_none());
            let merged: Vec<&Vec<f32>> = rep.merged[1..].iter().map(|m| m.as_ref().unwrap()).collect();
            assert!(merged.iter().all(|m| *m == merged[0]));
            assert!(merged[0].iter().all(|x| x.is_finite()), "{fault:?} {rule:?}: non-finite weights");
            // Centered clipping pulls a little towards the coordinate-wise
            // median; the mean is the honest mean up to the codec.
            let rel = dist(merged[0], &honest) / update;
            assert!(rel < 0.2, "{fault:?} {rule:?}: {rel} of an honest update away from the honest mean");
        }
    }
}

/// With two replicas every partition is owned by both, so no sender is
/// flagged by two others and nobody is planned out; an owner running the
/// honest code (here the faulty replica too: it cheats only in what it
/// sends) leaves the huge contribution out, so the merge is the other
/// replica's alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_two_replicas_a_huge_one_is_left_out_but_not_planned_out() {
    let n = 4_099;
    let (prev, mut reps) = replicas(2, n, 8);
    reps[0].fault = Some(MergeFault::HugeDelta);
    let honest = weighted_mean(&reps[1..]);
    let update = dist(&prev, &honest);
    let dir = tempfile::tempdir().unwrap();
    let rep = run_local_butterfly(spec(ReduceRule::Mean, WireCodec::Bf16, 1), 0, prev, reps, dir.path(), TIMEOUT, &[])
        .await
        .unwrap();
    assert!(rep.planned_out.is_empty(), "one other owner's flag is not enough");
    let m = rep.merged[1].clone().unwrap();
    assert_eq!(rep.merged[0].as_ref(), Some(&m), "both replicas end with the same weights");
    let rel = dist(&m, &honest) / update;
    assert!(rel < 0.05, "{rel} of an honest update away from the honest replica's weights");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_owner_is_caught_by_hash_and_the_refereed_slice_wins() {
    let n = 6_000;
    let dir = tempfile::tempdir().unwrap();
    let (prev, mut reps) = replicas(3, n, 21);
    let want = weighted_mean(&reps);
    reps[1].fault = Some(MergeFault::CorruptUpdates);
    let rep = run_local_butterfly(spec(ReduceRule::Mean, WireCodec::F32, 1), 0, prev, reps, dir.path(), TIMEOUT, &[])
        .await
        .unwrap();
    let liar = rep.peers[1];
    // Replica 1 owns two of the three partitions: both disputes reported, with both owners.
    assert_eq!(rep.mismatches.len(), 2, "{:?}", rep.mismatches);
    for m in &rep.mismatches {
        assert_eq!(m.owners.len(), 2);
        assert!(m.owners.iter().any(|(p, _)| *p == liar));
        assert_eq!(m.deviants, vec![liar], "the referee's result names the liar");
    }
    let merged: Vec<Vec<f32>> = rep.merged.into_iter().map(|m| m.unwrap()).collect();
    for m in &merged {
        assert!(max_abs(m, &want) < 1e-6, "every replica, the liar too, holds the honest result");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_dying_mid_merge_is_planned_out_and_rejoins_by_download() {
    let n = 8_192;
    let dir = tempfile::tempdir().unwrap();
    let (prev, mut reps) = replicas(4, n, 5);
    reps[2].dies_on_plan = true;
    let survivors: Vec<LocalReplica> = reps.iter().filter(|r| !r.dies_on_plan).cloned().collect();
    let want = weighted_mean(&survivors);
    let rep = run_local_butterfly(spec(ReduceRule::Mean, WireCodec::F32, 1), 0, prev, reps, dir.path(), TIMEOUT, &[])
        .await
        .unwrap();
    assert!(rep.merged[2].is_none());
    let merged: Vec<Vec<f32>> = rep.merged.iter().flatten().cloned().collect();
    assert_eq!(merged.len(), 3);
    assert!(merged.iter().all(|m| m == &merged[0]));
    assert!(max_abs(&merged[0], &want) < 1e-6);
    // The dead replica (or any newcomer) downloads the merged stage.
    let store = LocalDirStore::shared(dir.path(), FileIo::start(false)).unwrap();
    let (fetched, bad) = load_weights(&store, &rep.weights_objects, &flat_layout(n)).await;
    assert!(bad.is_empty());
    let fetched = fetched.unwrap();
    assert_eq!(fetched, merged[0], "the stored stage is bitwise the merged one");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_replica_merges_through_the_object_store() {
    let _ = tracing_subscriber::fmt().with_env_filter("warn").with_test_writer().try_init();
    let n = 3_000;
    let dir = tempfile::tempdir().unwrap();
    let (prev, mut reps) = replicas(3, n, 13);
    let want = weighted_mean(&reps);
    reps[0].isolated = true;
    let rep = run_local_butterfly(spec(ReduceRule::Mean, WireCodec::F32, 1), 0, prev, reps, dir.path(), TIMEOUT, &[])
        .await
        .unwrap();
    assert!(rep.store_fallbacks > 0, "slices went through the store");
    let merged: Vec<Vec<f32>> = rep.merged.into_iter().map(|m| m.unwrap()).collect();
    assert!(merged.iter().all(|m| m == &merged[0]), "replicas differ");
    assert!(max_abs(&merged[0], &want) < 1e-6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outer_nesterov_momentum_persists_across_merges_through_the_store() {
    use iota_core::merge::{OuterOpt, reduce_slice};
    let n = 2_500;
    let dir = tempfile::tempdir().unwrap();
    let outer = OuterOpt { lr: 0.7, momentum: 0.9 };
    let mut s = spec(ReduceRule::Mean, WireCodec::F32, 1);
    s.outer = outer;
    // Epoch 0 with 3 replicas, epoch 1 with 4 (other identities, another plan).
    let (prev0, reps0) = replicas(3, n, 31);
    let m0 = run_local_butterfly(s.clone(), 0, prev0.clone(), reps0.clone(), dir.path(), TIMEOUT, &[]).await.unwrap();
    assert_eq!(m0.momentum_objects.len(), m0.weights_objects.len(), "every partition's momentum is stored");
    let theta1 = m0.merged[0].clone().unwrap();
    let mut rng = Rng::new(77);
    let reps1: Vec<LocalReplica> = (0..4)
        .map(|i| LocalReplica {
            params: theta1.iter().map(|t| t - 0.002 + rng.normal() * 0.001).collect(),
            work: 5 + i,
            fault: None,
            dies_on_plan: false,
            isolated: false,
        })
        .collect();
    let m1 =
        run_local_butterfly(s, 1, Arc::new(theta1.clone()), reps1.clone(), dir.path(), TIMEOUT, &m0.momentum_objects)
            .await
            .unwrap();
    let theta2 = m1.merged[0].clone().unwrap();
    // The same two outer steps computed directly.
    let step = |prev: &[f32], reps: &[LocalReplica], m: &mut Vec<f32>| -> Vec<f32> {
        let deltas: Vec<Vec<f32>> =
            reps.iter().map(|r| prev.iter().zip(&r.params).map(|(p, l)| p - l).collect()).collect();
        let total: f64 = reps.iter().map(|r| r.work as f64).sum();
        let w: Vec<f64> = reps.iter().map(|r| r.work as f64 / total).collect();
        let refs: Vec<Option<&[f32]>> = deltas.iter().map(|d| Some(d.as_slice())).collect();
        let (u, _) = reduce_slice(ReduceRule::Mean, outer, &refs, &w, m);
        prev.iter().zip(&u).map(|(p, u)| p - u).collect()
    };
    let mut m = vec![0.0f32; n];
    let want1 = step(&prev0, &reps0, &mut m);
    assert!(max_abs(&theta1, &want1) < 1e-6);
    let want2 = step(&theta1, &reps1, &mut m);
    let err = max_abs(&theta2, &want2);
    assert!(err < 1e-6, "second merge used the stored momentum: error {err}");
    // And the momentum mattered: without it the result differs.
    let mut zero = vec![0.0f32; n];
    let no_momentum = step(&theta1, &reps1, &mut zero);
    assert!(max_abs(&theta2, &no_momentum) > 1e-4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_storing_other_bytes_than_it_announced_is_named_and_its_objects_unused() {
    let n = 4_096;
    let dir = tempfile::tempdir().unwrap();
    let mut s = spec(ReduceRule::Mean, WireCodec::F32, 2);
    s.outer = OuterOpt { lr: 0.7, momentum: 0.9 };
    let (prev, mut reps) = replicas(3, n, 41);
    reps[1].fault = Some(MergeFault::LyingWriter);
    let m0 = run_local_butterfly(s.clone(), 0, prev, reps, dir.path(), TIMEOUT, &[]).await.unwrap();
    let liar = m0.peers[1];
    let lied: Vec<_> = m0.weights_objects.iter().filter(|o| o.writer == liar).collect();
    assert!(!lied.is_empty() && lied.len() < m0.weights_objects.len(), "the liar writes some partitions");
    // The merge itself is unaffected: every replica holds the same weights.
    let merged: Vec<Vec<f32>> = m0.merged.iter().map(|m| m.clone().unwrap()).collect();
    assert!(merged.iter().all(|m| m == &merged[0]));
    // A newcomer loading the stage finds the liar's parts, and only those,
    // different from their announcement, and fails rather than load them.
    let store = LocalDirStore::shared(dir.path(), FileIo::start(false)).unwrap();
    let (got, bad) = load_weights(&store, &m0.weights_objects, &flat_layout(n)).await;
    assert!(got.is_err());
    assert_eq!(bad.len(), lied.len());
    assert!(bad.iter().all(|b| b.object.writer == liar && b.reason.contains("hash")), "{bad:?}");
    // The next merge reads the momentum: the liar's parts are rejected
    // (zeros used for their ranges) and the merge still completes, equal
    // on every replica and finite.
    let theta1 = Arc::new(merged[0].clone());
    let (_, reps1) = replicas(3, n, 43);
    let reps1: Vec<LocalReplica> = reps1
        .into_iter()
        .map(|r| LocalReplica { params: theta1.iter().zip(&r.params).map(|(t, p)| t + p * 0.01).collect(), ..r })
        .collect();
    let m1 = run_local_butterfly(s, 1, theta1, reps1, dir.path(), TIMEOUT, &m0.momentum_objects).await.unwrap();
    let merged1: Vec<Vec<f32>> = m1.merged.iter().map(|m| m.clone().unwrap()).collect();
    assert!(merged1.iter().all(|m| m == &merged1[0] && m.iter().all(|v| v.is_finite())));
}

/// Sparse contributions (`MergeSpec::sparse_density`): each replica sends
/// the largest 1/32 of every 16,384 values of its pseudo-gradient. With two
/// replicas both own every partition, so no update crosses the wire and the
/// merge sends a twentieth of bf16's bytes or less; every replica ends with
/// the same weights, moved only where a contribution kept a value, and
/// nearer the replicas' mean. With three, updates go to non-owners in bf16
/// and the replicas still agree. A sender of NaN or of a huge
/// pseudo-gradient is flagged and planned out, as with dense slices.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sparse_contributions_send_a_fraction_of_the_bytes_and_every_replica_agrees() {
    // Not whole sparse blocks: each partition's last block is padded.
    let n = 8 * 16_384 + 77;
    let sparse =
        |r: usize| MergeSpec { sparse_density: 1.0 / 32.0, ..spec(ReduceRule::Mean, WireCodec::Bf16, r as u32) };
    let (prev, reps) = replicas(2, n, 5);
    let run = |s: MergeSpec, reps: Vec<LocalReplica>, prev: Arc<Vec<f32>>| async move {
        let dir = tempfile::tempdir().unwrap();
        run_local_butterfly(s, 0, prev, reps, dir.path(), TIMEOUT, &[]).await.unwrap()
    };
    let dense = run(spec(ReduceRule::Mean, WireCodec::Bf16, 1), reps.clone(), prev.clone()).await;
    let rep = run(sparse(1), reps.clone(), prev.clone()).await;
    let (d, s): (u64, u64) = (dense.sent_bytes.iter().sum(), rep.sent_bytes.iter().sum());
    assert!(s > 0 && d > 20 * s, "{s} bytes sparse against {d} in bf16");
    let merged: Vec<Vec<f32>> = rep.merged.into_iter().map(|m| m.unwrap()).collect();
    assert!(merged.iter().all(|m| m == &merged[0]), "replicas differ");
    let moved = merged[0].iter().zip(prev.iter()).filter(|(m, p)| m != p).count();
    assert!(moved > 0 && moved < n / 8, "{moved} of {n} values moved");
    let want = weighted_mean(&reps);
    assert!(dist(&merged[0], &want) < dist(&prev, &want), "the merge moves towards the replicas' mean");

    let (prev, reps) = replicas(3, n, 6);
    let rep = run(sparse(2), reps, prev).await;
    let merged: Vec<Vec<f32>> = rep.merged.into_iter().map(|m| m.unwrap()).collect();
    assert!(merged.iter().all(|m| m == &merged[0]), "three replicas differ");

    for fault in [MergeFault::HugeDelta, MergeFault::NanDelta] {
        let (prev, mut reps) = replicas(5, n, 7);
        reps[0].fault = Some(fault);
        let rep = run(sparse(1), reps, prev).await;
        assert_eq!(rep.planned_out, vec![rep.peers[0]], "{fault:?}: the faulty replica is planned out");
        let merged: Vec<&Vec<f32>> = rep.merged[1..].iter().map(|m| m.as_ref().unwrap()).collect();
        assert!(merged.iter().all(|m| *m == merged[0] && m.iter().all(|x| x.is_finite())), "{fault:?}");
    }
}
