//! Float weights to the `u16` values a validator hands subtensor, as the
//! Bittensor Python SDK computes them before `set_weights`.
//!
//! Two steps, both on `f64` (Python floats), in the SDK's order of
//! operations so that the results are bit for bit the SDK's:
//!
//! - [`clip_to_max_weight`]: when the subnet's `MaxWeightsLimit` is below
//!   `u16::MAX`, the SDK (11.x, `bittensor.intents.weights`) first
//!   normalises the vector to sum 1 with no entry above the limit, finding
//!   a cutoff so that mass is redistributed rather than dropped (the same
//!   algorithm as the older SDK's `normalize_max_weight`). The chain
//!   refuses a vector whose largest share exceeds the limit
//!   (`MaxWeightExceeded`).
//! - [`weights_for_emit`]: max-upscale (the largest weight becomes
//!   65535), round half to even (Python's `round`), and drop the entries
//!   that round to zero, with their uids (the SDK's
//!   `convert_weights_and_uids_for_emit`, 11.x: `intents.normalize`).
//!
//! Where the SDK versions differ we follow the current one (11.x): checks
//! in the order length, finiteness and sign; an empty or all-zero vector
//! gives empty lists (the 10.x SDK raises on an empty one). The 10.x
//! `set_weights` also casts a Python *list* of weights to `float32` first;
//! callers that want that do the cast themselves (`w as f32 as f64`).
//! `scripts/bittensor-crosscheck.py` runs the installed SDK on the same
//! inputs, and `chain::tests` compares.

/// The largest value a chain weight takes.
pub const U16_MAX: u16 = u16::MAX;

/// Why a weight vector cannot go on chain (each raised by the SDK too).
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum WeightError {
    #[error("{uids} uids but {weights} weights: they must be the same length")]
    LengthMismatch { uids: usize, weights: usize },
    #[error("weight {index} is {value}: weights must be finite")]
    NotFinite { index: usize, value: f64 },
    #[error("weight {index} is {value}: a negative weight cannot exist on chain")]
    Negative { index: usize, value: f64 },
    #[error("all weights are zero: nothing to set")]
    AllZero,
    #[error("max weight limit {0} is not in (0, 1]")]
    BadLimit(f64),
}

fn check(weights: &[f64]) -> Result<(), WeightError> {
    for (index, &value) in weights.iter().enumerate() {
        if !value.is_finite() {
            return Err(WeightError::NotFinite { index, value });
        }
        // -0.0 passes, as `w < 0` lets it pass in Python.
        if value < 0.0 {
            return Err(WeightError::Negative { index, value });
        }
    }
    Ok(())
}

/// Python's `sum` over floats: left to right, from 0.
fn py_sum(xs: impl IntoIterator<Item = f64>) -> f64 {
    xs.into_iter().fold(0.0, |acc, x| acc + x)
}

/// The uids and `u16` weights the SDK submits for `weights` (parallel to
/// `uids`): `round_half_even(w / max * 65535)`, zeros dropped with their
/// uids. All-zero (or empty) input gives two empty lists.
pub fn weights_for_emit(uids: &[u16], weights: &[f64]) -> Result<(Vec<u16>, Vec<u16>), WeightError> {
    if uids.len() != weights.len() {
        return Err(WeightError::LengthMismatch { uids: uids.len(), weights: weights.len() });
    }
    check(weights)?;
    let top = weights.iter().copied().fold(0.0, f64::max);
    if top == 0.0 {
        return Ok((Vec::new(), Vec::new()));
    }
    let mut out_uids = Vec::new();
    let mut out_vals = Vec::new();
    for (&uid, &w) in uids.iter().zip(weights) {
        // (w / top) <= 1, so the product is at most 65535 and the cast exact.
        let v = ((w / top) * f64::from(U16_MAX)).round_ties_even() as u16;
        if v != 0 {
            out_uids.push(uid);
            out_vals.push(v);
        }
    }
    Ok((out_uids, out_vals))
}

/// The subnet hyperparameter `MaxWeightsLimit` (a `u16`, 65535 = no
/// limit) as the share the SDK clips to.
pub fn max_weight_share(max_weight_limit: u16) -> f64 {
    f64::from(max_weight_limit) / f64::from(U16_MAX)
}

/// Normalises `weights` to sum 1 with no entry above `limit` (a share in
/// (0, 1]), as the SDK's `clip_to_max_weight`: weights already within
/// the limit are only normalised; otherwise every weight above a cutoff is
/// cut to it, the cutoff chosen so that the largest share lands on the
/// limit (less a 1e-7 margin). A limit no vector can meet
/// (`len * limit <= 1`) gives the uniform vector.
pub fn clip_to_max_weight(weights: &[f64], limit: f64) -> Result<Vec<f64>, WeightError> {
    if !(limit > 0.0 && limit <= 1.0) {
        return Err(WeightError::BadLimit(limit));
    }
    check(weights)?;
    let n = weights.len();
    let total = py_sum(weights.iter().copied());
    if n == 0 || total <= 0.0 {
        return Err(WeightError::AllZero);
    }
    if n as f64 * limit <= 1.0 {
        return Ok(vec![1.0 / n as f64; n]);
    }
    let mut estimation: Vec<f64> = weights.iter().map(|w| w / total).collect();
    estimation.sort_by(f64::total_cmp);
    if estimation[n - 1] <= limit {
        return Ok(weights.iter().map(|w| w / total).collect());
    }
    const EPSILON: f64 = 1e-7;
    let cumsum: Vec<f64> = estimation
        .iter()
        .scan(0.0, |acc, &e| {
            *acc += e;
            Some(*acc)
        })
        .collect();
    let n_values = estimation
        .iter()
        .enumerate()
        .filter(|&(i, &e)| e / ((n - i - 1) as f64 * e + cumsum[i] + EPSILON) < limit)
        .count();
    // Entry 0 always counts when n * limit > 1; Python's index -1 (the
    // last) is kept for the case that cannot happen.
    let at = if n_values == 0 { n - 1 } else { n_values - 1 };
    let cutoff_scale = (limit * cumsum[at] - EPSILON) / (1.0 - limit * (n - n_values) as f64);
    let cutoff = cutoff_scale * total;
    // Python's `min(w, cutoff)` keeps w unless cutoff is smaller.
    let clipped: Vec<f64> = weights.iter().map(|&w| if cutoff < w { cutoff } else { w }).collect();
    let clipped_total = py_sum(clipped.iter().copied());
    Ok(clipped.iter().map(|w| w / clipped_total).collect())
}
