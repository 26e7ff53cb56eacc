//! What CLASP hands back: why records were rejected, and each miner's
//! verdict for the epoch.

/// The attribution of one epoch's samples.
#[derive(Clone, Debug, PartialEq)]
pub struct ClaspReport<K> {
    /// Samples in the fit.
    pub samples: u64,
    pub rejected: Rejected,
    /// Samples whose order was past the horizon (clamped, still used).
    pub beyond_horizon: u64,
    /// Residual standard deviation of one sample's loss (nats); `None` when
    /// there was no fit.
    pub sigma: Option<f64>,
    /// Residual degrees of freedom (`n - edf`).
    pub dof: f64,
    /// The critical value the bounds use (after correction and dof).
    pub critical: f64,
    /// Miners estimated (the Bonferroni divisor).
    pub tested: usize,
    /// Every (stage, miner) seen, sorted by stage then key.
    pub miners: Vec<MinerReport<K>>,
}

impl<K: Ord + Copy> ClaspReport<K> {
    pub fn get(&self, stage: usize, key: K) -> Option<&MinerReport<K>> {
        self.miners.binary_search_by(|m| (m.stage, m.key).cmp(&(stage, key))).ok().map(|i| &self.miners[i])
    }

    /// The miners flagged harmful.
    pub fn harmful(&self) -> impl Iterator<Item = &MinerReport<K>> {
        self.miners.iter().filter(|m| m.harmful())
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct MinerReport<K> {
    pub key: K,
    pub stage: usize,
    /// Samples through this miner at this stage.
    pub samples: u64,
    pub verdict: Verdict,
}

impl<K> MinerReport<K> {
    pub fn estimate(&self) -> Option<&Estimate> {
        match &self.verdict {
            Verdict::Estimated(e) => Some(e),
            Verdict::Unidentifiable(_) => None,
        }
    }

    pub fn effect(&self) -> Option<f64> {
        self.estimate().map(|e| e.effect)
    }

    pub fn harmful(&self) -> bool {
        self.estimate().is_some_and(|e| e.harmful)
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    Estimated(Estimate),
    Unidentifiable(Unidentifiable),
}

/// A miner's marginal effect on loss relative to its stage's peers (nats per
/// sample; positive is worse).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Estimate {
    pub effect: f64,
    pub se: f64,
    /// `effect ± critical * se`.
    pub lo: f64,
    pub hi: f64,
    /// `lo > min_harm`.
    pub harmful: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unidentifiable {
    /// No other miner served this stage: nothing to compare with.
    SoleReplica,
    /// Fewer than `ClaspParams::min_samples` samples.
    TooFewSamples,
    /// Routing made the effect inseparable from the trend or another stage.
    Confounded,
    /// No fit: no samples, or fewer than 3 residual degrees of freedom.
    NoFit,
}

/// Why a record was not accumulated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reject {
    /// The pathway does not name one miner per stage.
    WrongLength,
    /// The loss is NaN or infinite.
    NonFinite,
    /// The loss exceeds `MAX_ABS_LOSS` in magnitude.
    OutOfRange,
    /// `ClaspConfig::max_samples` samples are already kept.
    OverCap,
    /// The pathway's new miners would exceed `ClaspConfig::max_miners`.
    TooManyMiners,
}

/// Rejected records, by reason.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Rejected {
    pub wrong_length: u64,
    pub non_finite: u64,
    pub out_of_range: u64,
    pub over_cap: u64,
    pub too_many_miners: u64,
}

impl Rejected {
    pub fn total(&self) -> u64 {
        self.wrong_length + self.non_finite + self.out_of_range + self.over_cap + self.too_many_miners
    }

    pub(super) fn count(&mut self, r: Reject) {
        let c = match r {
            Reject::WrongLength => &mut self.wrong_length,
            Reject::NonFinite => &mut self.non_finite,
            Reject::OutOfRange => &mut self.out_of_range,
            Reject::OverCap => &mut self.over_cap,
            Reject::TooManyMiners => &mut self.too_many_miners,
        };
        *c = c.saturating_add(1);
    }
}
