//! A small dense f32 tensor: a shape and contiguous row-major storage. It is
//! the host-side currency of the model API (inputs, outputs, checkpoints);
//! backends keep their own buffers.

use thiserror::Error;

#[derive(Debug, Error, PartialEq, Eq)]
#[error("shape {shape:?} holds {expected} values, got {got}")]
pub struct ShapeError {
    pub shape: Vec<usize>,
    pub expected: usize,
    pub got: usize,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    shape: Vec<usize>,
    data: Vec<f32>,
}

impl Tensor {
    pub fn new(shape: &[usize], data: Vec<f32>) -> Result<Tensor, ShapeError> {
        let expected = shape.iter().product();
        if data.len() != expected {
            return Err(ShapeError { shape: shape.to_vec(), expected, got: data.len() });
        }
        Ok(Tensor { shape: shape.to_vec(), data })
    }

    pub fn zeros(shape: &[usize]) -> Tensor {
        Tensor { shape: shape.to_vec(), data: vec![0.0; shape.iter().product()] }
    }

    pub fn shape(&self) -> &[usize] {
        &self.shape
    }
    pub fn data(&self) -> &[f32] {
        &self.data
    }
    pub fn data_mut(&mut self) -> &mut [f32] {
        &mut self.data
    }
    pub fn into_data(self) -> Vec<f32> {
        self.data
    }
    pub fn numel(&self) -> usize {
        self.data.len()
    }
    /// Rows when read as a matrix `[prod(shape[..-1]), shape[-1]]`.
    pub fn rows(&self) -> usize {
        self.shape.split_last().map_or(1, |(_, r)| r.iter().product())
    }
    /// Width of the last axis.
    pub fn cols(&self) -> usize {
        self.shape.last().copied().unwrap_or(1)
    }
    /// Largest |a - b| / max(|b|, floor) over all elements.
    pub fn max_rel_diff(&self, other: &Tensor, floor: f32) -> f32 {
        assert_eq!(self.shape, other.shape, "max_rel_diff shape mismatch");
        self.data.iter().zip(&other.data).map(|(a, b)| (a - b).abs() / b.abs().max(floor)).fold(0.0, f32::max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shape_must_match_data() {
        assert!(Tensor::new(&[2, 3], vec![0.0; 6]).is_ok());
        let e = Tensor::new(&[2, 3], vec![0.0; 5]).unwrap_err();
        assert_eq!(e.expected, 6);
        let t = Tensor::zeros(&[4, 2, 5]);
        assert_eq!((t.rows(), t.cols(), t.numel()), (8, 5, 40));
    }
}
