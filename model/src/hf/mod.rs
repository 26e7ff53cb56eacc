//! Hugging Face Llama folders: what `iota export` and the swarm's end of
//! run write, and what `iota generate` / `iota eval` read back (with
//! trainer checkpoints and swarm run directories).

pub mod config_json;
pub mod export;
pub mod load;
pub mod tokenizer_files;
pub mod weights;

#[cfg(test)]
mod tests;

pub use export::{ExportDtype, ExportOptions, Exported, export};
pub use load::{ModelSource, RUN_MODEL_DIR};
pub use weights::{ModelWeights, NamedWeights, Provenance};
