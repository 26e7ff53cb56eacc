//! Settlement, sans I/O: from measured work to rewards.
//!
//! - [`chain`]: where each validator's weights go once settled: the
//!   [`chain::Chain`] trait, an in-memory local chain (the default) and an
//!   offline subtensor adapter (sr25519 hotkeys, the SDK's `u16` weights,
//!   the SCALE-encoded `set_weights` call);
//! - [`clasp`]: attribution of loss to the miners on each sample's pathway
//!   (Contribution Loss Assessment via Sampling of Pathways);
//! - [`ledger`]: the hash-chained, signed record of every epoch's
//!   settlement, and its verification;
//! - [`scores`]: a validator's weights over an epoch's miners (work
//!   times quality);
//! - [`yuma`]: Yuma consensus, the stake-weighted step that turns the
//!   validators' weight vectors into incentive, dividends, bonds and
//!   emission (as subtensor's epoch computes it).

pub mod chain;
pub mod clasp;
pub mod ledger;
pub mod scores;
pub mod yuma;
