//! The butterfly merge plan on the wire: conversions between
//! `iota_core::merge::MergePlan` and its protobuf form.

// Input from peers: no unchecked arithmetic or indexing (issue 21).
#![cfg_attr(not(test), deny(clippy::arithmetic_side_effects, clippy::indexing_slicing))]

use iota_core::PeerId;
use iota_core::merge::{MergePlan, Participant, Partition};

use crate::pb;

pub fn plan_to_pb(p: &MergePlan) -> pb::MergePlan {
    pb::MergePlan {
        epoch: p.epoch,
        stage: p.stage,
        params: p.params,
        participants: p
            .participants
            .iter()
            .map(|x| pb::MergeParticipant { peer_id: x.peer.0.to_vec(), work: x.work })
            .collect(),
        partitions: p
            .partitions
            .iter()
            .map(|x| pb::MergePartition {
                offset: x.offset,
                len: x.len,
                owners: x.owners.iter().map(|o| o.0.to_vec()).collect(),
                generation: x.generation,
            })
            .collect(),
    }
}

/// A plan from the wire; structurally checked (`MergePlan::validate` checks
/// it against the stage).
pub fn plan_from_pb(p: &pb::MergePlan) -> Result<MergePlan, String> {
    let peer = |b: &[u8]| <[u8; 32]>::try_from(b).map(PeerId).map_err(|_| "peer id must be 32 bytes".to_string());
    if p.partitions.len() > 1 << 20 || p.participants.len() > 1 << 16 {
        return Err("plan too large".into());
    }
    Ok(MergePlan {
        epoch: p.epoch,
        stage: p.stage,
        params: p.params,
        participants: p
            .participants
            .iter()
            .map(|x| Ok(Participant { peer: peer(&x.peer_id)?, work: x.work }))
            .collect::<Result<_, String>>()?,
        partitions: p
            .partitions
            .iter()
            .map(|x| {
                Ok(Partition {
                    offset: x.offset,
                    len: x.len,
                    owners: x.owners.iter().map(|o| peer(o)).collect::<Result<_, String>>()?,
                    generation: x.generation,
                })
            })
            .collect::<Result<_, String>>()?,
    })
}
