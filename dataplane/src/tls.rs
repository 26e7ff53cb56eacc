//! TLS for the data plane, bound to node identities.
//!
//! Each miner's certificate is self-signed with its Ed25519 identity key, so
//! the key in the certificate *is* the identity. A peer is accepted only if
//! that key belongs to an identity the control plane published (the
//! `PeerDirectory`), and when dialling, only if it is exactly the identity we
//! meant to reach. There is no "accept any certificate" path. Handshake
//! signatures are checked by rustls' own (webpki) routines, which prove the
//! peer holds the key. The identity-certificate helpers are shared with the
//! control plane (`iota_protocol::tls_identity`).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use parking_lot::RwLock;

use iota_core::{Identity, PeerId};
use iota_protocol::tls_identity::{Signatures, bad_cert, certificate_for};
pub use iota_protocol::tls_identity::{peer_of_cert, provider};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{DigitallySignedStruct, DistinguishedName, SignatureScheme};

/// ALPN protocol id of the data plane.
pub const ALPN: &[u8] = b"iota-dp/1";

/// What the data plane knows of a peer: where to reach it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerEntry {
    pub addr: Option<SocketAddr>,
}

/// The identities this node may talk to, as published by the control plane.
#[derive(Debug, Default)]
pub struct PeerDirectory {
    peers: RwLock<HashMap<PeerId, PeerEntry>>,
}

impl PeerDirectory {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }
    pub fn insert(&self, peer: PeerId, addr: Option<SocketAddr>) {
        self.peers.write().insert(peer, PeerEntry { addr });
    }
    pub fn remove(&self, peer: &PeerId) -> bool {
        self.peers.write().remove(peer).is_some()
    }
    pub fn contains(&self, peer: &PeerId) -> bool {
        self.peers.read().contains_key(peer)
    }
    pub fn addr(&self, peer: &PeerId) -> Option<SocketAddr> {
        self.peers.read().get(peer).and_then(|e| e.addr)
    }
}

/// A self-signed certificate carrying `id`'s key, and that key.
pub fn certificate(id: &Identity) -> anyhow::Result<(CertificateDer<'static>, PrivateKeyDer<'static>)> {
    certificate_for(id, "iota-peer")
}

/// The identity a finished QUIC handshake authenticated.
pub fn peer_of_connection(conn: &quinn::Connection) -> Option<PeerId> {
    let certs = conn.peer_identity()?.downcast::<Vec<CertificateDer<'static>>>().ok()?;
    peer_of_cert(certs.first()?).ok()
}

/// Client side: the server must be exactly `expected`, and published.
#[derive(Debug)]
pub struct ExpectPeer {
    expected: PeerId,
    dir: Arc<PeerDirectory>,
    sig: Signatures,
}

impl ExpectPeer {
    pub fn new(expected: PeerId, dir: Arc<PeerDirectory>, provider: Arc<CryptoProvider>) -> Self {
        ExpectPeer { expected, dir, sig: Signatures(provider) }
    }
}

impl ServerCertVerifier for ExpectPeer {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let peer = peer_of_cert(end_entity)?;
        if peer != self.expected {
            return Err(bad_cert(&format!("server is {peer}, expected {}", self.expected)));
        }
        if !self.dir.contains(&peer) {
            return Err(bad_cert(&format!("server {peer} is not a published peer")));
        }
        Ok(ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.sig.tls12(m, c, d)
    }
    fn verify_tls13_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.sig.tls13(m, c, d)
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.sig.schemes()
    }
}

/// Server side: every client must present a published identity.
#[derive(Debug)]
pub struct PublishedPeers {
    dir: Arc<PeerDirectory>,
    sig: Signatures,
}

impl PublishedPeers {
    pub fn new(dir: Arc<PeerDirectory>, provider: Arc<CryptoProvider>) -> Self {
        PublishedPeers { dir, sig: Signatures(provider) }
    }
}

impl ClientCertVerifier for PublishedPeers {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }
    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _i: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let peer = peer_of_cert(end_entity)?;
        if !self.dir.contains(&peer) {
            return Err(bad_cert(&format!("client {peer} is not a published peer")));
        }
        Ok(ClientCertVerified::assertion())
    }
    fn client_auth_mandatory(&self) -> bool {
        true
    }
    fn verify_tls12_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.sig.tls12(m, c, d)
    }
    fn verify_tls13_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.sig.tls13(m, c, d)
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.sig.schemes()
    }
}

/// rustls server config requiring a published client identity (TLS 1.3).
pub fn server_config(id: &Identity, dir: Arc<PeerDirectory>) -> anyhow::Result<rustls::ServerConfig> {
    let p = provider();
    let (cert, key) = certificate(id)?;
    let mut c = rustls::ServerConfig::builder_with_provider(p.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_client_cert_verifier(Arc::new(PublishedPeers::new(dir, p)))
        .with_single_cert(vec![cert], key)?;
    c.alpn_protocols = vec![ALPN.to_vec()];
    Ok(c)
}

/// rustls client config that presents `id` and accepts only `expected`.
pub fn client_config(id: &Identity, expected: PeerId, dir: Arc<PeerDirectory>) -> anyhow::Result<rustls::ClientConfig> {
    let p = provider();
    let (cert, key) = certificate(id)?;
    let mut c = rustls::ClientConfig::builder_with_provider(p.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(ExpectPeer::new(expected, dir, p)))
        .with_client_auth_cert(vec![cert], key)?;
    c.alpn_protocols = vec![ALPN.to_vec()];
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn certificate_carries_the_identity() {
        let id = Identity::from_seed([9; 32]);
        let (cert, _) = certificate(&id).unwrap();
        assert_eq!(peer_of_cert(&cert).unwrap(), id.peer_id());
        assert!(peer_of_cert(&CertificateDer::from(vec![0x30, 0x03, 0x02, 0x01, 0x00])).is_err());
    }
}
