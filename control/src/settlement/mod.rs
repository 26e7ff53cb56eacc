//! Settlement, sans I/O: from measured work to rewards.
//!
//! - [`clasp`]: attribution of loss to the miners on each sample's pathway
//!   (Contribution Loss Assessment via Sampling of Pathways);
//! - [`ledger`]: the hash-chained, signed record of every epoch's
//!   settlement, and its verification;
//! - [`scores`]: a validator's weights over an epoch's miners (work
//!   times quality);
//! - [`yuma`]: Yuma consensus, the stake-weighted step that turns the
//!   validators' weight vectors into incentive, dividends, bonds and
//!   emission (as subtensor's epoch computes it).

pub mod clasp;
pub mod ledger;
pub mod scores;
pub mod yuma;
