//! An S3-compatible server for tests (`s3s-fs` on 127.0.0.1, its own
//! temporary directory, its own credentials), the `ObjectStore`
//! conformance suite every store implementation must pass, and a minimal
//! HTTP/1.1 client for presigned URLs (what a credential-less miner does).

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use iota_control::s3_store::{Presigned, S3Location, S3Secret, S3Store};
use iota_protocol::object_store::ObjectStore;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

pub const ACCESS_KEY: &str = "iota-test-access";
pub const SECRET_KEY: &str = "iota-test-secret-not-for-production";

/// Where the `s3s-fs` binary is: `$IOTA_S3S_FS`, what `scripts/test.sh`
/// installs under `target/tools/bin`, or `PATH`.
pub fn s3s_fs_binary() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("IOTA_S3S_FS") {
        return Some(PathBuf::from(p));
    }
    let installed = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/tools/bin/s3s-fs");
    if installed.exists() {
        return Some(installed);
    }
    std::env::var_os("PATH")?.to_str()?.split(':').map(|d| PathBuf::from(d).join("s3s-fs")).find(|p| p.exists())
}

/// A running `s3s-fs`, killed when dropped.
pub struct S3Server {
    child: Child,
    pub endpoint: String,
    _root: tempfile::TempDir,
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl S3Server {
    /// Starts one on a free loopback port, or says why not and gives None
    /// (the caller skips; `scripts/test.sh` installs the binary, so CI
    /// never skips).
    pub fn start() -> Option<S3Server> {
        let Some(bin) = s3s_fs_binary() else {
            eprintln!("skipped: s3s-fs not found (scripts/test.sh installs it; or set IOTA_S3S_FS)");
            return None;
        };
        let root = tempfile::tempdir().unwrap();
        // A free port: bind, read, release (s3s-fs takes a port number).
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let child = Command::new(&bin)
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args(["--access-key", ACCESS_KEY, "--secret-key", SECRET_KEY])
            .arg(root.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", bin.display()));
        let server = S3Server { child, endpoint: format!("http://127.0.0.1:{port}"), _root: root };
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "s3s-fs did not listen on port {port} within 10 s");
            std::thread::sleep(Duration::from_millis(20));
        }
        Some(server)
    }

    /// A store on this server, in `bucket` (made if needed) under `prefix`.
    pub async fn store(&self, bucket: &str, prefix: &str) -> S3Store {
        let loc = S3Location::parse(
            &format!("s3://{bucket}/{prefix}"),
            Some(self.endpoint.clone()),
            "us-east-1".into(),
            true,
        )
        .unwrap();
        let s = S3Store::new(loc, S3Secret { access_key: ACCESS_KEY.into(), secret_key: SECRET_KEY.into() });
        s.ensure_bucket().await.unwrap();
        s
    }
}

/// What came back from a presigned request: the status and the body.
pub struct HttpReply {
    pub status: u16,
    pub body: Vec<u8>,
}

/// Sends a presigned request over plain HTTP/1.1 (loopback test servers
/// only), with `body` for a PUT, and reads the whole reply.
pub async fn send_presigned(p: &Presigned, body: &[u8]) -> std::io::Result<HttpReply> {
    let rest = p.url.strip_prefix("http://").ok_or_else(|| std::io::Error::other("only http:// in tests"))?;
    let (host, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let mut s = tokio::net::TcpStream::connect(host).await?;
    let mut req = format!("{} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n", p.method);
    for (k, v) in &p.headers {
        if !k.eq_ignore_ascii_case("content-length") {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
    }
    if p.method == "PUT" {
        req.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).await?;
    if p.method == "PUT" {
        s.write_all(body).await?;
    }
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut raw)).await.map_err(std::io::Error::other)??;
    let text_end = raw.windows(4).position(|w| w == b"\r\n\r\n").ok_or_else(|| std::io::Error::other("no headers"))?;
    let head = String::from_utf8_lossy(&raw[..text_end]).to_string();
    let status =
        head.split(' ').nth(1).and_then(|c| c.parse().ok()).ok_or_else(|| std::io::Error::other(head.clone()))?;
    let mut body = raw[text_end + 4..].to_vec();
    if head.to_ascii_lowercase().contains("transfer-encoding: chunked") {
        body = dechunk(&body);
    }
    Ok(HttpReply { status, body })
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(eol) = b.windows(2).position(|w| w == b"\r\n") {
        let n = usize::from_str_radix(String::from_utf8_lossy(&b[..eol]).trim(), 16).unwrap_or(0);
        if n == 0 {
            break;
        }
        out.extend_from_slice(&b[eol + 2..eol + 2 + n]);
        b = &b[eol + 2 + n + 2..];
    }
    out
}

/// The behaviour every `ObjectStore` must show: what is put is got back
/// whole, a missing key is `NotFound` (never empty bytes), listings are
/// the direct children in order, keys that could escape are refused, an
/// overwrite replaces, and a large object survives the trip.
pub async fn conformance(store: &dyn ObjectStore, large: usize) {
    store.put("e1/stage-000/a.st", vec![1, 2, 3]).await.unwrap();
    store.put("e1/stage-000/b.st", vec![]).await.unwrap();
    store.put("e1/stage-000/deeper/c.st", vec![9]).await.unwrap();
    assert_eq!(store.get("e1/stage-000/a.st").await.unwrap(), vec![1, 2, 3]);
    assert_eq!(store.get("e1/stage-000/b.st").await.unwrap(), Vec::<u8>::new(), "an empty object is not missing");
    let missing = store.get("e1/stage-000/missing.st").await.unwrap_err();
    assert_eq!(missing.kind(), std::io::ErrorKind::NotFound, "{missing}");
    assert_eq!(
        store.list("e1/stage-000/").await.unwrap(),
        vec!["e1/stage-000/a.st", "e1/stage-000/b.st"],
        "direct children only, sorted"
    );
    assert!(store.list("nothing/").await.unwrap().is_empty());
    store.put("e1/stage-000/a.st", vec![4]).await.unwrap();
    assert_eq!(store.get("e1/stage-000/a.st").await.unwrap(), vec![4], "an overwrite replaces");
    for k in ["", "/etc/passwd", "../x", "a/../../x", "a//b", "a/./b", "a\\b"] {
        assert!(store.put(k, vec![1]).await.is_err(), "put {k:?}");
        assert!(store.get(k).await.is_err(), "get {k:?}");
    }
    // Bytes that are not a pattern a short read could fake.
    let big: Vec<u8> = (0..large).map(|i| (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15).to_le_bytes()[7]).collect();
    store.put("e2/big.bin", big.clone()).await.unwrap();
    let back = store.get("e2/big.bin").await.unwrap();
    assert_eq!(back.len(), big.len());
    assert!(back == big, "the large object came back changed");
}
