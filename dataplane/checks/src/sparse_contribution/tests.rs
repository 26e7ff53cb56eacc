use super::*;
use crate::hashes::weights_hash;
use crate::sparse::{ErrorFeedback, kept_per_block};

const N: usize = 3 * SPARSE_BLOCK + 700;
const DECAY: f32 = 0.95;

fn kept() -> usize {
    kept_per_block(SPARSE_BLOCK, 0.05)
}

/// Partitions cut on sparse blocks (as `MergeSpec::plan` cuts a sparse
/// run's), and one that is not.
fn parts() -> Vec<std::ops::Range<usize>> {
    vec![0..2 * SPARSE_BLOCK, 2 * SPARSE_BLOCK..N]
}

/// One sender's epoch: where it started, its chain's items (the last is
/// its last weights), and its backlog before the epoch's contribution.
#[derive(Clone)]
struct Epoch {
    start: Vec<f32>,
    items: Vec<[u8; 32]>,
    last: Vec<f32>,
    backlog: Vec<f32>,
    chain: Chain,
}

impl Epoch {
    fn new(start: Vec<f32>, seed: f32, backlog: Vec<f32>) -> Epoch {
        let mid: Vec<f32> = start.iter().enumerate().map(|(i, x)| x - 1e-3 * (i as f32 * seed).sin()).collect();
        let last: Vec<f32> =
            mid.iter().enumerate().map(|(i, x)| x - 2e-3 * (i as f32 * seed * 1.7).cos().powi(3)).collect();
        let items = vec![weights_hash(&mid), weights_hash(&last)];
        let chain = Chain::of(items.iter());
        Epoch { start, items, last, backlog, chain }
    }

    fn delta(&self) -> Vec<f32> {
        self.start.iter().zip(&self.last).map(|(s, l)| s - l).collect()
    }

    fn starts(&self) -> [[u8; 32]; 1] {
        [weights_hash(&self.start)]
    }

    fn weights(&self, r: std::ops::Range<usize>) -> ContributionWitness {
        ContributionWitness::of(&self.start, &self.last, &self.items, r)
    }
}

/// What an honest sender sends over `parts` from `backlog`, and the
/// backlog it is left with (the miner's own code: `ErrorFeedback`).
fn send(delta: &[f32], backlog: &[f32]) -> (Vec<Vec<u8>>, Vec<f32>) {
    let mut held = ErrorFeedback::from_residual(backlog.to_vec());
    let payloads = parts().into_iter().map(|r| held.encode_frame(r.start, &delta[r.clone()], kept(), DECAY).unwrap());
    let payloads: Vec<Vec<u8>> = payloads.collect();
    (payloads, held.residual().to_vec())
}

struct Case {
    e0: Epoch,
    e1: Epoch,
    /// Epoch 1's contributions, from the backlog epoch 0 left.
    payloads1: Vec<Vec<u8>>,
}

fn case() -> Case {
    let start0: Vec<f32> = (0..N).map(|i| (i as f32 * 0.01).cos()).collect();
    let e0 = Epoch::new(start0, 0.37, vec![0.0; N]);
    let (_, left0) = send(&e0.delta(), &e0.backlog);
    let start1: Vec<f32> = e0.start.iter().zip(&e0.last).map(|(s, l)| 0.5 * (s + l)).collect();
    let e1 = Epoch::new(start1, 0.53, left0);
    let (payloads1, _) = send(&e1.delta(), &e1.backlog);
    Case { e0, e1, payloads1 }
}

fn bound<'a>(
    now: &'a Epoch,
    before: Option<&'a Epoch>,
    now_starts: &'a [[u8; 32]],
    before_starts: &'a [[u8; 32]],
    r: std::ops::Range<usize>,
    payload: &[u8],
) -> SparseBound<'a> {
    SparseBound {
        now: EpochBound { committed: &now.chain, starts: now_starts, backlog: weights_hash(&now.backlog) },
        before: before.map(|b| EpochBound {
            committed: &b.chain,
            starts: before_starts,
            backlog: weights_hash(&b.backlog),
        }),
        range: r.start as u64..r.end as u64,
        payload_hash: *blake3::hash(payload).as_bytes(),
        kept: kept(),
        decay: DECAY,
    }
}

fn witness(now: &Epoch, before: Option<&Epoch>, r: std::ops::Range<usize>) -> SparseWitness {
    SparseWitness::of(now.weights(r.clone()), &now.backlog, before.map(|b| (b.weights(r.clone()), &b.backlog[..])), r)
}

#[test]
fn an_honest_sparse_sender_is_bound_from_a_fresh_start_and_across_epochs() {
    let c = case();
    let (s0, s1) = (c.e0.starts(), c.e1.starts());
    let (payloads0, _) = send(&c.e0.delta(), &c.e0.backlog);
    let limits = WitnessLimits { weights: N as u64, partition: 2 * SPARSE_BLOCK as u64, max_steps: 8 };
    for (i, r) in parts().into_iter().enumerate() {
        // Epoch 0: nothing held back, nothing of an epoch before to show.
        let w0 = witness(&c.e0, None, r.clone());
        assert!(w0.before.is_none());
        check_sparse_contribution(&w0, &bound(&c.e0, None, &s0, &[], r.clone(), &payloads0[i])).unwrap();
        // Epoch 1: the backlog epoch 0 left, shown with epoch 0.
        let w1 = witness(&c.e1, Some(&c.e0), r.clone());
        assert!(w1.before.is_some(), "a carried backlog shows where it came from");
        let decoded = SparseWitness::decode(&w1.encode(), limits).unwrap();
        assert_eq!(decoded, w1);
        check_sparse_contribution(&decoded, &bound(&c.e1, Some(&c.e0), &s1, &s0, r.clone(), &c.payloads1[i])).unwrap();
    }
    // A sender may always start afresh (it restarted, or was moved): an
    // all-zero backlog needs no epoch before, whatever it held.
    let fresh = Epoch { backlog: vec![0.0; N], ..c.e1.clone() };
    let (payloads, _) = send(&fresh.delta(), &fresh.backlog);
    for (i, r) in parts().into_iter().enumerate() {
        let w = witness(&fresh, Some(&c.e0), r.clone());
        check_sparse_contribution(&w, &bound(&fresh, Some(&c.e0), &s1, &s0, r, &payloads[i])).unwrap();
    }
}

#[test]
fn a_backlog_it_did_not_earn_is_caught() {
    let c = case();
    let (s0, s1) = (c.e0.starts(), c.e1.starts());
    let r = parts()[1].clone();
    // Consistent with itself (committed, and its contribution follows from
    // it), but not what epoch 0 left: an inflated backlog, one with a
    // planted direction, and one carried over a skipped epoch.
    let inflated: Vec<f32> = c.e1.backlog.iter().map(|b| 3.0 * b).collect();
    let mut planted = c.e1.backlog.clone();
    planted[r.start + 5] += 0.5;
    for backlog in [inflated, planted] {
        let liar = Epoch { backlog, ..c.e1.clone() };
        let (payloads, _) = send(&liar.delta(), &liar.backlog);
        let w = witness(&liar, Some(&c.e0), r.clone());
        let e =
            check_sparse_contribution(&w, &bound(&liar, Some(&c.e0), &s1, &s0, r.clone(), &payloads[1])).unwrap_err();
        assert!(e.contains("not what its contribution of the epoch before left"), "{e}");
    }
    let w = witness(&c.e1, Some(&c.e0), r.clone());
    let e = check_sparse_contribution(&w, &bound(&c.e1, None, &s1, &s0, r.clone(), &c.payloads1[1])).unwrap_err();
    assert!(e.contains("took no part"), "{e}");
    let bare = SparseWitness { before: None, ..w.clone() };
    let e =
        check_sparse_contribution(&bare, &bound(&c.e1, Some(&c.e0), &s1, &s0, r.clone(), &c.payloads1[1])).unwrap_err();
    assert!(e.contains("without the epoch before's witness"), "{e}");
    // The epoch before's weights must be the committed ones.
    let mut forged = w.clone();
    if let Some((wb, _)) = forged.before.as_mut() {
        wb.last.values[7] += 1e-3;
    }
    let e = check_sparse_contribution(&forged, &bound(&c.e1, Some(&c.e0), &s1, &s0, r, &c.payloads1[1])).unwrap_err();
    assert!(e.contains("the epoch before"), "{e}");
}

#[test]
fn a_contribution_that_does_not_follow_from_its_commitments_is_caught() {
    let c = case();
    let (s0, s1) = (c.e0.starts(), c.e1.starts());
    let r = parts()[0].clone();
    let b = |payload: &[u8]| bound(&c.e1, Some(&c.e0), &s1, &s0, r.clone(), payload);
    let w = witness(&c.e1, Some(&c.e0), r.clone());
    // Sent from no backlog while committing to one; sent from a scaled
    // pseudo-gradient; another partition's rows.
    let (from_nothing, _) = send(&c.e1.delta(), &vec![0.0; N]);
    let scaled: Vec<f32> = c.e1.delta().iter().map(|d| 3.0 * d).collect();
    let (tripled, _) = send(&scaled, &c.e1.backlog);
    for payload in [&from_nothing[0], &tripled[0], &c.payloads1[1]] {
        let e = check_sparse_contribution(&w, &b(payload)).unwrap_err();
        assert!(e.contains("not what its committed weights and backlog give"), "{e}");
    }
    // A backlog shown with values other than the committed ones.
    let mut forged = w.clone();
    forged.backlog.values[3] += 1.0;
    let e = check_sparse_contribution(&forged, &b(&c.payloads1[0])).unwrap_err();
    assert!(e.contains("its backlog"), "{e}");
    // A carried backlog over a partition not cut on sparse blocks cannot be
    // judged (the plan's fault, not the sender's).
    let odd = 256..2 * SPARSE_BLOCK;
    let mut held = ErrorFeedback::from_residual(c.e1.backlog.clone());
    let payload = held.encode_frame(odd.start, &c.e1.delta()[odd.clone()], kept(), DECAY).unwrap();
    let w = witness(&c.e1, Some(&c.e0), odd.clone());
    let e = check_sparse_contribution(&w, &bound(&c.e1, Some(&c.e0), &s1, &s0, odd, &payload)).unwrap_err();
    assert!(e.contains("not cut on sparse blocks"), "{e}");
}

#[test]
fn hostile_sparse_witnesses_are_refused_without_panics() {
    let c = case();
    let w = witness(&c.e1, Some(&c.e0), parts()[1].clone());
    let bytes = w.encode();
    let limits = WitnessLimits { weights: N as u64, partition: 2 * SPARSE_BLOCK as u64, max_steps: 8 };
    assert_eq!(SparseWitness::decode(&bytes, limits).unwrap(), w);
    for cut in (0..bytes.len()).step_by(101) {
        assert!(SparseWitness::decode(&bytes[..cut], limits).is_err(), "cut at {cut}");
    }
    let mut long = bytes.clone();
    long.push(0);
    assert!(SparseWitness::decode(&long, limits).is_err());
    // The tag byte after this epoch's weights and backlog says whether the
    // epoch before follows: only 0 and 1 are tags.
    let mut r = Reader { b: &bytes, at: 8 };
    read_weights(&mut r, limits).unwrap();
    r.witness(limits).unwrap();
    assert_eq!(bytes[r.at], 1);
    for t in [0u8, 2, 255] {
        let mut f = bytes.clone();
        f[r.at] = t;
        assert!(SparseWitness::decode(&f, limits).is_err(), "tag {t}");
    }
    let other = WitnessLimits { weights: 5, ..limits };
    assert!(SparseWitness::decode(&bytes, other).is_err(), "another stage's size");
    let mut dense = bytes.clone();
    dense[..8].copy_from_slice(b"IOTACWT1");
    assert!(SparseWitness::decode(&dense, limits).is_err(), "a dense witness is not a sparse one");
}
