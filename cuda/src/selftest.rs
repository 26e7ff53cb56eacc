//! `iota-miner selftest`: every custom kernel against its CPU reference on
//! fresh random inputs. With `--device cpu` the CPU references are checked
//! against plain re-computations instead (what a machine without a GPU can
//! check); with `--device cuda` the GPU runs them.

use std::time::Instant;

use iota_core::WireCodec;
use iota_core::merge::{OuterOpt, ReduceRule, reduce_slice};
use iota_core::rng::Rng;

use crate::CudaError;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Device {
    Cpu,
    Cuda,
}

#[derive(Clone, Debug)]
pub struct Check {
    pub op: String,
    pub shape: String,
    pub max_rel_err: f64,
    pub tolerance: f64,
    pub millis: f64,
}

impl Check {
    pub fn passed(&self) -> bool {
        self.max_rel_err.is_finite() && self.max_rel_err <= self.tolerance
    }
}

fn max_rel(a: &[f32], b: &[f32]) -> f64 {
    if a.len() != b.len() {
        return f64::INFINITY;
    }
    let scale = b.iter().fold(0.0f64, |m, v| m.max(v.abs() as f64)).max(1e-30);
    a.iter().zip(b).map(|(x, y)| ((x - y) as f64).abs() / scale).fold(0.0, f64::max)
}

fn inputs(r: usize, n: usize, seed: u64) -> (Vec<Vec<f32>>, Vec<f64>) {
    let mut rng = Rng::new(seed);
    let base: Vec<f32> = (0..n).map(|_| rng.normal() * 0.01).collect();
    let xs = (0..r).map(|_| base.iter().map(|b| b + rng.normal() * 0.003).collect()).collect();
    let w: Vec<f64> = (0..r).map(|i| 1.0 + i as f64).collect();
    let t: f64 = w.iter().sum();
    (xs, w.iter().map(|x| x / t).collect())
}

/// Runs every check; the caller prints the table and fails on any miss.
pub fn run(device: Device) -> Result<Vec<Check>, CudaError> {
    let gpu = match device {
        Device::Cuda => Some(crate::gpu::Gpu::open(0)?),
        Device::Cpu => None,
    };
    let mut out = Vec::new();
    let outer = OuterOpt { lr: 0.7, momentum: 0.9 };
    for (rule, r, n) in
        [(ReduceRule::Mean, 4usize, 100_003usize), (ReduceRule::CenteredClip { tau_factor: 2.0, iters: 3 }, 8, 65_536)]
    {
        let (xs, w) = inputs(r, n, n as u64);
        let refs: Vec<Option<&[f32]>> = xs.iter().map(|x| Some(x.as_slice())).collect();
        let mut m_ref = vec![0.01f32; n];
        let (u_ref, _) = reduce_slice(rule, outer, &refs, &w, &mut m_ref);
        let mut m = vec![0.01f32; n];
        let t0 = Instant::now();
        let u = match &gpu {
            Some(g) => g.reduce_slice(rule, outer, &refs, &w, &mut m)?.0,
            None => {
                // The reference against a plain weighted mean (mean rule only) + Nesterov.
                if rule == ReduceRule::Mean {
                    (0..n)
                        .map(|j| {
                            let g: f64 = xs.iter().zip(&w).map(|(x, w)| w * x[j] as f64).sum();
                            m[j] = 0.9 * m[j] + g as f32;
                            0.7 * (g as f32 + 0.9 * m[j])
                        })
                        .collect()
                } else {
                    reduce_slice(rule, outer, &refs, &w, &mut m).0
                }
            }
        };
        let millis = t0.elapsed().as_secs_f64() * 1e3;
        out.push(Check {
            op: format!("butterfly reduce ({})", rule.name()),
            shape: format!("{r} x {n}"),
            max_rel_err: max_rel(&u, &u_ref).max(max_rel(&m, &m_ref)),
            tolerance: 1e-5,
            millis,
        });
    }
    let (rows, cols) = (513usize, 384usize);
    let mut rng = Rng::new(9);
    let x: Vec<f32> = (0..rows * cols).map(|_| rng.normal()).collect();
    let cpu_bytes =
        iota_model::codec::encode(WireCodec::Int8Row, rows, cols, &x).map_err(|e| CudaError::Driver(e.to_string()))?;
    let cpu_back = iota_model::codec::decode(WireCodec::Int8Row, rows, cols, &cpu_bytes)
        .map_err(|e| CudaError::Driver(e.to_string()))?;
    let t0 = Instant::now();
    let (bytes, back) = match &gpu {
        Some(g) => {
            let b = g.encode_int8_rows(&x, rows, cols)?;
            let back = g.decode_int8_rows(&b, rows, cols)?.unwrap_or_default();
            (b, back)
        }
        None => (cpu_bytes.clone(), cpu_back.clone()),
    };
    let millis = t0.elapsed().as_secs_f64() * 1e3;
    let differing =
        bytes.iter().zip(&cpu_bytes).filter(|(a, b)| a != b).count() + bytes.len().abs_diff(cpu_bytes.len());
    out.push(Check {
        op: "int8 row encode (bytes differing)".into(),
        shape: format!("{rows} x {cols}"),
        max_rel_err: differing as f64,
        tolerance: 0.0,
        millis,
    });
    // Decode: against the CPU decode, and the round trip within the codec's bound.
    let bound = iota_model::codec::error_bound(WireCodec::Int8Row, 1.0) as f64;
    let rt_err = back.iter().zip(&x).map(|(a, b)| ((a - b) as f64).abs()).fold(0.0, f64::max);
    out.push(Check {
        op: "int8 row decode".into(),
        shape: format!("{rows} x {cols}"),
        max_rel_err: max_rel(&back, &cpu_back),
        tolerance: 0.0,
        millis: 0.0,
    });
    let absmax = x.iter().fold(0.0f32, |m, v| m.max(v.abs())) as f64;
    out.push(Check {
        op: "int8 round trip / error bound".into(),
        shape: format!("{rows} x {cols}"),
        max_rel_err: rt_err / (bound * absmax),
        tolerance: 1.0,
        millis: 0.0,
    });
    Ok(out)
}
