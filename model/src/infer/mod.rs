//! Using a trained model: token-by-token generation with a KV cache
//! ([`llama`]) and sampling ([`sample`]).

pub mod llama;
pub mod sample;

#[cfg(test)]
mod tests;

pub use llama::{KvCache, Llama};
pub use sample::{SamplerConfig, sample};
