//! Typed errors of the core crate.

use thiserror::Error;

/// A configuration that cannot describe a working model or stage split.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum ConfigError {
    #[error("unknown model preset '{0}' (known: {1})")]
    UnknownPreset(String, String),
    #[error("invalid model config: {0}")]
    Invalid(String),
    #[error("cannot split {layers} layers into {stages} stages (need 1 <= stages <= layers)")]
    BadStageCount { layers: usize, stages: usize },
}

/// Errors from decoding data that may come from outside the process.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum CoreError {
    #[error("payload length {got} does not match the {expected} bytes that {rows}x{cols} {codec} needs")]
    PayloadLength { codec: &'static str, rows: usize, cols: usize, expected: usize, got: usize },
    #[error("non-finite value in {0}")]
    NonFinite(&'static str),
    #[error("unknown codec id {0}")]
    UnknownCodec(u8),
    #[error("the {0} codec carries merge contributions, not tensors")]
    NotATensorCodec(&'static str),
}
