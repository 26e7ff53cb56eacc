//! The dense matrix and the normalisation the epoch's steps share.

/// A dense row-major matrix.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Matrix {
    pub(super) rows: usize,
    pub(super) cols: usize,
    pub(super) data: Vec<f64>,
}

impl Matrix {
    pub(super) fn row(&self, i: usize) -> &[f64] {
        &self.data[i * self.cols..(i + 1) * self.cols]
    }

    /// `sum_i x_i m_ij` for every column j.
    pub(super) fn weighted_col_sums(&self, x: &[f64]) -> Vec<f64> {
        let mut out = vec![0.0; self.cols];
        for (i, &xi) in x.iter().enumerate() {
            if xi != 0.0 {
                for (o, &m) in out.iter_mut().zip(self.row(i)) {
                    *o += xi * m;
                }
            }
        }
        out
    }
}

/// Scales `x` (non-negative) to sum 1; leaves an all-zero vector alone.
pub(super) fn normalize(x: &mut [f64]) {
    let mut sum: f64 = x.iter().sum();
    if !sum.is_finite() {
        let max = x.iter().fold(0.0f64, |m, &v| m.max(v));
        x.iter_mut().for_each(|v| *v /= max);
        sum = x.iter().sum();
    }
    if sum > 0.0 {
        x.iter_mut().for_each(|v| *v /= sum);
    }
}
