//! Limits on where requests come from, checked before anything costs a
//! signature check: a budget for the whole server (so a flood from many
//! addresses cannot take every core), a budget per source address (so one
//! host cannot take the whole budget), and a cap on the identities one
//! address may register (a Sybil with one host gets that many, not
//! thousands). Each refusal is a [`Rejected`] the server answers with
//! RESOURCE_EXHAUSTED.
//!
//! Sans-IO: every call takes `now_ms`. Addresses are grouped as an operator
//! would block them: an IPv4 address alone, an IPv6 address by its /64
//! (one host's share of a typical allocation), an IPv4-mapped IPv6 address
//! as its IPv4 address.

use std::collections::{HashMap, HashSet};
use std::hash::Hash;
use std::net::IpAddr;

use iota_core::PeerId;
use parking_lot::Mutex;

use crate::refusal::{Reason, Rejected};

/// Why a token bucket refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exhausted {
    /// The key's bucket is empty.
    Empty,
    /// The key is new and as many keys as allowed are live.
    TooManyKeys,
}

pub(crate) struct Bucket {
    tokens: f64,
    at_ms: u64,
}

/// Token buckets by key, `burst` deep, refilling at `rate_per_s`. A bucket
/// idle for a whole refill is full again, which is the same as none: such
/// buckets are forgotten, so only keys active within one refill count
/// against `max_keys`.
pub struct TokenBuckets<K> {
    rate_per_s: f64,
    burst: f64,
    max_keys: usize,
    pub(crate) map: HashMap<K, Bucket>,
    /// Prune when the map grows past this (amortises the sweep).
    pub(crate) prune_at: usize,
}

impl<K: Hash + Eq + Copy> TokenBuckets<K> {
    pub fn new(rate_per_s: f64, burst: f64, max_keys: usize) -> Self {
        TokenBuckets { rate_per_s, burst, max_keys, map: HashMap::new(), prune_at: 1024 }
    }

    /// Takes one token from `key`'s bucket.
    pub fn take(&mut self, key: K, now_ms: u64) -> Result<(), Exhausted> {
        let refill_ms = (self.burst / self.rate_per_s * 1000.0).ceil() as u64;
        if self.map.len() >= self.prune_at {
            self.map.retain(|_, e| now_ms.saturating_sub(e.at_ms) < refill_ms);
            self.prune_at = self.map.len().saturating_mul(2).max(1024);
        }
        if self.map.len() >= self.max_keys && !self.map.contains_key(&key) {
            return Err(Exhausted::TooManyKeys);
        }
        let e = self.map.entry(key).or_insert(Bucket { tokens: self.burst, at_ms: now_ms });
        let dt = now_ms.saturating_sub(e.at_ms) as f64 / 1000.0;
        e.tokens = (e.tokens + dt * self.rate_per_s).min(self.burst);
        e.at_ms = now_ms.max(e.at_ms);
        if e.tokens < 1.0 {
            return Err(Exhausted::Empty);
        }
        e.tokens -= 1.0;
        Ok(())
    }

    /// Keys with a bucket now (for tests and memory accounting).
    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

/// A source address as limits group it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Source {
    V4([u8; 4]),
    /// The first 64 bits of an IPv6 address.
    V6Prefix([u8; 8]),
}

impl Source {
    pub fn of(ip: IpAddr) -> Source {
        match ip {
            IpAddr::V4(a) => Source::V4(a.octets()),
            IpAddr::V6(a) => match a.to_ipv4_mapped() {
                Some(v4) => Source::V4(v4.octets()),
                None => {
                    let o = a.octets();
                    Source::V6Prefix([o[0], o[1], o[2], o[3], o[4], o[5], o[6], o[7]])
                }
            },
        }
    }
}

/// The server's limits on sources.
#[derive(Clone, Debug)]
pub struct SourcePolicy {
    /// Requests per second from one address (its bucket's refill rate).
    pub per_address_rate_per_s: f64,
    pub per_address_burst: f64,
    /// Requests per second from everyone together.
    pub global_rate_per_s: f64,
    pub global_burst: f64,
    /// Identities one address may register (miners and validators).
    pub identities_per_address: usize,
}

impl Default for SourcePolicy {
    /// Sized for a swarm of hundreds of miners with a few per host: a miner
    /// sends a few requests a second (heartbeats, reports, grants) and each
    /// identity may burst to 400 (auth's per-identity limit), so one host
    /// gets room for several, and the server as a whole a few thousand a
    /// second, far below what its cores verify.
    fn default() -> Self {
        SourcePolicy {
            per_address_rate_per_s: 1_000.0,
            per_address_burst: 2_000.0,
            global_rate_per_s: 10_000.0,
            global_burst: 20_000.0,
            identities_per_address: 64,
        }
    }
}

/// Addresses with a rate bucket at once (past this, requests from new
/// addresses are refused until buckets refill and are forgotten).
pub const MAX_SOURCES: usize = 1 << 16;

/// Per-source and global limits of one server.
pub struct SourceLimits {
    policy: SourcePolicy,
    global: Mutex<TokenBuckets<()>>,
    sources: Mutex<TokenBuckets<Source>>,
    /// Identities registered from each address. Only registrations the run
    /// accepted are entered, so the map is bounded by the run's capacity
    /// times the churn between prunes; `prune_identities` keeps it to the
    /// live members.
    identities: Mutex<HashMap<Source, HashSet<PeerId>>>,
}

impl SourceLimits {
    pub fn new(policy: SourcePolicy) -> Self {
        SourceLimits {
            global: Mutex::new(TokenBuckets::new(policy.global_rate_per_s, policy.global_burst, 1)),
            sources: Mutex::new(TokenBuckets::new(
                policy.per_address_rate_per_s,
                policy.per_address_burst,
                MAX_SOURCES,
            )),
            identities: Mutex::new(HashMap::new()),
            policy,
        }
    }

    pub fn policy(&self) -> &SourcePolicy {
        &self.policy
    }

    /// Admits one request from `ip` (None where the transport gives no
    /// address: counted against the global budget only). The address's own
    /// budget is taken first, so one flooding host empties its bucket, not
    /// the one everybody shares.
    pub fn admit_request(&self, ip: Option<IpAddr>, now_ms: u64) -> Result<(), Rejected> {
        if let Some(ip) = ip {
            match self.sources.lock().take(Source::of(ip), now_ms) {
                Ok(()) => {}
                Err(Exhausted::Empty) => {
                    return Err(Rejected::new(Reason::RateLimited, "too many requests from this address"));
                }
                Err(Exhausted::TooManyKeys) => {
                    return Err(Rejected::new(Reason::RateLimited, "too many source addresses at once; retry shortly"));
                }
            }
        }
        self.global
            .lock()
            .take((), now_ms)
            .map_err(|_| Rejected::new(Reason::RateLimited, "the server is over its request budget; retry shortly"))
    }

    /// May `peer` register from `ip`? An identity already registered from
    /// there always may (re-registration after a restart); a new one only
    /// while the address holds fewer than the cap.
    pub fn admit_identity(&self, ip: Option<IpAddr>, peer: PeerId) -> Result<(), Rejected> {
        let Some(ip) = ip else { return Ok(()) };
        let ids = self.identities.lock();
        match ids.get(&Source::of(ip)) {
            Some(set) if !set.contains(&peer) && set.len() >= self.policy.identities_per_address => Err(Rejected::new(
                Reason::TooManyIdentities,
                format!("this address already holds {} identities, as many as the run takes", set.len()),
            )),
            _ => Ok(()),
        }
    }

    /// Records that `peer` registered from `ip` (after the run accepted it).
    pub fn registered(&self, ip: Option<IpAddr>, peer: PeerId) {
        let Some(ip) = ip else { return };
        let mut ids = self.identities.lock();
        // Another address's entry for the same identity is stale (it moved).
        let source = Source::of(ip);
        for (s, set) in ids.iter_mut() {
            if *s != source {
                set.remove(&peer);
            }
        }
        ids.retain(|_, set| !set.is_empty());
        ids.entry(source).or_default().insert(peer);
    }

    /// Keeps only the identities `live` says are still members.
    pub fn prune_identities(&self, live: impl Fn(&PeerId) -> bool) {
        let mut ids = self.identities.lock();
        for set in ids.values_mut() {
            set.retain(|p| live(p));
        }
        ids.retain(|_, set| !set.is_empty());
    }

    /// Identities recorded, over all addresses.
    pub fn identities_recorded(&self) -> usize {
        self.identities.lock().values().map(HashSet::len).sum()
    }

    /// Addresses with a live rate bucket.
    pub fn sources_tracked(&self) -> usize {
        self.sources.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, Ipv6Addr};

    fn v4(last: u8) -> Option<IpAddr> {
        Some(IpAddr::V4(Ipv4Addr::new(198, 18, 0, last)))
    }

    fn peer(n: u8) -> PeerId {
        PeerId([n; 32])
    }

    fn small() -> SourcePolicy {
        SourcePolicy {
            per_address_rate_per_s: 10.0,
            per_address_burst: 5.0,
            global_rate_per_s: 100.0,
            global_burst: 12.0,
            identities_per_address: 2,
        }
    }

    #[test]
    fn one_address_empties_its_own_bucket_not_the_shared_one() {
        let l = SourceLimits::new(small());
        for _ in 0..5 {
            l.admit_request(v4(1), 0).unwrap();
        }
        let e = l.admit_request(v4(1), 0).unwrap_err();
        assert_eq!(e.reason, Reason::RateLimited);
        // Its refused requests took nothing from the global budget: another
        // address still gets the rest of it (12 - 5 = 7).
        for _ in 0..5 {
            l.admit_request(v4(2), 0).unwrap();
        }
        l.admit_request(v4(3), 0).unwrap();
        l.admit_request(v4(3), 0).unwrap();
        let e = l.admit_request(v4(3), 0).unwrap_err();
        assert!(e.message.contains("request budget"), "{}", e.message);
        // Time refills both: 100 ms is one token for an address, ten globally.
        l.admit_request(v4(1), 100).unwrap();
        assert!(l.admit_request(v4(1), 100).is_err());
    }

    #[test]
    fn many_addresses_cannot_exceed_the_global_budget() {
        let l = SourceLimits::new(small());
        let admitted = (0..200u8).filter(|&i| l.admit_request(v4(i), 0).is_ok()).count();
        assert_eq!(admitted, 12);
    }

    #[test]
    fn ipv6_hosts_are_grouped_by_their_64_and_mapped_v4_is_v4() {
        let a: Ipv6Addr = "2001:db8:1:2::1".parse().unwrap();
        let b: Ipv6Addr = "2001:db8:1:2:ffff::9".parse().unwrap();
        let c: Ipv6Addr = "2001:db8:1:3::1".parse().unwrap();
        assert_eq!(Source::of(a.into()), Source::of(b.into()));
        assert_ne!(Source::of(a.into()), Source::of(c.into()));
        let mapped: Ipv6Addr = "::ffff:198.18.0.7".parse().unwrap();
        assert_eq!(Source::of(mapped.into()), Source::of(v4(7).unwrap()));
    }

    #[test]
    fn an_address_registers_up_to_its_cap_and_a_known_identity_always_comes_back() {
        let l = SourceLimits::new(small());
        for n in 1..=2 {
            l.admit_identity(v4(1), peer(n)).unwrap();
            l.registered(v4(1), peer(n));
        }
        let e = l.admit_identity(v4(1), peer(3)).unwrap_err();
        assert_eq!(e.reason, Reason::TooManyIdentities);
        // A restart of a registered miner is not a new identity.
        l.admit_identity(v4(1), peer(2)).unwrap();
        // Another address has its own cap.
        l.admit_identity(v4(2), peer(3)).unwrap();
        // A member that left frees its place.
        l.prune_identities(|p| *p != peer(1));
        l.admit_identity(v4(1), peer(3)).unwrap();
        // An identity that moves is counted at its new address only.
        l.registered(v4(2), peer(2));
        assert_eq!(l.identities_recorded(), 1);
    }

    #[test]
    fn idle_address_buckets_are_forgotten_and_their_number_is_bounded() {
        let mut b: TokenBuckets<u32> = TokenBuckets::new(10.0, 5.0, 3_000);
        // 5,000 addresses, one request each, spread over 50 s: buckets refill
        // in 0.5 s, so few are live at once.
        for i in 0..5_000u32 {
            b.take(i, u64::from(i) * 10).unwrap();
        }
        assert!(b.len() < 2_100, "{} buckets kept", b.len());
        // 3,000 at once fill the map; the 3,001st is refused, not stored.
        let mut full: TokenBuckets<u32> = TokenBuckets::new(10.0, 5.0, 3_000);
        for i in 0..3_000u32 {
            full.take(i, 0).unwrap();
        }
        assert_eq!(full.take(99_999, 0), Err(Exhausted::TooManyKeys));
        assert_eq!(full.len(), 3_000);
    }
}
