//! The object store as a miner without credentials sees it: every put, get
//! and list first asks the orchestrator for a grant (`Grant`: a presigned
//! URL for that one key, or the listing itself), then speaks plain HTTP(S)
//! to the bucket. The orchestrator refuses a PUT the merge did not ask of
//! this miner, so a miner cannot overwrite another's objects.

use std::io;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use iota_protocol::client::ControlClient;
use iota_protocol::manifest::MAX_OBJECT_BYTES;
use iota_protocol::object_store::{ObjectStore, StoreFuture, check_key};
use iota_protocol::pb;

type Https = hyper_rustls::HttpsConnector<HttpConnector>;

/// How long one HTTP request to the bucket may take, body included.
const HTTP_TIMEOUT: Duration = Duration::from_secs(300);

pub struct GrantedStore {
    control: ControlClient,
    http: Client<Https, Full<Bytes>>,
}

fn status_err(e: tonic::Status) -> io::Error {
    let kind = match e.code() {
        tonic::Code::PermissionDenied => io::ErrorKind::PermissionDenied,
        tonic::Code::InvalidArgument => io::ErrorKind::InvalidInput,
        _ => io::ErrorKind::Other,
    };
    io::Error::new(kind, format!("no grant from the orchestrator: {}", e.message()))
}

impl GrantedStore {
    pub fn new(control: ControlClient) -> io::Result<Self> {
        let tls = rustls::ClientConfig::builder_with_provider(rustls::crypto::ring::default_provider().into())
            .with_safe_default_protocol_versions()
            .map_err(io::Error::other)?;
        let mut roots = rustls::RootCertStore::empty();
        // The system's CAs (buckets speak HTTPS with public certificates);
        // none is fine for a loopback test bucket over plain HTTP.
        let found = rustls_native_certs::load_native_certs();
        roots.add_parsable_certificates(found.certs);
        let tls = tls.with_root_certificates(roots).with_no_client_auth();
        let https =
            hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(tls).https_or_http().enable_http1().build();
        Ok(GrantedStore { control, http: Client::builder(TokioExecutor::new()).build(https) })
    }

    async fn one(&self, key: &str, access: pb::Access, size: u64) -> io::Result<pb::Grant> {
        let ask = pb::GrantAsk { key: key.to_string(), access: access as i32, size };
        let mut grants = self.control.clone().grant(vec![ask]).await.map_err(status_err)?;
        grants.pop().ok_or_else(|| io::Error::other("the orchestrator sent no grant"))
    }

    /// Sends the presigned request; the reply's status and body (at most
    /// `limit` bytes).
    async fn send(&self, g: &pb::Grant, body: Vec<u8>, limit: u64) -> io::Result<(u16, Vec<u8>)> {
        let mut req = hyper::Request::builder().method(g.method.as_str()).uri(g.url.as_str());
        for h in &g.headers {
            // The body sets its own length.
            if !h.name.eq_ignore_ascii_case("content-length") {
                req = req.header(h.name.as_str(), h.value.as_str());
            }
        }
        let req =
            req.body(Full::new(Bytes::from(body))).map_err(|e| io::Error::other(format!("presigned URL: {e}")))?;
        let exchange = async {
            let resp = self.http.request(req).await.map_err(|e| io::Error::other(format!("the bucket: {e}")))?;
            let status = resp.status().as_u16();
            let limit = usize::try_from(limit).unwrap_or(usize::MAX);
            let bytes = Limited::new(resp.into_body(), limit)
                .collect()
                .await
                .map_err(|e| io::Error::other(format!("the bucket's reply: {e}")))?
                .to_bytes();
            Ok::<_, io::Error>((status, bytes.to_vec()))
        };
        tokio::time::timeout(HTTP_TIMEOUT, exchange)
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, format!("the bucket took over {HTTP_TIMEOUT:?}")))?
    }
}

fn http_err(op: &str, key: &str, status: u16, body: &[u8]) -> io::Error {
    let kind = match status {
        404 => io::ErrorKind::NotFound,
        403 => io::ErrorKind::PermissionDenied,
        _ => io::ErrorKind::Other,
    };
    // S3 error bodies are short XML; show a bounded, printable part.
    let text: String = String::from_utf8_lossy(body).chars().filter(|c| !c.is_control()).take(200).collect();
    io::Error::new(kind, format!("{op} {key}: HTTP {status} {text}"))
}

impl ObjectStore for GrantedStore {
    fn put<'a>(&'a self, key: &'a str, data: Vec<u8>) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            check_key(key)?;
            let g = self.one(key, pb::Access::Put, data.len() as u64).await?;
            let (status, body) = self.send(&g, data, 64 << 10).await?;
            if !(200..300).contains(&status) {
                return Err(http_err("put", key, status, &body));
            }
            Ok(())
        })
    }

    fn get<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Vec<u8>> {
        Box::pin(async move {
            check_key(key)?;
            let g = self.one(key, pb::Access::Get, 0).await?;
            let (status, body) = self.send(&g, Vec::new(), MAX_OBJECT_BYTES).await?;
            if status != 200 {
                return Err(http_err("get", key, status, &body));
            }
            Ok(body)
        })
    }

    fn list<'a>(&'a self, prefix: &'a str) -> StoreFuture<'a, Vec<String>> {
        Box::pin(async move {
            check_key(prefix.trim_end_matches('/'))?;
            let g = self.one(prefix, pb::Access::List, 0).await?;
            // The listing comes from the orchestrator's signed reply; keys
            // are still only names, checked where they are used.
            Ok(g.listed.into_iter().filter(|k| k.starts_with(prefix) && check_key(k).is_ok()).collect())
        })
    }
}
