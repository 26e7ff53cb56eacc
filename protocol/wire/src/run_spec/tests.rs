use super::*;

fn spec(epochs: u64, per_epoch: u64, ramp_first_epoch: u64) -> RunSpec {
    RunSpec {
        run_id: 1,
        stages: 3,
        replicas: 2,
        epochs,
        micro_batches_per_epoch: per_epoch,
        batch: 4,
        max_in_flight: 4,
        ramp_first_epoch,
        ..RunSpec::default()
    }
}

fn lengths(s: &RunSpec) -> Vec<u64> {
    (0..s.epoch_count()).map(|e| s.epoch_len(e)).collect()
}

/// Every micro-batch of the run has one global number, in order, with
/// no gap or overlap between epochs.
fn numbers_follow_on(s: &RunSpec) {
    let mut next = 0;
    for e in 0..s.epoch_count() {
        assert_eq!(s.epoch_start(e), next, "epoch {e}");
        for seq in 0..s.epoch_len(e) {
            assert_eq!(s.micro_batch(e, seq).first_sample, next * s.batch as u64);
            next += 1;
        }
    }
    assert_eq!(next, s.total_micro_batches());
    assert_eq!(s.epoch_len(s.epoch_count()), 0);
}

#[test]
fn without_the_ramp_every_epoch_is_full() {
    let s = spec(6, 48, 0);
    assert_eq!(lengths(&s), vec![48; 6]);
    numbers_follow_on(&s);
}

#[test]
fn the_ramp_doubles_the_first_epochs_and_keeps_the_runs_micro_batches() {
    // 2 replicas, one step each, then doubling: the merges fall after
    // inner steps 1, 3, 7, 15 and 31 of each replica, then every 24,
    // as the replay's `-ramp` (bench/src/convergence/variant.rs).
    let s = spec(6, 48, 2);
    assert_eq!(lengths(&s), vec![2, 4, 8, 16, 32, 48, 48, 48, 48, 34]);
    numbers_follow_on(&s);
    // A run shorter than the ramp ends inside it.
    let short = spec(1, 48, 2);
    assert_eq!(lengths(&short), vec![2, 4, 8, 16, 18]);
    numbers_follow_on(&short);
    // A first epoch as long as a full one: no ramp.
    assert_eq!(lengths(&spec(3, 8, 8)), vec![8; 3]);
    // The pipeline's warm-up counts micro-batches over the epochs.
    let mut warm = spec(6, 48, 2);
    warm.pipeline_warmup_micro_batches = 7;
    assert_eq!(warm.max_in_flight_at(2, 0), 2, "6 issued before epoch 2, the 7th is in the warm-up");
    assert_eq!(warm.max_in_flight_at(2, 1), 4);
}

#[test]
fn epoch_arithmetic_saturates_at_the_limits() {
    let s = spec(MAX_RUN_SAMPLES / 4, 1, 0);
    assert_eq!(s.epoch_count(), MAX_RUN_SAMPLES / 4);
    assert_eq!(s.epoch_len(u64::MAX), 0);
    let r = spec(1, 1 << 40, 3);
    assert_eq!(r.epoch_start(1), 3);
    assert_eq!(lengths(&r).iter().sum::<u64>(), 1 << 40);
    assert!(r.epoch_count() <= 40);
    assert_eq!(r.epoch_start(u64::MAX), u64::MAX);
}

/// Sparse contributions: their frame shape and bytes, the dense
/// contribution's unchanged, the run id of a dense run unchanged, and
/// the settings refused (a density outside (0, 1], the parameter
/// server, validators).
#[test]
fn sparse_contributions_have_their_own_shape_and_are_refused_where_unchecked() {
    let dense = MergeSpec::butterfly();
    assert_eq!(dense.contribution_codec(), WireCodec::Bf16);
    assert_eq!(dense.contribution_shape(1000), (4, 256));
    assert_eq!(dense.contribution_bytes(1000), Some(2048));
    let sparse = MergeSpec { sparse_density: 1.0 / 32.0, ..MergeSpec::butterfly() };
    assert_eq!(sparse.contribution_codec(), WireCodec::SparseTopK);
    assert_eq!(sparse.contribution_shape(40_000), (3, 512));
    // 512 kept: 5 low bits each, a 1,024-bit bitvector, 2-bit codes.
    assert_eq!(sparse.contribution_bytes(40_000), Some(3 * (6 + 320 + 128 + 128)));
    // Not in a dense run's settings: its run id stays what it was.
    assert!(!serde_json::to_string(&dense).unwrap().contains("sparse"));
    let mut s = RunSpec { merge: sparse, ..spec(2, 8, 0) };
    s.merge.stage_params = vec![100; 3];
    assert_eq!(s.validate(), Ok(()));
    for bad in [-0.1, 1.5, f32::NAN] {
        let mut b = s.clone();
        b.merge.sparse_density = bad;
        assert!(b.validate().unwrap_err().contains("density"), "{bad}");
    }
    let mut decay = s.clone();
    decay.merge.sparse_decay = 1.5;
    assert!(decay.validate().unwrap_err().contains("decay"));
    let mut ps = s.clone();
    ps.merge.method = MergeMethod::ParameterServer;
    assert!(ps.validate().unwrap_err().contains("butterfly"));
    let mut v = s.clone();
    v.validation.validators = vec![ValidatorStake { peer: iota_core::PeerId([3; 32]), stake: 1 }];
    // Validated: each sender's backlog is committed and audited with its
    // contribution (iota_checks::sparse_contribution).
    assert_eq!(v.validate(), Ok(()));
    // Sparse plans cut partitions on sparse blocks (the same cuts every
    // epoch, for the backlog's audit); a slice bound under one is refused.
    assert_eq!(s.merge.partition_block(), iota_core::codec::SPARSE_BLOCK as u64);
    let peers = (1..4u8).map(|i| Participant { peer: iota_core::PeerId([i; 32]), work: 1 }).collect();
    let plan = s.merge.plan(3, 0, peers, 100_000, 7);
    assert!(plan.partitions.iter().all(|p| p.offset % iota_core::codec::SPARSE_BLOCK as u64 == 0), "{plan:?}");
    let mut small = s.clone();
    small.merge.max_slice_bytes = 8192;
    assert!(small.validate().unwrap_err().contains("partitions of at least 16384"));
}
