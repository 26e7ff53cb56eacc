//! The simulator's pending happenings, in the order they happen: by time,
//! and those due at the same millisecond in the order they were scheduled.
//! A binary heap ordered by (time, sequence number) gives the same order;
//! at 2,000 miners it held hundreds of thousands of entries and its
//! sift-down missed the cache at every level. Here each millisecond with
//! something due is one queue, found in a small ordered map.

use std::collections::{BTreeMap, VecDeque};

use crate::orchestrator::Ms;

pub(super) struct EventQueue<T> {
    by_time: BTreeMap<Ms, VecDeque<T>>,
    /// Emptied queues, kept for the next millisecond (no allocation per
    /// millisecond).
    spare: Vec<VecDeque<T>>,
}

impl<T> Default for EventQueue<T> {
    fn default() -> Self {
        EventQueue { by_time: BTreeMap::new(), spare: Vec::new() }
    }
}

impl<T> EventQueue<T> {
    /// Schedules `x` at `t`, after everything already due at `t`.
    pub(super) fn push(&mut self, t: Ms, x: T) {
        let spare = &mut self.spare;
        self.by_time.entry(t).or_insert_with(|| spare.pop().unwrap_or_default()).push_back(x);
    }

    /// The earliest happening, with its time.
    pub(super) fn pop(&mut self) -> Option<(Ms, T)> {
        let mut first = self.by_time.first_entry()?;
        let t = *first.key();
        let x = first.get_mut().pop_front();
        if first.get().is_empty() {
            let q = first.remove();
            if self.spare.len() < 64 {
                self.spare.push(q);
            }
        }
        x.map(|x| (t, x))
    }
}

#[cfg(test)]
mod tests {
    use iota_core::Rng;

    use super::*;

    /// Pushes and pops interleaved at random come out exactly as a sort by
    /// (time, order pushed) would put them.
    #[test]
    fn happenings_come_out_by_time_then_in_the_order_scheduled() {
        let mut rng = Rng::new(11);
        let mut q = EventQueue::default();
        let mut pending: Vec<(Ms, u64)> = Vec::new();
        let (mut seq, mut now, mut popped) = (0u64, 0, 0);
        for _ in 0..20_000 {
            if rng.below(3) < 2 {
                // Some at the same millisecond as others, some later.
                let t = now + rng.below(40);
                seq += 1;
                q.push(t, seq);
                pending.push((t, seq));
            } else if let Some((t, s)) = q.pop() {
                let want = *pending.iter().min().expect("the queue had something");
                assert_eq!((t, s), want);
                pending.retain(|p| *p != want);
                assert!(t >= now, "time went back");
                now = t;
                popped += 1;
            } else {
                assert!(pending.is_empty());
            }
        }
        while let Some((t, s)) = q.pop() {
            let want = *pending.iter().min().unwrap();
            assert_eq!((t, s), want);
            pending.retain(|p| *p != want);
        }
        assert!(pending.is_empty() && popped > 1_000, "{popped}");
    }
}
