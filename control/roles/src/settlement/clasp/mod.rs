//! CLASP: Contribution Loss Assessment via Sampling of Pathways, sans I/O.
//!
//! Every sample (micro-batch) of an epoch travels one *pathway*: one miner per
//! pipeline stage. The tail reports the sample's loss. A miner that hurts the
//! model (noise in its activations, a stale or corrupted stage) raises the loss
//! of every sample through it, whatever the other stages do; CLASP attributes
//! each loss to its pathway and estimates each miner's marginal effect.
//!
//! # The estimator
//!
//! Sample `i` has issue order `t_i` (its index in the epoch) and pathway
//! `(m_i0, .., m_i,S-1)`. The model is
//!
//! ```text
//! y_i = g(t_i) + sum_s alpha[s, m_is] + e_i
//! ```
//!
//! - `g` is the shared training trend: continuous and piecewise linear in the
//!   order over `[0, horizon]` with `trend_knots` equally spaced knots (a hat
//!   basis, so `g` is free at every knot; orders past `horizon` use
//!   `g(horizon)`). It absorbs the loss falling as the epoch trains, so a
//!   miner that only works late (when every loss is lower) is not credited
//!   for the timing.
//! - `alpha[s, m]` is miner `m`'s additive effect at stage `s`.
//!
//! The design row of a sample holds two hat weights and `S` ones, so `X'X`,
//! `X'y` and `y'y` are accumulated per sample in `O(p^2)` memory (packed
//! lower triangle; `p = trend_knots + miners`) and never the samples
//! themselves. The fit is ridge least squares on every column,
//! `beta = (X'X + lambda I)^-1 X'y`, `lambda = ridge * tr(X'X) / p`, solved by
//! a dense Cholesky. The hats sum to one and so do each stage's indicators, so
//! the levels are not identified (an intercept can move between the trend and
//! any stage): the small ridge picks the minimum-norm solution and keeps
//! unequal counts and rank deficiency from blowing up, and only *contrasts*
//! inside a stage are reported, which do not depend on that choice.
//!
//! The **effect** of miner `j` at stage `s` is the reference-free,
//! sample-weighted contrast against its stage peers `P` (the stage's other
//! miners with samples this epoch):
//!
//! ```text
//! delta_j = alpha[s, j] - sum_{k in P} (n_k / n_P) alpha[s, k]
//! ```
//!
//! the expected change in a sample's loss (nats) when it is routed through
//! `j` instead of through the other replicas in their observed traffic
//! shares. Positive is worse. Its standard error is
//! `sigma * sqrt(z' X'X z)` with `z = (X'X + lambda I)^-1 c` (the ridge
//! sandwich; `c` the contrast vector), `sigma^2 = RSS / (n - edf)`,
//! `edf = tr((X'X + lambda I)^-1 X'X)` (the fit's effective parameters).
//!
//! **Flagging.** With `m` miners estimated, the critical value `q` is the
//! one-sided normal quantile at `P(Z > z) / m` (Bonferroni across miners when
//! [`ClaspParams::bonferroni`]; `z = 3` gives a family-wise false-positive
//! rate near 0.13% per epoch), converted to a Student-t quantile with
//! `n - edf` degrees of freedom. The interval is `delta ± q se`; a miner is
//! `harmful` when its lower bound exceeds [`ClaspParams::min_harm`].
//!
//! **Not identifiable** miners get no number: the only replica at its stage
//! (nothing to compare with), fewer than [`ClaspParams::min_samples`]
//! samples, or a contrast outside the row space of `X'X` (`lambda |z| / |c|`
//! above 1e-3: routing made the effect indistinguishable from the trend or
//! from another stage's miner, e.g. a miner whose samples always went through
//! the same downstream miner while its peers' never did).
//!
//! # Assumptions
//!
//! - *Additivity*: stage effects add on the loss scale; a pair of miners bad
//!   only together is an interaction the model does not have (it averages
//!   into both).
//! - *Shared smooth trend*: every pathway sees the same training progress at
//!   the same order, and `g` is close to piecewise linear between knots.
//! - *Constant effects*: a miner's effect is the same all epoch (one that
//!   turns bad mid-epoch is measured by its average).
//! - *Noise*: given pathway and order, sample noise is independent with a
//!   common variance (homoskedastic standard errors: a heteroskedasticity-
//!   robust sandwich needs the residuals, i.e. a second pass over stored
//!   samples, which the `O(p^2)` accumulation rules out).
//! - *Routing*: random routing makes the contrasts well conditioned and
//!   makes mild model misspecification average out; correlated routing is
//!   allowed (the regression separates stages) but then leans on additivity.
//!
//! Effects are relative to the stage's peers: if every replica of a stage is
//! equally bad, nothing is flagged. Losses are taken as reported (a lying
//! tail is the validators' spot-checks' business) and a sample recorded twice
//! counts twice.
//!
//! # Bounds
//!
//! At most [`ClaspConfig::max_samples`] samples (default
//! [`DEFAULT_MAX_SAMPLES`] = 2^20) and [`ClaspConfig::max_miners`] miner
//! columns (default [`DEFAULT_MAX_MINERS`] = 1024, i.e. a packed Gram matrix of
//! about 4.5 MB) are kept per epoch; further records are rejected and counted.
//! [`Clasp::estimate`] costs about `p^3` flops (milliseconds for a few hundred
//! miners) and allocates `O(p^2)`.

mod linalg;
mod report;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;

use linalg::{critical_value, dot, spd_inverse};
pub use report::{ClaspReport, Estimate, MinerReport, Reject, Rejected, Unidentifiable, Verdict};

/// Default cap on the samples one [`Clasp`] accumulates (2^20).
pub const DEFAULT_MAX_SAMPLES: u64 = 1 << 20;
/// Default cap on the distinct (stage, miner) columns.
pub const DEFAULT_MAX_MINERS: usize = 1024;
/// Default number of knots of the piecewise-linear trend.
pub const DEFAULT_TREND_KNOTS: usize = 16;
/// Largest number of trend knots accepted (more are clamped).
pub const MAX_TREND_KNOTS: usize = 64;
/// Losses of larger magnitude (nats) are rejected as out of range.
pub const MAX_ABS_LOSS: f32 = 1e4;
/// `lambda |z| / |c|` above this marks a contrast as not estimable.
const CONFOUNDED_TOL: f64 = 1e-3;
/// Fewer residual degrees of freedom than this: no fit.
const MIN_DOF: f64 = 3.0;

/// What is fixed for an epoch's accumulation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClaspConfig {
    /// Pipeline stages: every pathway names exactly this many miners.
    pub stages: usize,
    /// Orders span `[0, horizon]` (the epoch's micro-batch count); later
    /// orders are clamped to it and counted.
    pub horizon: u64,
    /// Knots of the piecewise-linear trend (1 = a constant; clamped to
    /// `1..=MAX_TREND_KNOTS`).
    pub trend_knots: usize,
    /// Samples kept at most; later records are rejected ([`Reject::OverCap`]).
    pub max_samples: u64,
    /// Distinct (stage, miner) columns at most ([`Reject::TooManyMiners`]).
    pub max_miners: usize,
}

impl ClaspConfig {
    pub fn new(stages: usize, horizon: u64) -> Self {
        ClaspConfig {
            stages,
            horizon,
            trend_knots: DEFAULT_TREND_KNOTS,
            max_samples: DEFAULT_MAX_SAMPLES,
            max_miners: DEFAULT_MAX_MINERS,
        }
    }
}

/// How an estimate is judged; may change between calls on the same data.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ClaspParams {
    /// One-sided normal critical value before the correction (default 3).
    pub z: f64,
    /// Divide the tail probability of `z` by the number of miners estimated.
    pub bonferroni: bool,
    /// A miner is harmful when its effect's lower bound exceeds this (nats).
    pub min_harm: f64,
    /// Miners with fewer samples are not estimated.
    pub min_samples: u64,
    /// Relative ridge: `lambda = ridge * tr(X'X) / p` (clamped to
    /// `1e-12..=1e-2`; keep it small, it biases contrasts by about
    /// `lambda / n_j`).
    pub ridge: f64,
}

impl Default for ClaspParams {
    fn default() -> Self {
        ClaspParams { z: 3.0, bonferroni: true, min_harm: 0.0, min_samples: 16, ridge: 1e-6 }
    }
}

impl ClaspParams {
    fn sanitized(&self) -> ClaspParams {
        let d = ClaspParams::default();
        ClaspParams {
            z: if self.z.is_finite() && self.z >= 0.0 { self.z } else { d.z },
            bonferroni: self.bonferroni,
            min_harm: if self.min_harm.is_finite() { self.min_harm } else { d.min_harm },
            min_samples: self.min_samples.max(1),
            ridge: if self.ridge.is_finite() && self.ridge > 0.0 { self.ridge.clamp(1e-12, 1e-2) } else { d.ridge },
        }
    }
}

/// One (stage, miner) column.
#[derive(Clone, Debug)]
struct Column<K> {
    stage: usize,
    key: K,
    samples: u64,
}

/// An epoch's CLASP accumulator: feed it every completed sample with
/// [`Clasp::record`], read the attribution with [`Clasp::estimate`].
#[derive(Clone, Debug)]
pub struct Clasp<K> {
    cfg: ClaspConfig,
    /// (stage, miner) -> index into `miners` (design column `knots + index`).
    index: BTreeMap<(usize, K), usize>,
    miners: Vec<Column<K>>,
    /// Packed lower triangle of X'X, row-major: (i, j <= i) at i(i+1)/2 + j.
    gram: Vec<f64>,
    xty: Vec<f64>,
    yty: f64,
    /// Losses are accumulated relative to the first one (less cancellation).
    y0: Option<f64>,
    samples: u64,
    beyond_horizon: u64,
    rejected: Rejected,
    /// The current design row's non-zeros (kept to avoid an allocation).
    scratch: Vec<(usize, f64)>,
}

impl<K: Ord + Copy> Clasp<K> {
    /// An accumulator for `stages` stages over orders `0..=horizon`, with the
    /// default trend and caps.
    pub fn new(stages: usize, horizon: u64) -> Self {
        Self::with_config(ClaspConfig::new(stages, horizon))
    }

    pub fn with_config(cfg: ClaspConfig) -> Self {
        let cfg =
            ClaspConfig { horizon: cfg.horizon.max(1), trend_knots: cfg.trend_knots.clamp(1, MAX_TREND_KNOTS), ..cfg };
        let k = cfg.trend_knots;
        Clasp {
            cfg,
            index: BTreeMap::new(),
            miners: Vec::new(),
            gram: vec![0.0; k * (k + 1) / 2],
            xty: vec![0.0; k],
            yty: 0.0,
            y0: None,
            samples: 0,
            beyond_horizon: 0,
            rejected: Rejected::default(),
            scratch: Vec::new(),
        }
    }

    pub fn config(&self) -> &ClaspConfig {
        &self.cfg
    }

    /// Samples accumulated so far.
    pub fn samples(&self) -> u64 {
        self.samples
    }

    pub fn rejected(&self) -> Rejected {
        self.rejected
    }

    /// Accumulates one completed sample: its issue `order` in the epoch, its
    /// `pathway` (the miner at each stage, head first) and the tail's `loss`.
    /// Invalid or over-cap records change nothing but their counter.
    pub fn record(&mut self, order: u64, pathway: &[K], loss: f32) -> Result<(), Reject> {
        let res = self.try_record(order, pathway, loss);
        if let Err(r) = res {
            self.rejected.count(r);
        }
        res
    }

    fn try_record(&mut self, order: u64, pathway: &[K], loss: f32) -> Result<(), Reject> {
        if pathway.len() != self.cfg.stages {
            return Err(Reject::WrongLength);
        }
        if !loss.is_finite() {
            return Err(Reject::NonFinite);
        }
        if loss.abs() > MAX_ABS_LOSS {
            return Err(Reject::OutOfRange);
        }
        if self.samples >= self.cfg.max_samples {
            return Err(Reject::OverCap);
        }
        let new = pathway.iter().enumerate().filter(|&(s, k)| !self.index.contains_key(&(s, *k))).count();
        if self.miners.len() + new > self.cfg.max_miners {
            return Err(Reject::TooManyMiners);
        }

        let knots = self.cfg.trend_knots;
        // The design row's non-zeros: two hat weights, then one per stage.
        let mut nz = std::mem::take(&mut self.scratch);
        nz.clear();
        if order > self.cfg.horizon {
            self.beyond_horizon += 1;
        }
        if knots == 1 {
            nz.push((0, 1.0));
        } else {
            let t = order.min(self.cfg.horizon) as f64 / self.cfg.horizon as f64 * (knots - 1) as f64;
            let seg = (t.floor() as usize).min(knots - 2);
            let w = t - seg as f64;
            if w < 1.0 {
                nz.push((seg, 1.0 - w));
            }
            if w > 0.0 {
                nz.push((seg + 1, w));
            }
        }
        for (s, &key) in pathway.iter().enumerate() {
            let j = match self.index.get(&(s, key)) {
                Some(&j) => j,
                None => {
                    let j = self.miners.len();
                    self.index.insert((s, key), j);
                    self.miners.push(Column { stage: s, key, samples: 0 });
                    let col = knots + j;
                    self.gram.resize(self.gram.len() + col + 1, 0.0);
                    self.xty.push(0.0);
                    j
                }
            };
            self.miners[j].samples += 1;
            nz.push((knots + j, 1.0));
        }

        let y0 = *self.y0.get_or_insert(loss as f64);
        let y = loss as f64 - y0;
        for &(a, va) in &nz {
            self.xty[a] += va * y;
            let row = a * (a + 1) / 2;
            for &(b, vb) in &nz {
                if b <= a {
                    self.gram[row + b] += va * vb;
                }
            }
        }
        self.yty += y * y;
        self.samples += 1;
        self.scratch = nz;
        Ok(())
    }

    /// The attribution of the samples so far. Pure: the same accumulator and
    /// parameters give a bitwise identical report.
    pub fn estimate(&self, params: &ClaspParams) -> ClaspReport<K> {
        let params = params.sanitized();
        let mut report = ClaspReport {
            samples: self.samples,
            rejected: self.rejected,
            beyond_horizon: self.beyond_horizon,
            sigma: None,
            dof: 0.0,
            critical: f64::NAN,
            tested: 0,
            miners: Vec::with_capacity(self.miners.len()),
        };
        let knots = self.cfg.trend_knots;
        let p = knots + self.miners.len();
        let verdicts = match self.fit(&params) {
            Some(fit) => {
                report.sigma = Some(fit.sigma);
                report.dof = fit.dof;
                self.judge(&fit, &params)
            }
            None => vec![Verdict::Unidentifiable(Unidentifiable::NoFit); self.miners.len()],
        };
        debug_assert!(verdicts.len() + knots == p);
        let tested = verdicts.iter().filter(|v| matches!(v, Verdict::Estimated(_))).count();
        let critical = critical_value(params.z, if params.bonferroni { tested } else { 1 }, report.dof);
        report.tested = tested;
        report.critical = critical;
        for (col, mut verdict) in self.miners.iter().zip(verdicts) {
            if let Verdict::Estimated(e) = &mut verdict {
                e.lo = e.effect - critical * e.se;
                e.hi = e.effect + critical * e.se;
                e.harmful = e.lo > params.min_harm;
            }
            report.miners.push(MinerReport { key: col.key, stage: col.stage, samples: col.samples, verdict });
        }
        report.miners.sort_by_key(|m| (m.stage, m.key));
        report
    }

    /// The ridge fit: coefficients, the inverse, sigma and the residual dof.
    fn fit(&self, params: &ClaspParams) -> Option<Fit> {
        let p = self.cfg.trend_knots + self.miners.len();
        if self.samples == 0 {
            return None;
        }
        let mut gram = vec![0.0; p * p];
        for i in 0..p {
            for j in 0..=i {
                let v = self.gram[i * (i + 1) / 2 + j];
                gram[i * p + j] = v;
                gram[j * p + i] = v;
            }
        }
        let trace: f64 = (0..p).map(|i| gram[i * p + i]).sum();
        let mut lambda = params.ridge * trace / p as f64;
        let mut a = gram.clone();
        // A positive ridge makes A positive definite in exact arithmetic; if
        // rounding says otherwise, grow it a few times before giving up.
        let (inv, inv_trace) = (0..4).find_map(|_| {
            for i in 0..p {
                a[i * p + i] = gram[i * p + i] + lambda;
            }
            let r = spd_inverse(&a, p);
            if r.is_none() {
                lambda *= 100.0;
            }
            r
        })?;
        let beta: Vec<f64> = (0..p).map(|i| dot(&inv[i * p..(i + 1) * p], &self.xty)).collect();
        let g_beta: Vec<f64> = (0..p).map(|i| dot(&gram[i * p..(i + 1) * p], &beta)).collect();
        let rss = (self.yty - 2.0 * dot(&beta, &self.xty) + dot(&beta, &g_beta)).max(0.0);
        // edf = tr(A^-1 G) = tr(I - lambda A^-1).
        let edf = (p as f64 - lambda * inv_trace).max(0.0);
        let dof = self.samples as f64 - edf;
        if dof.is_nan() || dof < MIN_DOF {
            return None;
        }
        let sigma = (rss / dof).sqrt();
        sigma.is_finite().then_some(Fit { p, lambda, inv, beta, sigma, dof })
    }

    /// Each miner's effect and standard error (bounds filled in later), in
    /// `O(p)` per miner: with `z = A^-1 c`, `z' X'X z = c'z - lambda z'z`,
    /// and the peers' part of `A^-1 c` comes from a per-stage sum of rows.
    fn judge(&self, fit: &Fit, params: &ClaspParams) -> Vec<Verdict> {
        let (knots, p) = (self.cfg.trend_knots, fit.p);
        let row = |j: usize| &fit.inv[(knots + j) * p..(knots + j + 1) * p];
        // Per stage: members, their samples, and sum_k n_k A^-1 e_k.
        let mut members: Vec<Vec<usize>> = vec![Vec::new(); self.cfg.stages];
        for (j, col) in self.miners.iter().enumerate() {
            members[col.stage].push(j);
        }
        let totals: Vec<f64> = members.iter().map(|m| m.iter().map(|&k| self.miners[k].samples as f64).sum()).collect();
        let sums: Vec<Vec<f64>> = members
            .iter()
            .map(|m| {
                let mut w = vec![0.0; if m.len() > 1 { p } else { 0 }];
                for &k in m.iter().filter(|_| m.len() > 1) {
                    let n = self.miners[k].samples as f64;
                    for (wv, &a) in w.iter_mut().zip(row(k)) {
                        *wv += n * a;
                    }
                }
                w
            })
            .collect();
        let mut z = vec![0.0; p];
        self.miners
            .iter()
            .enumerate()
            .map(|(j, col)| {
                let s = col.stage;
                if members[s].len() < 2 {
                    return Verdict::Unidentifiable(Unidentifiable::SoleReplica);
                }
                if col.samples < params.min_samples {
                    return Verdict::Unidentifiable(Unidentifiable::TooFewSamples);
                }
                // c = e_j - sum_{k in P} (n_k / n_P) e_k, P = the stage's others.
                let n_j = col.samples as f64;
                let n_p = totals[s] - n_j;
                let peers =
                    || members[s].iter().filter(move |&&k| k != j).map(|&k| (k, self.miners[k].samples as f64 / n_p));
                let c_norm = (1.0 + peers().map(|(_, w)| w * w).sum::<f64>()).sqrt();
                for ((zv, &a), &w) in z.iter_mut().zip(row(j)).zip(&sums[s]) {
                    *zv = a * (1.0 + n_j / n_p) - w / n_p;
                }
                let zz = dot(&z, &z);
                if fit.lambda * zz.sqrt() > CONFOUNDED_TOL * c_norm {
                    return Verdict::Unidentifiable(Unidentifiable::Confounded);
                }
                let cz = z[knots + j] - peers().map(|(k, w)| w * z[knots + k]).sum::<f64>();
                let effect = fit.beta[knots + j] - peers().map(|(k, w)| w * fit.beta[knots + k]).sum::<f64>();
                let se = fit.sigma * (cz - fit.lambda * zz).max(0.0).sqrt();
                Verdict::Estimated(Estimate { effect, se, lo: f64::NAN, hi: f64::NAN, harmful: false })
            })
            .collect()
    }
}

struct Fit {
    p: usize,
    lambda: f64,
    /// (X'X + lambda I)^-1, dense.
    inv: Vec<f64>,
    beta: Vec<f64>,
    sigma: f64,
    dof: f64,
}
