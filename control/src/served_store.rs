//! The run's store served by the orchestrator itself, for a run with no
//! bucket: `RUN_DIR/store` over HTTPS (its identity certificate, or the
//! operator's `--tls-cert`) on a port of its own, reached through the same
//! `Grant` RPC as a bucket. The Grant RPC decides who may touch which key
//! (the same rules as for S3); this server only checks that a request
//! carries a grant the orchestrator minted (`iota_protocol::served_grant`),
//! still good, for that key, method and length. Objects stream both ways:
//! a GET is read from disk a piece at a time (byte ranges too), a PUT is
//! written as it arrives into a temporary file, synced, then renamed into
//! place, so a reader never sees half an object.

use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Full, StreamBody, combinators::BoxBody};
use hyper::body::{Frame, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use iota_protocol::object_store::ObjectStore;
use iota_protocol::served_grant::{GrantKey, GrantMethod, ServedGrant};
use tokio::io::{AsyncReadExt, AsyncSeekExt, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::s3_store::Presigned;

/// Connections served at once; further ones wait in the kernel's backlog.
const MAX_CONNECTIONS: usize = 256;
/// A client gets this long for its TLS handshake and its request's head.
const HEAD_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest gap between two pieces of a request's or a reply's body.
const BODY_IDLE: Duration = Duration::from_secs(60);
/// A GET's body is read from disk and sent this much at a time.
const PIECE: usize = 1 << 20;
/// Slack on a grant's expiry for clocks (the orchestrator's own, here).
const EXPIRY_SLACK_MS: u64 = 60_000;

type Body = BoxBody<Bytes, io::Error>;

/// The orchestrator's store: its directory, the key its grants are
/// tagged with, and the URL miners reach it at.
pub struct ServedStore {
    root: PathBuf,
    dir: iota_dataplane::local_store::LocalDirStore,
    key: GrantKey,
    base: String,
}

impl ServedStore {
    /// The store in `root`, tagging grants with `id`'s derived key; `base`
    /// is how miners reach the server (`https://HOST:PORT`).
    pub fn new(root: &Path, id: &iota_core::Identity, base: String) -> io::Result<ServedStore> {
        let dir = iota_dataplane::local_store::LocalDirStore::open(root, iota_dataplane::fileio::FileIo::start(false))?;
        Ok(ServedStore { root: root.to_path_buf(), dir, key: GrantKey::from_identity_seed(id.seed()), base })
    }

    pub fn base(&self) -> &str {
        &self.base
    }

    /// A grant to GET `key` (`put_len: None`) or PUT exactly `put_len`
    /// bytes under it, good until `expires_ms`.
    pub fn presign(&self, key: &str, put_len: Option<u64>, expires_ms: u64) -> io::Result<Presigned> {
        iota_protocol::object_store::check_key(key)?;
        let (method, len) = match put_len {
            Some(n) => (GrantMethod::Put, n),
            None => (GrantMethod::Get, 0),
        };
        let url = self.key.mint(&self.base, method, key, len, expires_ms);
        let headers = match put_len {
            Some(n) => vec![("content-length".to_string(), n.to_string())],
            None => Vec::new(),
        };
        Ok(Presigned { method: method.as_str().to_string(), url, headers })
    }

    /// The keys directly under `prefix`, as a bucket's listing.
    pub async fn list(&self, prefix: &str) -> io::Result<Vec<String>> {
        self.dir.list(prefix).await
    }
}

/// Where the Grant RPC presigns: a bucket, or the orchestrator's own store.
#[derive(Clone)]
pub enum Presigner {
    S3(Arc<crate::s3_store::S3Store>),
    Served(Arc<ServedStore>),
}

impl Presigner {
    pub async fn list(&self, prefix: &str) -> io::Result<Vec<String>> {
        match self {
            Presigner::S3(s) => s.list(prefix).await,
            Presigner::Served(s) => s.list(prefix).await,
        }
    }

    /// The grants for `asks` (checked by the caller as the caller's),
    /// good for `ttl`: a listing's keys, or a presigned request.
    pub async fn grants(
        &self,
        asks: Vec<iota_protocol::pb::GrantAsk>,
        ttl: Duration,
    ) -> io::Result<Vec<iota_protocol::pb::Grant>> {
        use iota_protocol::pb;
        let expires_ms = iota_protocol::auth::now_ms().saturating_add(ttl.as_millis() as u64);
        let mut grants = Vec::with_capacity(asks.len());
        for a in asks {
            let mut g = pb::Grant { key: a.key.clone(), access: a.access, expires_ms, ..Default::default() };
            let presigned = match a.access() {
                pb::Access::List => {
                    g.listed = self.list(&a.key).await?;
                    None
                }
                pb::Access::Put => Some(self.presign(&a.key, Some(a.size), ttl).await?),
                _ => Some(self.presign(&a.key, None, ttl).await?),
            };
            if let Some(p) = presigned {
                g.method = p.method;
                g.url = p.url;
                g.headers = p.headers.into_iter().map(|(name, value)| pb::HttpHeader { name, value }).collect();
            }
            grants.push(g);
        }
        Ok(grants)
    }

    /// A GET grant (`put_len` None) or a PUT of exactly `put_len` bytes.
    pub async fn presign(&self, key: &str, put_len: Option<u64>, ttl: Duration) -> io::Result<Presigned> {
        match (self, put_len) {
            (Presigner::S3(s), Some(n)) => s.presign_put(key, n, ttl).await,
            (Presigner::S3(s), None) => s.presign_get(key, ttl).await,
            (Presigner::Served(s), _) => {
                let expires = iota_protocol::auth::now_ms().saturating_add(ttl.as_millis() as u64);
                s.presign(key, put_len, expires)
            }
        }
    }
}

/// Serves `store` on `listener` (over `tls` unless None: plaintext, for
/// `--insecure-plaintext` runs) until the task is aborted.
pub fn serve(
    listener: TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
    store: Arc<ServedStore>,
    max_ttl: Duration,
) -> tokio::task::JoinHandle<()> {
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
    tokio::spawn(async move {
        loop {
            let Ok(permit) = slots.clone().acquire_owned().await else { return };
            let (tcp, from) = match listener.accept().await {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(error = %e, "accepting a store connection failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let (store, acceptor) = (store.clone(), acceptor.clone());
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req| answer(store.clone(), req, max_ttl));
                let http = hyper::server::conn::http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(HEAD_TIMEOUT)
                    .keep_alive(true)
                    .clone();
                let served = match acceptor {
                    Some(a) => match tokio::time::timeout(HEAD_TIMEOUT, a.accept(tcp)).await {
                        Ok(Ok(tls)) => http.serve_connection(TokioIo::new(tls), service).await,
                        _ => {
                            tracing::debug!(%from, "a store connection's TLS handshake failed or stalled");
                            return;
                        }
                    },
                    None => http.serve_connection(TokioIo::new(tcp), service).await,
                };
                if let Err(e) = served {
                    tracing::debug!(%from, error = %e, "a store connection ended in error");
                }
                drop(permit);
            });
        }
    })
}

fn text(status: StatusCode, msg: impl Into<String>) -> Response<Body> {
    let body = Full::new(Bytes::from(msg.into() + "\n")).map_err(|e: std::convert::Infallible| match e {}).boxed();
    let mut r = Response::new(body);
    *r.status_mut() = status;
    r.headers_mut().insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static("text/plain"));
    r
}

/// One request: its grant checked, then the object read or written.
async fn answer(
    store: Arc<ServedStore>,
    req: Request<Incoming>,
    max_ttl: Duration,
) -> Result<Response<Body>, std::convert::Infallible> {
    let target = req.uri().path_and_query().map_or("", |p| p.as_str()).to_string();
    let grant = match ServedGrant::parse(req.method().as_str(), &target) {
        Ok(g) => g,
        Err(e) if req.method() == Method::GET || req.method() == Method::HEAD || req.method() == Method::PUT => {
            return Ok(text(StatusCode::BAD_REQUEST, e.to_string()));
        }
        Err(_) => return Ok(text(StatusCode::METHOD_NOT_ALLOWED, "GET, HEAD or PUT with a grant")),
    };
    let now = iota_protocol::auth::now_ms();
    let max_ttl_ms = (max_ttl.as_millis() as u64).saturating_add(EXPIRY_SLACK_MS);
    if let Err(e) = store.key.check(&grant, now.saturating_sub(EXPIRY_SLACK_MS), max_ttl_ms) {
        return Ok(text(StatusCode::FORBIDDEN, e.to_string()));
    }
    let path = store.root.join(&grant.key);
    Ok(match grant.method {
        GrantMethod::Get => get(&path, &req).await,
        GrantMethod::Put => put(&path, grant.len, req).await,
    })
}

/// A `Range` header that cannot be served (416).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Unsatisfiable;

/// The byte range a `Range` header asks of an object of `len` bytes:
/// `Ok(None)` for the whole object.
pub fn byte_range(header: Option<&str>, len: u64) -> Result<Option<(u64, u64)>, Unsatisfiable> {
    let Some(h) = header else { return Ok(None) };
    let spec = h.trim().strip_prefix("bytes=").ok_or(Unsatisfiable)?;
    // One range only (what a resuming download asks).
    let (a, b) = spec.split_once('-').ok_or(Unsatisfiable)?;
    let num = |s: &str| -> Result<u64, Unsatisfiable> {
        if s.is_empty() || s.len() > 20 || !s.bytes().all(|c| c.is_ascii_digit()) {
            return Err(Unsatisfiable);
        }
        s.parse().map_err(|_| Unsatisfiable)
    };
    let (first, last) = match (a.is_empty(), b.is_empty()) {
        // The last `b` bytes.
        (true, false) => {
            let n = num(b)?.min(len);
            if n == 0 {
                return Err(Unsatisfiable);
            }
            (len - n, len - 1)
        }
        (false, true) => (num(a)?, len.saturating_sub(1)),
        (false, false) => (num(a)?, num(b)?.min(len.saturating_sub(1))),
        (true, true) => return Err(Unsatisfiable),
    };
    if first >= len || first > last {
        return Err(Unsatisfiable);
    }
    Ok(Some((first, last)))
}

async fn get(path: &Path, req: &Request<Incoming>) -> Response<Body> {
    let mut file = match tokio::fs::File::open(path).await {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return text(StatusCode::NOT_FOUND, "no such object"),
        Err(e) => return text(StatusCode::INTERNAL_SERVER_ERROR, format!("reading the object: {e}")),
    };
    let len = match file.metadata().await {
        Ok(m) if m.is_file() => m.len(),
        _ => return text(StatusCode::NOT_FOUND, "no such object"),
    };
    let range_header = req.headers().get(hyper::header::RANGE).and_then(|v| v.to_str().ok());
    let range = match byte_range(range_header, len) {
        Ok(r) => r,
        Err(Unsatisfiable) => {
            let mut r = text(StatusCode::RANGE_NOT_SATISFIABLE, "unsatisfiable range");
            if let Ok(v) = format!("bytes */{len}").parse() {
                r.headers_mut().insert(hyper::header::CONTENT_RANGE, v);
            }
            return r;
        }
    };
    let (first, last) = range.unwrap_or((0, len.saturating_sub(1)));
    let count = if len == 0 { 0 } else { last - first + 1 };
    let mut builder = Response::builder()
        .header(hyper::header::CONTENT_LENGTH, count)
        .header(hyper::header::ACCEPT_RANGES, "bytes")
        .header(hyper::header::CONTENT_TYPE, "application/octet-stream");
    builder = match range {
        Some(_) => builder
            .status(StatusCode::PARTIAL_CONTENT)
            .header(hyper::header::CONTENT_RANGE, format!("bytes {first}-{last}/{len}")),
        None => builder.status(StatusCode::OK),
    };
    if req.method() == Method::HEAD || count == 0 {
        return builder
            .body(Empty::new().map_err(|e: std::convert::Infallible| match e {}).boxed())
            .unwrap_or_else(|e| text(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()));
    }
    if first > 0
        && let Err(e) = file.seek(io::SeekFrom::Start(first)).await
    {
        return text(StatusCode::INTERNAL_SERVER_ERROR, format!("reading the object: {e}"));
    }
    // A reader task a piece ahead of the connection: memory stays at two
    // pieces however large the object.
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, io::Error>>(1);
    tokio::spawn(async move {
        let mut left = count;
        while left > 0 {
            let mut buf = vec![0u8; (left as usize).min(PIECE)];
            let piece = match file.read_exact(&mut buf).await {
                Ok(_) => Ok(Frame::data(Bytes::from(buf))),
                Err(e) => Err(e),
            };
            let failed = piece.is_err();
            left -= if failed { left } else { (left as usize).min(PIECE) as u64 };
            match tokio::time::timeout(BODY_IDLE, tx.send(piece)).await {
                Ok(Ok(())) if !failed => {}
                _ => return,
            }
        }
    });
    let body = StreamBody::new(tokio_stream::wrappers::ReceiverStream::new(rx)).boxed();
    builder.body(body).unwrap_or_else(|e| text(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))
}

async fn put(path: &Path, len: u64, req: Request<Incoming>) -> Response<Body> {
    let declared = req
        .headers()
        .get(hyper::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared != Some(len) {
        return text(
            StatusCode::BAD_REQUEST,
            format!("the body must be exactly the granted {len} bytes (Content-Length)"),
        );
    }
    match write_streamed(path, len, req.into_body()).await {
        Ok(()) => text(StatusCode::OK, "stored"),
        Err(e) if e.kind() == io::ErrorKind::InvalidData => text(StatusCode::BAD_REQUEST, e.to_string()),
        Err(e) if e.kind() == io::ErrorKind::TimedOut => text(StatusCode::REQUEST_TIMEOUT, e.to_string()),
        Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, format!("storing the object: {e}")),
    }
}

/// Writes exactly `len` bytes of `body` to `path`: into a temporary file
/// beside it, synced, then renamed (the temporary file is removed when
/// anything fails).
async fn write_streamed(path: &Path, len: u64, mut body: Incoming) -> io::Result<()> {
    static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    if let Some(dir) = path.parent() {
        tokio::fs::create_dir_all(dir).await?;
    }
    let n = WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".served-{}-{n}.tmp", std::process::id()));
    let tmp = PathBuf::from(tmp);
    let result = async {
        let mut file = tokio::fs::File::create(&tmp).await?;
        let mut written = 0u64;
        loop {
            let frame = match tokio::time::timeout(BODY_IDLE, body.frame()).await {
                Err(_) => return Err(io::Error::new(io::ErrorKind::TimedOut, "the upload stalled")),
                Ok(None) => break,
                Ok(Some(f)) => f.map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("the upload: {e}")))?,
            };
            let Ok(data) = frame.into_data() else { continue };
            written += data.len() as u64;
            if written > len {
                return Err(io::Error::new(io::ErrorKind::InvalidData, "the body is longer than granted"));
            }
            file.write_all(&data).await?;
        }
        if written != len {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{written} of the granted {len} bytes came"),
            ));
        }
        file.sync_all().await?;
        drop(file);
        tokio::fs::rename(&tmp, path).await
    }
    .await;
    if result.is_err() {
        let _ = tokio::fs::remove_file(&tmp).await;
    }
    result
}

/// Binds the store's port: `addr`, or else the control plane's port + 1 on
/// the same address (an ephemeral one when the control plane's is).
pub async fn bind(addr: Option<SocketAddr>, control: SocketAddr) -> anyhow::Result<TcpListener> {
    use anyhow::Context;
    let addr = addr.unwrap_or_else(|| {
        let port = if control.port() == 0 { 0 } else { control.port().saturating_add(1) };
        SocketAddr::new(control.ip(), port)
    });
    TcpListener::bind(addr).await.with_context(|| format!("binding the store's port {addr} (see --store-listen)"))
}

#[cfg(test)]
mod tests {
    use super::{Unsatisfiable, byte_range};

    #[test]
    fn byte_ranges_are_read_as_http_says_and_bad_ones_refused() {
        assert_eq!(byte_range(None, 10), Ok(None));
        assert_eq!(byte_range(Some("bytes=0-"), 10), Ok(Some((0, 9))));
        assert_eq!(byte_range(Some("bytes=4-"), 10), Ok(Some((4, 9))));
        assert_eq!(byte_range(Some("bytes=2-5"), 10), Ok(Some((2, 5))));
        assert_eq!(byte_range(Some("bytes=2-50"), 10), Ok(Some((2, 9))));
        assert_eq!(byte_range(Some("bytes=-3"), 10), Ok(Some((7, 9))));
        assert_eq!(byte_range(Some("bytes=-30"), 10), Ok(Some((0, 9))));
        for bad in
            ["bytes=10-", "bytes=5-4", "bytes=-0", "bytes=-", "items=0-1", "bytes=a-b", "bytes=0-1,3-4", "bytes=1"]
        {
            assert_eq!(byte_range(Some(bad), 10), Err(Unsatisfiable), "{bad}");
        }
        assert_eq!(byte_range(Some("bytes=0-"), 0), Err(Unsatisfiable));
    }
}
