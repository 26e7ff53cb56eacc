//! A sparse row's kept indices, Elias-Fano coded (issue 57): each index
//! `i` of a block splits into its `l` low bits, packed in turn, and its
//! high part `i >> l`, written in unary as one set bit at `(i >> l) + n`
//! for the n-th index of a bitvector `k + SPARSE_BLOCK >> l` bits long
//! (`iota_core::codec::sparse_index_bytes`). With `l` log2 of the mean gap
//! an index costs about `l + 2` bits, 6 at 1/16 against a u16's 16, and
//! the size depends only on `k`, so a row's length is fixed by the run's
//! density. A range read finds its first index by counting zeros of the
//! bitvector (one per high value passed), without decoding what is before.
//!
//! Everything read is hostile: the reader only yields what the bits say;
//! the row's decoder checks the count, the order, the range and that no
//! padding bit is set.

// Store and network bytes: no unchecked arithmetic or indexing.
#![cfg_attr(not(test), deny(clippy::arithmetic_side_effects, clippy::indexing_slicing))]

use iota_core::codec::{sparse_index_bytes, sparse_low_bits};

/// Appends the index sections of `order` (a row's kept indices; a valid
/// row's rise strictly and stay below the block, which the encoder does
/// not check so tests can write hostile rows with it).
pub fn write(order: &[u32], out: &mut Vec<u8>) {
    let k = order.len();
    let l = sparse_low_bits(k);
    let (low_bytes, high_bytes) = sparse_index_bytes(k);
    let mut low = vec![0u8; low_bytes];
    let mut high = vec![0u8; high_bytes];
    let mask = (1u32 << l).wrapping_sub(1);
    for (n, &i) in order.iter().enumerate() {
        put_bits(&mut low, n.saturating_mul(l as usize), l, i & mask);
        let at = ((i >> l) as usize).saturating_add(n);
        if let Some(b) = high.get_mut(at / 8) {
            *b |= 1u8 << (at % 8);
        }
    }
    out.extend_from_slice(&low);
    out.extend_from_slice(&high);
}

/// Writes the `width` low bits of `v` at bit `at` of `bytes` (low bits
/// first; the bits there are zero).
fn put_bits(bytes: &mut [u8], at: usize, width: u32, v: u32) {
    let mut word = u32::from_le_bytes(window(bytes, at / 8));
    word |= (v & (1u32 << width).wrapping_sub(1)).checked_shl((at % 8) as u32).unwrap_or(0);
    for (j, b) in word.to_le_bytes().iter().enumerate().take(3) {
        if let Some(dst) = bytes.get_mut((at / 8).saturating_add(j)) {
            *dst = *b;
        }
    }
}

/// Up to three bytes from `from` (zeros past the end) as a little-endian
/// word: enough for 14 bits at any bit offset.
fn window(bytes: &[u8], from: usize) -> [u8; 4] {
    let mut w = [0u8; 4];
    for (j, dst) in w.iter_mut().enumerate().take(3) {
        *dst = bytes.get(from.saturating_add(j)).copied().unwrap_or(0);
    }
    w
}

/// The `width` bits at bit `at` (zeros past the end).
fn get_bits(bytes: &[u8], at: usize, width: u32) -> u32 {
    let word = u32::from_le_bytes(window(bytes, at / 8));
    word.checked_shr((at % 8) as u32).unwrap_or(0) & (1u32 << width).wrapping_sub(1)
}

/// The indices a row's two sections name, in order, as the bits say them
/// (every set bit of the high bitvector yields one, padding included: the
/// caller checks the count, the order and the range).
pub struct Reader<'a> {
    low: &'a [u8],
    high: &'a [u8],
    l: u32,
    /// Set bits yielded so far: the index of the next one.
    n: usize,
    /// The high bitvector's byte being read, and its bits not yet read.
    byte: usize,
    bits: u8,
}

impl<'a> Reader<'a> {
    /// The reader of a row's index sections for `k` kept values (`None`
    /// where `sections` is shorter than they are).
    pub fn new(sections: &'a [u8], k: usize) -> Option<Self> {
        let (low_bytes, high_bytes) = sparse_index_bytes(k);
        let low = sections.get(..low_bytes)?;
        let high = sections.get(low_bytes..low_bytes.checked_add(high_bytes)?)?;
        Some(Reader { low, high, l: sparse_low_bits(k), n: 0, byte: 0, bits: high.first().copied().unwrap_or(0) })
    }

    /// The same reader moved past every index whose high part is below
    /// `off >> l` (so past no index at or after `off`): it skips whole bytes
    /// of the bitvector while they hold fewer zeros than high values to
    /// pass, counting their set bits. Returns it with the count passed.
    pub fn seek(mut self, off: usize) -> Self {
        let mut zeros_to_pass = off.checked_shr(self.l).unwrap_or(0);
        for (at, b) in self.high.iter().enumerate() {
            let zeros = b.count_zeros() as usize;
            if zeros >= zeros_to_pass {
                self.byte = at;
                self.bits = *b;
                return self;
            }
            zeros_to_pass = zeros_to_pass.saturating_sub(zeros);
            self.n = self.n.saturating_add(b.count_ones() as usize);
        }
        self.byte = self.high.len();
        self.bits = 0;
        self
    }

    /// Set bits in the low section past `k` values' bits (a canonical row
    /// has none).
    pub fn low_padding_set(&self, k: usize) -> bool {
        let used = k.saturating_mul(self.l as usize);
        let total = self.low.len().saturating_mul(8);
        (used..total).any(|at| get_bits(self.low, at, 1) != 0)
    }
}

impl Iterator for Reader<'_> {
    /// The index's place in the row (its code's) and the index; `None`
    /// for one whose high part overflows (no bit of a row's length can
    /// make it, but the arithmetic is checked all the same).
    type Item = (usize, Option<usize>);

    fn next(&mut self) -> Option<(usize, Option<usize>)> {
        while self.bits == 0 {
            self.byte = self.byte.checked_add(1)?;
            self.bits = *self.high.get(self.byte)?;
        }
        let pos = self.byte.checked_mul(8)?.checked_add(self.bits.trailing_zeros() as usize)?;
        self.bits &= self.bits.wrapping_sub(1);
        let n = self.n;
        self.n = n.saturating_add(1);
        let low = get_bits(self.low, n.saturating_mul(self.l as usize), self.l) as usize;
        Some((n, pos.checked_sub(n).and_then(|h| h.checked_shl(self.l)).map(|h| h | low)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use iota_core::codec::SPARSE_BLOCK;

    fn read(bytes: &[u8], k: usize) -> Vec<usize> {
        Reader::new(bytes, k).unwrap().enumerate().map(|(j, (n, i))| (assert_eq!(j, n), i.unwrap()).1).collect()
    }

    /// Any rising indices read back as written, at every density's split
    /// (from 14 low bits down to none), and the sections have the size the
    /// shared formula says.
    #[test]
    fn indices_read_back_at_every_split() {
        let mut s = 0x2545_F491_4F6C_DD1Du64;
        for k in [1, 2, 3, 7, 100, 512, 1000, 1024, 4096, 9000, SPARSE_BLOCK - 1, SPARSE_BLOCK] {
            // k distinct indices: a random subset, sorted.
            let mut all: Vec<u32> = (0..SPARSE_BLOCK as u32).collect();
            for j in 0..k {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                let pick = j + (s as usize) % (SPARSE_BLOCK - j);
                all.swap(j, pick);
            }
            let mut order = all[..k].to_vec();
            order.sort_unstable();
            let mut bytes = Vec::new();
            write(&order, &mut bytes);
            let (low, high) = sparse_index_bytes(k);
            assert_eq!(bytes.len(), low + high, "k {k}");
            let got = read(&bytes, k);
            assert_eq!(got, order.iter().map(|i| *i as usize).collect::<Vec<_>>(), "k {k}");
            assert!(!Reader::new(&bytes, k).unwrap().low_padding_set(k), "k {k}");
            // Extremes: the first and the last indices of the block.
            let edge: Vec<u32> = (0..k as u32).chain(SPARSE_BLOCK as u32 - k as u32..SPARSE_BLOCK as u32).collect();
            for part in [&edge[..k], &edge[k..]] {
                let mut b = Vec::new();
                write(part, &mut b);
                assert_eq!(read(&b, k), part.iter().map(|i| *i as usize).collect::<Vec<_>>(), "k {k} edge");
            }
        }
    }

    /// A seek passes only indices below its offset (none at or after it)
    /// and stops within a byte of the bitvector of the first one that is
    /// not: what it yields is the rising list's tail from there.
    #[test]
    fn seeks_pass_only_what_lies_before() {
        let order: Vec<u32> = (0..1024u32).map(|j| j * 16 + (j * 7) % 16).collect();
        let all: Vec<usize> = order.iter().map(|i| *i as usize).collect();
        let mut bytes = Vec::new();
        write(&order, &mut bytes);
        for off in [0usize, 1, 15, 16, 17, 1000, 4096, 8191, 16_000, 16_383, 16_384, 40_000] {
            let seek = Reader::new(&bytes, 1024).unwrap().seek(off);
            let rest: Vec<(usize, usize)> = seek.map(|(n, i)| (n, i.unwrap())).collect();
            assert!(rest.iter().all(|(n, i)| all[*n] == *i), "off {off}: each index's place");
            let rest: Vec<usize> = rest.into_iter().map(|(_, i)| i).collect();
            let at_or_after = all.iter().filter(|i| **i >= off).count();
            assert_eq!(rest[..], all[all.len() - rest.len()..], "off {off}: a tail");
            assert!(rest.len() >= at_or_after && rest.len() <= at_or_after + 8, "off {off}: {}", rest.len());
        }
    }

    /// Hostile sections: short ones give no reader, set padding bits are
    /// seen, and junk reads as whatever it says without a panic.
    #[test]
    fn hostile_sections_never_panic() {
        let k = 100;
        let (low, high) = sparse_index_bytes(k);
        assert!(Reader::new(&vec![0u8; low + high - 1], k).is_none());
        let mut bytes = vec![0u8; low + high];
        assert!(Reader::new(&bytes, k).unwrap().next().is_none(), "no set bit, no index");
        bytes[low - 1] = 0x80;
        let used = k * sparse_low_bits(k) as usize;
        assert_eq!(Reader::new(&bytes, k).unwrap().low_padding_set(k), used < low * 8);
        let mut s = 7u64;
        for _ in 0..200 {
            let junk: Vec<u8> = (0..low + high)
                .map(|_| {
                    s = s.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                    (s >> 56) as u8
                })
                .collect();
            let r = Reader::new(&junk, k).unwrap();
            assert!(r.count() <= 8 * high);
            let _ = Reader::new(&junk, k).unwrap().seek((s % 20_000) as usize).count();
        }
    }
}
