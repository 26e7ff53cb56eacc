//! TLS certificates that *are* identities: each node's certificate is
//! self-signed with its Ed25519 identity key, so the key in the certificate
//! is the peer id. Shared by the data plane (QUIC between miners) and the
//! control plane (gRPC to the orchestrator, whose key miners pin).
//!
//! The control plane's side is here too: [`server_config`] for the
//! orchestrator and [`client_config`] for a caller that accepts exactly the
//! pinned orchestrator key. There is no "accept any certificate" path:
//! without a pin, a caller still requires an identity certificate and then
//! checks the signed `Hello` against what it is told to trust.

use std::sync::Arc;

use iota_core::{Identity, PeerId};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, verify_tls12_signature, verify_tls13_signature};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};

/// DER of an Ed25519 SubjectPublicKeyInfo, up to the 32 key bytes.
const ED25519_SPKI_PREFIX: [u8; 12] = [0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00];

/// The name the orchestrator's certificate carries and callers ask for (the
/// key, not the name, is what is checked).
pub const CONTROL_SERVER_NAME: &str = "iota-orchestrator";

/// The crypto provider of every TLS session (ring), chosen explicitly.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A self-signed certificate carrying `id`'s key, for `name`, and that key.
pub fn certificate_for(id: &Identity, name: &str) -> anyhow::Result<(CertificateDer<'static>, PrivateKeyDer<'static>)> {
    let der = PrivatePkcs8KeyDer::from(id.pkcs8_der());
    let kp = rcgen::KeyPair::from_pkcs8_der_and_sign_algo(&der, &rcgen::PKCS_ED25519)?;
    let params = rcgen::CertificateParams::new(vec![name.to_string()])?;
    let cert = params.self_signed(&kp)?;
    Ok((cert.der().clone(), PrivateKeyDer::Pkcs8(der)))
}

/// The identity whose key a certificate carries.
pub fn peer_of_cert(cert: &CertificateDer<'_>) -> Result<PeerId, rustls::Error> {
    let ee = webpki::EndEntityCert::try_from(cert).map_err(|_| bad_cert("unparsable certificate"))?;
    let spki = ee.subject_public_key_info();
    let key = spki
        .as_ref()
        .strip_prefix(ED25519_SPKI_PREFIX.as_slice())
        .and_then(|k| <[u8; 32]>::try_from(k).ok())
        .ok_or_else(|| bad_cert("certificate key is not an Ed25519 identity key"))?;
    Ok(PeerId(key))
}

pub fn bad_cert(msg: &str) -> rustls::Error {
    rustls::Error::General(msg.to_string())
}

/// Verifies handshake signatures with the provider's algorithms (which
/// proves the peer holds the certificate's key).
#[derive(Debug)]
pub struct Signatures(pub Arc<CryptoProvider>);

impl Signatures {
    pub fn tls12(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(m, c, d, &self.0.signature_verification_algorithms)
    }
    pub fn tls13(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(m, c, d, &self.0.signature_verification_algorithms)
    }
    pub fn schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// A caller's check of the orchestrator's certificate: an identity
/// certificate, and the pinned key when there is one.
#[derive(Debug)]
struct PinnedServer {
    pinned: Option<PeerId>,
    sig: Signatures,
}

impl ServerCertVerifier for PinnedServer {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let server = peer_of_cert(end_entity)?;
        match self.pinned {
            Some(p) if p != server => {
                Err(bad_cert(&format!("the orchestrator's key is {}, not the pinned {}", server.to_hex(), p.to_hex())))
            }
            _ => Ok(ServerCertVerified::assertion()),
        }
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

/// The orchestrator's TLS: its identity certificate, HTTP/2 only, TLS 1.3.
pub fn server_config(id: &Identity) -> anyhow::Result<rustls::ServerConfig> {
    let (cert, key) = certificate_for(id, CONTROL_SERVER_NAME)?;
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_no_client_auth()
        .with_single_cert(vec![cert], key)?;
    cfg.alpn_protocols = vec![b"h2".to_vec()];
    Ok(cfg)
}

/// A caller's TLS to the orchestrator: accepts the `pinned` key only (any
/// identity certificate without a pin), HTTP/2, TLS 1.3.
pub fn client_config(pinned: Option<PeerId>) -> anyhow::Result<rustls::ClientConfig> {
    let provider = provider();
    let verifier = Arc::new(PinnedServer { pinned, sig: Signatures(provider.clone()) });
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    cfg.alpn_protocols = vec![b"h2".to_vec()];
    Ok(cfg)
}

/// An operator's CA-issued certificate for the orchestrator, instead of its
/// identity certificate: `cert` holds the chain (leaf first) and `key` its
/// private key, both PEM. Callers then check the chain against their CA
/// roots and the URL's host name ([`client_config_ca`]); the orchestrator's
/// key is still checked in `Hello` and in every signed reply.
pub fn server_config_pem(cert: &std::path::Path, key: &std::path::Path) -> anyhow::Result<rustls::ServerConfig> {
    use anyhow::Context;
    use rustls::pki_types::pem::PemObject;
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .with_context(|| format!("reading {}", cert.display()))?
        .collect::<Result<_, _>>()
        .with_context(|| format!("{}: not a PEM certificate chain", cert.display()))?;
    anyhow::ensure!(!chain.is_empty(), "{} holds no certificate", cert.display());
    let key = PrivateKeyDer::from_pem_file(key).with_context(|| format!("{}: no PEM private key", key.display()))?;
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .context("the certificate and the key do not make a TLS identity")?;
    cfg.alpn_protocols = vec![b"h2".to_vec()];
    Ok(cfg)
}

/// The CA certificates (PEM) a caller trusts for an orchestrator with a
/// CA-issued certificate.
pub fn load_ca_roots(path: &std::path::Path) -> anyhow::Result<Arc<rustls::RootCertStore>> {
    use anyhow::Context;
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(path).with_context(|| format!("reading {}", path.display()))? {
        let c = c.with_context(|| format!("{}: not a PEM certificate", path.display()))?;
        roots.add(c).with_context(|| format!("{}: a certificate rustls cannot use as a root", path.display()))?;
    }
    anyhow::ensure!(!roots.is_empty(), "{} holds no CA certificate", path.display());
    Ok(Arc::new(roots))
}

/// A caller's TLS to an orchestrator with a CA-issued certificate: the
/// chain must lead to one of `roots` and name the host the caller dialled
/// (webpki), HTTP/2, TLS 1.3.
pub fn client_config_ca(roots: Arc<rustls::RootCertStore>) -> anyhow::Result<rustls::ClientConfig> {
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_root_certificates(roots)
        .with_no_client_auth();
    cfg.alpn_protocols = vec![b"h2".to_vec()];
    Ok(cfg)
}
