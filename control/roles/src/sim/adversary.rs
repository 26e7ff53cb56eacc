//! The adversary modes of the real miner (`iota_dataplane::miner::
//! adversary::Adversary`, same names), as the simulator acts them out:
//! by the messages the orchestrator and validators get from the cheater,
//! its neighbours and its co-owners (`cheating.rs`). What the recompute of
//! a drawn attempt would find is the truth of the mode, not a
//! computation; what the simulation checks is that the roles name each
//! cheater as the real swarm does.

/// Every mode of the real miner.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SimAdversary {
    Silent,
    Closed,
    Slow,
    Flaky,
    Noise,
    Zeros,
    Replay,
    LossLie,
    Copy,
    GradNoise,
    Lazy,
    MergeEquivocate,
    Nan,
    MergeGarbage,
    Collude,
    MergeLie,
    HostileUnreachable,
    Withholder,
    LyingOwner,
    RefereeCollusion,
    FramingSender,
    FabricatedEvidence,
    SkipWeightGrad,
    SkipOptimizer,
    SkipBackward,
    ScaledPoison,
    CopyPartner,
    NegatePartner,
    /// Sparse contributions' backlog inflated (the miner's
    /// `InflatedBacklog`); the simulator's merges are dense, with no
    /// backlog, so it acts honestly here.
    InflatedBacklog,
}

impl SimAdversary {
    /// Every mode, as the miner's command line names them.
    pub const NAMES: [(&'static str, SimAdversary); 29] = [
        ("silent", SimAdversary::Silent),
        ("closed", SimAdversary::Closed),
        ("slow", SimAdversary::Slow),
        ("flaky", SimAdversary::Flaky),
        ("noise", SimAdversary::Noise),
        ("zeros", SimAdversary::Zeros),
        ("replay", SimAdversary::Replay),
        ("loss-lie", SimAdversary::LossLie),
        ("copy", SimAdversary::Copy),
        ("grad-noise", SimAdversary::GradNoise),
        ("lazy", SimAdversary::Lazy),
        ("merge-equivocate", SimAdversary::MergeEquivocate),
        ("nan", SimAdversary::Nan),
        ("merge-garbage", SimAdversary::MergeGarbage),
        ("collude", SimAdversary::Collude),
        ("merge-lie", SimAdversary::MergeLie),
        ("hostile-unreachable", SimAdversary::HostileUnreachable),
        ("withholder", SimAdversary::Withholder),
        ("lying-owner", SimAdversary::LyingOwner),
        ("referee-collusion", SimAdversary::RefereeCollusion),
        ("framing-sender", SimAdversary::FramingSender),
        ("fabricated-evidence", SimAdversary::FabricatedEvidence),
        ("skip-weight-grad", SimAdversary::SkipWeightGrad),
        ("skip-optimizer", SimAdversary::SkipOptimizer),
        ("skip-backward", SimAdversary::SkipBackward),
        ("scaled-poison", SimAdversary::ScaledPoison),
        ("copy-partner", SimAdversary::CopyPartner),
        ("negate-partner", SimAdversary::NegatePartner),
        ("inflated-backlog", SimAdversary::InflatedBacklog),
    ];

    pub fn name(self) -> &'static str {
        Self::NAMES.iter().find(|(_, a)| *a == self).map_or("?", |(n, _)| n)
    }

    pub fn parse(s: &str) -> Option<SimAdversary> {
        Self::NAMES.iter().find(|(n, _)| *n == s).map(|(_, a)| *a)
    }
}
