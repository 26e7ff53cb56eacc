//! Grants on the store the orchestrator serves itself (a run with no
//! bucket): what a presigned S3 URL is for a bucket, for the orchestrator's
//! own store endpoint. A grant is a URL naming one key, one method, the
//! body's exact length for a PUT and an expiry, with a keyed BLAKE3 tag
//! over all of them; the tag's key is derived from the orchestrator's
//! identity seed, so grants survive its restart and no one else can mint
//! one. Pure: the orchestrator's store server (`iota-control`) and its
//! tests both read URLs through [`ServedGrant::parse`] and [`GrantKey::check`].

use crate::object_store::check_key;

/// The path every object is served under: `/o/KEY`.
pub const OBJECT_PATH: &str = "/o/";

/// The method a grant allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GrantMethod {
    /// Read the object (whole, or a byte range).
    Get,
    /// Write the object, exactly `len` bytes.
    Put,
}

impl GrantMethod {
    pub fn as_str(self) -> &'static str {
        match self {
            GrantMethod::Get => "GET",
            GrantMethod::Put => "PUT",
        }
    }
}

/// A grant as its URL carries it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServedGrant {
    pub method: GrantMethod,
    /// The object key, decoded and checked by `check_key`.
    pub key: String,
    /// A PUT's exact body length (0 for a GET).
    pub len: u64,
    /// Unix milliseconds after which the grant is refused.
    pub expires_ms: u64,
    pub tag: [u8; 32],
}

/// Why a grant is refused: said to the caller as it is (none of it is secret).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum GrantRefusal {
    #[error("malformed grant: {0}")]
    Malformed(&'static str),
    #[error("the grant expired")]
    Expired,
    #[error("the grant's expiry is further away than any grant is issued for")]
    TooLong,
    #[error("the grant's tag is not the orchestrator's")]
    BadTag,
}

/// The key grants are tagged with. Not `Debug`: it must never reach a log.
pub struct GrantKey([u8; 32]);

impl GrantKey {
    /// The key of an orchestrator whose identity seed is `seed` (a
    /// one-way derivation: a grant shows nothing of the seed).
    pub fn from_identity_seed(seed: &[u8; 32]) -> GrantKey {
        GrantKey(blake3::derive_key("iota-rs 2026 served-store grant tag v1", seed))
    }

    fn tag(&self, method: GrantMethod, key: &str, len: u64, expires_ms: u64) -> [u8; 32] {
        let mut h = blake3::Hasher::new_keyed(&self.0);
        h.update(method.as_str().as_bytes());
        h.update(&[0]);
        h.update(&(key.len() as u64).to_le_bytes());
        h.update(key.as_bytes());
        h.update(&len.to_le_bytes());
        h.update(&expires_ms.to_le_bytes());
        *h.finalize().as_bytes()
    }

    /// The path and query of a grant for `key` (`base` is prepended as
    /// given: `https://HOST:PORT`).
    pub fn mint(&self, base: &str, method: GrantMethod, key: &str, len: u64, expires_ms: u64) -> String {
        let len = if method == GrantMethod::Put { len } else { 0 };
        let tag = self.tag(method, key, len, expires_ms);
        let m = method.as_str().to_ascii_lowercase();
        format!("{base}{OBJECT_PATH}{}?m={m}&n={len}&x={expires_ms}&t={}", encode_key(key), hex(&tag))
    }

    /// Whether `g` was minted by this key and is good at `now_ms` (and
    /// expires within `max_ttl_ms`: a tag over a far expiry is not ours).
    pub fn check(&self, g: &ServedGrant, now_ms: u64, max_ttl_ms: u64) -> Result<(), GrantRefusal> {
        // The tag first, compared in constant time (blake3::Hash's Eq).
        let want = blake3::Hash::from(self.tag(g.method, &g.key, g.len, g.expires_ms));
        if want != blake3::Hash::from(g.tag) {
            return Err(GrantRefusal::BadTag);
        }
        if now_ms > g.expires_ms {
            return Err(GrantRefusal::Expired);
        }
        if g.expires_ms - now_ms > max_ttl_ms {
            return Err(GrantRefusal::TooLong);
        }
        Ok(())
    }
}

impl ServedGrant {
    /// Reads a request's method, path and query (`path_and_query`: what
    /// follows the authority). Hostile input: bounded, every field checked.
    pub fn parse(method: &str, path_and_query: &str) -> Result<ServedGrant, GrantRefusal> {
        if path_and_query.len() > 4096 {
            return Err(GrantRefusal::Malformed("the URL is over 4096 bytes"));
        }
        let (path, query) = path_and_query.split_once('?').ok_or(GrantRefusal::Malformed("no query"))?;
        let key = path.strip_prefix(OBJECT_PATH).ok_or(GrantRefusal::Malformed("not an object path"))?;
        let key = decode_key(key).ok_or(GrantRefusal::Malformed("the key is not percent-encoded UTF-8"))?;
        check_key(&key).map_err(|_| GrantRefusal::Malformed("not a valid object key"))?;
        let (mut m, mut n, mut x, mut t) = (None, None, None, None);
        for pair in query.split('&') {
            let (name, value) = pair.split_once('=').ok_or(GrantRefusal::Malformed("a query field without '='"))?;
            let slot = match name {
                "m" => &mut m,
                "n" => &mut n,
                "x" => &mut x,
                "t" => &mut t,
                _ => return Err(GrantRefusal::Malformed("an unknown query field")),
            };
            if slot.replace(value).is_some() {
                return Err(GrantRefusal::Malformed("a query field given twice"));
            }
        }
        let grant_method = match m {
            Some("get") => GrantMethod::Get,
            Some("put") => GrantMethod::Put,
            _ => return Err(GrantRefusal::Malformed("the method is not get or put")),
        };
        // Both sides must agree: HEAD reads as GET (a HEAD has no body).
        let asked = match method {
            "GET" | "HEAD" => GrantMethod::Get,
            "PUT" => GrantMethod::Put,
            _ => return Err(GrantRefusal::Malformed("the request's method is not GET, HEAD or PUT")),
        };
        if asked != grant_method {
            return Err(GrantRefusal::Malformed("the request's method is not the grant's"));
        }
        let number = |v: Option<&str>, what| {
            v.filter(|s| !s.is_empty() && s.len() <= 20 && s.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|s| s.parse::<u64>().ok())
                .ok_or(GrantRefusal::Malformed(what))
        };
        let len = number(n, "the length is not a number")?;
        let expires_ms = number(x, "the expiry is not a number")?;
        let tag = t.and_then(unhex).ok_or(GrantRefusal::Malformed("the tag is not 64 hex digits"))?;
        Ok(ServedGrant { method: grant_method, key, len, expires_ms, tag })
    }
}

fn hex(b: &[u8; 32]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Option<[u8; 32]> {
    if s.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// A key as a URL path: unreserved characters and '/' as they are, every
/// other byte `%XX`.
pub fn encode_key(key: &str) -> String {
    let mut out = String::with_capacity(key.len());
    for b in key.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~' | b'/') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The inverse of `encode_key` (None: a bad escape or not UTF-8).
pub fn decode_key(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hexpair = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hexpair, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: u64 = 15 * 60 * 1000;

    fn parse_url(url: &str, method: &str) -> Result<ServedGrant, GrantRefusal> {
        let rest = url.strip_prefix("https://h:1").unwrap();
        ServedGrant::parse(method, rest)
    }

    #[test]
    fn a_minted_grant_checks_and_any_change_to_it_is_refused() {
        let k = GrantKey::from_identity_seed(&[7; 32]);
        let key = "epoch-000001/stage-000/a b%?#é.st";
        let url = k.mint("https://h:1", GrantMethod::Put, key, 1234, 10_000);
        let g = parse_url(&url, "PUT").unwrap();
        assert_eq!((g.key.as_str(), g.len, g.expires_ms, g.method), (key, 1234, 10_000, GrantMethod::Put));
        assert_eq!(k.check(&g, 9_000, TTL), Ok(()));
        assert_eq!(k.check(&g, 10_001, TTL), Err(GrantRefusal::Expired));
        assert_eq!(k.check(&g, 0, 5_000), Err(GrantRefusal::TooLong));
        // Another key, length, expiry or method: the tag no longer holds.
        for changed in [
            ServedGrant { key: "epoch-000001/stage-000/other.st".into(), ..g.clone() },
            ServedGrant { len: 1235, ..g.clone() },
            ServedGrant { expires_ms: 10_001, ..g.clone() },
            ServedGrant { method: GrantMethod::Get, len: 0, ..g.clone() },
        ] {
            assert_eq!(k.check(&changed, 9_000, TTL), Err(GrantRefusal::BadTag), "{changed:?}");
        }
        // Another orchestrator's key.
        assert_eq!(GrantKey::from_identity_seed(&[8; 32]).check(&g, 9_000, TTL), Err(GrantRefusal::BadTag));
        // A PUT grant used for a GET, and the reverse.
        assert!(parse_url(&url, "GET").is_err());
        let get = k.mint("https://h:1", GrantMethod::Get, key, 99, 10_000);
        assert!(parse_url(&get, "PUT").is_err());
        let g = parse_url(&get, "HEAD").unwrap();
        assert_eq!(g.len, 0, "a GET grant names no length");
        assert_eq!(k.check(&g, 9_000, TTL), Ok(()));
    }

    #[test]
    fn hostile_urls_are_refused_without_panicking() {
        let k = GrantKey::from_identity_seed(&[1; 32]);
        let good = k.mint("", GrantMethod::Get, "a/b", 0, 5);
        assert!(ServedGrant::parse("GET", &good).is_ok());
        let tag = good.rsplit_once("t=").unwrap().1.to_string();
        let long = format!("/o/{}?m=get&n=0&x=5&t={tag}", "a".repeat(5000));
        for bad in [
            "/o/a/b".to_string(),
            format!("/x/a/b?m=get&n=0&x=5&t={tag}"),
            format!("/o/../etc?m=get&n=0&x=5&t={tag}"),
            format!("/o/a//b?m=get&n=0&x=5&t={tag}"),
            format!("/o/a%2?m=get&n=0&x=5&t={tag}"),
            format!("/o/a%FF?m=get&n=0&x=5&t={tag}"),
            format!("/o/a?m=get&n=0&x=5&t={tag}&t={tag}"),
            format!("/o/a?m=get&n=-1&x=5&t={tag}"),
            format!("/o/a?m=get&n=0&x=99999999999999999999999&t={tag}"),
            format!("/o/a?m=delete&n=0&x=5&t={tag}"),
            "/o/a?m=get&n=0&x=5&t=zz".to_string(),
            "/o/a?m=get&n=0&x=5&t=ééééééééééééééééééééééééééééééééé".to_string(),
            format!("/o/a?m=get&n=0&x=5&t={tag}&y=1"),
            "/o/a?m=get&n=0&x=5&t".to_string(),
            long,
        ] {
            assert!(ServedGrant::parse("GET", &bad).is_err(), "{bad}");
        }
        assert!(ServedGrant::parse("DELETE", &good).is_err());
    }

    #[test]
    fn keys_survive_their_url_encoding() {
        for key in ["a/b.c", "a b", "x%41", "ü/ß", "q?r#s&t=u", "~_-."] {
            let enc = encode_key(key);
            assert!(enc.bytes().all(|b| b.is_ascii_graphic() && !b"?#& ".contains(&b)), "{enc}");
            assert_eq!(decode_key(&enc).as_deref(), Some(key));
        }
    }
}
