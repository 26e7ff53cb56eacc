//! A validator's weights over an epoch's miners: work times quality.
//!
//! A miner's weight is the number of completed micro-batch attempts the
//! orchestrator lists for it in the epoch's work (each one completed end
//! to end: the tail's loss and the head's backward were both reported, so
//! no miner can inflate its own count), and zero when this validator found
//! its sampled work dishonest or CLASP found it significantly harmful. The
//! vector is normalised to sum to 1; Yuma consensus then weighs the
//! validators' vectors by stake.

use iota_core::PeerId;

use super::clasp::ClaspParams;

/// Harm CLASP tolerates before a miner's weight goes to zero: this share
/// of the epoch's mean loss, and at least [`CLASP_TOLERATED_NATS`].
/// Replicas of a stage train apart within an epoch, so an honest one may
/// be measurably, and honestly, worse than its peers: in a `tiny` swarm's
/// first epoch (loss falling from 5.5 to 3) an honest tail replica
/// measured 0.098 nats (3% of the loss) worse than its peer, bounded below
/// at 0.055.
pub const CLASP_TOLERATED_SHARE: f64 = 0.05;
pub const CLASP_TOLERATED_NATS: f64 = 0.05;

/// The CLASP parameters settlement judges an epoch with (validators and
/// the orchestrator's payout table alike), given its mean loss.
pub fn clasp_params(mean_loss: f64) -> ClaspParams {
    let tolerated = if mean_loss.is_finite() { CLASP_TOLERATED_SHARE * mean_loss.abs() } else { 0.0 };
    ClaspParams { min_harm: tolerated.max(CLASP_TOLERATED_NATS), ..ClaspParams::default() }
}

/// What a validator knows of one miner at the end of its round.
#[derive(Clone, Debug, PartialEq)]
pub struct Rated {
    pub peer: PeerId,
    /// Completed attempts listed for it in the epoch's work.
    pub completed: u64,
    /// This validator voted its sampled work guilty.
    pub guilty: bool,
    /// CLASP found its effect on the loss significantly harmful.
    pub harmful: bool,
}

impl Rated {
    /// The miner's unnormalised score.
    pub fn score(&self) -> f64 {
        if self.guilty || self.harmful { 0.0 } else { self.completed as f64 }
    }
}

/// The weight vector, in the order of `rated` (that of the epoch's work):
/// normalised to sum to 1, or empty (abstaining) when nobody scores.
pub fn weight_vector(rated: &[Rated]) -> Vec<f32> {
    let total: f64 = rated.iter().map(Rated::score).sum();
    if total <= 0.0 || !total.is_finite() {
        return Vec::new();
    }
    rated.iter().map(|r| (r.score() / total) as f32).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(i: u8, completed: u64, guilty: bool, harmful: bool) -> Rated {
        Rated { peer: PeerId([i; 32]), completed, guilty, harmful }
    }

    #[test]
    fn weights_follow_work_and_cheaters_get_nothing() {
        let w = weight_vector(&[
            r(1, 30, false, false),
            r(2, 10, false, false),
            r(3, 60, true, false),
            r(4, 60, false, true),
        ]);
        assert_eq!(w.len(), 4);
        assert!((w[0] - 0.75).abs() < 1e-6 && (w[1] - 0.25).abs() < 1e-6, "{w:?}");
        assert_eq!((w[2], w[3]), (0.0, 0.0), "guilty and harmful miners get nothing");
        assert!((w.iter().sum::<f32>() - 1.0).abs() < 1e-6);
    }

    #[test]
    fn nobody_to_pay_means_abstaining() {
        assert!(weight_vector(&[]).is_empty());
        assert!(weight_vector(&[r(1, 5, true, false), r(2, 0, false, false)]).is_empty());
    }
}
