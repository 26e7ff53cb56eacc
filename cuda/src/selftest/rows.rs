//! The reduce and codec rows: their inputs and how each is judged.

use std::time::Instant;

use iota_core::WireCodec;
use iota_core::merge::{OuterOpt, ReduceRule};
use iota_core::rng::Rng;

use super::check::{Check, Kernels, max_rel};
use crate::runtime::CudaError;

/// The reduce and codec rows: `subject` against `reference`, same inputs.
pub fn run_with(subject: &dyn Kernels, reference: &dyn Kernels) -> Result<Vec<Check>, CudaError> {
    let mut out = Vec::new();
    for case in reduce_cases() {
        out.push(reduce_row(subject, reference, &case)?);
    }
    codec_rows(subject, reference, &mut out)?;
    Ok(out)
}

/// One slice reduce's inputs.
pub(super) struct ReduceCase {
    pub(super) rule: ReduceRule,
    pub(super) outer: OuterOpt,
    pub(super) contribs: Vec<Option<Vec<f32>>>,
    pub(super) weights: Vec<f64>,
    pub(super) momentum: Vec<f32>,
}

impl ReduceCase {
    pub(super) fn refs(&self) -> Vec<Option<&[f32]>> {
        self.contribs.iter().map(|c| c.as_deref()).collect()
    }
}

/// `r` honest pseudo-gradients (a shared base plus noise) of length `n`,
/// weights 1..=r normalised, a random outer momentum.
pub(super) fn honest(r: usize, n: usize, seed: u64) -> (Vec<Option<Vec<f32>>>, Vec<f64>, Vec<f32>) {
    let mut rng = Rng::new(seed);
    let base: Vec<f32> = (0..n).map(|_| rng.normal() * 0.01).collect();
    let xs = (0..r).map(|_| Some(base.iter().map(|b| b + rng.normal() * 0.003).collect())).collect();
    let momentum = (0..n).map(|_| rng.normal() * 0.01).collect();
    let w: Vec<f64> = (0..r).map(|i| 1.0 + i as f64).collect();
    let t: f64 = w.iter().sum();
    (xs, w.iter().map(|x| x / t).collect(), momentum)
}

/// The reduce rows' inputs. Each has a contribution that never arrived and
/// one with a non-finite value (both left out, the weights renormalised);
/// the centered-clip one also has an outlier, so the clipping engages.
pub(super) fn reduce_cases() -> Vec<ReduceCase> {
    let outer = OuterOpt { lr: 0.7, momentum: 0.9 };
    let mut out = Vec::new();
    for (rule, r, n) in
        [(ReduceRule::Mean, 4usize, 100_003usize), (ReduceRule::CenteredClip { tau_factor: 2.0, iters: 3 }, 8, 65_536)]
    {
        let (mut contribs, mut weights, momentum) = honest(r, n, n as u64);
        let mut bad = contribs[0].clone().unwrap_or_default();
        if rule == ReduceRule::Mean {
            bad[n / 3] = f32::INFINITY;
        } else {
            bad[17] = f32::NAN;
            // A Byzantine replica: the honest direction flipped and scaled.
            if let Some(x) = &mut contribs[r - 1] {
                x.iter_mut().for_each(|v| *v *= -20.0);
            }
        }
        contribs.insert(1, None);
        contribs.push(Some(bad));
        weights.insert(1, 0.25);
        weights.push(0.5);
        out.push(ReduceCase { rule, outer, contribs, weights, momentum });
    }
    out
}

pub(super) fn reduce_row(
    subject: &dyn Kernels,
    reference: &dyn Kernels,
    case: &ReduceCase,
) -> Result<Check, CudaError> {
    let refs = case.refs();
    let mut m_ref = case.momentum.clone();
    let u_ref = reference.reduce_slice(case.rule, case.outer, &refs, &case.weights, &mut m_ref)?;
    let mut m = case.momentum.clone();
    let t0 = Instant::now();
    let u = subject.reduce_slice(case.rule, case.outer, &refs, &case.weights, &mut m)?;
    let millis = t0.elapsed().as_secs_f64() * 1e3;
    Ok(Check {
        op: format!("butterfly reduce ({})", case.rule.name()),
        shape: format!("{} x {}", refs.len(), case.momentum.len()),
        max_rel_err: max_rel(&u, &u_ref).max(max_rel(&m, &m_ref)),
        tolerance: 1e-5,
        millis,
        reference: reference.name().into(),
    })
}

/// The codec rows' input: random rows, plus row 0 all zeros (scale 0) and
/// row 1 with absmax exactly 127 (scale 1) and every other value a half
/// (k + 0.5), so codes must round halves away from zero to match.
pub(super) fn codec_input() -> (usize, usize, Vec<f32>) {
    let (rows, cols) = (513usize, 384usize);
    let mut rng = Rng::new(9);
    let mut x: Vec<f32> = (0..rows * cols).map(|_| rng.normal()).collect();
    x[..cols].fill(0.0);
    for (j, v) in x[cols..2 * cols].iter_mut().enumerate() {
        *v = match j {
            0 => 127.0,
            1 => -127.0,
            _ => (j % 254) as f32 - 126.5,
        };
    }
    (rows, cols, x)
}

/// Valid bytes made invalid four ways: a code -128, a NaN, an infinite and
/// a negative scale, a huge scale whose product overflows.
pub(super) fn corrupted(bytes: &[u8], cols: usize) -> Vec<Vec<u8>> {
    let rb = cols + 2;
    let with = |row: usize, at: usize, b: &[u8]| {
        let mut v = bytes.to_vec();
        v[row * rb + at..row * rb + at + b.len()].copy_from_slice(b);
        v
    };
    vec![
        with(7, 2 + cols / 3, &[0x80]),
        with(3, 0, &0x7FC0u16.to_le_bytes()),
        with(5, 0, &0x7F80u16.to_le_bytes()),
        with(4, 0, &0xBF80u16.to_le_bytes()),
        with(2, 0, &[0x7F, 0x7F, 127]),
    ]
}

/// Per row, the largest round-trip error over the codec's bound for that
/// row (`iota_model::codec::error_bound` of the row's absmax).
pub(super) fn round_trip_ratio(x: &[f32], back: &[f32], cols: usize) -> f64 {
    if back.len() != x.len() {
        return f64::INFINITY;
    }
    let mut worst = 0.0f64;
    for (xr, br) in x.chunks(cols).zip(back.chunks(cols)) {
        let absmax = xr.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let bound = iota_model::codec::error_bound(WireCodec::Int8Row, absmax) as f64;
        for (&a, &b) in xr.iter().zip(br) {
            let err = (a as f64 - b as f64).abs();
            let ratio = if err == 0.0 { 0.0 } else { err / bound };
            if ratio.is_nan() {
                return f64::INFINITY;
            }
            worst = worst.max(ratio);
        }
    }
    worst
}

pub(super) fn codec_rows(
    subject: &dyn Kernels,
    reference: &dyn Kernels,
    out: &mut Vec<Check>,
) -> Result<(), CudaError> {
    let (rows, cols, x) = codec_input();
    let shape = format!("{rows} x {cols}");
    let want = reference.encode_int8_rows(&x, rows, cols)?;
    let t0 = Instant::now();
    let bytes = subject.encode_int8_rows(&x, rows, cols)?;
    let millis = t0.elapsed().as_secs_f64() * 1e3;
    let differing = bytes.iter().zip(&want).filter(|(a, b)| a != b).count() + bytes.len().abs_diff(want.len());
    out.push(Check {
        op: "int8 row encode (bytes differing)".into(),
        shape: shape.clone(),
        max_rel_err: differing as f64,
        tolerance: 0.0,
        millis,
        reference: reference.name().into(),
    });
    // Decode: both sides decode the same (reference) bytes, so a faulty
    // encoder cannot hide a faulty decoder; and both refuse corrupted bytes.
    let want_back = reference.decode_int8_rows(&want, rows, cols)?;
    let t0 = Instant::now();
    let back = subject.decode_int8_rows(&want, rows, cols)?;
    let millis = t0.elapsed().as_secs_f64() * 1e3;
    let mut all_refused = true;
    for bad in corrupted(&want, cols) {
        all_refused &= subject.decode_int8_rows(&bad, rows, cols)?.is_none()
            && reference.decode_int8_rows(&bad, rows, cols)?.is_none();
    }
    out.push(Check {
        op: "int8 row decode".into(),
        shape: shape.clone(),
        max_rel_err: match (back, want_back) {
            (Some(b), Some(w)) if all_refused => max_rel(&b, &w),
            _ => f64::INFINITY,
        },
        tolerance: 0.0,
        millis,
        reference: reference.name().into(),
    });
    // The subject's own round trip, within the codec's bound row by row.
    let rt = subject.decode_int8_rows(&bytes, rows, cols)?;
    out.push(Check {
        op: "int8 round trip / error bound".into(),
        shape,
        max_rel_err: rt.map_or(f64::INFINITY, |b| round_trip_ratio(&x, &b, cols)),
        tolerance: 1.0,
        millis: 0.0,
        reference: "error_bound".into(),
    });
    Ok(())
}
