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

/// Attempts at one store operation while the bucket or the orchestrator is
/// unreachable or answers 5xx/429; the waits between them double from
/// `FIRST_BACKOFF` (with full jitter), about 12 s in all.
const ATTEMPTS: u32 = 6;
const FIRST_BACKOFF: Duration = Duration::from_millis(200);

/// Whether an error is worth another attempt: the bucket or the
/// orchestrator could not be reached or was overloaded, not a refusal or a
/// missing object.
fn transient(e: &io::Error) -> bool {
    match e.kind() {
        io::ErrorKind::NotFound
        | io::ErrorKind::PermissionDenied
        | io::ErrorKind::InvalidInput
        | io::ErrorKind::InvalidData => false,
        io::ErrorKind::TimedOut
        | io::ErrorKind::ConnectionRefused
        | io::ErrorKind::ConnectionReset
        | io::ErrorKind::ConnectionAborted
        | io::ErrorKind::BrokenPipe
        | io::ErrorKind::UnexpectedEof => true,
        _ => e.get_ref().is_some_and(|inner| inner.is::<Transient>()),
    }
}

/// Marks an error `transient` retries.
#[derive(Debug)]
struct Transient(String);

impl std::fmt::Display for Transient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Transient {}

fn transient_err(msg: String) -> io::Error {
    io::Error::other(Transient(msg))
}

/// Runs `op` until it succeeds, fails for good, or `ATTEMPTS` are spent.
async fn with_retries<T, F, Fut>(what: &str, key: &str, op: F) -> io::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = io::Result<T>>,
{
    retrying(ATTEMPTS, FIRST_BACKOFF, what, key, op).await
}

/// Store operations retried in this process (the miner's metrics).
static STORE_RETRIES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Store operations retried in this process so far.
pub fn store_retries() -> u64 {
    STORE_RETRIES.load(std::sync::atomic::Ordering::Relaxed)
}

async fn retrying<T, F, Fut>(attempts: u32, first: Duration, what: &str, key: &str, mut op: F) -> io::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = io::Result<T>>,
{
    let mut wait = first;
    // Jitter from the clock: many miners retrying one bucket spread out.
    let mut rng = iota_core::Rng::new(
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64),
    );
    for attempt in 1..=attempts {
        match op().await {
            Err(e) if attempt < attempts && transient(&e) => {
                STORE_RETRIES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                tracing::debug!(what, key, attempt, error = %e, "store operation failed; retrying");
                tokio::time::sleep(wait.mul_f32(rng.next_f32())).await;
                wait = wait.saturating_mul(2);
            }
            done => return done,
        }
    }
    Err(io::Error::other(format!("{what} {key}: no attempt made")))
}

pub struct GrantedStore {
    control: ControlClient,
    http: Client<Https, Full<Bytes>>,
}

fn status_err(e: tonic::Status) -> io::Error {
    let msg = format!("no grant from the orchestrator: {}", e.message());
    match e.code() {
        tonic::Code::PermissionDenied => io::Error::new(io::ErrorKind::PermissionDenied, msg),
        tonic::Code::InvalidArgument => io::Error::new(io::ErrorKind::InvalidInput, msg),
        // The orchestrator (or the bucket behind a listing) unreachable or busy.
        tonic::Code::Unavailable
        | tonic::Code::DeadlineExceeded
        | tonic::Code::ResourceExhausted
        | tonic::Code::Cancelled
        | tonic::Code::Unknown => transient_err(msg),
        _ => io::Error::other(msg),
    }
}

impl GrantedStore {
    /// Granted URLs over HTTPS to a bucket with a certificate from the
    /// system's CAs, or to the store the orchestrator serves itself (its
    /// identity certificate, the key `control` checked in `Hello`).
    pub fn new(control: ControlClient) -> io::Result<Self> {
        Self::with_roots(control, None)
    }

    /// Like `new`, also trusting `extra` (the operator's CA of `--tls-ca`).
    pub fn with_roots(control: ControlClient, extra: Option<&rustls::RootCertStore>) -> io::Result<Self> {
        let mut roots = rustls::RootCertStore::empty();
        // The system's CAs (buckets speak HTTPS with public certificates);
        // none is fine for a loopback test bucket over plain HTTP.
        let found = rustls_native_certs::load_native_certs();
        roots.add_parsable_certificates(found.certs);
        if let Some(extra) = extra {
            roots.roots.extend(extra.roots.iter().cloned());
        }
        let orchestrator = control.audience().orchestrator;
        let tls = iota_protocol::store_tls::client_config(orchestrator, roots).map_err(io::Error::other)?;
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
    async fn send(&self, g: &pb::Grant, body: Bytes, limit: u64) -> io::Result<(u16, Vec<u8>)> {
        let mut req = hyper::Request::builder().method(g.method.as_str()).uri(g.url.as_str());
        for h in &g.headers {
            // The body sets its own length.
            if !h.name.eq_ignore_ascii_case("content-length") {
                req = req.header(h.name.as_str(), h.value.as_str());
            }
        }
        let req = req.body(Full::new(body)).map_err(|e| io::Error::other(format!("presigned URL: {e}")))?;
        let exchange = async {
            let resp = self.http.request(req).await.map_err(|e| transient_err(format!("the bucket: {e}")))?;
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
    // S3 error bodies are short XML; show a bounded, printable part.
    let text: String = String::from_utf8_lossy(body).chars().filter(|c| !c.is_control()).take(200).collect();
    let msg = format!("{op} {key}: HTTP {status} {text}");
    match status {
        404 => io::Error::new(io::ErrorKind::NotFound, msg),
        403 => io::Error::new(io::ErrorKind::PermissionDenied, msg),
        // Overloaded or failing for now (S3's SlowDown, InternalError).
        429 | 500..=599 => transient_err(msg),
        _ => io::Error::other(msg),
    }
}

impl ObjectStore for GrantedStore {
    fn put<'a>(&'a self, key: &'a str, data: Vec<u8>) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            check_key(key)?;
            let (len, data) = (data.len() as u64, Bytes::from(data));
            with_retries("put", key, || async {
                // A fresh grant each attempt: one that lapsed mid-outage is no good.
                let g = self.one(key, pb::Access::Put, len).await?;
                let (status, body) = self.send(&g, data.clone(), 64 << 10).await?;
                if !(200..300).contains(&status) {
                    return Err(http_err("put", key, status, &body));
                }
                Ok(())
            })
            .await
        })
    }

    fn get<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Vec<u8>> {
        Box::pin(async move {
            check_key(key)?;
            with_retries("get", key, || async {
                let g = self.one(key, pb::Access::Get, 0).await?;
                let (status, body) = self.send(&g, Bytes::new(), MAX_OBJECT_BYTES).await?;
                if status != 200 {
                    return Err(http_err("get", key, status, &body));
                }
                Ok(body)
            })
            .await
        })
    }

    fn list<'a>(&'a self, prefix: &'a str) -> StoreFuture<'a, Vec<String>> {
        Box::pin(async move {
            check_key(prefix.trim_end_matches('/'))?;
            let g = with_retries("list", prefix, || self.one(prefix, pb::Access::List, 0)).await?;
            // The listing comes from the orchestrator's signed reply; keys
            // are still only names, checked where they are used.
            Ok(g.listed.into_iter().filter(|k| k.starts_with(prefix) && check_key(k).is_ok()).collect())
        })
    }
}

/// The run's object store as a miner or validator reaches it: through
/// grants (a bucket, or the orchestrator's own store), or the directory it
/// was given (`dir`: `--store`) where the run allows one.
pub fn open_run_store(
    access: iota_protocol::run_config::StoreAccess,
    dir: Option<&std::path::Path>,
    control: &ControlClient,
    tls_ca: Option<&std::path::Path>,
) -> anyhow::Result<iota_protocol::SharedStore> {
    use anyhow::Context;
    use iota_protocol::run_config::StoreAccess;
    let granted = || -> anyhow::Result<iota_protocol::SharedStore> {
        let roots = tls_ca.map(iota_protocol::tls_identity::load_ca_roots).transpose()?;
        let store = GrantedStore::with_roots(control.clone(), roots.as_deref())
            .context("the HTTPS client for the run's store")?;
        Ok(std::sync::Arc::new(store))
    };
    let local = |dir: &std::path::Path| {
        crate::local_store::LocalDirStore::shared(dir, crate::fileio::FileIo::start(false))
            .with_context(|| format!("opening the object store {}", dir.display()))
    };
    match (access, dir) {
        (StoreAccess::Granted, dir) => {
            if let Some(dir) = dir {
                tracing::warn!(dir = %dir.display(), "this run's store is a bucket reached through grants; --store is ignored");
            }
            granted()
        }
        // On the orchestrator's machine the directory itself is quicker
        // than its server (and trusted alike: it is the same files).
        (StoreAccess::Served, Some(dir)) => local(dir),
        (StoreAccess::Served, None) => granted(),
        (StoreAccess::Directory, Some(dir)) => local(dir),
        (StoreAccess::Directory, None) => anyhow::bail!(
            "no object store: this run keeps its objects in a directory on the orchestrator's machine; give \
             --store DIR (iota-control orchestrator prints it)"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[test]
    fn transient_failures_are_retried_and_refusals_are_not() {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let first = Duration::from_millis(1);
            // Two transient failures (a 503, a refused connection), then success.
            let calls = AtomicU32::new(0);
            let got = retrying(6, first, "get", "k", || async {
                match calls.fetch_add(1, Ordering::SeqCst) {
                    0 => Err(http_err("get", "k", 503, b"SlowDown")),
                    1 => Err(io::Error::from(io::ErrorKind::ConnectionRefused)),
                    _ => Ok(7),
                }
            })
            .await;
            assert_eq!(got.unwrap(), 7);
            assert_eq!(calls.load(Ordering::SeqCst), 3);
            // A missing object, a refused grant, a 403: once, as they are.
            for e in [
                http_err("get", "k", 404, b""),
                http_err("put", "k", 403, b""),
                status_err(tonic::Status::permission_denied("not yours")),
                status_err(tonic::Status::invalid_argument("bad key")),
            ] {
                let kind = e.kind();
                let calls = AtomicU32::new(0);
                let mut once = Some(e);
                let r: io::Result<()> = retrying(6, first, "get", "k", || {
                    calls.fetch_add(1, Ordering::SeqCst);
                    let e = once.take().unwrap_or_else(|| io::Error::other("called twice"));
                    async move { Err(e) }
                })
                .await;
                assert_eq!(r.unwrap_err().kind(), kind);
                assert_eq!(calls.load(Ordering::SeqCst), 1);
            }
            // An orchestrator that stays unreachable: every attempt, then its error.
            let calls = AtomicU32::new(0);
            let r: io::Result<()> = retrying(4, first, "list", "p/", || async {
                calls.fetch_add(1, Ordering::SeqCst);
                Err(status_err(tonic::Status::unavailable("the bucket is down")))
            })
            .await;
            assert!(r.unwrap_err().to_string().contains("the bucket is down"));
            assert_eq!(calls.load(Ordering::SeqCst), 4);
        });
    }
}
