//! iota-core: the vocabulary every other iota-rs crate shares.
//!
//! Identifiers and signed identities, the data-plane frame schema, model presets and their exact parameter layout, the stage
//! split, wire codec descriptors, a deterministic random generator, and what a
//! stage holds in memory, sends and computes, counted from the code
//! (`memory_plan`, `traffic_plan`, `compute_plan`). Nothing here performs I/O, so the control plane, the data
//! plane and the model can all depend on it without pulling in a runtime.

pub mod codec;
pub mod commitment;
pub mod compute_plan;
pub mod config;
pub mod error;
pub mod frame_equivocation;
pub mod identity;
pub mod ids;
pub mod layout;
pub mod memory_fit;
pub mod memory_plan;
pub mod merge;
pub mod rng;
pub mod traffic_plan;
pub mod train_config;
pub mod wire;

pub use codec::WireCodec;
pub use config::{BottleneckStyle, ModelConfig, RopeScaling};
pub use error::{ConfigError, CoreError};
pub use identity::{Identity, PeerId};
pub use ids::{MicroBatchId, SampleId};
pub use layout::{ParamEntry, ParamLayout, StageRole, StageSpec};
pub use rng::Rng;
