//! Vectors stored in the object store as part objects, one per range
//! (`{offset:012}-{len:012}.f32`, little-endian f32): merged weights and
//! outer momentum.

use anyhow::{Context, Result, bail};
use iota_protocol::SharedStore;
use iota_protocol::store_keys::parse_part_name;

/// Reads `[offset, offset + len)` of a vector stored as part objects under
/// `prefix` (names from `part_name`). Returns the values and how many of
/// them were covered by some part (the rest are zero).
pub async fn read_range(store: &SharedStore, prefix: &str, offset: u64, len: u64) -> Result<(Vec<f32>, u64)> {
    let mut out = vec![0.0f32; len as usize];
    let mut covered = 0u64;
    let end = offset + len;
    for key in store.list(prefix).await.unwrap_or_default() {
        let Some((o, l)) = parse_part_name(&key) else { continue };
        let (lo, hi) = (o.max(offset), (o + l).min(end));
        if lo >= hi {
            continue;
        }
        let bytes = store.get(&key).await.with_context(|| format!("reading {key}"))?;
        if bytes.len() as u64 != l * 4 {
            bail!("part {key} holds {} bytes, its name says {} values", bytes.len(), l);
        }
        for i in lo..hi {
            let b = ((i - o) * 4) as usize;
            out[(i - offset) as usize] = f32::from_le_bytes(bytes[b..b + 4].try_into().unwrap());
        }
        covered += hi - lo;
    }
    Ok((out, covered))
}

/// Little-endian f32 bytes of `x` (the part objects' format).
pub fn f32_bytes(x: &[f32]) -> Vec<u8> {
    x.iter().flat_map(|v| v.to_le_bytes()).collect()
}
