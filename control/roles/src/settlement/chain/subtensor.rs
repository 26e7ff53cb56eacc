//! The subtensor adapter: what a validator would submit to Bittensor's
//! chain for one weight vector, built offline.
//!
//! For each submission it maps the miner columns to their uids on the
//! subnet, clips to the subnet's `MaxWeightsLimit` and converts to `u16`
//! exactly as the Python SDK does ([`super::weights`]), and SCALE-encodes
//! `SubtensorModule.set_weights` ([`super::scale`]), naming the validator's
//! sr25519 hotkey as the account ([`super::hotkey`]). It sends nothing and
//! builds no signed extrinsic: that needs the live chain's nonce, genesis
//! and block hashes, runtime versions and transaction extensions, which
//! belong to a node client, not to settlement. What it produced is kept
//! ([`SubtensorAdapter::prepared`]) for such a client, or a person, to
//! submit.
//!
//! Not checked here, because the chain holds them: that the hotkey is
//! registered and has a validator permit, the weights rate limit,
//! `MinAllowedWeights`, the subnet's required version key, and whether the
//! subnet runs commit-reveal (where `set_weights` is refused and weights
//! go through `commit_weights`). The SDK's exemption of a lone self-weight
//! from the clip does not arise: settlement's validators are not among its
//! miner columns.

use std::collections::{BTreeMap, BTreeSet};

use iota_core::PeerId;

use super::hotkey::Hotkey;
use super::scale::{CallIndex, set_weights_call};
use super::weights::{U16_MAX, clip_to_max_weight, max_weight_share, weights_for_emit};
use super::{Chain, ChainError, Receipt, check_submission};

/// The subnet and runtime a validator submits to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SubtensorConfig {
    pub netuid: u16,
    /// The weights version key the validator reports (the subnet refuses
    /// one below its `WeightsVersionKey`).
    pub version_key: u64,
    /// The subnet's `MaxWeightsLimit` (65535: no clip).
    pub max_weight_limit: u16,
    /// Where `set_weights` sits in the runtime's metadata.
    pub call_index: CallIndex,
}

impl SubtensorConfig {
    /// A subnet of the current finney runtime, with no weight limit and
    /// version key 0.
    pub fn finney(netuid: u16) -> SubtensorConfig {
        SubtensorConfig { netuid, version_key: 0, max_weight_limit: U16_MAX, call_index: CallIndex::FINNEY_SET_WEIGHTS }
    }
}

/// One `set_weights` call, ready for a node client to sign and submit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PreparedCall {
    pub epoch: u64,
    pub validator: PeerId,
    /// The hotkey that must sign the extrinsic.
    pub hotkey_ss58: String,
    pub netuid: u16,
    pub dests: Vec<u16>,
    pub weights: Vec<u16>,
    pub version_key: u64,
    /// The SCALE-encoded call.
    pub call: Vec<u8>,
}

/// The subtensor chain, offline: see the module docs.
#[derive(Debug)]
pub struct SubtensorAdapter {
    config: SubtensorConfig,
    hotkeys: BTreeMap<PeerId, Hotkey>,
    uids: BTreeMap<PeerId, u16>,
    prepared: Vec<PreparedCall>,
}

impl SubtensorAdapter {
    /// An adapter that submits for the validators whose hotkeys it holds,
    /// with `uids` the miners' uids on the subnet (from its metagraph).
    pub fn new(
        config: SubtensorConfig,
        hotkeys: BTreeMap<PeerId, Hotkey>,
        uids: BTreeMap<PeerId, u16>,
    ) -> Result<SubtensorAdapter, ChainError> {
        let mut seen = BTreeSet::new();
        for &uid in uids.values() {
            if !seen.insert(uid) {
                return Err(ChainError::DuplicateUid { uid });
            }
        }
        Ok(SubtensorAdapter { config, hotkeys, uids, prepared: Vec::new() })
    }

    pub fn config(&self) -> &SubtensorConfig {
        &self.config
    }

    /// Every call built so far, in order.
    pub fn prepared(&self) -> &[PreparedCall] {
        &self.prepared
    }

    /// The uids and `u16` weights for one row: registered columns in
    /// column order, clipped to the subnet's limit when it has one, then
    /// max-upscaled and rounded; columns without a uid must weigh zero.
    pub fn chain_weights(&self, miners: &[PeerId], weights: &[f64]) -> Result<(Vec<u16>, Vec<u16>), ChainError> {
        check_submission(miners, weights)?;
        let mut uids = Vec::with_capacity(miners.len());
        let mut row = Vec::with_capacity(miners.len());
        for (m, &w) in miners.iter().zip(weights) {
            match self.uids.get(m) {
                Some(&uid) => {
                    uids.push(uid);
                    row.push(w);
                }
                None if w == 0.0 => {}
                None => return Err(ChainError::UnregisteredMiner(*m)),
            }
        }
        let mut seen = BTreeSet::new();
        if let Some(&uid) = uids.iter().find(|&&u| !seen.insert(u)) {
            return Err(ChainError::DuplicateUid { uid });
        }
        if !row.iter().any(|&w| w > 0.0) {
            return Err(ChainError::NothingToSet);
        }
        if self.config.max_weight_limit < U16_MAX {
            row = clip_to_max_weight(&row, max_weight_share(self.config.max_weight_limit))?;
        }
        let (dests, vals) = weights_for_emit(&uids, &row)?;
        if dests.is_empty() {
            return Err(ChainError::NothingToSet);
        }
        Ok((dests, vals))
    }
}

impl Chain for SubtensorAdapter {
    fn submit_weights(
        &mut self,
        epoch: u64,
        validator: PeerId,
        miners: &[PeerId],
        weights: &[f64],
    ) -> Result<Receipt, ChainError> {
        let hotkey = self.hotkeys.get(&validator).ok_or(ChainError::UnknownValidator(validator))?;
        let hotkey_ss58 = hotkey.ss58();
        let (dests, vals) = self.chain_weights(miners, weights)?;
        let c = &self.config;
        let call = set_weights_call(c.call_index, c.netuid, &dests, &vals, c.version_key);
        let receipt = Receipt {
            seq: self.prepared.len() as u64,
            epoch,
            validator,
            account: hotkey_ss58.clone(),
            payload: call.clone(),
        };
        self.prepared.push(PreparedCall {
            epoch,
            validator,
            hotkey_ss58,
            netuid: c.netuid,
            dests,
            weights: vals,
            version_key: c.version_key,
            call,
        });
        Ok(receipt)
    }
}
