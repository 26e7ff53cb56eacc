use std::collections::BTreeMap;

use iota_core::PeerId;

use super::*;
use crate::frame::RunContext;

fn header(step: u64, before: u8, after: u8) -> StepHeader {
    StepHeader {
        step,
        mbs: vec![
            StepMb { shard: 1, first_sample: 4 * step, samples: 2, attempt: 0, weights: [before; 32] },
            StepMb { shard: 1, first_sample: 4 * step + 2, samples: 2, attempt: 1, weights: [before; 32] },
        ],
        weights_before: [before; 32],
        weights_after: [after; 32],
        optimizer_before: [before ^ 0x80; 32],
        optimizer_after: [after ^ 0x80; 32],
    }
}

fn evidence() -> StepEvidence {
    StepEvidence {
        headers: vec![header(3, 1, 2), header(4, 2, 3)],
        carried: false,
        carried_before: Chain::default(),
        index: Some(1),
        from: 1,
        optimizer: OptimizerState { t: 4, m: vec![0.5; 6], v: vec![0.25; 6] },
        weights: vec![vec![1.0; 6], vec![-1.0; 6]],
        frames: vec![
            MbFrames { input: vec![9; 13], input_signer: [5; 32], grad: vec![8; 7], grad_signer: [6; 32] },
            MbFrames { input: vec![], input_signer: [0; 32], grad: vec![7; 3], grad_signer: [6; 32] },
        ],
    }
}

/// What these tests' records call a fresh optimizer state.
const FRESH: [u8; 32] = [1 ^ 0x80; 32];

const LIM: StepLimits = StepLimits { weights: 6, max_headers: 4, max_mbs: 2, max_frame: 64, window: 2 };

#[test]
fn a_record_hashes_every_field_and_evidence_round_trips() {
    let h = header(3, 1, 2);
    let mut seen = std::collections::HashSet::new();
    seen.insert(h.hash());
    let variants = [
        StepHeader { step: 4, ..h.clone() },
        StepHeader { weights_before: [9; 32], ..h.clone() },
        StepHeader { weights_after: [9; 32], ..h.clone() },
        StepHeader { optimizer_before: [9; 32], ..h.clone() },
        StepHeader { optimizer_after: [9; 32], ..h.clone() },
        StepHeader { mbs: h.mbs.iter().rev().copied().collect(), ..h.clone() },
        StepHeader { mbs: h.mbs[..1].to_vec(), ..h.clone() },
    ];
    for v in variants {
        assert!(seen.insert(v.hash()), "{v:?}");
    }
    let ev = evidence();
    assert_eq!(StepEvidence::decode(&ev.encode(), LIM).unwrap(), ev);
    let carried = StepEvidence { carried: true, carried_before: Chain::of([&[4u8; 32]]), ..ev.clone() };
    assert_eq!(StepEvidence::decode(&carried.encode(), LIM).unwrap(), carried);
    let none = StepEvidence { index: None, ..Default::default() };
    let none = StepEvidence { headers: ev.headers.clone(), ..none };
    assert_eq!(StepEvidence::decode(&none.encode(), LIM).unwrap(), none);
    assert_ne!(optimizer_hash(1, &[0.0], &[0.0]), optimizer_hash(2, &[0.0], &[0.0]), "the counter is committed");
    assert_ne!(optimizer_hash(1, &[0.0, 1.0], &[]), optimizer_hash(1, &[0.0], &[1.0]), "m and v apart");
}

/// What a replay is shown: what its first step reads, states older than
/// the two steps before the one reading them, and the last step's result;
/// not what a replayed step left for the next two.
#[test]
fn a_replay_is_shown_only_the_weights_it_cannot_compute() {
    let mut steps = vec![header(0, 1, 2), header(1, 2, 3), header(2, 3, 4), header(3, 4, 5)];
    assert_eq!(shown_states(&steps), vec![[1; 32], [5; 32]], "a replay from 1 computes 2, 3 and 4");
    assert_eq!(shown_states(&steps[2..3]), vec![[3; 32], [4; 32]], "one step: its state before and after");
    // A micro-batch forwarded on the state two steps back is computed; on
    // three steps back it is shown (the replay keeps two results).
    steps[2].mbs[0].weights = [2; 32];
    assert_eq!(shown_states(&steps), vec![[1; 32], [5; 32]]);
    steps[3].mbs[1].weights = [2; 32];
    assert_eq!(shown_states(&steps), vec![[1; 32], [2; 32], [5; 32]]);
    // A late merge's weights in the middle are nobody's result: shown.
    steps[1].weights_before = [9; 32];
    assert_eq!(shown_states(&steps), vec![[1; 32], [9; 32], [2; 32], [5; 32]]);
}

#[test]
fn hostile_step_evidence_is_refused_without_panics() {
    let bytes = evidence().encode();
    for cut in 0..bytes.len() {
        assert!(StepEvidence::decode(&bytes[..cut], LIM).is_err(), "cut at {cut}");
    }
    let mut long = bytes.clone();
    long.push(0);
    assert!(StepEvidence::decode(&long, LIM).is_err(), "trailing");
    // Counts past the bounds, or past what the bytes hold.
    for (at, v) in [(0usize, 5u64), (0, u64::MAX), (16, 3), (16, u64::MAX >> 1)] {
        let mut lie = bytes.clone();
        lie[at..at + 8].copy_from_slice(&v.to_le_bytes());
        assert!(StepEvidence::decode(&lie, LIM).is_err(), "{at}: {v}");
    }
    let tight = StepLimits { max_frame: 12, ..LIM };
    assert!(StepEvidence::decode(&bytes, tight).is_err(), "a frame over the bound");
    let other = StepLimits { weights: 5, ..LIM };
    assert!(StepEvidence::decode(&bytes, other).is_err(), "another stage's size");
}

/// Links 1 and 2 alone (no recompute): the chain, the records' succession
/// and the drawn attempt's place.
#[test]
fn the_records_must_be_the_committed_chain_and_follow_each_other() {
    let accum = 2;
    let ctx = RunContext::new(1, crate::FrameLimits::default());
    let ev = evidence();
    let steps = Chain::of(ev.headers.iter().map(StepHeader::hash).collect::<Vec<_>>().iter());
    let step_hashes = [[2u8; 32], [3u8; 32]];
    let completed: BTreeMap<(u32, u64, u32), Vec<PeerId>> =
        [((1, 16, 0), vec![]), ((1, 12, 0), vec![]), ((1, 99, 0), vec![])].into_iter().collect();
    let data = |_: u32, _: u64, _: u32| None;
    type Done = BTreeMap<(u32, u64, u32), Vec<PeerId>>;
    fn with<'a>(
        (ctx, hashes, completed, data): (&'a RunContext, &'a [[u8; 32]], &'a Done, MbData<'a>),
        steps: &'a Chain,
        attempt: (u32, u64, u32),
        epoch_starts: &'a [[u8; 32]],
    ) -> StepKnown<'a> {
        StepKnown {
            ctx,
            miner: PeerId([1; 32]),
            stage: 1,
            steps,
            previous_steps: None,
            step_hashes: hashes,
            epoch_starts,
            attempt,
            completed,
            upstream_miners: &[],
            downstream_miners: &[],
            data,
            tolerance: 0.0,
        }
    }
    let fixed = (&ctx, &step_hashes[..], &completed, &data as MbData);
    let known = |steps, attempt, starts| with(fixed, steps, attempt, starts);
    let starts = [[1u8; 32]];
    check_chain(accum, FRESH, &known(&steps, (1, 16, 0), &starts), &ev).unwrap();
    let err = |k: &StepKnown, ev: &StepEvidence| format!("{:#}", check_chain(accum, FRESH, k, ev).unwrap_err());
    let empty = Chain::default();
    assert!(err(&known(&empty, (1, 16, 0), &starts), &ev).contains("not the committed steps chain"));
    assert!(err(&known(&steps, (1, 16, 0), &[[7; 32]]), &ev).contains("started from"));
    assert!(err(&known(&steps, (1, 0, 0), &starts), &ev).contains("does not list the drawn attempt"));
    // A record whose optimizer state its predecessor did not leave.
    let mut broken = ev.clone();
    broken.headers[1].optimizer_before = [0x55; 32];
    let chain = Chain::of(broken.headers.iter().map(StepHeader::hash).collect::<Vec<_>>().iter());
    assert!(err(&known(&chain, (1, 16, 0), &starts), &broken).contains("predecessor did not leave"));
    // The attempt in no step: at most grad_accum - 1 completed attempts
    // may be (here one, the 99th sample's).
    let none = StepEvidence { index: None, ..ev.clone() };
    check_chain(accum, FRESH, &known(&steps, (1, 99, 0), &starts), &none).unwrap();
    let mut fewer = completed.clone();
    fewer.insert((1, 98, 0), vec![]);
    let k = StepKnown { completed: &fewer, ..known(&steps, (1, 99, 0), &starts) };
    assert!(err(&k, &none).contains("completed attempts in no step"));
    // A first step must start from a fresh optimizer unless a record is
    // carried in, and one carried in must be where the epoch before ended.
    let mut unfresh = ev.clone();
    unfresh.headers[0].optimizer_before = [0x33; 32];
    unfresh.headers[0].optimizer_after = [0x34; 32];
    unfresh.headers[1].optimizer_before = [0x34; 32];
    let chain = Chain::of(unfresh.headers.iter().map(StepHeader::hash).collect::<Vec<_>>().iter());
    assert!(err(&known(&chain, (1, 16, 0), &starts), &unfresh).contains("fresh optimizer"));
    let carry = header(2, 0, 1);
    let mut carried = StepEvidence { carried: true, carried_before: Chain::of([&[9u8; 32]]), ..ev.clone() };
    carried.headers.insert(0, carry.clone());
    let chain = Chain::of(carried.headers.iter().map(StepHeader::hash).collect::<Vec<_>>().iter());
    let mut ended = carried.carried_before;
    ended.push(&carry.hash());
    let k = StepKnown { previous_steps: Some(&ended), ..known(&chain, (1, 16, 0), &starts) };
    check_chain(accum, FRESH, &k, &carried).unwrap();
    assert!(err(&known(&chain, (1, 16, 0), &starts), &carried).contains("previous epoch's steps chain"));
    let elsewhere = Chain::of([&[9u8; 32], &[8u8; 32]]);
    let k = StepKnown { previous_steps: Some(&elsewhere), ..known(&chain, (1, 16, 0), &starts) };
    assert!(err(&k, &carried).contains("previous epoch's steps chain"));
}
