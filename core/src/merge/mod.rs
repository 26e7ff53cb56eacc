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
//!
//! - [`plan`]: partitions and their owners, re-plans, referees;
//! - [`reduce`]: `reduce_slice`, the per-partition reduce (the CUDA kernel
//!   in `iota-cuda` is checked against it);
//! - [`stage`]: `StageMerge`, one stage's merge as the coordinator sees it
//!   (owners' hashes, verdicts, disputes, re-plans);
//! - [`equivocation`]: proofs that a participant sent two owners different
//!   contributions;
//! - [`flaws`]: contributions every honest owner flags (undecodable,
//!   non-finite, far outlying).

mod audit_order;
pub mod equivocation;
pub mod flaws;
pub mod plan;
pub mod reduce;
pub mod stage;

pub use equivocation::{Equivocation, PartitionOf, SignedContribution};
pub use flaws::{Flaw, flaws};
pub use plan::{BLOCK, MergePlan, Participant, Partition};
pub use reduce::{OuterOpt, ReduceRule, ReduceStats, reduce_slice};
pub use stage::{
    AuditCounts, FlagHold, KEEP_PREVIOUS, MergeOut, Mismatch, SliceReport, StageMerge, Verdict, WithheldClaim,
};
