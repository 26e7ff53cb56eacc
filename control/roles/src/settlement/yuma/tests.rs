//! Tests of Yuma consensus: subtensor's own epoch cases (their numbers, our
//! code) and properties; hostile inputs are in `hostile_tests.rs`.
//!
//! Subtensor stores most epoch outputs as u16 proportions (`floor(x *
//! 65_535)`) and bonds as u16 between epochs, and emits whole rao
//! (`floor(share * emission)`); [`u16_of`], [`stored`] and [`rao`] do the
//! same to our `f64` outputs, so the u16 figures of its tests compare
//! exactly. Its I32F32 arithmetic differs from `f64` in the last digits:
//! emissions are compared within [`RAO_TOLERANCE`] of 1e9 (its tests' own
//! comments call these "discrepancy").

use super::*;

const MAX: f64 = u16::MAX as f64;
/// Subtensor's tests emit 1e9 rao per epoch.
pub(super) const RAO: f64 = 1_000_000_000.0;
/// |ours - subtensor's| in rao, out of 1e9 (the largest seen is 1): its I32F32 stake and weight
/// shares are off by up to ~2.3e-10 each (e.g. 0.1 is 0.0999999999767).
const RAO_TOLERANCE: u64 = 1;

/// A proportion as subtensor stores it: `fixed_proportion_to_u16`.
fn u16_of(x: f64) -> u16 {
    (x * MAX).floor() as u16
}

/// Bonds as subtensor stores them (u16, floor) and reads them back for the
/// next epoch: classic Yuma reads the raw u16 (it normalises the columns
/// anyway), Yuma 3 reads u16 / 65_535.
fn stored(bonds: &[Vec<f64>], mode: BondsMode) -> Vec<Vec<f64>> {
    let scale = if mode == BondsMode::Yuma3 { MAX } else { 1.0 };
    bonds.iter().map(|row| row.iter().map(|&b| f64::from(u16_of(b)) / scale).collect()).collect()
}

fn rao(x: f64) -> u64 {
    x.floor() as u64
}

fn assert_rao(what: &str, ours: f64, theirs: u64) {
    let ours = rao(ours);
    assert!(
        ours.abs_diff(theirs) <= RAO_TOLERANCE,
        "{what}: ours {ours} rao, subtensor {theirs} (tolerance {RAO_TOLERANCE})"
    );
}

pub(super) fn input(stakes: &[f64], weights: Vec<Vec<f64>>) -> YumaInput {
    YumaInput {
        stakes: stakes.to_vec(),
        weights,
        params: YumaParams { emission: RAO, ..YumaParams::default() },
        ..YumaInput::default()
    }
}

pub(super) fn approx(a: f64, b: f64, tol: f64) -> bool {
    (a - b).abs() <= tol
}

// ---------------------------------------------------------------------------
// Subtensor's cases. Files are in opentensor/subtensor,
// pallets/subtensor/src/tests/ (epoch.rs read at commit 03f92770a0081475b69811334b0a7c7163157c1b).
// Subtensor has one uid space (every uid is a row and a column, self-weights
// masked); here validators are rows and miners columns, so each case lists
// the validators that hold stake as rows, the servers as columns, and a
// self-weight (which subtensor masks) as an empty row.

/// math.rs `test_math_weighted_median_col`: the median routine itself
/// (rows with zero stake do not vote; rows need not be normalised).
#[test]
fn subtensor_test_math_weighted_median_col() {
    let rows = |flat: &[f64]| Matrix { rows: 4, cols: 3, data: flat.to_vec() };
    let w = rows(&[0., 0.1, 0., 0., 0.2, 0.4, 0., 0.3, 0.1, 0., 0.4, 0.5]);
    let stake = [0., 0.75, 0.25, 0.];
    assert_eq!(weighted_median_cols(&stake, &w, 0.24), vec![0., 0.3, 0.4]);
    assert_eq!(weighted_median_cols(&stake, &w, 0.26), vec![0., 0.2, 0.4]);
    assert_eq!(weighted_median_cols(&stake, &w, 0.76), vec![0., 0.2, 0.1]);

    let w = rows(&[0., 0.1, 0., 0., 0.2, 0.4, 0., 0.3, 0.1, 0., 0., 0.5]);
    assert_eq!(weighted_median_cols(&[0., 0.3, 0.2, 0.5], &w, 0.51), vec![0., 0., 0.4]);

    // Nobody with stake: every median is 0.
    let w = Matrix { rows: 2, cols: 2, data: vec![0.; 4] };
    assert_eq!(weighted_median_cols(&[0., 0.], &w, 0.5), vec![0., 0.]);
}

/// epoch.rs `test_512_graph`: 64 validators with equal stake put equal
/// weight on 448 servers; three epochs (after the permit-setting one).
#[test]
fn subtensor_test_512_graph() {
    let (n_v, n_m) = (64, 448);
    let stake = vec![328_125_000_000_000.0; n_v];
    // The permit-setting epoch: no weights yet.
    let mut inp = input(&stake, vec![vec![0.0; n_m]; n_v]);
    let out = run(&inp).unwrap();
    inp.bonds = Some(stored(&out.bonds, inp.params.bonds_mode));
    // u16::MAX / 512 on every server, max-upscaled by set_weights.
    inp.weights = vec![vec![MAX; n_m]; n_v];
    let mut out = out;
    for _ in 0..3 {
        out = run(&inp).unwrap();
        inp.bonds = Some(stored(&out.bonds, inp.params.bonds_mode));
    }
    for i in 0..n_v {
        assert_eq!(u16_of(out.dividends[i]), 1023, "validator {i} dividends");
        assert_rao("validator emission", out.emission.validators[i], 7_812_500);
        for j in 0..n_m {
            assert_eq!(u16_of(out.bonds[i][j]), 65_535, "bond {i},{j}");
        }
    }
    for j in 0..n_m {
        // Subtensor stores normalised ranks (= incentive).
        assert_eq!(u16_of(out.incentive[j]), 146, "server {j} rank/incentive");
        assert_eq!(u16_of(out.trust[j]), 65_535, "server {j} trust");
        assert_eq!(u16_of(out.consensus[j]), 146, "server {j} consensus");
        assert_rao("server emission", out.emission.miners[j], 1_116_071);
    }
}

/// epoch.rs `test_10_graph`: ten uids with stake 1, each weighting only
/// itself. Self-weights are masked, nobody has incentive, and the emission
/// falls back to stake: 99_999_999 each there (I32F32's 0.1), 1e8 here.
#[test]
fn subtensor_test_10_graph() {
    let out = run(&input(&[1.0; 10], vec![vec![0.0; 10]; 10])).unwrap();
    for i in 0..10 {
        assert_eq!(u16_of(out.incentive[i]), 0);
        assert_eq!(u16_of(out.consensus[i]), 0);
        assert_eq!(u16_of(out.trust[i]), 0);
        assert_eq!(u16_of(out.dividends[i]), 0);
        assert_eq!(out.emission.miners[i], 0.0);
        assert_rao("uid emission", out.emission.validators[i], 99_999_999);
    }
}

/// epoch.rs `test_bonds`: validators with stake 1, 2, 3, 4 weight four
/// servers 0.1 : 0.2 : 0.3 : 0.4; then one by one they switch to
/// self-weights, and validator 3 moves all its weight to server 4. Checks
/// the stored bonds after every epoch (asserted there) and the emissions
/// its log prints.
#[test]
fn subtensor_test_bonds() {
    let stakes = [1.0, 2.0, 3.0, 4.0];
    let w = vec![16_383.0, 32_767.0, 49_149.0, 65_535.0];
    let zero = vec![0.0; 4];
    let srv4 = vec![0.0, 0.0, 0.0, 65_535.0];
    let mut inp = input(&stakes, vec![w.clone(); 4]);
    // (weights this epoch, bonds column asserted, asserted u16 bonds, emissions printed)
    #[allow(clippy::type_complexity)]
    let epochs: [(Vec<Vec<f64>>, usize, [u16; 4], [u64; 8]); 8] = [
        (
            vec![w.clone(), w.clone(), w.clone(), w.clone()],
            0,
            [16383, 32767, 49151, 65535],
            [49999998, 99999999, 150000000, 200000001, 49998779, 100000610, 149996337, 200004272],
        ),
        (
            vec![zero.clone(), w.clone(), w.clone(), w.clone()],
            0,
            [14582, 32767, 49151, 65535],
            [44998351, 101110561, 151667215, 202223870, 49998779, 100000610, 149996337, 200004272],
        ),
        (
            vec![zero.clone(), zero.clone(), w.clone(), w.clone()],
            0,
            [12603, 28321, 49151, 65535],
            [40496805, 90999783, 157929636, 210573773, 49998779, 100000610, 149996337, 200004272],
        ),
        (
            vec![zero.clone(), zero.clone(), zero.clone(), w.clone()],
            3,
            [12602, 28320, 49150, 65535],
            [99999999, 199999999, 299999999, 399999999, 0, 0, 0, 0],
        ),
        (
            vec![zero.clone(), zero.clone(), srv4.clone(), w.clone()],
            3,
            [10951, 24609, 49150, 65535],
            [36443733, 81898628, 163565493, 218092144, 0, 0, 0, 500000000],
        ),
        (
            vec![zero.clone(), zero.clone(), srv4.clone(), w.clone()],
            3,
            [9559, 21482, 49150, 65535],
            [32799427, 73706612, 168638129, 224855830, 0, 0, 0, 500000000],
        ),
        (
            vec![zero.clone(), zero.clone(), srv4.clone(), w.clone()],
            3,
            [8376, 18824, 49150, 65535],
            [29518068, 66336137, 173203134, 230942659, 0, 0, 0, 500000000],
        ),
        // The last epoch is only printed: emaB column 4 (max-upscaled)
        // 0.1123638137, 0.2525234516, 0.7499832308, 1.
        (
            vec![zero.clone(), zero.clone(), srv4.clone(), w.clone()],
            3,
            [7363, 16549, 49150, 65535],
            [26565175, 59701871, 177311856, 236421095, 0, 0, 0, 500000000],
        ),
    ];
    for (e, (weights, col, bonds, emission)) in epochs.into_iter().enumerate() {
        inp.weights = weights;
        let out = run(&inp).unwrap();
        let got: Vec<u16> = out.bonds.iter().map(|row| u16_of(row[col])).collect();
        assert_eq!(got, bonds, "epoch {e}: bonds on server {col}");
        for (i, &theirs) in emission.iter().enumerate() {
            let ours = if i < 4 { out.emission.validators[i] } else { out.emission.miners[i - 4] };
            assert_rao(&format!("epoch {e} uid {i} emission"), ours, theirs);
        }
        inp.bonds = Some(stored(&out.bonds, inp.params.bonds_mode));
    }
}

/// epoch.rs `test_active_stake`: four uids with stake 1; uids 0 and 1
/// weight servers 2 and 3 equally. Then uid 1, later both, are past the
/// activity cutoff... (uid 1 inactive, then both active again).
#[test]
fn subtensor_test_active_stake() {
    let half = vec![32_767.0, 32_767.0];
    let none = vec![0.0, 0.0];
    let mut inp = input(&[1.0; 4], vec![half.clone(), half.clone(), none.clone(), none.clone()]);
    let combined = |out: &YumaOutput, uid: usize| {
        out.emission.validators[uid] + if uid >= 2 { out.emission.miners[uid - 2] } else { 0.0 }
    };

    let out = run(&inp).unwrap();
    for uid in 0..2 {
        assert_eq!(u16_of(out.dividends[uid]), 32767, "uid {uid} dividends");
    }
    for uid in 0..4 {
        assert_rao(&format!("uid {uid} emission"), combined(&out, uid), 250_000_000);
    }
    for row in &out.bonds[..2] {
        assert_eq!(row.iter().map(|&b| u16_of(b)).collect::<Vec<_>>(), vec![65535, 65535]);
    }
    for row in &out.bonds[2..] {
        assert_eq!(row, &vec![0.0, 0.0]);
    }

    // Past the cutoff; uid 0 sets its weights again, uid 1 does not.
    inp.bonds = Some(stored(&out.bonds, inp.params.bonds_mode));
    inp.active = Some(vec![true, false, false, false]);
    let out = run(&inp).unwrap();
    assert_eq!(u16_of(out.dividends[0]), 36044);
    assert_rao("uid 0 emission", combined(&out, 0), 274_999_999);
    assert_eq!(u16_of(out.dividends[1]), 29490);
    assert_rao("uid 1 emission", combined(&out, 1), 224_999_999);
    assert_eq!(out.bonds[0].iter().map(|&b| u16_of(b)).collect::<Vec<_>>(), vec![65535, 65535]);
    assert_eq!(out.bonds[1].iter().map(|&b| u16_of(b)).collect::<Vec<_>>(), vec![53619, 53619]);

    // uid 1 sets its weights again too.
    inp.bonds = Some(stored(&out.bonds, inp.params.bonds_mode));
    inp.active = Some(vec![true, true, false, false]);
    let out = run(&inp).unwrap();
    assert_eq!(u16_of(out.dividends[0]), 35716);
    assert_rao("uid 0 emission", combined(&out, 0), 272_501_132);
    assert_eq!(u16_of(out.dividends[1]), 29818);
    assert_rao("uid 1 emission", combined(&out, 1), 227_498_866);
    assert_eq!(out.bonds[0].iter().map(|&b| u16_of(b)).collect::<Vec<_>>(), vec![65535, 65535]);
    assert_eq!(out.bonds[1].iter().map(|&b| u16_of(b)).collect::<Vec<_>>(), vec![54712, 54712]);
}

/// epoch.rs `test_outdated_weights`: uids 0 and 1 (stake 1) weight servers
/// 2 and 3 at 2/3 and 1/3; server 3 is deregistered and replaced by a new
/// uid without stake or permit, which masks uid 1's (outdated) weight on it.
#[test]
fn subtensor_test_outdated_weights() {
    let w = vec![65_535.0, 32_768.0];
    let none = vec![0.0, 0.0];
    let mut inp = input(&[1.0; 4], vec![w.clone(), w.clone(), none.clone(), none.clone()]);
    let out = run(&inp).unwrap();
    for (uid, theirs) in [(0, 250_000_000), (1, 250_000_000)] {
        assert_rao(&format!("uid {uid} emission"), out.emission.validators[uid], theirs);
    }
    assert_rao("uid 2 emission", out.emission.miners[0], 333_331_637);
    assert_rao("uid 3 emission", out.emission.miners[1], 166_668_361);

    inp.bonds = Some(stored(&out.bonds, inp.params.bonds_mode));
    inp.stakes = vec![1.0, 1.0, 1.0, 0.0];
    inp.validator_permits = Some(vec![true, true, true, false]);
    inp.weights = vec![w, vec![65_535.0, 0.0], none.clone(), none];
    let out = run(&inp).unwrap();
    assert_eq!(u16_of(out.dividends[0]), 32767);
    assert_rao("uid 0 emission", out.emission.validators[0], 250_000_000);
    assert_eq!(u16_of(out.bonds[0][0]), 65535);
    assert_eq!(u16_of(out.bonds[0][1]), 65535);
}

/// epoch.rs `test_zero_weights`: one validator (stake 1) and one server.
/// With no usable weights the validator takes the whole emission; once its
/// weight on the server counts, they split it in half.
#[test]
fn subtensor_test_zero_weights() {
    // Rows: the validator, the server (no stake, self-weight masked).
    let mut inp = input(&[1.0, 0.0], vec![vec![0.0], vec![0.0]]);
    for epoch in 0..3 {
        // No weights; the server's self-weight; the validator's weight outdated.
        let out = run(&inp).unwrap();
        assert_eq!(rao(out.emission.validators[0]), 1_000_000_000, "epoch {epoch}");
        assert_eq!(rao(out.emission.miners[0]), 0, "epoch {epoch}");
        assert_eq!(rao(out.emission.validators[1]), 0, "epoch {epoch}");
    }
    inp.weights = vec![vec![32_767.0], vec![0.0]];
    let out = run(&inp).unwrap();
    assert_eq!(rao(out.emission.validators[0]), 500_000_000);
    assert_eq!(rao(out.emission.miners[0]), 500_000_000);
}

/// epoch.rs `test_yuma_3_liquid_alpha_disabled`: Yuma 3, bonds moving
/// average 0.975, no bonds penalty, kappa u16::MAX / 2; three validators
/// (stake 33, 33, 34) all on server 1, except that in the third epoch the
/// third one votes for server 2. Subtensor checks the dividends within 1e-3;
/// we check them and the bonds it lists (its check skips them: it zips the
/// listed rows after `skip(3)`), both within 1e-3.
#[test]
fn subtensor_test_yuma_3_liquid_alpha_disabled() {
    let params = YumaParams {
        kappa: f64::from(u16::MAX / 2) / MAX,
        bonds_moving_average: 0.975,
        bonds_penalty: 0.0,
        bonds_mode: BondsMode::Yuma3,
        emission: RAO,
        miner_share: 0.5,
    };
    let s1 = vec![MAX, 0.0];
    let s2 = vec![0.0, MAX];
    // The setup epoch: no weights, no bonds bought.
    let mut inp =
        YumaInput { stakes: vec![33.0, 33.0, 34.0], weights: vec![vec![0.0; 2]; 3], params, ..Default::default() };
    let out = run(&inp).unwrap();
    inp.bonds = Some(stored(&out.bonds, inp.params.bonds_mode));
    let bonds_targets: [[[f64; 2]; 3]; 6] = [
        [[0.0250, 0.0], [0.0250, 0.0], [0.0250, 0.0]],
        [[0.0494, 0.0], [0.0494, 0.0], [0.0494, 0.0]],
        [[0.0731, 0.0], [0.0731, 0.0], [0.0481, 0.0250]],
        [[0.0963, 0.0], [0.0963, 0.0], [0.0719, 0.0244]],
        [[0.1189, 0.0], [0.1189, 0.0], [0.0951, 0.0238]],
        [[0.1409, 0.0], [0.1409, 0.0], [0.1178, 0.0232]],
    ];
    let dividends_targets: [[f64; 3]; 6] = [
        [0.3300, 0.3300, 0.3400],
        [0.3300, 0.3300, 0.3400],
        [0.3734, 0.3734, 0.2532],
        [0.3611, 0.3611, 0.2779],
        [0.3541, 0.3541, 0.2919],
        [0.3495, 0.3495, 0.3009],
    ];
    for epoch in 0..6 {
        inp.weights = if epoch == 2 { vec![s1.clone(), s1.clone(), s2.clone()] } else { vec![s1.clone(); 3] };
        let out = run(&inp).unwrap();
        for i in 0..3 {
            let d = f64::from(u16_of(out.dividends[i])) / MAX;
            assert!(approx(d, dividends_targets[epoch][i], 1e-3), "epoch {epoch} dividends {i}: {d}");
            for (j, (&b, &target)) in out.bonds[i].iter().zip(&bonds_targets[epoch][i]).enumerate() {
                assert!(approx(b, target, 1e-3), "epoch {epoch} bond {i},{j}: {b}");
            }
        }
        inp.bonds = Some(stored(&out.bonds, inp.params.bonds_mode));
    }
}

// ---------------------------------------------------------------------------
// Properties.

/// xorshift64*: deterministic test data without a new dependency.
pub(super) struct Rng(pub(super) u64);

impl Rng {
    pub(super) fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    pub(super) fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    pub(super) fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    /// A value that is often exactly zero.
    pub(super) fn sparse(&mut self) -> f64 {
        if self.below(3) == 0 { 0.0 } else { self.unit() }
    }
}

/// The weighted median by its definition: sort, then walk up the
/// cumulative stake (the oracle for the quickselect in `weighted_median`).
fn median_by_sorting(votes: &[(f64, f64)], kappa: f64) -> f64 {
    let mut votes = votes.to_vec();
    votes.sort_by(|a, b| a.0.total_cmp(&b.0));
    let minority = votes.iter().map(|v| v.1).sum::<f64>() - kappa;
    let mut below = 0.0;
    for (k, &(w, s)) in votes.iter().enumerate() {
        below += s;
        let last_of_its_weight = votes.get(k + 1).is_none_or(|next| next.0 != w);
        if last_of_its_weight && below > minority {
            return w;
        }
    }
    votes.last().map_or(0.0, |v| v.0)
}

#[test]
fn quickselect_median_matches_sorting() {
    let mut rng = Rng(11);
    let mut seen_middle = 0;
    for case in 0..3_000 {
        let n = 1 + rng.below(400);
        // Few distinct weights (ties) or many; dyadic stakes and kappa, so
        // every partial sum is exact and the two orders of summing agree.
        let distinct = if rng.below(2) == 0 { 1 + rng.below(4) } else { 1 << 20 };
        let votes: Vec<(f64, f64)> = (0..n)
            .map(|_| ((rng.below(distinct) as f64) / distinct as f64, (1 + rng.below(64)) as f64 / 1024.0))
            .collect();
        let total: f64 = votes.iter().map(|v| v.1).sum();
        let kappa = if rng.below(2) == 0 {
            rng.below(1025) as f64 / 1024.0 * total
        } else {
            // Exactly at a boundary: the minority is the stake of the r
            // smallest votes, where "exceeds" must be strict.
            let mut sorted = votes.clone();
            sorted.sort_by(|a, b| a.0.total_cmp(&b.0));
            total - sorted[..rng.below(n + 1)].iter().map(|v| v.1).sum::<f64>()
        };
        let want = median_by_sorting(&votes, kappa);
        let mut bits: Vec<(u64, f64)> = votes.iter().map(|&(w, s)| (w.to_bits(), s)).collect();
        let got = weighted_median(&mut bits, total, kappa);
        assert_eq!(got, want, "case {case}: n {n}, kappa {kappa} of {total}");
        let lo = votes.iter().map(|v| v.0).fold(f64::INFINITY, f64::min);
        let hi = votes.iter().map(|v| v.0).fold(0.0, f64::max);
        if n > 32 && want > lo && want < hi {
            seen_middle += 1;
        }
    }
    // Not only the extremes: the quickselect path (n > 32) found interior medians.
    assert!(seen_middle > 300, "{seen_middle}");
}

fn random_input(rng: &mut Rng) -> YumaInput {
    let (v, m) = (1 + rng.below(12), 1 + rng.below(12));
    let mode = if rng.below(2) == 0 { BondsMode::Classic } else { BondsMode::Yuma3 };
    let mut stakes: Vec<f64> = (0..v).map(|_| rng.sparse() * 1e6).collect();
    stakes[rng.below(v)] = 1.0 + rng.unit();
    YumaInput {
        stakes,
        weights: (0..v).map(|_| (0..m).map(|_| rng.sparse()).collect()).collect(),
        bonds: Some((0..v).map(|_| (0..m).map(|_| rng.sparse()).collect()).collect()),
        validator_permits: Some((0..v).map(|_| rng.below(4) != 0).collect()),
        active: Some((0..v).map(|_| rng.below(4) != 0).collect()),
        recently_registered: Some((0..m).map(|_| rng.below(5) == 0).collect()),
        params: YumaParams {
            kappa: rng.unit(),
            bonds_moving_average: rng.unit(),
            bonds_penalty: rng.unit(),
            bonds_mode: mode,
            emission: 1.0 + rng.unit() * 1e12,
            miner_share: rng.unit(),
        },
    }
}

#[test]
fn emission_sums_to_the_epoch_total() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut splits = 0;
    for case in 0..2_000 {
        let inp = random_input(&mut rng);
        let out = run(&inp).unwrap();
        let total: f64 = out.emission.miners.iter().chain(&out.emission.validators).sum();
        let want = inp.params.emission;
        assert!(((total - want) / want).abs() <= 1e-9, "case {case}: emitted {total}, epoch total {want}");
        assert!(out.emission.miners.iter().chain(&out.emission.validators).all(|&e| e >= 0.0), "case {case}");
        let to_miners: f64 = out.emission.miners.iter().sum();
        if to_miners > 0.0 && out.dividends.iter().any(|&d| d > 0.0) {
            // Both sides paid: the miners get exactly their share.
            let share = to_miners / want;
            assert!(approx(share, inp.params.miner_share, 1e-9), "case {case}: miners got {share}");
            splits += 1;
        }
    }
    // The random cases do exercise the split, not only the fallbacks.
    assert!(splits > 200, "only {splits} cases paid both sides");
}

#[test]
fn a_miner_rated_only_by_a_stake_minority_gets_no_incentive() {
    // Validators 0 and 1 hold 45% of the stake (< kappa of the total) and
    // put most weight on miner 2; the majority never rates it.
    let weights = vec![vec![0.1, 0.1, 0.8], vec![0.0, 0.2, 0.8], vec![0.5, 0.5, 0.0], vec![0.6, 0.4, 0.0]];
    let inp = input(&[20.0, 25.0, 30.0, 25.0], weights);
    let out = run(&inp).unwrap();
    assert_eq!(out.consensus[2], 0.0);
    assert_eq!(out.incentive[2], 0.0);
    assert_eq!(out.emission.miners[2], 0.0);
    // ... while the miners the majority rates share the miner emission.
    assert!(out.incentive[0] > 0.2 && out.incentive[1] > 0.2, "{:?}", out.incentive);
    assert!(approx(out.emission.miners[0] + out.emission.miners[1], RAO / 2.0, 1e-6));
    // The minority's trust falls with the weight it wasted.
    assert!(out.validator_trust[0] < 0.3 && out.validator_trust[2] > 0.8, "{:?}", out.validator_trust);

    // With 55% behind it instead, miner 2 keeps its incentive.
    let mut inp = inp;
    inp.stakes = vec![30.0, 25.0, 25.0, 20.0];
    let out = run(&inp).unwrap();
    assert!(out.incentive[2] > 0.3, "{:?}", out.incentive);
}

#[test]
fn bonds_follow_the_ema_across_epochs() {
    let alpha: f64 = 0.1; // bonds_moving_average 0.9
    // Classic: both validators weight miner 0 alone; the bond purchase
    // column-normalises to their stake shares s = (0.25, 0.75), so the
    // column-normalised bonds go b_t = s + (1 - alpha)^t (b_0 - s).
    let mut inp = input(&[1.0, 3.0], vec![vec![1.0, 0.0], vec![1.0, 0.0]]);
    inp.bonds = Some(vec![vec![1.0, 0.0], vec![0.0, 0.0]]);
    for t in 1..=3 {
        let out = run(&inp).unwrap();
        let col: Vec<f64> = out.bonds.iter().map(|r| r[0]).collect();
        let sum: f64 = col.iter().sum();
        let decay = (1.0 - alpha).powi(t);
        for (i, (&b0, s)) in [1.0, 0.0].iter().zip([0.25, 0.75]).enumerate() {
            let want = s + decay * (b0 - s);
            assert!(approx(col[i] / sum, want, 1e-8), "epoch {t} validator {i}: {} vs {want}", col[i] / sum);
        }
        // Stored max-upscaled, and dividends follow the bonds (miner 0 has all incentive).
        assert_eq!(col.iter().cloned().fold(0.0, f64::max), 1.0);
        assert!(approx(out.dividends[0], col[0] / sum, 1e-8));
        inp.bonds = Some(out.bonds);
    }

    // Yuma 3: each validator's bond is an EMA of its own weight,
    // b_t = w + (1 - alpha)^t (b_0 - w), unnormalised.
    let mut inp = input(&[1.0, 3.0], vec![vec![0.25, 0.75], vec![1.0, 0.0]]);
    inp.params.bonds_mode = BondsMode::Yuma3;
    inp.params.bonds_penalty = 0.0;
    let b0 = vec![vec![0.5, 0.5], vec![0.0, 1.0]];
    inp.bonds = Some(b0.clone());
    let w = [[0.25, 0.75], [1.0, 0.0]];
    for t in 1..=3 {
        let out = run(&inp).unwrap();
        let decay = (1.0 - alpha).powi(t);
        for i in 0..2 {
            for j in 0..2 {
                let want = w[i][j] + decay * (b0[i][j] - w[i][j]);
                assert!(approx(out.bonds[i][j], want, 1e-8), "epoch {t} bond {i},{j}: {} vs {want}", out.bonds[i][j]);
            }
        }
        inp.bonds = Some(out.bonds);
    }
}

#[test]
fn clipping_trust_and_ranks_are_consistent() {
    // Three equal validators; on miner 1 they say 0.2, 0.4, 0.6: the median
    // (kappa 1/2) is 0.4, so the 0.6 is clipped to 0.4.
    let weights = vec![vec![0.8, 0.2], vec![0.6, 0.4], vec![0.4, 0.6]];
    let out = run(&input(&[1.0, 1.0, 1.0], weights)).unwrap();
    assert!(approx(out.consensus[0], 0.6, 1e-15) && approx(out.consensus[1], 0.4, 1e-15), "{:?}", out.consensus);
    // Clipped: [0.6, 0.2], [0.6, 0.4], [0.4, 0.4].
    for (got, want) in out.validator_trust.iter().zip([0.8, 1.0, 0.8]) {
        assert!(approx(*got, want, 1e-12), "{:?}", out.validator_trust);
    }
    let ranks = [1.6 / 3.0, 1.0 / 3.0];
    let preranks = [1.8 / 3.0, 1.2 / 3.0];
    for j in 0..2 {
        assert!(approx(out.ranks[j], ranks[j], 1e-12), "{:?}", out.ranks);
        assert!(approx(out.trust[j], ranks[j] / preranks[j], 1e-12), "{:?}", out.trust);
        assert!(approx(out.incentive[j], ranks[j] / (ranks[0] + ranks[1]), 1e-12), "{:?}", out.incentive);
    }
}

#[test]
fn validators_without_permit_or_activity_do_not_vote() {
    // Validator 1 (most stake) rates miner 1 only; without a permit, or
    // inactive, it has no say and no new bonds.
    let weights = vec![vec![1.0, 0.0], vec![0.0, 1.0]];
    for how in ["permit", "active"] {
        let mut inp = input(&[1.0, 3.0], weights.clone());
        match how {
            "permit" => inp.validator_permits = Some(vec![true, false]),
            _ => inp.active = Some(vec![true, false]),
        }
        let out = run(&inp).unwrap();
        assert_eq!(out.active_stake, vec![1.0, 0.0], "{how}");
        assert_eq!(out.incentive, vec![1.0, 0.0], "{how}");
        assert_eq!(out.dividends, vec![1.0, 0.0], "{how}");
        assert_eq!(out.bonds[1], vec![0.0, 0.0], "{how}");
    }
}

#[test]
fn recently_registered_miners_lose_their_old_bonds() {
    let mut inp = input(&[1.0, 1.0], vec![vec![1.0, 0.0], vec![1.0, 0.0]]);
    inp.bonds = Some(vec![vec![1.0, 1.0], vec![0.0, 0.5]]);
    let kept = run(&inp).unwrap();
    assert!(kept.bonds[0][1] > 0.0);
    inp.recently_registered = Some(vec![false, true]);
    let reset = run(&inp).unwrap();
    assert_eq!(reset.bonds[0][1], 0.0);
    assert_eq!(reset.bonds[1][1], 0.0);
    assert_eq!(reset.bonds[0][0], kept.bonds[0][0]);
}

#[test]
fn fixed_point_division_is_exact_truncation() {
    use super::fixed::{Fx, div_wide};
    let mut rng = Rng(3);
    let mut cases: Vec<(u64, u128)> =
        vec![(1, 1), (1 << 32, 1 << 32), (12_603 << 32, 155_610 << 32), (5, 3), (u64::MAX >> 1, 1)];
    for _ in 0..200_000 {
        // Entries up to their divisor (column sums and maxima, up to 2^68
        // raw), as the bonds meet them ...
        let d = 1 + u128::from(rng.next()) % (1u128 << (rng.below(68) + 1));
        cases.push(((u128::from(rng.next()) % (d.min(1 << 63) + 1)) as u64, d));
        // ... and quotients far above 1.
        cases.push((rng.next() >> 1, 1 + u128::from(rng.next() % 1000)));
    }
    for (a, d) in cases {
        let want = u64::try_from((u128::from(a) << 32) / d).unwrap_or(u64::MAX);
        assert_eq!(div_wide(Fx::from_raw(a), d).raw(), want, "{a} / {d}");
    }
}

/// Time one 256 x 4096 epoch. Not an assertion: run with
/// `cargo test --release -p iota-control --lib settlement::yuma -- --ignored --nocapture`.
#[test]
#[ignore = "a timing, not an assertion: run it in release with --ignored --nocapture"]
fn time_256_validators_by_4096_miners() {
    let mut rng = Rng(42);
    let (v, m) = (256, 4096);
    let mut inp = input(
        &(0..v).map(|_| 1.0 + rng.unit() * 1e6).collect::<Vec<_>>(),
        (0..v).map(|_| (0..m).map(|_| rng.sparse()).collect()).collect(),
    );
    let out = run(&inp).unwrap();
    inp.bonds = Some(out.bonds);
    for mode in [BondsMode::Classic, BondsMode::Yuma3] {
        inp.params.bonds_mode = mode;
        let mut best = f64::INFINITY;
        for _ in 0..10 {
            let t = std::time::Instant::now();
            let out = run(&inp).unwrap();
            best = best.min(t.elapsed().as_secs_f64());
            std::hint::black_box(out);
        }
        println!("yuma {v} x {m} ({mode:?}): best of 10 {:.2} ms", best * 1e3);
    }
}
