//! Chains: where a validator's weight vector goes once settlement has it.
//!
//! [`Chain`] is the one step settlement needs from a chain: take one
//! validator's weights over an epoch's miner columns and say what was
//! recorded ([`Receipt`]). Two implementations:
//!
//! - [`LocalLedgerChain`], the default: keeps every submission in memory,
//!   in order, and hands back the record's canonical JSON. (The
//!   orchestrator's own hash-chained ledger, `ledger.rs`, is separate: it
//!   records whole settlements, Yuma included.)
//! - [`subtensor::SubtensorAdapter`]: produces exactly what a Bittensor
//!   validator would submit to subtensor (the miners' uids and `u16`
//!   weights as the Python SDK computes them, the SCALE-encoded
//!   `SubtensorModule.set_weights` call, the sr25519 hotkey that would sign
//!   it) without touching a network.
//!
//! Sans I/O, like the rest of settlement.

pub mod hotkey;
pub mod scale;
pub mod subtensor;
pub mod weights;

#[cfg(test)]
mod tests;

use iota_core::PeerId;
use serde::{Deserialize, Serialize};

use self::weights::WeightError;
use super::ledger::Settlement;

/// What a chain recorded for one submission.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Receipt {
    /// Its place among this chain's submissions (0 first).
    pub seq: u64,
    pub epoch: u64,
    pub validator: PeerId,
    /// The account the chain credits the weights to: the validator's peer
    /// id (hex) on the local ledger, its hotkey's SS58 address on subtensor.
    pub account: String,
    /// Exactly what the chain was handed, in the chain's own encoding:
    /// the record as JSON locally, the SCALE-encoded call on subtensor.
    pub payload: Vec<u8>,
}

/// Why a chain refused a submission.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum ChainError {
    #[error("{miners} miner columns but {weights} weights")]
    Shape { miners: usize, weights: usize },
    #[error(transparent)]
    Weights(#[from] WeightError),
    #[error("no hotkey is held for validator {0}")]
    UnknownValidator(PeerId),
    #[error("miner {0} has weight but no uid on the subnet")]
    UnregisteredMiner(PeerId),
    #[error("uid {uid} is given to two miners")]
    DuplicateUid { uid: u16 },
    #[error("every weight is zero (or rounds to zero): nothing to set")]
    NothingToSet,
}

/// Where settled weights go.
pub trait Chain {
    /// Records `validator`'s weights for `epoch`: `weights[j]` is its
    /// weight for miner column `miners[j]` (any non-negative scale; the
    /// chain normalises).
    fn submit_weights(
        &mut self,
        epoch: u64,
        validator: PeerId,
        miners: &[PeerId],
        weights: &[f64],
    ) -> Result<Receipt, ChainError>;
}

/// Checks what every chain needs: one finite, non-negative weight per
/// miner column.
pub fn check_submission(miners: &[PeerId], weights: &[f64]) -> Result<(), ChainError> {
    if miners.len() != weights.len() {
        return Err(ChainError::Shape { miners: miners.len(), weights: weights.len() });
    }
    for (index, &value) in weights.iter().enumerate() {
        if !value.is_finite() {
            return Err(WeightError::NotFinite { index, value }.into());
        }
        if value < 0.0 {
            return Err(WeightError::Negative { index, value }.into());
        }
    }
    Ok(())
}

/// One submission to the local ledger chain.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LocalRecord {
    pub seq: u64,
    pub epoch: u64,
    pub validator: PeerId,
    pub miners: Vec<PeerId>,
    pub weights: Vec<f64>,
}

/// The default chain: an in-memory, append-only list of submissions.
#[derive(Clone, Debug, Default)]
pub struct LocalLedgerChain {
    records: Vec<LocalRecord>,
}

impl LocalLedgerChain {
    pub fn new() -> LocalLedgerChain {
        LocalLedgerChain::default()
    }

    /// Every submission so far, in order.
    pub fn records(&self) -> &[LocalRecord] {
        &self.records
    }
}

impl Chain for LocalLedgerChain {
    fn submit_weights(
        &mut self,
        epoch: u64,
        validator: PeerId,
        miners: &[PeerId],
        weights: &[f64],
    ) -> Result<Receipt, ChainError> {
        check_submission(miners, weights)?;
        let record = LocalRecord {
            seq: self.records.len() as u64,
            epoch,
            validator,
            miners: miners.to_vec(),
            weights: weights.to_vec(),
        };
        let payload = serde_json::to_vec(&record).expect("a record serialises");
        let receipt = Receipt { seq: record.seq, epoch, validator, account: validator.to_hex(), payload };
        self.records.push(record);
        Ok(receipt)
    }
}

/// Hands every validator row of a settlement that carries weight (a row
/// of zeros is a validator that sent none) to `chain`, in row order; one
/// result per submitted row, with its validator.
pub fn submit_settlement(chain: &mut dyn Chain, s: &Settlement) -> Vec<(PeerId, Result<Receipt, ChainError>)> {
    s.validators
        .iter()
        .zip(&s.input.weights)
        .filter(|(_, row)| row.iter().any(|&w| w != 0.0))
        .map(|(&v, row)| (v, chain.submit_weights(s.epoch, v, &s.miners, row)))
        .collect()
}
