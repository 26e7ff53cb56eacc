//! Reading announced objects from the store: checked against their
//! announcement (size, then BLAKE3) before a byte is parsed, and finite or
//! rejected after. Vectors are stored as part objects, one per range
//! (`{offset:012}-{len:012}.f32`, little-endian f32): merged weights and
//! outer momentum; a parameter-server stage as one safetensors object.
//!
//! Nothing here lists the store or reads a name: the orchestrator's records
//! say which objects exist, what range each holds and what its bytes hash
//! to (see `iota_protocol::manifest`).
//!
//! Lengths and offsets here come from peers: no unchecked arithmetic or
//! indexing (the lints below hold the module to that).
#![cfg_attr(not(test), deny(clippy::arithmetic_side_effects, clippy::indexing_slicing))]

use anyhow::{Context, Result, bail};
use iota_core::ParamLayout;
use iota_model::checkpoint::stage_params;
use iota_protocol::{SharedStore, StoredObject, pb};

use crate::miner::events::Output;

/// An announced object that failed its check, and why.
#[derive(Clone, Debug, PartialEq)]
pub struct BadRead {
    pub object: StoredObject,
    pub reason: String,
}

impl BadRead {
    /// The report that tells the orchestrator (and names the writer).
    pub fn report(&self, epoch: u64, stage: u32) -> Output {
        Output::Report(pb::report::Kind::BadObject(pb::BadObject {
            epoch,
            stage,
            object: Some(self.object.to_pb()),
            reason: self.reason.clone(),
        }))
    }
}

/// Fetches `obj` and checks it against its announcement. `Ok(Err(_))`: the
/// bytes are not what was announced (report it); `Err(_)`: the store
/// failed (missing object, outage), which says nothing about the writer.
pub async fn get_verified(store: &SharedStore, obj: &StoredObject) -> Result<Result<Vec<u8>, BadRead>> {
    let bytes = store.get(&obj.key).await.with_context(|| format!("reading {}", obj.key))?;
    Ok(match obj.verify(&bytes) {
        Ok(()) => Ok(bytes),
        Err(reason) => Err(BadRead { object: obj.clone(), reason }),
    })
}

/// What [`read_parts`] found.
#[derive(Debug)]
pub struct PartsRead {
    /// The values of the range; zeros where no good part covered them.
    pub values: Vec<f32>,
    /// How many values good parts covered (overlaps count once).
    pub covered: u64,
    /// Parts that failed their check (not used).
    pub bad: Vec<BadRead>,
}

/// Reads `[offset, offset + len)` of a vector stored as the announced part
/// objects `parts`. Parts outside the range are not fetched; a part that
/// does not match its announcement, or holds a non-finite value, is left
/// out and returned in `bad`; a store failure is an error.
pub async fn read_parts(store: &SharedStore, parts: &[StoredObject], offset: u64, len: u64) -> Result<PartsRead> {
    let end = offset.checked_add(len).context("range end overflows")?;
    let mut values = vec![0.0f32; usize::try_from(len).context("range too large")?];
    let (mut spans, mut bad) = (Vec::new(), Vec::new());
    for part in parts {
        // `StoredObject::from_pb` checked `offset + values` and `size = 4 x values`.
        let (o, o_end) = (part.offset, part.end());
        let (lo, hi) = (o.max(offset), o_end.min(end));
        if !part.is_part() || lo >= hi {
            continue;
        }
        let bytes = match get_verified(store, part).await? {
            Ok(b) => b,
            Err(b) => {
                bad.push(b);
                continue;
            }
        };
        let floats = f32_values(&bytes);
        if floats.iter().any(|v| !v.is_finite()) {
            bad.push(BadRead { object: part.clone(), reason: "holds a non-finite value".into() });
            continue;
        }
        // lo..hi lies inside both [offset, end) and [o, o_end), and both
        // lengths fit in memory (`values` and `floats` exist).
        let at = |x: u64, base: u64| x.checked_sub(base).and_then(|d| usize::try_from(d).ok());
        let (Some(d0), Some(d1), Some(s0), Some(s1)) = (at(lo, offset), at(hi, offset), at(lo, o), at(hi, o)) else {
            bail!("part {} does not hold the range it was announced with", part.key);
        };
        let (dst, src) = (d0..d1, s0..s1);
        let (Some(d), Some(s)) = (values.get_mut(dst), floats.get(src)) else {
            bail!("part {} does not hold the range it was announced with", part.key);
        };
        d.copy_from_slice(s);
        spans.push((lo, hi));
    }
    Ok(PartsRead { values, covered: union_len(spans), bad })
}

/// A stage's whole weights from the objects the orchestrator announced:
/// part objects covering every value (butterfly), or one safetensors
/// object (parameter server). Bad objects are returned for reporting
/// whether or not the load succeeded.
pub async fn load_weights(
    store: &SharedStore,
    objects: &[StoredObject],
    layout: &ParamLayout,
) -> (Result<Vec<f32>>, Vec<BadRead>) {
    let total = layout.total() as u64;
    match objects {
        [] => (Err(anyhow::anyhow!("no stored weights were announced for this stage")), Vec::new()),
        [one] if !one.is_part() => {
            let bytes = match get_verified(store, one).await {
                Ok(Ok(b)) => b,
                Ok(Err(bad)) => return (Err(anyhow::anyhow!("{}: {}", bad.object.key, bad.reason)), vec![bad]),
                Err(e) => return (Err(e), Vec::new()),
            };
            match stage_params(layout, &bytes) {
                Ok(p) if p.iter().all(|v| v.is_finite()) => (Ok(p), Vec::new()),
                Ok(_) => bad_object(one, "holds a non-finite value"),
                Err(e) => bad_object(one, &format!("not the stage's safetensors: {e:#}")),
            }
        }
        parts => match read_parts(store, parts, 0, total).await {
            Ok(r) if r.covered == total => (Ok(r.values), r.bad),
            Ok(r) => (Err(anyhow::anyhow!("the stored weights cover {} of {total} values", r.covered)), r.bad),
            Err(e) => (Err(e), Vec::new()),
        },
    }
}

fn bad_object<T>(o: &StoredObject, why: &str) -> (Result<T>, Vec<BadRead>) {
    let bad = BadRead { object: o.clone(), reason: why.to_string() };
    (Err(anyhow::anyhow!("{}: {why}", o.key)), vec![bad])
}

fn f32_values(bytes: &[u8]) -> Vec<f32> {
    bytes.chunks_exact(4).filter_map(|c| c.try_into().ok()).map(f32::from_le_bytes).collect()
}

/// Total length of the union of half-open spans.
fn union_len(mut spans: Vec<(u64, u64)>) -> u64 {
    spans.sort();
    let (mut total, mut reach) = (0u64, 0u64);
    for (lo, hi) in spans {
        let lo = lo.max(reach);
        if let Some(d) = hi.checked_sub(lo).filter(|d| *d > 0) {
            total = total.saturating_add(d);
            reach = hi;
        }
    }
    total
}

/// Little-endian f32 bytes of `x` (the part objects' format).
pub fn f32_bytes(x: &[f32]) -> Vec<u8> {
    f32_le(x).into_owned()
}

/// The little-endian bytes of `x`: the values themselves on a
/// little-endian machine (no copy), a copy elsewhere.
pub fn f32_le(x: &[f32]) -> std::borrow::Cow<'_, [u8]> {
    if cfg!(target_endian = "little") {
        std::borrow::Cow::Borrowed(bytemuck::cast_slice(x))
    } else {
        std::borrow::Cow::Owned(x.iter().flat_map(|v| v.to_le_bytes()).collect())
    }
}

#[cfg(test)]
mod tests {
    use iota_core::PeerId;
    use iota_protocol::store_keys::part_name;

    use super::*;
    use crate::fileio::FileIo;
    use crate::local_store::LocalDirStore;

    fn writer() -> PeerId {
        PeerId([7; 32])
    }

    async fn put_part(store: &SharedStore, offset: u64, vals: &[f32]) -> StoredObject {
        let key = format!("w/{}", part_name(offset, vals.len() as u64));
        let bytes = f32_bytes(vals);
        store.put(&key, bytes.clone()).await.unwrap();
        StoredObject::part(&key, &bytes, offset, writer())
    }

    #[tokio::test]
    async fn only_announced_bytes_are_read_and_mismatches_name_the_writer() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalDirStore::shared(dir.path(), FileIo::start(false)).unwrap();
        let vals: Vec<f32> = (0..8).map(|i| i as f32).collect();
        let a = put_part(&store, 0, &vals[..4]).await;
        let b = put_part(&store, 4, &vals[4..]).await;
        // The crash inputs, planted beside them, are never read:
        // nothing lists the store.
        store.put("w/000000000000-4611686018427387904.f32", Vec::new()).await.unwrap();
        store.put("w/000000000000-4611686018427387905.f32", vec![0; 4]).await.unwrap();
        let r = read_parts(&store, &[a.clone(), b.clone()], 0, 8).await.unwrap();
        assert_eq!((r.values.as_slice(), r.covered, r.bad.len()), (vals.as_slice(), 8, 0));

        // Another miner overwrites b's bytes: b is left out and reported
        // against its announced writer; a is still used.
        store.put(&b.key, f32_bytes(&[9.0; 4])).await.unwrap();
        let r = read_parts(&store, &[a.clone(), b.clone()], 0, 8).await.unwrap();
        assert_eq!((r.covered, &r.values[..4], &r.values[4..]), (4, &vals[..4], &[0.0f32; 4][..]));
        assert_eq!(r.bad.len(), 1);
        assert_eq!((r.bad[0].object.writer, r.bad[0].reason.contains("hash")), (writer(), true));

        // A part announced with a NaN in it is rejected after its hash checks.
        let n = put_part(&store, 4, &[1.0, f32::NAN, 2.0, 3.0]).await;
        let r = read_parts(&store, &[n], 4, 4).await.unwrap();
        assert_eq!((r.covered, r.bad[0].reason.as_str()), (0, "holds a non-finite value"));

        // A missing object is a store error, not zeros.
        let gone = StoredObject { key: "w/none".into(), ..a };
        assert!(read_parts(&store, &[gone], 0, 4).await.is_err());
    }

    #[tokio::test]
    async fn overlapping_parts_count_once_and_ranges_are_clipped() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalDirStore::shared(dir.path(), FileIo::start(false)).unwrap();
        let vals: Vec<f32> = (0..6).map(|i| i as f32).collect();
        let a = put_part(&store, 0, &vals[..4]).await;
        let b = put_part(&store, 2, &vals[2..4]).await;
        // [0, 4) is covered (twice over [2, 4)); [4, 6) is not.
        let r = read_parts(&store, &[a.clone(), b], 0, 6).await.unwrap();
        assert_eq!(r.covered, 4);
        assert_eq!(&r.values[..4], &vals[..4]);
        let r = read_parts(&store, &[a], 1, 2).await.unwrap();
        assert_eq!((r.values.as_slice(), r.covered), (&vals[1..3], 2));
        assert_eq!(union_len(vec![(5, 9), (0, 3), (2, 4), (8, 10)]), 9);
        // A range whose end overflows is an error.
        assert!(read_parts(&store, &[], u64::MAX - 1, 4).await.is_err());
    }
}
