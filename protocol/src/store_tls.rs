//! TLS of the run's object store over HTTPS, as granted URLs reach it: a
//! bucket with a public (or an operator's CA's) certificate, or the store
//! the orchestrator serves itself with its identity certificate. One
//! client configuration takes both: a certificate carrying the
//! orchestrator's key (which the caller learnt from its signed `Hello`), or
//! a chain to the given roots for the URL's host.

use std::sync::Arc;

use iota_core::{Identity, PeerId};
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};

use crate::tls_identity::{CONTROL_SERVER_NAME, Signatures, certificate_for, peer_of_cert, provider};

/// The orchestrator's store endpoint: its identity certificate, HTTP/1.1,
/// TLS 1.3.
pub fn server_config(id: &Identity) -> anyhow::Result<rustls::ServerConfig> {
    let (cert, key) = certificate_for(id, CONTROL_SERVER_NAME)?;
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_no_client_auth()
        .with_single_cert(vec![cert], key)?;
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(cfg)
}

/// The store endpoint with an operator's CA-issued certificate (PEM chain
/// and key), as `--tls-cert` gives the control plane.
pub fn server_config_pem(cert: &std::path::Path, key: &std::path::Path) -> anyhow::Result<rustls::ServerConfig> {
    let mut cfg = crate::tls_identity::server_config_pem(cert, key)?;
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(cfg)
}

/// Accepts the orchestrator's identity certificate, or else a chain to the
/// roots for the host asked for.
#[derive(Debug)]
struct OrchestratorOrRoots {
    orchestrator: PeerId,
    roots: Option<Arc<WebPkiServerVerifier>>,
    sig: Signatures,
}

impl ServerCertVerifier for OrchestratorOrRoots {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        if peer_of_cert(end_entity).is_ok_and(|p| p == self.orchestrator) {
            return Ok(ServerCertVerified::assertion());
        }
        match &self.roots {
            Some(v) => v.verify_server_cert(end_entity, intermediates, server_name, ocsp, now),
            None => Err(crate::tls_identity::bad_cert(
                "the store's certificate is neither the orchestrator's nor one a trusted CA issued",
            )),
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

/// A client of granted URLs: the orchestrator's own store (its identity
/// certificate, `orchestrator`'s key) or a bucket whose chain leads to
/// `roots` (none: the orchestrator's store only).
pub fn client_config(orchestrator: PeerId, roots: rustls::RootCertStore) -> anyhow::Result<rustls::ClientConfig> {
    let provider = provider();
    let roots = if roots.is_empty() {
        None
    } else {
        Some(WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone()).build()?)
    };
    let verifier = Arc::new(OrchestratorOrRoots { orchestrator, roots, sig: Signatures(provider.clone()) });
    // No ALPN here: the HTTPS connector names the protocol it speaks.
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A TLS handshake over an in-memory pipe: the store server of
    /// `server`, a client trusting `orchestrator` (no CA roots).
    async fn handshake(server: &Identity, orchestrator: PeerId) -> Result<(), String> {
        let (a, b) = tokio::io::duplex(1 << 16);
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server_config(server).unwrap()));
        let connector = tokio_rustls::TlsConnector::from(Arc::new(
            client_config(orchestrator, rustls::RootCertStore::empty()).unwrap(),
        ));
        let name = ServerName::try_from("198.18.0.11").unwrap();
        let (_server_side, c) = tokio::join!(acceptor.accept(a), connector.connect(name, b));
        c.map(|_| ()).map_err(|e| e.to_string())
    }

    #[tokio::test]
    async fn the_store_client_takes_the_orchestrators_certificate_and_no_other() {
        let orchestrator = Identity::from_seed([5; 32]);
        let impostor = Identity::from_seed([6; 32]);
        assert_eq!(handshake(&orchestrator, orchestrator.peer_id()).await, Ok(()));
        let e = handshake(&impostor, orchestrator.peer_id()).await.unwrap_err();
        assert!(e.contains("neither the orchestrator's"), "{e}");
    }
}
