//! A bounds-checked front to the `gemm` crate, plus an optional log of every
//! call (the benchmark replays the log to measure the "GEMMs alone" floor).

use std::sync::Mutex;

use gemm::Parallelism;

/// A strided matrix view: element (i, j) is at `i * rs + j * cs`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mat {
    pub rows: usize,
    pub cols: usize,
    pub rs: usize,
    pub cs: usize,
}

impl Mat {
    /// A contiguous row-major matrix.
    pub fn rm(rows: usize, cols: usize) -> Mat {
        Mat { rows, cols, rs: cols, cs: 1 }
    }
    /// A row-major matrix whose rows are `stride` apart (a column block of a
    /// wider buffer).
    pub fn strided(rows: usize, cols: usize, stride: usize) -> Mat {
        Mat { rows, cols, rs: stride, cs: 1 }
    }
    /// The same memory read as its transpose.
    pub fn t(self) -> Mat {
        Mat { rows: self.cols, cols: self.rows, rs: self.cs, cs: self.rs }
    }
    /// One past the last element touched.
    pub fn extent(&self) -> usize {
        if self.rows == 0 || self.cols == 0 { 0 } else { (self.rows - 1) * self.rs + (self.cols - 1) * self.cs + 1 }
    }
}

/// One recorded GEMM: `batch` independent products of these shapes, run
/// either as one multi-threaded GEMM (`parallel`) or as `batch`
/// single-threaded GEMMs spread over the thread pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GemmCall {
    pub dst: Mat,
    pub lhs: Mat,
    pub rhs: Mat,
    pub acc: bool,
    pub batch: usize,
    pub parallel: bool,
}

impl GemmCall {
    pub fn flops(&self) -> f64 {
        2.0 * self.batch as f64 * self.dst.rows as f64 * self.dst.cols as f64 * self.lhs.cols as f64
    }
}

#[derive(Default)]
pub struct GemmLog {
    calls: Mutex<Option<Vec<GemmCall>>>,
}

impl GemmLog {
    pub fn start(&self) {
        *self.calls.lock().unwrap() = Some(Vec::new());
    }
    pub fn take(&self) -> Vec<GemmCall> {
        self.calls.lock().unwrap().take().unwrap_or_default()
    }
    pub fn record(&self, call: GemmCall) {
        if let Some(v) = self.calls.lock().unwrap().as_mut() {
            v.push(call);
        }
    }
}

fn check(d: Mat, l: Mat, r: Mat) {
    assert!(
        d.rows == l.rows && d.cols == r.cols && l.cols == r.rows,
        "gemm shape mismatch: dst {d:?} lhs {l:?} rhs {r:?}"
    );
}

/// dst (+)= lhs @ rhs, checked against the slices' lengths.
pub fn sgemm(dst: &mut [f32], d: Mat, lhs: &[f32], l: Mat, rhs: &[f32], r: Mat, acc: bool, parallel: bool) {
    check(d, l, r);
    assert!(d.extent() <= dst.len(), "gemm dst out of bounds");
    assert!(l.extent() <= lhs.len(), "gemm lhs out of bounds");
    assert!(r.extent() <= rhs.len(), "gemm rhs out of bounds");
    // SAFETY: every element the views address lies inside the slices (checked
    // above) and `dst` is exclusively borrowed.
    unsafe { sgemm_raw(dst.as_mut_ptr(), d, lhs.as_ptr(), l, rhs.as_ptr(), r, acc, parallel) }
}

/// # Safety
/// The three views must address valid memory, and no other thread may touch
/// the elements `dst` addresses during the call.
#[allow(clippy::too_many_arguments)]
pub unsafe fn sgemm_raw(
    dst: *mut f32,
    d: Mat,
    lhs: *const f32,
    l: Mat,
    rhs: *const f32,
    r: Mat,
    acc: bool,
    parallel: bool,
) {
    check(d, l, r);
    if d.rows == 0 || d.cols == 0 {
        return;
    }
    if l.cols == 0 {
        if !acc {
            for i in 0..d.rows {
                for j in 0..d.cols {
                    unsafe { *dst.add(i * d.rs + j * d.cs) = 0.0 };
                }
            }
        }
        return;
    }
    let par = if parallel { Parallelism::Rayon(0) } else { Parallelism::None };
    unsafe {
        gemm::gemm(
            d.rows,
            d.cols,
            l.cols,
            dst,
            d.cs as isize,
            d.rs as isize,
            acc,
            lhs,
            l.cs as isize,
            l.rs as isize,
            rhs,
            r.cs as isize,
            r.rs as isize,
            1.0f32,
            1.0f32,
            false,
            false,
            false,
            par,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A product large enough that gemm splits it across threads (a long
    /// inner dimension included) gives the same bits on 1 and on 8 threads:
    /// validators compare recomputed work bitwise.
    #[test]
    fn products_are_bitwise_independent_of_the_thread_count() {
        let (m, k, n) = (192, 2048, 320);
        let lhs: Vec<f32> = (0..m * k).map(|i| ((i * 7919 % 1000) as f32 - 500.0) * 1e-3).collect();
        let rhs: Vec<f32> = (0..k * n).map(|i| ((i * 104_729 % 997) as f32 - 498.0) * 1e-3).collect();
        let run = |threads: usize| {
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
            let mut out = vec![0.0f32; m * n];
            pool.install(|| sgemm(&mut out, Mat::rm(m, n), &lhs, Mat::rm(m, k), &rhs, Mat::rm(k, n), false, true));
            out
        };
        let one = run(1);
        assert!(one.iter().any(|v| *v != 0.0));
        for threads in [2, 8] {
            let many = run(threads);
            assert!(one.iter().zip(&many).all(|(a, b)| a.to_bits() == b.to_bits()), "{threads} threads");
        }
    }

    fn naive(d: Mat, l: Mat, lhs: &[f32], r: Mat, rhs: &[f32]) -> Vec<f32> {
        let mut out = vec![0.0; d.rows * d.cols];
        for i in 0..d.rows {
            for j in 0..d.cols {
                let mut s = 0.0f64;
                for k in 0..l.cols {
                    s += lhs[i * l.rs + k * l.cs] as f64 * rhs[k * r.rs + j * r.cs] as f64;
                }
                out[i * d.cols + j] = s as f32;
            }
        }
        out
    }

    #[test]
    fn strided_and_transposed_views_match_naive() {
        let mut rng = iota_core::Rng::new(1);
        let (m, n, k) = (37, 29, 45);
        let mut a = vec![0.0; m * 60];
        let mut b = vec![0.0; n * k];
        rng.fill_normal(&mut a, 1.0);
        rng.fill_normal(&mut b, 1.0);
        let l = Mat::strided(m, k, 60);
        let r = Mat::rm(n, k).t(); // b stored [n, k], read as [k, n]
        let d = Mat::rm(m, n);
        let want = naive(d, l, &a, r, &b);
        for par in [false, true] {
            let mut out = vec![1.0; m * n];
            sgemm(&mut out, d, &a, l, &b, r, false, par);
            for (x, y) in out.iter().zip(&want) {
                assert!((x - y).abs() < 1e-4, "{x} vs {y}");
            }
            sgemm(&mut out, d, &a, l, &b, r, true, par);
            for (x, y) in out.iter().zip(&want) {
                assert!((x - 2.0 * y).abs() < 2e-4);
            }
        }
    }

    #[test]
    #[should_panic(expected = "out of bounds")]
    fn out_of_bounds_view_is_refused() {
        let mut out = vec![0.0; 4];
        sgemm(&mut out, Mat::rm(2, 3), &[0.0; 6], Mat::rm(2, 3), &[0.0; 9], Mat::rm(3, 3), false, false);
    }
}
