//! Validation, free of I/O (issue 13): which work a validator re-checks
//! ([`sample`]) and how the validators' verdicts become consequences
//! ([`quorum`]), one validator's round ([`round`]), its check of one
//! evidence object ([`check`]), both ends of a gradient lane ([`lanes`]) and of what a merge's participants said
//! they merged ([`merge_reports`]), and the training loss a merged model is
//! held against ([`train_loss`]). The validator process and the orchestrator drive these
//! from their events; simulations drive them directly.

pub mod check;
pub mod lanes;
pub mod merge_audit;
pub mod merge_reports;
pub mod quorum;
pub mod round;
mod round_io;
pub mod sample;
pub mod shared_clasp;
pub mod train_loss;
