//! A join token: the orchestrator's address and its identity key in one
//! string a miner or validator can be handed (`iota://KEY@HOST:PORT`). With
//! it the joiner connects over TLS and pins the key: the token is all it
//! needs to trust the right orchestrator, and nothing in it is secret (the
//! key is public; admission is by the joiner's own identity).

use std::fmt;

use iota_core::PeerId;

const SCHEME: &str = "iota://";

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JoinToken {
    /// The orchestrator's identity (64 hex in the token).
    pub key: PeerId,
    /// Where it listens: `HOST:PORT` (a name, an IPv4 address or a
    /// bracketed IPv6 address).
    pub authority: String,
}

impl JoinToken {
    /// The token of an orchestrator at `url` (`https://HOST:PORT`) with `key`.
    pub fn new(url: &str, key: PeerId) -> Result<JoinToken, String> {
        let authority = url
            .strip_prefix("https://")
            .ok_or_else(|| format!("a join token needs an https:// orchestrator URL, not {url:?}"))?
            .trim_end_matches('/');
        check_authority(authority)?;
        Ok(JoinToken { key, authority: authority.to_string() })
    }

    pub fn parse(s: &str) -> Result<JoinToken, String> {
        let rest = s
            .trim()
            .strip_prefix(SCHEME)
            .ok_or_else(|| format!("a join token starts with {SCHEME} (iota://KEY@HOST:PORT), got {s:?}"))?;
        let (key, authority) =
            rest.split_once('@').ok_or_else(|| "a join token is iota://KEY@HOST:PORT: no '@'".to_string())?;
        let key = PeerId::from_hex(key)
            .ok_or_else(|| format!("the join token's key {key:?} is not an identity (64 hex characters)"))?;
        let authority = authority.trim_end_matches('/');
        check_authority(authority)?;
        Ok(JoinToken { key, authority: authority.to_string() })
    }

    /// The orchestrator's URL (always TLS).
    pub fn url(&self) -> String {
        format!("https://{}", self.authority)
    }
}

/// `HOST:PORT` with a port and nothing else (no path, user or query).
fn check_authority(a: &str) -> Result<(), String> {
    let bad = || format!("{a:?} is not HOST:PORT");
    let (host, port) = a.rsplit_once(':').ok_or_else(bad)?;
    port.parse::<u16>().map_err(|_| bad())?;
    let host_ok = !host.is_empty()
        && host.len() <= 255
        && (host.starts_with('[') && host.ends_with(']')
            || host.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-'));
    if !host_ok {
        return Err(bad());
    }
    Ok(())
}

impl fmt::Display for JoinToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{SCHEME}{}@{}", self.key.to_hex(), self.authority)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_round_trips_and_carries_the_url_and_key() {
        let key = PeerId([7; 32]);
        for url in ["https://198.18.0.11:7100", "https://orch.example.org:443/", "https://[2001:db8::1]:7100"] {
            let t = JoinToken::new(url, key).unwrap();
            let back = JoinToken::parse(&t.to_string()).unwrap();
            assert_eq!(back, t);
            assert_eq!(back.url(), url.trim_end_matches('/'));
            assert_eq!(back.key, key);
        }
    }

    #[test]
    fn malformed_tokens_are_refused_saying_why() {
        let k = PeerId([7; 32]).to_hex();
        for (s, why) in [
            (format!("https://{k}@h:1"), "starts with"),
            (format!("iota://{k}h:1"), "no '@'"),
            ("iota://abc@h:1".to_string(), "64 hex"),
            (format!("iota://{k}@h"), "HOST:PORT"),
            (format!("iota://{k}@h:99999"), "HOST:PORT"),
            (format!("iota://{k}@h:1/path"), "HOST:PORT"),
            (format!("iota://{k}@user@h:1"), "HOST:PORT"),
        ] {
            let e = JoinToken::parse(&s).unwrap_err();
            assert!(e.contains(why), "{s}: {e}");
        }
        assert!(JoinToken::new("http://h:1", PeerId([1; 32])).unwrap_err().contains("https://"));
    }
}
