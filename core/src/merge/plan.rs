//! The butterfly plan: which participant owns (reduces) which partition.

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
        participants: Vec<Participant>,
        params: u64,
        seed: u64,
        slices_per_replica: u32,
    ) -> MergePlan {
        MergePlan::bounded(epoch, stage, participants, params, seed, slices_per_replica, u64::MAX, BLOCK)
    }

    /// `new`, with no partition longer than `max_partition_len` values
    /// (rounded down to whole blocks, at least one): a slice must fit one
    /// frame its receivers accept, so a large stage gets more partitions
    /// than `slices_per_replica` asks for, a multiple of the participant
    /// count so that ownership stays balanced. Boundaries fall on
    /// multiples of `block` (at least `BLOCK`; sparse contributions use
    /// their own block, so that every epoch's plan cuts a stage's sparse
    /// blocks in the same places).
    #[allow(clippy::too_many_arguments)]
    pub fn bounded(
        epoch: u64,
        stage: u32,
        mut participants: Vec<Participant>,
        params: u64,
        seed: u64,
        slices_per_replica: u32,
        max_partition_len: u64,
        block: u64,
    ) -> MergePlan {
        let block = block.max(BLOCK);
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
        let blocks = params.div_ceil(block);
        let max_blocks = (max_partition_len / block).max(1);
        // Partitions that keep each under the bound, rounded up to whole rounds of owners.
        let by_size = blocks.div_ceil(max_blocks).div_ceil(r as u64).saturating_mul(r as u64);
        let k = (r as u64 * u64::from(slices_per_replica.max(1))).max(by_size);
        let k = k.min(blocks).max(1) as usize;
        let mut offset = 0u64;
        for i in 0..k {
            // Blocks spread as evenly as possible; the last partition ends at P.
            let nb = blocks / k as u64 + u64::from((i as u64) < blocks % k as u64);
            let len = if i + 1 == k { params - offset } else { (nb * block).min(params - offset) };
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

    /// Who re-computes disputed partition `k`: a participant other than its
    /// owners, drawn with `seed` (the orchestrator's secret), so no key
    /// ground to sort first, and no load kept low on purpose, makes a
    /// participant the referee of the disputes it would like to decide.
    pub fn referee_for(&self, k: usize, seed: u64) -> Option<PeerId> {
        let part = self.partitions.get(k)?;
        let others: Vec<PeerId> =
            self.participants.iter().map(|p| p.peer).filter(|p| !part.owners.contains(p)).collect();
        let n = u64::try_from(others.len()).ok().filter(|n| *n > 0)?;
        let mut rng = Rng::derived(seed, &[0x7265_6665_7265_6500, self.epoch, u64::from(self.stage), k as u64]);
        let at = usize::try_from(rng.below(n)).ok()?;
        others.get(at).copied()
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
    fn bounded_plans_cut_large_stages_into_partitions_under_the_bound() {
        for r in [1usize, 2, 3, 5] {
            for (params, bound) in [(1_000_000u64, 65_536u64), (1_000_003, 100_000), (10_000, 256), (10_000, 1)] {
                let plan = MergePlan::bounded(3, 1, peers(r), params, 42, 1, bound, BLOCK);
                plan.validate(params).unwrap();
                let longest = plan.partitions.iter().map(|p| p.len).max().unwrap();
                assert!(longest <= bound.max(BLOCK), "r={r} P={params}: a partition of {longest} > {bound}");
                assert!(plan.partitions.len() >= params.div_ceil(bound.max(BLOCK)) as usize);
                if plan.partitions.len() as u64 * BLOCK < params {
                    // Not capped by the block count: whole rounds of owners.
                    assert_eq!(plan.partitions.len() % r, 0, "r={r} P={params}");
                }
                let owned: Vec<u64> = plan.participants.iter().map(|p| plan.elements_owned(&p.peer)).collect();
                let (lo, hi) = (*owned.iter().min().unwrap(), *owned.iter().max().unwrap());
                assert!(hi - lo <= 2 * bound.max(BLOCK), "r={r} P={params}: {owned:?}");
            }
        }
        // A bound the stage fits under changes nothing.
        assert_eq!(
            MergePlan::bounded(1, 0, peers(4), 50_000, 7, 2, 50_000, BLOCK),
            MergePlan::new(1, 0, peers(4), 50_000, 7, 2)
        );
    }

    #[test]
    fn plans_in_larger_blocks_cut_the_same_places_whoever_takes_part() {
        let sparse = 16_384u64;
        for params in [40_000u64, 1_000_003, 16_384 * 7] {
            for r in [1usize, 2, 3, 5] {
                let plan = MergePlan::bounded(2, 0, peers(r), params, 9, 2, 100_000, sparse);
                plan.validate(params).unwrap();
                for p in &plan.partitions {
                    assert_eq!(p.offset % sparse, 0, "r={r} P={params}: {p:?}");
                    assert!(p.offset + p.len == params || p.len % sparse == 0, "r={r} P={params}: {p:?}");
                    assert!(p.len <= 100_000 || p.len == sparse, "r={r} P={params}: {p:?}");
                }
            }
        }
        // A block below the dense one is the dense one.
        assert_eq!(
            MergePlan::bounded(1, 0, peers(3), 50_000, 7, 2, u64::MAX, 1),
            MergePlan::new(1, 0, peers(3), 50_000, 7, 2)
        );
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
        let referee = plan.referee_for(2, 7).unwrap();
        assert!(!plan.partitions[2].owners.contains(&referee));
        // Drawn with the seed among every non-owner, not the least loaded
        // or the smallest id.
        let drawn: std::collections::BTreeSet<PeerId> = (0..64).filter_map(|s| plan.referee_for(2, s)).collect();
        let non_owners = plan.participants.iter().filter(|p| !plan.partitions[2].owners.contains(&p.peer)).count();
        assert_eq!(drawn.len(), non_owners, "{drawn:?}");
        assert_eq!(plan.referee_for(2, 7), Some(referee), "the same seed, the same referee");
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
}
