//! The selftest itself under test: it passes on the CPU, each row fails
//! when the kernel it checks is broken (and only the rows that should), and
//! the naive references agree with the production code on edge cases.

use iota_core::WireCodec;
use iota_core::codec::{bf16_to_f32, f32_to_bf16, f32_to_bf16_up};
use iota_core::merge::{OuterOpt, ReduceRule, reduce_slice};

use super::check::max_rel;
use super::rows::*;
use super::*;

const REDUCE_MEAN: &str = "butterfly reduce (mean)";
const REDUCE_CLIP: &str = "butterfly reduce (centered-clip)";
const ENCODE: &str = "int8 row encode (bytes differing)";
const DECODE: &str = "int8 row decode";
const ROUND_TRIP: &str = "int8 round trip / error bound";

fn failing(checks: &[Check]) -> Vec<&str> {
    checks.iter().filter(|c| !c.passed()).map(|c| c.op.as_str()).collect()
}

#[test]
fn cpu_selftest_passes_every_row_against_the_naive_reference() {
    let checks = run(Device::Cpu).unwrap();
    let ops: Vec<&str> = checks.iter().map(|c| c.op.as_str()).collect();
    assert_eq!(ops, [REDUCE_MEAN, REDUCE_CLIP, ENCODE, DECODE, ROUND_TRIP]);
    assert!(failing(&checks).is_empty(), "{checks:#?}");
    for c in &checks[..4] {
        assert_eq!(c.reference, "naive", "{c:?}");
    }
}

#[test]
fn the_reduce_rows_leave_out_bad_contributions_and_clip_the_outlier() {
    let cases = reduce_cases();
    for case in &cases {
        let mut m = case.momentum.clone();
        let (u, stats) = reduce_slice(case.rule, case.outer, &case.refs(), &case.weights, &mut m);
        assert!(u.iter().all(|v| v.is_finite()));
        assert_eq!(stats.rejected_non_finite, 1, "{:?}", case.rule);
        assert_eq!(stats.clipped, usize::from(case.rule != ReduceRule::Mean), "{:?}", case.rule);
    }
}

/// What a broken subject gets wrong.
#[derive(Clone, Copy, Debug)]
enum Fault {
    /// One value of u off by a relative 1e-3.
    ReduceOutput,
    /// One value of the updated momentum off by a relative 1e-3.
    ReduceMomentum,
    /// One value of u NaN (what 0 x NaN in a kernel's sum gives).
    ReduceNan,
    /// Centered clipping computed as the plain mean.
    ClipAsMean,
    /// One code one step further from its value.
    EncodeCode,
    /// Scales rounded to the nearest bf16 instead of up.
    EncodeNearestScale,
    /// Codes rounded half to even instead of away from zero.
    EncodeTiesEven,
    /// Every decoded value times (1 + 1e-6).
    DecodeScale,
    /// Accepts a code -128 (decodes it as -127).
    DecodeAcceptsMin,
}

/// The production CPU kernels with one fault.
struct Broken(Fault);

/// Bytes like the production encoder's, with the scale and code rounding
/// given.
fn encode_with(x: &[f32], cols: usize, scale_bits: fn(f32) -> u16, round: fn(f32) -> f32) -> Vec<u8> {
    let mut out = Vec::new();
    for row in x.chunks(cols) {
        let absmax = row.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let bits = scale_bits(absmax / 127.0);
        out.extend_from_slice(&bits.to_le_bytes());
        let scale = bf16_to_f32(bits);
        let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
        out.extend(row.iter().map(|&v| round(v * inv).clamp(-127.0, 127.0) as i8 as u8));
    }
    out
}

impl Kernels for Broken {
    fn name(&self) -> &'static str {
        "broken"
    }
    fn reduce_slice(
        &self,
        rule: ReduceRule,
        outer: OuterOpt,
        contribs: &[Option<&[f32]>],
        weights: &[f64],
        momentum: &mut [f32],
    ) -> Result<Vec<f32>, CudaError> {
        let rule = match (self.0, rule) {
            (Fault::ClipAsMean, ReduceRule::CenteredClip { .. }) => ReduceRule::Mean,
            _ => rule,
        };
        let mut u = CpuProduction.reduce_slice(rule, outer, contribs, weights, momentum)?;
        let k = u.len() / 2;
        match self.0 {
            Fault::ReduceOutput => u[k] *= 1.0 + 1e-3,
            Fault::ReduceMomentum => momentum[k] *= 1.0 + 1e-3,
            Fault::ReduceNan => u[k] = f32::NAN,
            _ => {}
        }
        Ok(u)
    }
    fn encode_int8_rows(&self, x: &[f32], rows: usize, cols: usize) -> Result<Vec<u8>, CudaError> {
        let mut bytes = CpuProduction.encode_int8_rows(x, rows, cols)?;
        match self.0 {
            Fault::EncodeCode => {
                // Row 10, column 100: one step away from the value.
                let (r, j) = (10, 100);
                let at = r * (cols + 2) + 2 + j;
                let scale = bf16_to_f32(u16::from_le_bytes([bytes[r * (cols + 2)], bytes[r * (cols + 2) + 1]]));
                let q = bytes[at] as i8;
                let away = if x[r * cols + j] >= q as f32 * scale { -1 } else { 1 };
                bytes[at] = (q + away) as u8;
            }
            Fault::EncodeNearestScale => bytes = encode_with(x, cols, f32_to_bf16, f32::round),
            Fault::EncodeTiesEven => bytes = encode_with(x, cols, f32_to_bf16_up, f32::round_ties_even),
            _ => {}
        }
        Ok(bytes)
    }
    fn decode_int8_rows(&self, bytes: &[u8], rows: usize, cols: usize) -> Result<Option<Vec<f32>>, CudaError> {
        let mut bytes = bytes.to_vec();
        if let Fault::DecodeAcceptsMin = self.0 {
            for row in bytes.chunks_mut(cols + 2) {
                row[2..].iter_mut().filter(|c| **c == 0x80).for_each(|c| *c = 0x81);
            }
        }
        let mut back = CpuProduction.decode_int8_rows(&bytes, rows, cols)?;
        if let (Fault::DecodeScale, Some(b)) = (self.0, &mut back) {
            b.iter_mut().for_each(|v| *v *= 1.0 + 1e-6);
        }
        Ok(back)
    }
}

#[test]
fn a_broken_kernel_fails_its_rows_and_only_those() {
    let cases: [(Fault, &[&str]); 9] = [
        (Fault::ReduceOutput, &[REDUCE_MEAN, REDUCE_CLIP]),
        (Fault::ReduceMomentum, &[REDUCE_MEAN, REDUCE_CLIP]),
        (Fault::ReduceNan, &[REDUCE_MEAN, REDUCE_CLIP]),
        (Fault::ClipAsMean, &[REDUCE_CLIP]),
        // A code one step off is also outside the round trip's bound.
        (Fault::EncodeCode, &[ENCODE, ROUND_TRIP]),
        // Still within the bound, but not the wire format.
        (Fault::EncodeNearestScale, &[ENCODE]),
        (Fault::EncodeTiesEven, &[ENCODE]),
        (Fault::DecodeScale, &[DECODE]),
        (Fault::DecodeAcceptsMin, &[DECODE]),
    ];
    for (fault, want) in cases {
        let checks = run_with(&Broken(fault), &Naive).unwrap();
        assert_eq!(checks.len(), 5);
        assert_eq!(failing(&checks), want, "{fault:?}: {checks:#?}");
    }
    // A broken reference fails the same rows: the comparison is symmetric.
    let checks = run_with(&CpuProduction, &Broken(Fault::DecodeScale)).unwrap();
    assert_eq!(failing(&checks), [DECODE]);
}

#[test]
fn max_rel_sees_nan_and_infinity_on_one_side() {
    assert_eq!(max_rel(&[1.0, 2.0], &[1.0, 2.0]), 0.0);
    assert_eq!(max_rel(&[1.0, f32::NAN], &[1.0, 2.0]), f64::INFINITY);
    assert_eq!(max_rel(&[1.0, 2.0], &[1.0, f32::NAN]), f64::INFINITY);
    assert_eq!(max_rel(&[1.0, f32::INFINITY], &[1.0, 2.0]), f64::INFINITY);
    assert_eq!(max_rel(&[1.0], &[1.0, 2.0]), f64::INFINITY);
    assert!((max_rel(&[1.0, 2.1], &[1.0, 2.0]) - 0.05).abs() < 1e-6);
}

fn assert_reduce_agrees(rule: ReduceRule, contribs: &[Option<&[f32]>], weights: &[f64], n: usize, what: &str) {
    let outer = OuterOpt { lr: 0.7, momentum: 0.9 };
    let m0: Vec<f32> = (0..n).map(|j| 0.001 * (j as f32 * 0.37).sin()).collect();
    let (mut m_prod, mut m_naive) = (m0.clone(), m0);
    let (u_prod, _) = reduce_slice(rule, outer, contribs, weights, &mut m_prod);
    let u_naive = naive::reduce(rule, outer, contribs, weights, &mut m_naive);
    let err = max_rel(&u_naive, &u_prod).max(max_rel(&m_naive, &m_prod));
    assert!(err <= 1e-5, "{rule:?}, {what}: {err}");
}

#[test]
fn naive_reduce_agrees_with_production_on_edge_cases() {
    let n = 37;
    let xs: Vec<Vec<f32>> =
        (0..5).map(|i| (0..n).map(|j| ((i * n + j) as f32 * 0.731).sin() * (1.0 + i as f32)).collect()).collect();
    let mut nan = xs[0].clone();
    nan[3] = f32::NAN;
    let short = &xs[1][..n - 1];
    let s = |i: usize| Some(xs[i].as_slice());
    let w = [0.1, 0.2, 0.3, 0.25, 0.15];
    let rules = [
        ReduceRule::Mean,
        ReduceRule::TrimmedMean { trim: 1 },
        ReduceRule::TrimmedMean { trim: 9 },
        ReduceRule::CenteredClip { tau_factor: 2.0, iters: 3 },
        ReduceRule::CenteredClip { tau_factor: 0.5, iters: 0 },
    ];
    type Case<'a> = (&'a str, Vec<Option<&'a [f32]>>, Vec<f64>);
    let edge_cases: [Case; 8] = [
        ("five, odd count", (0..5).map(s).collect(), w.to_vec()),
        ("one missing", vec![s(0), None, s(2), s(3), s(4)], w.to_vec()),
        ("a NaN and a short one", vec![Some(&nan), Some(short), s(2), s(3), s(4)], w.to_vec()),
        ("weights summing to zero", (0..4).map(s).collect(), vec![0.0; 4]),
        ("unnormalised weights", (0..4).map(s).collect(), vec![3.0, 1.0, 4.0, 1.0]),
        ("one", vec![s(2)], vec![1.0]),
        ("two identical", vec![s(1), s(1)], vec![0.5, 0.5]),
        ("none arrived", vec![None, None], vec![0.5, 0.5]),
    ];
    for rule in rules {
        for (what, contribs, weights) in &edge_cases {
            assert_reduce_agrees(rule, contribs, weights, n, what);
        }
    }
}

#[test]
fn naive_codec_agrees_with_production_on_edge_cases() {
    let ramp = |n: usize, f: f32| -> Vec<f32> { (0..n).map(|i| (i as f32 * 0.917).sin() * f).collect() };
    let mut mixed = ramp(4 * 9, 1.0);
    mixed[..9].fill(0.0); // an all-zero row
    mixed[9..18].copy_from_slice(&[127.0, -126.5, -0.5, 0.5, 1.5, 2.5, -2.5, 126.5, 0.0]); // ties, scale 1
    mixed[18] = f32::MAX; // a huge row
    mixed[27] = -1e-30; // a tiny row
    let shapes: [(&str, usize, usize, Vec<f32>); 6] = [
        ("1 x 1", 1, 1, vec![-0.3]),
        ("3 x 7", 3, 7, ramp(21, 3.0)),
        ("all zero", 2, 5, vec![0.0; 10]),
        ("zero rows", 0, 5, vec![]),
        ("mixed rows", 4, 9, mixed),
        ("denormal row", 1, 4, vec![1e-39, -2e-39, 0.0, 5e-40]),
    ];
    for (what, rows, cols, x) in shapes {
        let prod = iota_model::codec::encode(WireCodec::Int8Row, rows, cols, &x).unwrap();
        let naive = naive::encode_int8_rows(&x, rows, cols).unwrap();
        assert_eq!(naive, prod, "{what}");
        let back_prod = iota_model::codec::decode(WireCodec::Int8Row, rows, cols, &prod).unwrap();
        assert_eq!(naive::decode_int8_rows(&prod, rows, cols), Some(back_prod), "{what}");
    }
    // Invalid payloads: both refuse each one.
    let (rows, cols) = (8, 384);
    let x: Vec<f32> = ramp(rows * cols, 2.0);
    let good = iota_model::codec::encode(WireCodec::Int8Row, rows, cols, &x).unwrap();
    let mut bad = corrupted(&good, cols);
    bad.push(good[..good.len() - 1].to_vec());
    bad.push([good.as_slice(), &[0]].concat());
    for (i, b) in bad.iter().enumerate() {
        assert!(iota_model::codec::decode(WireCodec::Int8Row, rows, cols, b).is_err(), "payload {i}");
        assert_eq!(naive::decode_int8_rows(b, rows, cols), None, "payload {i}");
    }
    assert_eq!(naive::encode_int8_rows(&[1.0, f32::NAN], 1, 2), None);
}

/// The stage check's CPU half: the run it compares is deterministic, and
/// the residual style's stage has its branches' gradients (on a GPU the
/// same function runs on `CudaBackend`).
#[test]
fn the_body_stage_check_runs_on_the_cpu() {
    use iota_core::BottleneckStyle;
    let cpu = std::sync::Arc::new(iota_model::CpuBackend::new());
    let mut lens = Vec::new();
    for style in [BottleneckStyle::Linear, BottleneckStyle::Residual] {
        let (cfg, spec) = super::stage_checks::body_stage_config(style, 2);
        assert!(spec.decode_in && spec.encode_out);
        let n = 2 * 8 * cfg.bottleneck;
        let hidden: Vec<f32> = (0..n).map(|i| (i % 5) as f32 - 2.0).collect();
        let dout: Vec<f32> = (0..n).map(|i| 1e-2 * ((i % 3) as f32 - 1.0)).collect();
        let a = super::stage_checks::body_stage_run(cpu.clone(), &cfg, &spec, (2, 8), &hidden, &dout).unwrap();
        let b = super::stage_checks::body_stage_run(cpu.clone(), &cfg, &spec, (2, 8), &hidden, &dout).unwrap();
        assert_eq!(a, b);
        assert_eq!((a[0].len(), a[1].len()), (n, n));
        assert_eq!(max_rel(&a[2], &b[2]), 0.0);
        assert!(a[2].iter().any(|g| *g != 0.0));
        lens.push(a[2].len());
    }
    assert!(lens[1] > lens[0], "the residual stage has more parameters: {lens:?}");
}

/// The recompute check's runner on the CPU: bit-identical there, and its
/// sequence has every piece (two outputs, the input gradient of the body,
/// two weight gradients, the weights).
#[test]
fn the_recompute_check_is_bit_identical_on_the_cpu() {
    let cpu = std::sync::Arc::new(iota_model::CpuBackend::new());
    for (stage, pieces) in [(0usize, 5usize), (1, 7)] {
        let kept = super::stage_checks::pipelined_stage_run(cpu.clone(), stage, false, (2, 16)).unwrap();
        let recomputed = super::stage_checks::pipelined_stage_run(cpu.clone(), stage, true, (2, 16)).unwrap();
        assert_eq!(kept.len(), pieces, "stage {stage}");
        assert!(kept == recomputed, "stage {stage} differs recomputing");
        assert!(kept[pieces - 2].iter().any(|g| *g != 0.0));
    }
}
