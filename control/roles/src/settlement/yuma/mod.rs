//! Yuma consensus, sans I/O: from the validators' weight vectors and stake to
//! consensus, incentive, dividends, bonds and emission, the way Bittensor's
//! subtensor computes one epoch.
//!
//! The reference is subtensor's `pallets/subtensor/src/epoch/run_epoch.rs`
//! (`epoch` and `epoch_dense`, read at commit
//! `03f92770a0081475b69811334b0a7c7163157c1b` and checked against the later
//! mechanism-style rewrite at `39e773d984ec3f2505791dd3cd3ff92c80d87198`,
//! whose arithmetic is the same) and the helpers of `epoch/math.rs`. The code
//! here is our own; only the steps, their order and the defaults follow
//! subtensor. Steps, for V validators (rows) and M miners (columns):
//!
//! 1. **Stake.** `S = stakes / sum(stakes)`. The *active stake* masks out
//!    validators that are inactive or hold no validator permit, then is
//!    normalised again.
//! 2. **Weights.** Rows of validators without a permit are zeroed; every row
//!    is normalised to sum 1 (an all-zero row stays zero).
//! 3. **Preranks** `P_j = sum_i S_i W_ij` (active stake).
//! 4. **Consensus** `C_j`: per miner, the stake-weighted median of the
//!    weights at majority `kappa`: the smallest weight `w` such that the
//!    active stake voting `<= w` exceeds `1 - kappa` (subtensor's
//!    `weighted_median_col`; here a weighted quickselect per column, O(V)
//!    in the worst case).
//! 5. **Clipping** `Wc_ij = min(W_ij, C_j)`; **validator trust**
//!    `Tv_i = sum_j Wc_ij`.
//! 6. **Ranks** `R_j = sum_i S_i Wc_ij`, **trust** `T_j = R_j / P_j` (0 when
//!    `P_j = 0`), **incentive** `I = R / sum(R)`.
//! 7. **Bonds.** The weights that buy bonds are `Wb = W + beta (Wc - W)`
//!    (`beta` = bonds penalty; 1 buys with the clipped weights). The EMA
//!    coefficient is `alpha = 1 - bonds_moving_average` (liquid alpha off).
//!    - *classic* (subtensor's default, `Yuma3On = false`): the previous
//!      bonds (any scale: our output, or subtensor's raw u16) are
//!      column-normalised, `dB_ij = Wb_ij S_i` column-normalised,
//!      `B' = alpha dB + (1 - alpha) B`, column-normalised;
//!      **dividends** `D_i = sum_j B'_ij I_j`, normalised. The bonds returned
//!      are `B'` column max-upscaled (largest entry of each column 1), as
//!      subtensor stores them.
//!    - *yuma3* (`Yuma3On = true`): bonds are per-validator proportions in
//!      [0, 1]: `B' = alpha Wb + (1 - alpha) B`, returned as is; dividends
//!      `D_i = S_i sum_j (B'_ij / sum_k B'_kj) I_j`, normalised.
//! 8. **Emission.** `miner_share` of the epoch's emission goes to the miners
//!    in proportion to incentive and the rest to the validators in
//!    proportion to dividends (subtensor normalises incentive + dividends
//!    together, which is a 50/50 split). If only one side has anything, it
//!    takes the whole emission; if neither has, the validators take it in
//!    proportion to active stake (or to stake, when no stake is active).
//!
//! Left out: liquid alpha (per-bond alphas from a sigmoid), commit-reveal
//! masking, the outdated-weight mask (weights set before a miner's
//! registration) and the self-weight (diagonal) mask (validators and miners
//! are separate sets here: a caller with one shared uid space zeroes those
//! weights first), the stake threshold and the top-k assignment of new
//! validator permits (permits are an input), bonds reset, and subtensor's u16
//! storage (callers store what they like; the tests store u16 as subtensor
//! does).
//!
//! Numbers: `f64` throughout, except the bonds step (7), which is the state
//! carried from epoch to epoch: it runs in an emulation of subtensor's I32F32
//! (truncating multiplication and division; see `fixed`), because its
//! truncation makes stored bonds drift by a u16 step per epoch and
//! subtensor's `test_bonds` asserts exactly that drift. Everything else
//! agrees with subtensor to its I32F32 precision (about 1e-9): on the cases
//! of its tests that `tests` reproduces, the u16 figures exactly and the
//! emissions to within one rao in 1e9.

mod check;
mod fixed;
#[cfg(test)]
mod hostile_tests;
mod matrix;
#[cfg(test)]
mod tests;
mod types;

use check::{Checked, check};
use fixed::Fx;
use matrix::{Matrix, normalize};
pub use types::*;

/// Classic bonds up to this size enter the fixed-point EMA as they are (so
/// subtensor's raw u16 bonds keep its exact arithmetic); columns with a
/// larger entry are scaled to [0, 1] first.
const CLASSIC_BOND_LIMIT: f64 = (1u32 << 20) as f64;

/// The stake-weighted median of one column. `votes` are (weight, stake)
/// pairs of the validators with stake, the weight as the bits of a
/// non-negative `f64` (whose order they keep), their stake summing to
/// `stake_sum`. Returns the smallest weight w such that the stake voting
/// <= w exceeds `stake_sum - kappa` (the largest weight if rounding leaves
/// none).
///
/// A weighted quickselect: split at the middle vote (std's
/// `select_nth_unstable`, linear in the worst case), weigh the stake below
/// and at the pivot, keep the side that holds the answer. The sides halve,
/// so a column costs O(V), never worse; subtensor's `weighted_median` walks
/// the same partitions but can go quadratic.
fn weighted_median(votes: &mut [(u64, f64)], stake_sum: f64, kappa: f64) -> f64 {
    const SMALL: usize = 32;
    let minority = stake_sum - kappa;
    // Stake of the votes known to lie below everything in `rest`.
    let mut below = 0.0;
    let mut rest = votes;
    while rest.len() > SMALL {
        let mid = rest.len() / 2;
        let pivot = rest.select_nth_unstable_by_key(mid, |v| v.0).1.0;
        let (mut lt, mut eq) = (0.0, 0.0);
        for &(w, s) in rest.iter() {
            if w < pivot {
                lt += s;
            } else if w == pivot {
                eq += s;
            }
        }
        if below + lt > minority {
            // Below the pivot: every smaller vote sits left of `mid`.
            rest = &mut std::mem::take(&mut rest)[..mid];
        } else if below + lt + eq > minority {
            return f64::from_bits(pivot);
        } else {
            // Above the pivot: right of `mid`, less the pivot's equals.
            below += lt + eq;
            let upper = &mut std::mem::take(&mut rest)[mid + 1..];
            let mut kept = 0;
            for k in 0..upper.len() {
                if upper[k].0 != pivot {
                    upper.swap(k, kept);
                    kept += 1;
                }
            }
            if kept == 0 {
                return f64::from_bits(pivot);
            }
            rest = &mut upper[..kept];
        }
    }
    rest.sort_unstable_by_key(|v| v.0);
    let mut k = 0;
    while k < rest.len() {
        let weight = rest[k].0;
        while k < rest.len() && rest[k].0 == weight {
            below += rest[k].1;
            k += 1;
        }
        if below > minority {
            return f64::from_bits(weight);
        }
    }
    rest.last().map_or(0.0, |v| f64::from_bits(v.0))
}

/// Consensus per column: the `kappa`-majority stake-weighted median over the
/// validators with positive stake (their stake renormalised to sum 1, as
/// subtensor does). Zero for every column when nobody has stake.
fn weighted_median_cols(stake: &[f64], w: &Matrix, kappa: f64) -> Vec<f64> {
    let mut voters: Vec<(usize, f64)> = stake.iter().copied().enumerate().filter(|&(_, s)| s > 0.0).collect();
    let mut out = vec![0.0; w.cols];
    if voters.is_empty() {
        return out;
    }
    let mut shares: Vec<f64> = voters.iter().map(|&(_, s)| s).collect();
    normalize(&mut shares);
    for (v, &s) in voters.iter_mut().zip(&shares) {
        v.1 = s;
    }
    let stake_sum: f64 = shares.iter().sum();
    // Gather the votes column by column, a block of columns (one cache line
    // of each row) at a time, so that each column's votes end up contiguous
    // without striding through the whole matrix per column. The columns of
    // a block sit one vote apart more than the voters (4 KiB strides alias
    // in the cache).
    const BLOCK: usize = 8;
    let n = voters.len();
    let stride = n + 1;
    let mut block = vec![(0u64, 0.0); BLOCK * stride];
    for j0 in (0..w.cols).step_by(BLOCK) {
        let width = BLOCK.min(w.cols - j0);
        for (k, &(i, s)) in voters.iter().enumerate() {
            for (dj, &v) in w.row(i)[j0..j0 + width].iter().enumerate() {
                // abs: a weight of -0.0 (allowed: it is >= 0) sorts as 0.
                block[dj * stride + k] = (v.abs().to_bits(), s);
            }
        }
        for dj in 0..width {
            out[j0 + dj] = weighted_median(&mut block[dj * stride..dj * stride + n], stake_sum, kappa);
        }
    }
    out
}

/// Runs one epoch of Yuma consensus. Refuses (never panics on) inputs that
/// are empty, ragged, too large, or hold negative or non-finite numbers.
pub fn run(input: &YumaInput) -> Result<YumaOutput, YumaError> {
    let c = check(input)?;
    Ok(epoch(c))
}

/// [`run`] on a JSON [`YumaInput`]; returns the [`YumaOutput`] as pretty JSON
/// (what `iota-control yuma` prints).
pub fn run_json(json: &str) -> Result<String, YumaError> {
    let input: YumaInput = serde_json::from_str(json).map_err(|e| YumaError::Json(e.to_string()))?;
    let output = run(&input)?;
    serde_json::to_string_pretty(&output).map_err(|e| YumaError::Json(e.to_string()))
}

fn epoch(c: Checked<'_>) -> YumaOutput {
    let Checked { stake, mut weights, bonds, permits, active, recently_registered, params } = c;
    let (n_v, n_m) = (weights.rows, weights.cols);

    // 1. Active stake: only active validators with a permit vote.
    let mut active_stake: Vec<f64> =
        stake.iter().zip(permits.iter().zip(&active)).map(|(&s, (&p, &a))| if p && a { s } else { 0.0 }).collect();
    normalize(&mut active_stake);

    // 2. Weights: drop the rows of validators without a permit, normalise rows.
    for (row, &permit) in weights.data.chunks_exact_mut(n_m).zip(&permits) {
        if !permit {
            row.fill(0.0);
        }
        normalize(row);
    }

    // 3-4. Preranks and consensus.
    let preranks = weights.weighted_col_sums(&active_stake);
    let consensus = weighted_median_cols(&active_stake, &weights, params.kappa);

    // 5-6. One pass over the clipped weights Wc = min(W, C): validator trust,
    // ranks, and (7) the weights that buy bonds, Wb = W + beta (Wc - W),
    // which replace W in place (subtensor takes W or Wc as they are when
    // beta is 0 or 1).
    let beta = params.bonds_penalty;
    let mut validator_trust = vec![0.0; n_v];
    let mut ranks = vec![0.0; n_m];
    for ((row, vt), &s) in weights.data.chunks_exact_mut(n_m).zip(&mut validator_trust).zip(&active_stake) {
        // Four partial sums of the row, so the additions pipeline.
        let mut lanes = [0.0; 4];
        for (j, ((w, &c), r)) in row.iter_mut().zip(&consensus).zip(&mut ranks).enumerate() {
            let clipped = w.min(c);
            lanes[j % 4] += clipped;
            *r += s * clipped;
            *w = if beta == 1.0 {
                clipped
            } else if beta == 0.0 {
                *w
            } else {
                *w + beta * (clipped - *w)
            };
        }
        *vt = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
    }
    let trust: Vec<f64> = ranks.iter().zip(&preranks).map(|(&r, &p)| if p > 0.0 { r / p } else { 0.0 }).collect();
    let mut incentive = ranks.clone();
    normalize(&mut incentive);

    // 7. Bonds and dividends, on subtensor's I32F32 grid (see `fixed`); the
    // inputs are truncated onto it. alpha = 1 - bonds_moving_average there too.
    let alpha = Fx::ONE.sub(Fx::from_f64(params.bonds_moving_average));
    let keep = Fx::ONE.sub(alpha);
    let (mut ema, old_sums) = previous_bonds(bonds, &recently_registered, params.bonds_mode, n_v, n_m);
    let mut dividends = vec![0.0; n_v];
    match params.bonds_mode {
        BondsMode::Classic => {
            fixed::col_normalize_by(&mut ema, n_m, &old_sums);
            // dB = Wb o S (row-wise), column-normalised.
            let mut delta: Vec<Fx> = Vec::with_capacity(ema.len());
            let mut sums = vec![0u128; n_m];
            for (row, &s) in weights.data.chunks_exact(n_m).zip(&active_stake) {
                let s = Fx::from_f64(s);
                let start = delta.len();
                delta.extend(row.iter().map(|&w| s.mul(Fx::from_f64(w))));
                fixed::add_to_sums(&mut sums, &delta[start..]);
            }
            fixed::col_normalize_by(&mut delta, n_m, &sums);
            sums.fill(0);
            for (row, drow) in ema.chunks_exact_mut(n_m).zip(delta.chunks_exact(n_m)) {
                for (b, &d) in row.iter_mut().zip(drow) {
                    *b = alpha.mul(d).add(keep.mul(*b));
                }
                fixed::add_to_sums(&mut sums, row);
            }
            drop(delta);
            fixed::col_normalize_by(&mut ema, n_m, &sums);
            for (d, row) in dividends.iter_mut().zip(ema.chunks_exact(n_m)) {
                *d = row.iter().zip(&incentive).map(|(b, x)| b.to_f64() * x).sum();
            }
            normalize(&mut dividends);
            fixed::col_max_upscale(&mut ema, n_m);
        }
        BondsMode::Yuma3 => {
            let mut col_sums = vec![0.0; n_m];
            for (row, wrow) in ema.chunks_exact_mut(n_m).zip(weights.data.chunks_exact(n_m)) {
                for ((b, &w), sum) in row.iter_mut().zip(wrow).zip(&mut col_sums) {
                    *b = alpha.mul(Fx::from_f64(w)).add(keep.mul(*b));
                    *sum += b.to_f64();
                }
            }
            for ((d, row), &s) in dividends.iter_mut().zip(ema.chunks_exact(n_m)).zip(&active_stake) {
                let per_bond: f64 = row
                    .iter()
                    .zip(&incentive)
                    .zip(&col_sums)
                    .map(|((b, &x), &sum)| if sum > 0.0 { b.to_f64() / sum * x } else { 0.0 })
                    .sum();
                *d = per_bond * s;
            }
            normalize(&mut dividends);
        }
    }
    let bonds = ema.chunks_exact(n_m).map(|row| row.iter().map(|b| b.to_f64()).collect()).collect();

    // 8. Emission.
    let emission = split_emission(params, &incentive, &dividends, &active_stake, &stake);
    YumaOutput { active_stake, consensus, ranks, trust, incentive, validator_trust, dividends, bonds, emission }
}

/// The previous bonds on the fixed-point grid, the columns of recently
/// registered miners zeroed, and their column sums (raw). Classic bonds may
/// come in any scale (each column is normalised): columns with an entry past
/// the u16 range that subtensor stores are scaled to [0, 1] first, others
/// enter as they are.
fn previous_bonds(
    bonds: Option<&[Vec<f64>]>,
    recently_registered: &[bool],
    mode: BondsMode,
    n_v: usize,
    n_m: usize,
) -> (Vec<Fx>, Vec<u128>) {
    let mut sums = vec![0u128; n_m];
    let Some(bonds) = bonds else {
        return (vec![Fx::ZERO; n_v * n_m], sums);
    };
    let mut scale = vec![1.0f64; n_m];
    if mode == BondsMode::Classic {
        for row in bonds {
            for (s, &b) in scale.iter_mut().zip(row) {
                if b > CLASSIC_BOND_LIMIT {
                    *s = s.max(b);
                }
            }
        }
    }
    let scaled = scale.iter().any(|&s| s != 1.0);
    let fresh = recently_registered.iter().any(|&f| f);
    let mut out = Vec::with_capacity(n_v * n_m);
    for row in bonds {
        let start = out.len();
        if scaled || fresh {
            out.extend(
                row.iter().zip(&scale).zip(recently_registered).map(
                    |((&b, &s), &fresh)| {
                        if fresh { Fx::ZERO } else { Fx::from_f64(b / s) }
                    },
                ),
            );
        } else {
            out.extend(row.iter().map(|&b| Fx::from_f64(b)));
        }
        fixed::add_to_sums(&mut sums, &out[start..]);
    }
    (out, sums)
}

fn split_emission(
    p: &YumaParams,
    incentive: &[f64],
    dividends: &[f64],
    active_stake: &[f64],
    stake: &[f64],
) -> Emission {
    let has_incentive = incentive.iter().any(|&x| x > 0.0);
    let has_dividends = dividends.iter().any(|&x| x > 0.0);
    let (to_miners, to_validators) = match (has_incentive, has_dividends) {
        (true, true) => (p.emission * p.miner_share, p.emission * (1.0 - p.miner_share)),
        (true, false) => (p.emission, 0.0),
        (false, _) => (0.0, p.emission),
    };
    // Each share vector sums to 1 (or is all zero); dividing by its exact
    // sum keeps the emitted total exact to rounding.
    let share = |x: &[f64], total: f64| -> Vec<f64> {
        let sum: f64 = x.iter().sum();
        x.iter().map(|&v| if sum > 0.0 { total * (v / sum) } else { 0.0 }).collect()
    };
    // With incentive but no dividends, `to_validators` is 0 anyway.
    let validator_basis = if has_dividends || has_incentive {
        dividends
    } else if active_stake.iter().any(|&s| s > 0.0) {
        active_stake
    } else {
        stake
    };
    Emission { miners: share(incentive, to_miners), validators: share(validator_basis, to_validators) }
}
