//! Yuma's input checks: every field bounded and finite before any work,
//! each refusal naming its field; the weights densified on the way.

use super::matrix::{Matrix, normalize};
use super::types::*;

/// The checked input, weights densified.
pub(super) struct Checked<'a> {
    pub(super) stake: Vec<f64>,
    pub(super) weights: Matrix,
    /// V rows of M (checked), or none.
    pub(super) bonds: Option<&'a [Vec<f64>]>,
    pub(super) permits: Vec<bool>,
    pub(super) active: Vec<bool>,
    pub(super) recently_registered: Vec<bool>,
    pub(super) params: &'a YumaParams,
}

fn check_param(name: &'static str, value: f64, lo: f64, hi: f64, range: &'static str) -> Result<(), YumaError> {
    if value >= lo && value <= hi { Ok(()) } else { Err(YumaError::BadParam { name, value, range }) }
}

fn check_values(field: &str, values: &[f64], yuma3_bonds: bool) -> Result<(), YumaError> {
    // The fast path: one pass without early exit (it vectorises); NaN fails
    // both comparisons.
    let limit = if yuma3_bonds { 1.0 } else { f64::MAX };
    if values.iter().fold(true, |ok, &v| ok & (v >= 0.0) & (v <= limit)) {
        return Ok(());
    }
    for (k, &v) in values.iter().enumerate() {
        if !v.is_finite() || v < 0.0 {
            return Err(YumaError::BadValue {
                field: format!("{field}[{k}]"),
                value: v,
                why: "values must be finite and non-negative",
            });
        }
        if yuma3_bonds && v > 1.0 {
            return Err(YumaError::BadValue {
                field: format!("{field}[{k}]"),
                value: v,
                why: "yuma3 bonds are proportions in [0, 1]",
            });
        }
    }
    Ok(())
}

/// Checks a V x M matrix; appends its rows to `copy` when given (while
/// each row is still in cache).
fn check_matrix(
    field: &'static str,
    m: &[Vec<f64>],
    rows: usize,
    cols: usize,
    yuma3: bool,
    mut copy: Option<&mut Vec<f64>>,
) -> Result<(), YumaError> {
    if m.len() != rows {
        return Err(YumaError::Shape {
            field: field.to_string(),
            expected: rows,
            found: m.len(),
            why: "one row per validator",
        });
    }
    for (i, row) in m.iter().enumerate() {
        if row.len() != cols {
            return Err(YumaError::Shape {
                field: format!("{field}[{i}]"),
                expected: cols,
                found: row.len(),
                why: "one entry per miner, as many as weights[0] has",
            });
        }
        check_values(&format!("{field}[{i}]"), row, yuma3)?;
        if let Some(copy) = copy.as_deref_mut() {
            copy.extend_from_slice(row);
        }
    }
    Ok(())
}

/// A per-validator or per-miner flag vector: as given, or `default` for all
/// when absent.
fn check_mask(
    field: &'static str,
    mask: &Option<Vec<bool>>,
    len: usize,
    default: bool,
    why: &'static str,
) -> Result<Vec<bool>, YumaError> {
    match mask {
        None => Ok(vec![default; len]),
        Some(m) if m.len() == len => Ok(m.clone()),
        Some(m) => Err(YumaError::Shape { field: field.to_string(), expected: len, found: m.len(), why }),
    }
}

pub(super) fn check(input: &YumaInput) -> Result<Checked<'_>, YumaError> {
    let p = &input.params;
    check_param("kappa", p.kappa, 0.0, 1.0, "[0, 1]")?;
    check_param("bonds_moving_average", p.bonds_moving_average, 0.0, 1.0, "[0, 1]")?;
    check_param("bonds_penalty", p.bonds_penalty, 0.0, 1.0, "[0, 1]")?;
    check_param("miner_share", p.miner_share, 0.0, 1.0, "[0, 1]")?;
    check_param("emission", p.emission, 0.0, f64::MAX, "[0, f64::MAX]")?;

    let v = input.stakes.len();
    if v == 0 {
        return Err(YumaError::Empty { field: "stakes", what: "validator" });
    }
    if v > MAX_UIDS {
        return Err(YumaError::TooLarge { field: "stakes", len: v, max: MAX_UIDS });
    }
    check_values("stakes", &input.stakes, false)?;
    if input.weights.len() != v {
        return Err(YumaError::Shape {
            field: "weights".to_string(),
            expected: v,
            found: input.weights.len(),
            why: "one row per validator, as many as stakes",
        });
    }
    let m = input.weights[0].len();
    if m == 0 {
        return Err(YumaError::Empty { field: "weights[0]", what: "miner" });
    }
    if m > MAX_UIDS {
        return Err(YumaError::TooLarge { field: "weights[0]", len: m, max: MAX_UIDS });
    }
    if v.saturating_mul(m) > MAX_CELLS {
        return Err(YumaError::MatrixTooLarge { rows: v, cols: m, max: MAX_CELLS });
    }
    let mut weights = Vec::with_capacity(v * m);
    check_matrix("weights", &input.weights, v, m, false, Some(&mut weights))?;
    let yuma3 = p.bonds_mode == BondsMode::Yuma3;
    if let Some(b) = &input.bonds {
        check_matrix("bonds", b, v, m, yuma3, None)?;
    }
    let permits = check_mask("validator_permits", &input.validator_permits, v, true, "one per validator")?;
    let active = check_mask("active", &input.active, v, true, "one per validator")?;
    let recently_registered = check_mask("recently_registered", &input.recently_registered, m, false, "one per miner")?;

    let mut stake = input.stakes.clone();
    normalize(&mut stake);
    if stake.iter().all(|&s| s == 0.0) {
        return Err(YumaError::NoStake);
    }
    Ok(Checked {
        stake,
        weights: Matrix { rows: v, cols: m, data: weights },
        bonds: input.bonds.as_deref(),
        permits,
        active,
        recently_registered,
        params: p,
    })
}
