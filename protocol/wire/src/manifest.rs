//! Announced store objects: what a reader is told about an object before it
//! reads it (size, BLAKE3 hash, writer, and for part objects the range of
//! values it holds).
//!
//! Every miner can write to the store, so a reader trusts nothing it finds
//! there: it reads only the keys the orchestrator handed it, checks the
//! bytes against the announcement before parsing them, and reports any
//! difference naming the writer (see PROTOCOL.md, "Store objects").
//!
//! Every field here comes from a peer: no unchecked arithmetic or indexing.
#![cfg_attr(not(test), deny(clippy::arithmetic_side_effects, clippy::indexing_slicing))]

use iota_core::PeerId;

use crate::object_store::{MAX_KEY_LEN, check_key};
use crate::pb;

/// Largest object a reader accepts (a `1.5b` stage's weights are ~1.6 GB).
pub const MAX_OBJECT_BYTES: u64 = 1 << 36;

/// An announced object, checked (see [`StoredObject::from_pb`]).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StoredObject {
    pub key: String,
    pub size: u64,
    pub hash: [u8; 32],
    /// Part objects: index of the first f32 value; 0 otherwise.
    pub offset: u64,
    /// Part objects: f32 values held (`size == 4 * values`); 0 otherwise.
    pub values: u64,
    /// Who announced it (the orchestrator fills it in; a report's is the
    /// signer).
    pub writer: PeerId,
    /// Uploads handed to an aggregator: the writer's micro-batches, as the
    /// orchestrator counted them.
    pub work: u64,
}

impl StoredObject {
    /// The announcement of `bytes` under `key` by `writer`.
    pub fn of(key: &str, bytes: &[u8], writer: PeerId) -> StoredObject {
        StoredObject {
            key: key.to_string(),
            size: bytes.len() as u64,
            hash: *blake3::hash(bytes).as_bytes(),
            offset: 0,
            values: 0,
            writer,
            work: 0,
        }
    }

    /// The announcement of a part object holding `values` f32 values from
    /// `offset`.
    pub fn part(key: &str, bytes: &[u8], offset: u64, writer: PeerId) -> StoredObject {
        StoredObject { offset, values: (bytes.len() / 4) as u64, ..StoredObject::of(key, bytes, writer) }
    }

    pub fn is_part(&self) -> bool {
        self.values > 0
    }

    /// One past the last value a part object holds (checked at parse).
    pub fn end(&self) -> u64 {
        self.offset.saturating_add(self.values)
    }

    pub fn to_pb(&self) -> pb::StoredObject {
        pb::StoredObject {
            key: self.key.clone(),
            size: self.size,
            hash: self.hash.to_vec(),
            offset: self.offset,
            values: self.values,
            writer: self.writer.0.to_vec(),
            work: self.work,
        }
    }

    /// Checks an announcement from the wire. `writer`: the signer of a
    /// report (then `o.writer` must be empty or the same), or `None` to take
    /// the writer the orchestrator named.
    pub fn from_pb(o: &pb::StoredObject, writer: Option<PeerId>) -> Result<StoredObject, String> {
        check_key(&o.key).map_err(|e| e.to_string())?;
        if o.key.len() > MAX_KEY_LEN {
            return Err(format!("key longer than {} bytes", MAX_KEY_LEN));
        }
        let hash = <[u8; 32]>::try_from(o.hash.as_slice()).map_err(|_| "hash must be 32 bytes".to_string())?;
        if o.size > MAX_OBJECT_BYTES {
            return Err(format!("size {} is over the limit of {MAX_OBJECT_BYTES} bytes", o.size));
        }
        if o.values > 0 && o.values.checked_mul(4) != Some(o.size) {
            return Err(format!("a part of {} values must be 4 bytes per value, not {} bytes", o.values, o.size));
        }
        if o.offset.checked_add(o.values).is_none() {
            return Err("offset + values overflows".into());
        }
        let named = match o.writer.len() {
            0 => None,
            32 => Some(PeerId(o.writer.as_slice().try_into().expect("32 bytes"))),
            n => return Err(format!("writer must be 32 bytes, not {n}")),
        };
        let writer = match (writer, named) {
            (Some(s), Some(n)) if s != n => return Err("writer differs from the signer".into()),
            (Some(s), _) => s,
            (None, Some(n)) => n,
            (None, None) => return Err("writer missing".into()),
        };
        Ok(StoredObject {
            key: o.key.clone(),
            size: o.size,
            hash,
            offset: o.offset,
            values: o.values,
            writer,
            work: o.work,
        })
    }

    /// Checks fetched bytes against the announcement: size first (cheap),
    /// then the hash. Nothing parses bytes that fail this.
    pub fn verify(&self, bytes: &[u8]) -> Result<(), String> {
        if bytes.len() as u64 != self.size {
            return Err(format!("{} bytes, announced {}", bytes.len(), self.size));
        }
        if *blake3::hash(bytes).as_bytes() != self.hash {
            return Err("BLAKE3 hash differs from the announced one".into());
        }
        Ok(())
    }
}

/// A list of announcements from a command (writers named by the
/// orchestrator); the first bad entry fails the whole list.
pub fn from_pb_list(list: &[pb::StoredObject]) -> Result<Vec<StoredObject>, String> {
    list.iter().map(|o| StoredObject::from_pb(o, None)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(i: u8) -> PeerId {
        PeerId([i; 32])
    }

    #[test]
    fn round_trip_and_verify() {
        let bytes = vec![1u8; 16];
        let o = StoredObject::part("e/s/weights/p", &bytes, 8, w(1));
        assert_eq!((o.values, o.end()), (4, 12));
        assert_eq!(StoredObject::from_pb(&o.to_pb(), None).unwrap(), o);
        assert!(o.verify(&bytes).is_ok());
        assert!(o.verify(&bytes[..12]).unwrap_err().contains("12 bytes"));
        let mut other = bytes.clone();
        other[3] = 2;
        assert!(o.verify(&other).unwrap_err().contains("hash"));
    }

    #[test]
    fn hostile_announcements_are_refused() {
        let good = StoredObject::part("a/b", &[0u8; 8], 0, w(1)).to_pb();
        let cases: Vec<(pb::StoredObject, &str)> = vec![
            (pb::StoredObject { key: "../x".into(), ..good.clone() }, "invalid object key"),
            (pb::StoredObject { hash: vec![0; 31], ..good.clone() }, "hash"),
            // The crash inputs of issue 21: 2^62 values claimed by 0 or 4 bytes.
            (pb::StoredObject { values: 1 << 62, size: 0, ..good.clone() }, "4 bytes per value"),
            (pb::StoredObject { values: (1 << 62) + 1, size: 4, ..good.clone() }, "4 bytes per value"),
            (pb::StoredObject { offset: u64::MAX - 1, ..good.clone() }, "overflows"),
            (pb::StoredObject { size: u64::MAX, values: 0, ..good.clone() }, "over the limit"),
            (pb::StoredObject { writer: vec![2; 32], ..good.clone() }, "differs from the signer"),
            (pb::StoredObject { writer: vec![2; 5], ..good.clone() }, "32 bytes"),
        ];
        for (o, want) in cases {
            let err = StoredObject::from_pb(&o, Some(w(1))).unwrap_err();
            assert!(err.contains(want), "{err} (wanted {want})");
        }
        assert!(StoredObject::from_pb(&pb::StoredObject { writer: vec![], ..good }, None).is_err());
    }
}
