//! Each owner pair's partitions in audit-draw order, for one plan
//! revision and audit seed (built and read by `stage::audit_draw`). Its
//! own file: the stage merge's state holds it.

use std::collections::BTreeMap;

use crate::identity::PeerId;

/// An owner pair, the lesser peer first.
pub(crate) type Pair = (PeerId, PeerId);

/// Each owner pair's partitions, least audit key first, for one plan
/// revision and audit seed. Derived from the plan, so not saved: a
/// restored merge builds it again.
#[derive(Clone, Debug, Default)]
pub(crate) struct AuditOrder {
    /// (plan revision, audit seed) it was built for.
    pub(crate) built_at: Option<(u64, u64)>,
    pub(crate) of_pair: BTreeMap<Pair, Vec<u32>>,
}
