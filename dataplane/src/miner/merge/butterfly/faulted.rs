//! What a replica's merge fault (a test tool) does to what it sends: its
//! pseudo-gradient changed, or a co-owner's contribution sent as its own.

use anyhow::Result;
use bytes::Bytes;

use super::{Butterfly, MergeFault, decode_contribution, encode_contribution};

impl Butterfly {
    /// Whether a test tool's fault sends a co-owner's contribution as its own.
    pub(super) fn partner_fault(&self) -> bool {
        matches!(self.fault, Some(MergeFault::CopyPartner | MergeFault::NegatePartner))
    }

    /// `CopyPartner`, `NegatePartner`: another participant's contribution
    /// to partition k as received, or its negation, once one came.
    pub(super) fn partner_copy(&self, k: usize) -> Result<Option<Bytes>> {
        let Some(theirs) = self.contribs.get(&k).and_then(|c| c.iter().find(|(p, _)| **p != self.me)) else {
            return Ok(None);
        };
        let bytes = theirs.1.clone();
        if self.fault != Some(MergeFault::NegatePartner) {
            return Ok(Some(bytes));
        }
        let len = self.plan.as_ref().and_then(|p| p.partitions.get(k)).map_or(0, |p| p.len);
        let mut x = decode_contribution(&self.spec, len, &bytes)?;
        x.iter_mut().for_each(|v| *v = -*v);
        Ok(Some(Bytes::from(encode_contribution(&self.spec, &x)?)))
    }

    /// A pseudo-gradient fault's change to the replica's delta for `epoch`
    /// (nothing without one).
    pub(super) fn fault_delta(&self, epoch: u64, delta: &mut [f32]) {
        if self.fault == Some(MergeFault::ScaledPoison) {
            delta.iter_mut().for_each(|d| *d *= 8.0);
        }
        if self.fault == Some(MergeFault::HugeDelta) {
            delta.iter_mut().for_each(|d| *d = *d * 1e6 + 1.0);
        }
        if self.fault == Some(MergeFault::Overshoot) {
            // Noise of 20 times the honest pseudo-gradient's RMS.
            let rms =
                (delta.iter().map(|d| f64::from(*d) * f64::from(*d)).sum::<f64>() / delta.len().max(1) as f64).sqrt();
            let mut rng = iota_core::Rng::new(epoch);
            delta.iter_mut().for_each(|d| *d = rng.normal() * 20.0 * rms as f32);
        }
    }
}
