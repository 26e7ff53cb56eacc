//! Vectors stored in the object store as part objects, one per range
//! (`{offset:012}-{len:012}.f32`, little-endian f32): merged weights and
//! outer momentum.

use anyhow::{Context, Result, bail};
use iota_protocol::SharedStore;
use iota_protocol::store_keys::parse_part_name;

/// Reads `[offset, offset + len)` of a vector stored as part objects under
/// `prefix` (names from `part_name`). Returns the values and how many of
/// them were covered by some part (the rest are zero; values covered by
/// several parts count once).
///
/// Part names and contents are untrusted (any miner can write to the
/// store): a name whose range overflows, or an object whose size does not
/// match its name, is an error, never a panic.
pub async fn read_range(store: &SharedStore, prefix: &str, offset: u64, len: u64) -> Result<(Vec<f32>, u64)> {
    let end = offset.checked_add(len).context("range end overflows")?;
    let mut out = vec![0.0f32; usize::try_from(len).context("range too large")?];
    let mut spans: Vec<(u64, u64)> = Vec::new();
    for key in store.list(prefix).await.unwrap_or_default() {
        let Some((o, l)) = parse_part_name(&key) else { continue };
        let Some(o_end) = o.checked_add(l) else { bail!("part {key}: its range overflows") };
        let (lo, hi) = (o.max(offset), o_end.min(end));
        if lo >= hi {
            continue;
        }
        let bytes = store.get(&key).await.with_context(|| format!("reading {key}"))?;
        if l.checked_mul(4) != Some(bytes.len() as u64) {
            bail!("part {key} holds {} bytes, its name says {} values", bytes.len(), l);
        }
        for (slot, i) in out[(lo - offset) as usize..(hi - offset) as usize].iter_mut().zip(lo..hi) {
            let b = ((i - o) * 4) as usize;
            *slot = f32::from_le_bytes([bytes[b], bytes[b + 1], bytes[b + 2], bytes[b + 3]]);
        }
        spans.push((lo, hi));
    }
    Ok((out, union_len(spans)))
}

/// Total length of the union of half-open spans.
fn union_len(mut spans: Vec<(u64, u64)>) -> u64 {
    spans.sort();
    let (mut total, mut reach) = (0u64, 0u64);
    for (lo, hi) in spans {
        let lo = lo.max(reach);
        if hi > lo {
            total += hi - lo;
            reach = hi;
        }
    }
    total
}

/// Little-endian f32 bytes of `x` (the part objects' format).
pub fn f32_bytes(x: &[f32]) -> Vec<u8> {
    x.iter().flat_map(|v| v.to_le_bytes()).collect()
}

#[cfg(test)]
mod tests {
    use iota_protocol::store_keys::part_name;

    use super::*;
    use crate::fileio::FileIo;
    use crate::local_store::LocalDirStore;

    #[tokio::test]
    async fn hostile_part_names_and_sizes_are_errors_not_panics() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalDirStore::shared(dir.path(), FileIo::start(false)).unwrap();
        // An empty object whose name claims 2^62 values: len * 4 wraps to 0
        // in release (and panics in debug) if computed unchecked.
        store.put("w/000000000000-4611686018427387904.f32", Vec::new()).await.unwrap();
        assert!(read_range(&store, "w/", 0, 8).await.is_err());
        let store2 = LocalDirStore::shared(dir.path().join("b"), FileIo::start(false)).unwrap();
        store2.put("w/000000000000-4611686018427387905.f32", vec![0; 4]).await.unwrap();
        assert!(read_range(&store2, "w/", 0, 8).await.is_err());
        // offset + len overflows u64.
        let store3 = LocalDirStore::shared(dir.path().join("c"), FileIo::start(false)).unwrap();
        store3.put(&format!("w/{}", part_name(u64::MAX - 1, 4)), vec![0; 16]).await.unwrap();
        assert!(read_range(&store3, "w/", 0, 8).await.is_err());
    }

    #[tokio::test]
    async fn overlapping_parts_count_once() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalDirStore::shared(dir.path(), FileIo::start(false)).unwrap();
        let vals: Vec<f32> = (0..6).map(|i| i as f32).collect();
        store.put(&format!("w/{}", part_name(0, 4)), f32_bytes(&vals[..4])).await.unwrap();
        store.put(&format!("w/{}", part_name(2, 2)), f32_bytes(&vals[2..4])).await.unwrap();
        // [0, 4) is covered (twice over [2, 4)); [4, 6) is not.
        let (v, covered) = read_range(&store, "w/", 0, 6).await.unwrap();
        assert_eq!(covered, 4);
        assert_eq!(&v[..4], &vals[..4]);
        assert_eq!(union_len(vec![(5, 9), (0, 3), (2, 4), (8, 10)]), 9);
    }
}
