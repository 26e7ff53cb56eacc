//! iota-model: the compute stack of iota-rs.
//!
//! - [`backend`]: the `Backend` trait (explicit forward/backward per op);
//!   [`cpu`]: `CpuBackend`, the fp32 reference.
//! - [`stage`]: a pipeline stage (blocks, bottleneck, head/tail) built from
//!   [`block`], [`boundary`] and [`lm_head`].
//! - [`codec`]: wire quantisation of boundary tensors.

// Kernels take their operands and shapes explicitly (as BLAS does); bundling
// them into structs would only hide which buffer is which.
#![allow(clippy::too_many_arguments)]

pub mod alloc;
pub mod backend;
pub mod block;
pub mod boundary;
pub mod codec;
pub mod cpu;
pub mod lm_head;
pub mod rope;
pub mod stage;
pub mod tensor;

pub use backend::{AdamStep, AttnDims, Backend};
pub use cpu::CpuBackend;
pub use stage::{
    MbEnd, MbTrace, MbTraced, Segment, SegmentKind, SegmentOut, Stage, StageError, StageInput, TailOutput, segments_of,
};
pub use tensor::Tensor;
pub mod checkpoint;
pub mod data;
pub mod hf;
pub mod infer;
pub mod optim;
pub mod run_dir;
pub mod train;
