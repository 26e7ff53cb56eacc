//! Merging the replicas of a stage: the butterfly plan and the per-slice
//! reduce. No I/O: the orchestrator computes plans, miners and the bench
//! execute them, tests check them.
//!
//! The stage's parameters are one flat vector of P values. The plan cuts it
//! into K partitions (`slices_per_replica` per participant), each owned by
//! two distinct participants, so every partition is reduced twice and the
//! two results can be compared by hash. Every participant owns the same
//! number of partitions, whose sizes differ by at most one block, so owned
//! bytes are balanced. Partition boundaries fall on `BLOCK` elements so the
//! blockwise int8 codec never straddles two partitions.
//!
//! The reduce of one partition: the work-weighted mean of the participants'
//! pseudo-gradients (theta_prev - theta_local), optionally made robust
//! (`ReduceRule`), followed by the outer optimizer (Nesterov momentum, as in
//! DiLoCo). Its result is the update u: theta_next = theta_prev - u.

use serde::{Deserialize, Serialize};

use crate::identity::PeerId;
use crate::rng::Rng;

/// Partition boundaries are multiples of this many elements.
pub const BLOCK: u64 = 256;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Participant {
    pub peer: PeerId,
    /// Micro-batches it completed this epoch (the orchestrator's count).
    pub work: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Partition {
    pub offset: u64,
    pub len: u64,
    /// One or two owners (one only when a single participant is left).
    pub owners: Vec<PeerId>,
    /// Bumped whenever the partition's inputs or owners change (a re-plan
    /// after a dropout, a referee after a hash mismatch); results are
    /// compared and accepted per (partition, generation).
    pub generation: u32,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MergePlan {
    pub epoch: u64,
    pub stage: u32,
    pub params: u64,
    /// Sorted by peer id; their order is the plan's participant index.
    pub participants: Vec<Participant>,
    pub partitions: Vec<Partition>,
}

impl MergePlan {
    /// A plan for `participants` merging `params` values. Deterministic for
    /// a given seed and participant set (whatever order they come in).
    pub fn new(
        epoch: u64,
        stage: u32,
        mut participants: Vec<Participant>,
        params: u64,
        seed: u64,
        slices_per_replica: u32,
    ) -> MergePlan {
        participants.sort_by_key(|p| p.peer);
        participants.dedup_by_key(|p| p.peer);
        let r = participants.len();
        let mut plan = MergePlan { epoch, stage, params, participants, partitions: Vec::new() };
        if r == 0 || params == 0 {
            return plan;
        }
        // Seeded order of owners, so the pairing is not a function of the ids alone.
        let mut perm: Vec<usize> = (0..r).collect();
        let mut rng = Rng::derived(seed, &[0x6d65_7267, epoch, stage as u64]);
        for i in (1..r).rev() {
            perm.swap(i, rng.below(i as u64 + 1) as usize);
        }
        let k = r * slices_per_replica.max(1) as usize;
        let blocks = params.div_ceil(BLOCK);
        let k = k.min(blocks as usize).max(1);
        let mut offset = 0u64;
        for i in 0..k {
            // Blocks spread as evenly as possible; the last partition ends at P.
            let nb = blocks / k as u64 + u64::from((i as u64) < blocks % k as u64);
            let len = if i + 1 == k { params - offset } else { (nb * BLOCK).min(params - offset) };
            let primary = perm[i % r];
            let mut owners = vec![plan.participants[primary].peer];
            if r >= 2 {
                // Round j pairs owner i with i + 1 + (j mod (r-1)): a bijection,
                // so everyone is a secondary owner as often as a primary.
                let j = i / r;
                let secondary = perm[(i % r + 1 + j % (r - 1)) % r];
                owners.push(plan.participants[secondary].peer);
            }
            plan.partitions.push(Partition { offset, len, owners, generation: 0 });
            offset += len;
        }
        plan
    }

    pub fn index_of(&self, p: &PeerId) -> Option<usize> {
        self.participants.binary_search_by_key(p, |x| x.peer).ok()
    }

    pub fn is_participant(&self, p: &PeerId) -> bool {
        self.index_of(p).is_some()
    }

    /// Partitions `p` owns.
    pub fn owned_by<'a>(&'a self, p: &'a PeerId) -> impl Iterator<Item = usize> + 'a {
        self.partitions.iter().enumerate().filter(move |(_, x)| x.owners.contains(p)).map(|(k, _)| k)
    }

    /// Elements `p` reduces.
    pub fn elements_owned(&self, p: &PeerId) -> u64 {
        self.owned_by(p).map(|k| self.partitions[k].len).sum()
    }

    /// The owner that sends partition `k`'s result to `receiver` (None when
    /// the receiver owns it). The two owners split the receivers between
    /// them, so the gather load is balanced too.
    pub fn sender_of(&self, k: usize, receiver: &PeerId) -> Option<PeerId> {
        let part = self.partitions.get(k)?;
        if part.owners.contains(receiver) || part.owners.is_empty() {
            return None;
        }
        self.index_of(receiver)?;
        // The receiver's rank among the partition's non-owners, alternating.
        let rank = self
            .participants
            .iter()
            .take_while(|p| p.peer != *receiver)
            .filter(|p| !part.owners.contains(&p.peer))
            .count();
        Some(part.owners[(rank + k) % part.owners.len()])
    }

    /// The work weight of every participant, normalised to sum to 1 (equal
    /// weights when nobody reported work).
    pub fn weights(&self) -> Vec<f64> {
        let total: u64 = self.participants.iter().map(|p| p.work).sum();
        let n = self.participants.len().max(1) as f64;
        self.participants.iter().map(|p| if total > 0 { p.work as f64 / total as f64 } else { 1.0 / n }).collect()
    }

    /// The plan without `gone` (participants that dropped out mid-merge).
    /// Their partitions keep their surviving owner and get a new second one,
    /// the least loaded survivor; every partition's generation is bumped,
    /// since its inputs changed.
    pub fn without(&self, gone: &[PeerId]) -> MergePlan {
        let mut next = self.clone();
        next.participants.retain(|p| !gone.contains(&p.peer));
        let want = next.participants.len().min(2);
        for k in 0..next.partitions.len() {
            next.partitions[k].owners.retain(|o| !gone.contains(o));
            while next.partitions[k].owners.len() < want {
                let owners = next.partitions[k].owners.clone();
                let pick = next
                    .participants
                    .iter()
                    .filter(|p| !owners.contains(&p.peer))
                    .min_by_key(|p| (next.elements_owned(&p.peer), p.peer))
                    .map(|p| p.peer);
                match pick {
                    Some(p) => next.partitions[k].owners.push(p),
                    None => break,
                }
            }
            next.partitions[k].generation += 1;
        }
        next
    }

    /// The plan with partition `k` handed to `referee` alone (after its two
    /// owners disagreed).
    pub fn with_referee(&self, k: usize, referee: PeerId) -> MergePlan {
        let mut next = self.clone();
        if let Some(part) = next.partitions.get_mut(k) {
            part.owners = vec![referee];
            part.generation += 1;
        }
        next
    }

    /// A participant that owns neither of `owners`' roles for partition `k`
    /// and owns the fewest elements: who re-computes a disputed partition.
    pub fn referee_for(&self, k: usize) -> Option<PeerId> {
        let owners = &self.partitions.get(k)?.owners;
        self.participants
            .iter()
            .filter(|p| !owners.contains(&p.peer))
            .min_by_key(|p| (self.elements_owned(&p.peer), p.peer))
            .map(|p| p.peer)
    }

    /// Checks a plan received from the network before acting on it.
    pub fn validate(&self, expected_params: u64) -> Result<(), String> {
        if self.params != expected_params {
            return Err(format!("plan covers {} values, the stage has {expected_params}", self.params));
        }
        if !self.participants.windows(2).all(|w| w[0].peer < w[1].peer) {
            return Err("participants not sorted and unique".into());
        }
        let mut at = 0u64;
        for (k, p) in self.partitions.iter().enumerate() {
            if p.offset != at || p.len == 0 {
                return Err(format!("partition {k} does not continue at {at}"));
            }
            if p.owners.is_empty() || p.owners.len() > 2 || p.owners.iter().any(|o| !self.is_participant(o)) {
                return Err(format!("partition {k} has bad owners"));
            }
            at = at.checked_add(p.len).ok_or("partition sizes overflow")?;
        }
        if at != self.params {
            return Err(format!("partitions cover {at} of {} values", self.params));
        }
        Ok(())
    }
}

/// How an owner combines the participants' pseudo-gradients.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub enum ReduceRule {
    /// Work-weighted mean. Not robust: one replica can move it anywhere.
    Mean,
    /// Coordinate-wise: drop the `trim` lowest and highest values, then the
    /// work-weighted mean of the rest.
    TrimmedMean { trim: u32 },
    /// Centered clipping (Karimireddy, He, Jaggi 2021): start at the
    /// coordinate-wise median; `iters` times, move by the weighted mean of
    /// each contribution's offset, each offset's norm clipped to tau, where
    /// tau is `tau_factor` times the median offset norm.
    CenteredClip { tau_factor: f32, iters: u32 },
}

impl ReduceRule {
    pub fn parse(s: &str) -> Option<ReduceRule> {
        match s {
            "mean" => Some(ReduceRule::Mean),
            "trimmed-mean" => Some(ReduceRule::TrimmedMean { trim: 1 }),
            "centered-clip" => Some(ReduceRule::CenteredClip { tau_factor: 2.0, iters: 3 }),
            _ => None,
        }
    }
    pub fn name(&self) -> &'static str {
        match self {
            ReduceRule::Mean => "mean",
            ReduceRule::TrimmedMean { .. } => "trimmed-mean",
            ReduceRule::CenteredClip { .. } => "centered-clip",
        }
    }
}

/// The outer optimizer: SGD with Nesterov momentum on the pseudo-gradient.
/// lr 1 and momentum 0 make the merge a plain average of the replicas.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct OuterOpt {
    pub lr: f32,
    pub momentum: f32,
}

impl OuterOpt {
    pub const AVERAGE: OuterOpt = OuterOpt { lr: 1.0, momentum: 0.0 };
}

/// What one slice reduce did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ReduceStats {
    /// Contributions left out because they held a non-finite value.
    pub rejected_non_finite: usize,
    /// Contributions whose offset was clipped (centered clipping).
    pub clipped: usize,
}

/// Reduces one partition. `contribs[i]` is participant i's pseudo-gradient
/// slice (None if it never arrived) and `weights[i]` its work weight;
/// `momentum` is the outer momentum slice, updated in place. Returns the
/// update u (theta_next = theta_prev - u). Sums run in f64 in participant
/// order, so two owners given the same inputs produce the same bits.
pub fn reduce_slice(
    rule: ReduceRule,
    outer: OuterOpt,
    contribs: &[Option<&[f32]>],
    weights: &[f64],
    momentum: &mut [f32],
) -> (Vec<f32>, ReduceStats) {
    let n = momentum.len();
    let mut stats = ReduceStats::default();
    // Contributions that may take part: present, right length, all finite.
    let mut used: Vec<(&[f32], f64)> = Vec::with_capacity(contribs.len());
    for (c, &w) in contribs.iter().zip(weights) {
        let Some(c) = c else { continue };
        if c.len() != n || !c.iter().all(|x| x.is_finite()) {
            stats.rejected_non_finite += 1;
            continue;
        }
        used.push((c, w));
    }
    let mut g = vec![0.0f32; n];
    if !used.is_empty() {
        let total: f64 = used.iter().map(|u| u.1).sum();
        let norm: Vec<f64> =
            used.iter().map(|u| if total > 0.0 { u.1 / total } else { 1.0 / used.len() as f64 }).collect();
        match rule {
            ReduceRule::Mean => weighted_mean(&used, &norm, &mut g),
            ReduceRule::TrimmedMean { trim } => trimmed_mean(&used, &norm, trim as usize, &mut g),
            ReduceRule::CenteredClip { tau_factor, iters } => {
                stats.clipped = centered_clip(&used, &norm, tau_factor, iters, &mut g)
            }
        }
    }
    // Nesterov: m <- mu m + g; u = lr (g + mu m).
    let (lr, mu) = (outer.lr, outer.momentum);
    let u = g
        .iter()
        .zip(momentum.iter_mut())
        .map(|(&g, m)| {
            *m = mu * *m + g;
            lr * (g + mu * *m)
        })
        .collect();
    (u, stats)
}

fn weighted_mean(used: &[(&[f32], f64)], w: &[f64], out: &mut [f32]) {
    for (j, o) in out.iter_mut().enumerate() {
        let s: f64 = used.iter().zip(w).map(|((c, _), w)| w * c[j] as f64).sum();
        *o = s as f32;
    }
}

fn trimmed_mean(used: &[(&[f32], f64)], w: &[f64], trim: usize, out: &mut [f32]) {
    let r = used.len();
    // Never trim everything: keep at least one value per coordinate.
    let trim = trim.min(r.saturating_sub(1) / 2);
    let mut col: Vec<(f32, f64)> = Vec::with_capacity(r);
    for (j, o) in out.iter_mut().enumerate() {
        col.clear();
        col.extend(used.iter().zip(w).map(|((c, _), w)| (c[j], *w)));
        col.sort_by(|a, b| a.0.total_cmp(&b.0));
        let kept = &col[trim..r - trim];
        let wsum: f64 = kept.iter().map(|k| k.1).sum();
        let s: f64 = kept.iter().map(|k| k.1 * k.0 as f64).sum();
        *o = if wsum > 0.0 {
            (s / wsum) as f32
        } else {
            (kept.iter().map(|k| k.0 as f64).sum::<f64>() / kept.len() as f64) as f32
        };
    }
}

fn median_of(v: &mut [f32]) -> f32 {
    v.sort_by(f32::total_cmp);
    let n = v.len();
    if n % 2 == 1 { v[n / 2] } else { ((v[n / 2 - 1] as f64 + v[n / 2] as f64) / 2.0) as f32 }
}

fn centered_clip(used: &[(&[f32], f64)], w: &[f64], tau_factor: f32, iters: u32, out: &mut [f32]) -> usize {
    let r = used.len();
    let mut col = vec![0.0f32; r];
    for (j, o) in out.iter_mut().enumerate() {
        for (i, (c, _)) in used.iter().enumerate() {
            col[i] = c[j];
        }
        *o = median_of(&mut col);
    }
    let mut clipped = vec![false; r];
    for _ in 0..iters.max(1) {
        let dist: Vec<f64> = used
            .iter()
            .map(|(c, _)| c.iter().zip(out.iter()).map(|(&x, &v)| ((x - v) as f64).powi(2)).sum::<f64>().sqrt())
            .collect();
        let mut d32: Vec<f32> = dist.iter().map(|&d| d as f32).collect();
        let tau = tau_factor as f64 * median_of(&mut d32) as f64;
        let scale: Vec<f64> = dist
            .iter()
            .enumerate()
            .map(|(i, &d)| {
                if d > tau && d > 0.0 {
                    clipped[i] = true;
                    tau / d
                } else {
                    1.0
                }
            })
            .collect();
        for (j, o) in out.iter_mut().enumerate() {
            let v = *o as f64;
            let step: f64 = used.iter().zip(w).zip(&scale).map(|(((c, _), w), s)| w * s * (c[j] as f64 - v)).sum();
            *o = (v + step) as f32;
        }
    }
    clipped.iter().filter(|&&c| c).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peers(n: usize) -> Vec<Participant> {
        (0..n).map(|i| Participant { peer: PeerId([i as u8 * 7 + 1; 32]), work: 10 + i as u64 }).collect()
    }

    #[test]
    fn plans_are_balanced_two_owner_covers() {
        for r in [1usize, 2, 3, 5, 8, 16, 33] {
            for params in [1u64, 255, 1000, 100_003, 25_000_000] {
                for spr in [1, 2, 3] {
                    let plan = MergePlan::new(3, 1, peers(r), params, 42, spr);
                    plan.validate(params).unwrap();
                    for p in &plan.partitions {
                        assert_eq!(p.owners.len(), r.min(2), "r={r}");
                        if r >= 2 {
                            assert_ne!(p.owners[0], p.owners[1]);
                        }
                        if p.offset + p.len < params {
                            assert_eq!((p.offset + p.len) % BLOCK, 0, "boundaries on blocks");
                        }
                    }
                    let owned: Vec<u64> = plan.participants.iter().map(|p| plan.elements_owned(&p.peer)).collect();
                    let (lo, hi) = (*owned.iter().min().unwrap(), *owned.iter().max().unwrap());
                    if params >= (r as u64) * spr as u64 * BLOCK * 4 {
                        // Balanced to within a block per owned partition.
                        assert!(hi - lo <= 2 * spr as u64 * BLOCK + BLOCK, "r={r} P={params}: {owned:?}");
                    }
                    assert_eq!(owned.iter().sum::<u64>(), params * r.min(2) as u64);
                }
            }
        }
    }

    #[test]
    fn plan_is_deterministic_and_seeded() {
        let mut shuffled = peers(8);
        shuffled.reverse();
        let a = MergePlan::new(1, 0, peers(8), 1 << 20, 7, 1);
        assert_eq!(a, MergePlan::new(1, 0, shuffled, 1 << 20, 7, 1));
        assert_ne!(a, MergePlan::new(1, 0, peers(8), 1 << 20, 8, 1), "the seed picks the pairing");
    }

    #[test]
    fn gather_senders_are_owners_and_split_the_load() {
        let plan = MergePlan::new(0, 0, peers(6), 60_000, 1, 1);
        let mut sent = vec![0u64; 6];
        for (k, part) in plan.partitions.iter().enumerate() {
            for p in &plan.participants {
                match plan.sender_of(k, &p.peer) {
                    None => assert!(part.owners.contains(&p.peer)),
                    Some(s) => {
                        assert!(part.owners.contains(&s));
                        sent[plan.index_of(&s).unwrap()] += part.len;
                    }
                }
            }
        }
        let (lo, hi) = (*sent.iter().min().unwrap(), *sent.iter().max().unwrap());
        assert!(hi - lo <= 4 * BLOCK, "{sent:?}");
    }

    #[test]
    fn replans_keep_two_owners_among_survivors() {
        let plan = MergePlan::new(0, 0, peers(5), 50_000, 3, 2);
        let gone = [plan.participants[1].peer, plan.participants[3].peer];
        let next = plan.without(&gone);
        next.validate(50_000).unwrap();
        assert_eq!(next.participants.len(), 3);
        for (a, b) in plan.partitions.iter().zip(&next.partitions) {
            assert_eq!(b.owners.len(), 2);
            assert!(b.owners.iter().all(|o| !gone.contains(o)));
            assert_eq!(b.generation, a.generation + 1);
            // A surviving owner stays an owner (it already holds the inputs).
            for o in &a.owners {
                if !gone.contains(o) {
                    assert!(b.owners.contains(o));
                }
            }
        }
        let solo = plan.without(&plan.participants[1..].iter().map(|p| p.peer).collect::<Vec<_>>());
        assert!(solo.partitions.iter().all(|p| p.owners == vec![plan.participants[0].peer]));
        let referee = plan.referee_for(2).unwrap();
        assert!(!plan.partitions[2].owners.contains(&referee));
        let r = plan.with_referee(2, referee);
        assert_eq!(r.partitions[2].owners, vec![referee]);
        assert_eq!(r.partitions[2].generation, 1);
        assert_eq!(r.partitions[1], plan.partitions[1]);
    }

    #[test]
    fn validate_rejects_bad_plans() {
        let plan = MergePlan::new(0, 0, peers(3), 10_000, 3, 1);
        assert!(plan.validate(10_001).is_err());
        let mut p = plan.clone();
        p.partitions[1].offset += 1;
        assert!(p.validate(10_000).is_err());
        let mut p = plan.clone();
        p.partitions[0].owners[0] = PeerId([200; 32]);
        assert!(p.validate(10_000).is_err());
        let mut p = plan;
        p.partitions.pop();
        assert!(p.validate(10_000).is_err());
    }

    fn honest(r: usize, n: usize, seed: u64) -> Vec<Vec<f32>> {
        let mut rng = Rng::new(seed);
        let base: Vec<f32> = (0..n).map(|_| rng.normal() * 0.01).collect();
        (0..r).map(|_| base.iter().map(|&b| b + rng.normal() * 0.002).collect()).collect()
    }

    fn mean_of(xs: &[Vec<f32>], w: &[f64]) -> Vec<f32> {
        let t: f64 = w.iter().sum();
        (0..xs[0].len()).map(|j| (xs.iter().zip(w).map(|(x, w)| w * x[j] as f64).sum::<f64>() / t) as f32).collect()
    }

    fn dist(a: &[f32], b: &[f32]) -> f64 {
        a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum::<f64>().sqrt()
    }

    fn norm(a: &[f32]) -> f64 {
        a.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt()
    }

    #[test]
    fn mean_with_lr_one_and_no_momentum_is_the_weighted_mean() {
        let xs = honest(5, 1001, 1);
        let w = [1.0, 2.0, 3.0, 4.0, 5.0];
        let wn: Vec<f64> = w.iter().map(|x| x / 15.0).collect();
        let refs: Vec<Option<&[f32]>> = xs.iter().map(|x| Some(x.as_slice())).collect();
        let mut m = vec![0.0; 1001];
        let (u, st) = reduce_slice(ReduceRule::Mean, OuterOpt::AVERAGE, &refs, &wn, &mut m);
        assert!(dist(&u, &mean_of(&xs, &w)) < 1e-6 * norm(&u));
        assert_eq!(st, ReduceStats::default());
        assert_eq!(m, u, "momentum holds the last pseudo-gradient");
    }

    #[test]
    fn nesterov_matches_its_definition() {
        let g = [vec![1.0f32, -2.0]];
        let refs: Vec<Option<&[f32]>> = g.iter().map(|x| Some(x.as_slice())).collect();
        let mut m = vec![0.5f32, 0.5];
        let o = OuterOpt { lr: 0.7, momentum: 0.9 };
        let (u, _) = reduce_slice(ReduceRule::Mean, o, &refs, &[1.0], &mut m);
        // m = 0.9*0.5 + g; u = 0.7 (g + 0.9 m)
        let m0 = 0.9 * 0.5 + 1.0;
        assert!((m[0] - m0).abs() < 1e-6);
        assert!((u[0] - 0.7 * (1.0 + 0.9 * m0)).abs() < 1e-6);
        assert!((u[1] - 0.7 * (-2.0 + 0.9 * (0.9 * 0.5 - 2.0))).abs() < 1e-6);
    }

    #[test]
    fn robust_rules_bound_a_byzantine_replica() {
        let n = 4096;
        for r in [3usize, 5, 8] {
            let xs = honest(r, n, r as u64);
            let w = vec![1.0 / r as f64; r];
            let honest_mean = mean_of(&xs[1..], &w[1..]);
            let scale = norm(&honest_mean);
            for attack in ["huge", "nan", "flip"] {
                let mut bad = xs.clone();
                match attack {
                    "huge" => bad[0].iter_mut().for_each(|x| *x *= 1e6),
                    "nan" => bad[0][17] = f32::NAN,
                    _ => bad[0].iter_mut().for_each(|x| *x *= -20.0),
                }
                let refs: Vec<Option<&[f32]>> = bad.iter().map(|x| Some(x.as_slice())).collect();
                for rule in
                    [ReduceRule::CenteredClip { tau_factor: 2.0, iters: 3 }, ReduceRule::TrimmedMean { trim: 1 }]
                {
                    let mut m = vec![0.0; n];
                    let (u, st) = reduce_slice(rule, OuterOpt::AVERAGE, &refs, &w, &mut m);
                    assert!(u.iter().all(|x| x.is_finite()), "{rule:?} {attack}");
                    let err = dist(&u, &honest_mean) / scale;
                    assert!(err < 0.5, "{rule:?} r={r} {attack}: relative error {err}");
                    if attack == "nan" {
                        assert_eq!(st.rejected_non_finite, 1);
                    }
                }
                let mut m = vec![0.0; n];
                let (u, _) = reduce_slice(ReduceRule::Mean, OuterOpt::AVERAGE, &refs, &w, &mut m);
                if attack != "nan" {
                    assert!(dist(&u, &honest_mean) / scale > 1.0, "the plain mean is not robust ({attack})");
                }
            }
        }
    }

    #[test]
    fn centered_clip_leaves_honest_replicas_alone() {
        let xs = honest(5, 2048, 9);
        let w = vec![0.2; 5];
        let refs: Vec<Option<&[f32]>> = xs.iter().map(|x| Some(x.as_slice())).collect();
        let mut m = vec![0.0; 2048];
        let (u, st) =
            reduce_slice(ReduceRule::CenteredClip { tau_factor: 2.0, iters: 3 }, OuterOpt::AVERAGE, &refs, &w, &mut m);
        let err = dist(&u, &mean_of(&xs, &w)) / norm(&u);
        assert_eq!(st.clipped, 0);
        assert!(err < 1e-3, "relative error {err}");
    }

    #[test]
    fn missing_and_empty_contributions() {
        let mut m = vec![0.25f32; 3];
        let (u, _) =
            reduce_slice(ReduceRule::Mean, OuterOpt { lr: 1.0, momentum: 0.5 }, &[None, None], &[0.5, 0.5], &mut m);
        // No input: g = 0, the momentum still decays and moves the weights.
        assert_eq!(m, vec![0.125; 3]);
        assert_eq!(u, vec![0.0625; 3]);
    }
}
