//! Yuma's input, parameters, output and errors: what callers build and
//! read (and what `iota-control yuma` reads and writes as JSON).

use serde::{Deserialize, Serialize};

/// Most validators or miners one run accepts (subtensor's uids are u16).
pub const MAX_UIDS: usize = 65_536;
/// Most cells (validators x miners) one weight matrix may have: 2^26, 512 MiB
/// of `f64`.
pub const MAX_CELLS: usize = 1 << 26;
/// Subtensor's default kappa, its "0.5": the u16 32_767 read as
/// 32_767 / 65_535, a hair under one half, so that an exact 50/50 stake split
/// resolves to the higher weight even when rounding nudges the lower half's
/// stake a little above 0.5.
pub const DEFAULT_KAPPA: f64 = 32_767.0 / 65_535.0;
/// Subtensor's default bonds moving average (900_000 / 1_000_000).
pub const DEFAULT_BONDS_MOVING_AVERAGE: f64 = 0.9;

/// How bonds evolve (subtensor's `Yuma3On` switch).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BondsMode {
    /// Bonds bought with stake-weighted weights, column-normalised (the
    /// original Yuma; subtensor's default).
    #[default]
    Classic,
    /// Bonds are EMAs of each validator's own weights; dividends scale with
    /// the validator's stake (Yuma 3).
    Yuma3,
}

/// The parameters of one epoch. Every field has subtensor's default.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct YumaParams {
    /// Majority ratio of the consensus median, in [0, 1].
    pub kappa: f64,
    /// Weight of the previous bonds in the bonds EMA, in [0, 1]
    /// (alpha = 1 - bonds_moving_average).
    pub bonds_moving_average: f64,
    /// 0: bonds are bought with the raw weights; 1: with the weights clipped
    /// at consensus; in between: interpolated. In [0, 1].
    pub bonds_penalty: f64,
    pub bonds_mode: BondsMode,
    /// Total emission of the epoch (any unit; finite, >= 0).
    pub emission: f64,
    /// Share of the emission that goes to miners (incentive); the rest goes
    /// to validators (dividends). In [0, 1].
    pub miner_share: f64,
}

impl Default for YumaParams {
    fn default() -> Self {
        YumaParams {
            kappa: DEFAULT_KAPPA,
            bonds_moving_average: DEFAULT_BONDS_MOVING_AVERAGE,
            bonds_penalty: 1.0,
            bonds_mode: BondsMode::Classic,
            emission: 1.0,
            miner_share: 0.5,
        }
    }
}

/// One epoch's input: V validators (rows), M miners (columns).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct YumaInput {
    /// Stake of each validator (V entries, finite, >= 0, not all zero).
    pub stakes: Vec<f64>,
    /// V rows of M weights (finite, >= 0). Rows need not be normalised; an
    /// all-zero row is a validator that set no weights.
    pub weights: Vec<Vec<f64>>,
    /// The previous epoch's bonds (V x M, as this function returned them);
    /// absent: no bonds yet.
    #[serde(default)]
    pub bonds: Option<Vec<Vec<f64>>>,
    /// Which validators hold a permit (V entries); absent: all.
    #[serde(default)]
    pub validator_permits: Option<Vec<bool>>,
    /// Which validators are active (set weights recently; V entries);
    /// absent: all.
    #[serde(default)]
    pub active: Option<Vec<bool>>,
    /// Miners registered since the last epoch (M entries): their old bonds
    /// are dropped before the EMA; absent: none.
    #[serde(default)]
    pub recently_registered: Option<Vec<bool>>,
    #[serde(default)]
    pub params: YumaParams,
}

/// Emission of the epoch, in the unit of [`YumaParams::emission`].
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Emission {
    /// Per miner (M entries): incentive.
    pub miners: Vec<f64>,
    /// Per validator (V entries): dividends.
    pub validators: Vec<f64>,
}

/// One epoch's result.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct YumaOutput {
    /// The stake that voted (V entries, sums to 1 unless no stake is active).
    pub active_stake: Vec<f64>,
    /// Stake-weighted median weight per miner (M).
    pub consensus: Vec<f64>,
    /// Stake-weighted sum of the clipped weights per miner (M), before
    /// normalisation (subtensor stores the normalised value, i.e. incentive).
    pub ranks: Vec<f64>,
    /// Ranks after clipping over ranks before (M), in [0, 1].
    pub trust: Vec<f64>,
    /// Normalised ranks (M): the miners' share of the miner emission.
    pub incentive: Vec<f64>,
    /// Sum of each validator's clipped weights (V), in [0, 1].
    pub validator_trust: Vec<f64>,
    /// Normalised dividends (V): the validators' share of the validator emission.
    pub dividends: Vec<f64>,
    /// Bonds to feed to the next epoch (V x M).
    pub bonds: Vec<Vec<f64>>,
    pub emission: Emission,
}

/// Why an input was refused.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum YumaError {
    #[error("{field} is empty: at least one {what} is needed")]
    Empty { field: &'static str, what: &'static str },
    #[error("{field} has {len} entries; at most {max} are accepted")]
    TooLarge { field: &'static str, len: usize, max: usize },
    #[error("the weight matrix is {rows} x {cols}: more than {max} cells")]
    MatrixTooLarge { rows: usize, cols: usize, max: usize },
    #[error("{field} has {found} entries, expected {expected} ({why})")]
    Shape { field: String, expected: usize, found: usize, why: &'static str },
    #[error("{field} is {value}: {why}")]
    BadValue { field: String, value: f64, why: &'static str },
    #[error("parameter {name} is {value}, outside {range}")]
    BadParam { name: &'static str, value: f64, range: &'static str },
    #[error("stakes sum to zero: no validator has stake to weigh the votes with")]
    NoStake,
    #[error("input is not valid Yuma JSON: {0}")]
    Json(String),
}
