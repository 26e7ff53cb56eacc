//! The object store on any S3-compatible service (AWS S3, R2, MinIO,
//! s3s-fs): the orchestrator's. It is the only role that holds the
//! credentials; miners and validators get presigned URLs for exactly the
//! keys they may touch ([`S3Store::presign_get`], [`S3Store::presign_put`]).
//!
//! Large objects go up in parts (multipart upload, aborted on failure, so
//! no half-written object is ever visible); downloads that break off resume
//! from the byte they reached, pinned to the same object version by its
//! ETag. Requests are retried by the SDK with exponential backoff and
//! jitter. Contents are checked by their BLAKE3 announcements where they are
//! read (see `StoredObject`), not here.

use std::io;
use std::time::Duration;

use aws_sdk_s3::config::{
    BehaviorVersion, Credentials, Region, RequestChecksumCalculation, ResponseChecksumValidation, retry::RetryConfig,
    timeout::TimeoutConfig,
};
use aws_sdk_s3::error::ProvideErrorMetadata;
use aws_sdk_s3::presigning::PresigningConfig;
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::{CompletedMultipartUpload, CompletedPart};
use iota_protocol::object_store::{ObjectStore, StoreFuture, check_key};

/// Objects above this size go up in parts of this size (S3 takes 5 MiB to
/// 5 GiB per part, at most 10,000 parts).
pub const PART_SIZE: usize = 16 << 20;
/// Parts of one multipart upload in flight at once.
const UPLOAD_CONCURRENCY: usize = 4;
/// How often a broken download is resumed before the error is returned.
const RESUMES: u32 = 4;
/// The longest a presigned URL may live (S3's own ceiling is 7 days; a
/// grant outliving an epoch is a grant too many).
pub const MAX_PRESIGN_TTL: Duration = Duration::from_secs(6 * 3600);

/// Where the store is: `s3://BUCKET/PREFIX` plus the service's endpoint.
#[derive(Clone, Debug, PartialEq)]
pub struct S3Location {
    pub bucket: String,
    /// Prepended to every key ("" or ending in '/').
    pub prefix: String,
    /// `None`: AWS itself (from the region).
    pub endpoint: Option<String>,
    pub region: String,
    /// Path-style addressing (`ENDPOINT/BUCKET/KEY`), which MinIO and
    /// s3s-fs need; AWS prefers virtual-hosted style.
    pub path_style: bool,
}

impl S3Location {
    /// Parses `s3://bucket[/prefix]`.
    pub fn parse(url: &str, endpoint: Option<String>, region: String, path_style: bool) -> anyhow::Result<Self> {
        let rest =
            url.strip_prefix("s3://").ok_or_else(|| anyhow::anyhow!("{url:?} is not an s3://BUCKET/PREFIX URL"))?;
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        let bucket_ok = (3..=63).contains(&bucket.len())
            && bucket.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.');
        anyhow::ensure!(bucket_ok, "{bucket:?} is not a valid bucket name (3 to 63 of a-z, 0-9, '-', '.')");
        let prefix = prefix.trim_end_matches('/');
        if !prefix.is_empty() {
            check_key(prefix).map_err(|e| anyhow::anyhow!("the prefix of {url:?}: {e}"))?;
        }
        let prefix = if prefix.is_empty() { String::new() } else { format!("{prefix}/") };
        Ok(S3Location { bucket: bucket.to_string(), prefix, endpoint, region, path_style })
    }
}

/// The store's credentials. Not `Debug`: the secret must never reach a log.
pub struct S3Secret {
    pub access_key: String,
    pub secret_key: String,
}

impl S3Secret {
    /// From `AWS_ACCESS_KEY_ID` and `AWS_SECRET_ACCESS_KEY`.
    pub fn from_env() -> anyhow::Result<Self> {
        let get = |name: &str| {
            std::env::var(name)
                .map_err(|_| anyhow::anyhow!("{name} is not set: the S3 store needs credentials in the environment"))
        };
        Ok(S3Secret { access_key: get("AWS_ACCESS_KEY_ID")?, secret_key: get("AWS_SECRET_ACCESS_KEY")? })
    }
}

/// A presigned request: the URL and the headers that must go with it.
#[derive(Clone, Debug, PartialEq)]
pub struct Presigned {
    pub method: String,
    pub url: String,
    pub headers: Vec<(String, String)>,
}

pub struct S3Store {
    client: aws_sdk_s3::Client,
    loc: S3Location,
}

fn io_err(what: impl std::fmt::Display) -> io::Error {
    io::Error::other(what.to_string())
}

/// The SDK's error, with its service code where there is one (the
/// `Display` of an SDK error alone says little more than "service error").
fn sdk_err<E>(
    op: &str,
    key: &str,
    e: aws_sdk_s3::error::SdkError<E, aws_sdk_s3::config::http::HttpResponse>,
) -> io::Error
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    let status = e.raw_response().map(|r| r.status().as_u16());
    let not_found = matches!(e.code(), Some("NoSuchKey" | "NotFound")) || status == Some(404);
    let detail = match (e.code(), e.message()) {
        (Some(c), Some(m)) => format!("{c}: {m}"),
        (Some(c), None) => c.to_string(),
        _ => format!("{}", aws_sdk_s3::error::DisplayErrorContext(&e)),
    };
    let kind = if not_found { io::ErrorKind::NotFound } else { io::ErrorKind::Other };
    io::Error::new(kind, format!("S3 {op} {key}: {detail}"))
}

impl S3Store {
    pub fn new(loc: S3Location, secret: S3Secret) -> Self {
        let creds = Credentials::new(secret.access_key, secret.secret_key, None, None, "iota-run-config");
        let http = aws_smithy_http_client::Builder::new()
            .tls_provider(aws_smithy_http_client::tls::Provider::Rustls(
                aws_smithy_http_client::tls::rustls_provider::CryptoMode::Ring,
            ))
            .build_https();
        let mut conf = aws_sdk_s3::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .region(Region::new(loc.region.clone()))
            .credentials_provider(creds)
            .force_path_style(loc.path_style)
            .http_client(http)
            // Exponential backoff with full jitter, by the SDK's standard mode.
            .retry_config(RetryConfig::standard().with_max_attempts(5).with_initial_backoff(Duration::from_millis(200)))
            .timeout_config(
                TimeoutConfig::builder()
                    .connect_timeout(Duration::from_secs(5))
                    .read_timeout(Duration::from_secs(60))
                    .build(),
            )
            // Contents are checked by their BLAKE3 announcement; CRC
            // trailers would only narrow the services that work.
            .request_checksum_calculation(RequestChecksumCalculation::WhenRequired)
            .response_checksum_validation(ResponseChecksumValidation::WhenRequired);
        if let Some(ep) = &loc.endpoint {
            conf = conf.endpoint_url(ep.clone());
        }
        S3Store { client: aws_sdk_s3::Client::from_conf(conf.build()), loc }
    }

    pub fn location(&self) -> &S3Location {
        &self.loc
    }

    fn full_key(&self, key: &str) -> io::Result<String> {
        check_key(key)?;
        Ok(format!("{}{key}", self.loc.prefix))
    }

    /// Creates the bucket if it does not exist yet (one-machine and test
    /// setups; a production bucket is made by its owner).
    pub async fn ensure_bucket(&self) -> io::Result<()> {
        if self.client.head_bucket().bucket(&self.loc.bucket).send().await.is_ok() {
            return Ok(());
        }
        self.client
            .create_bucket()
            .bucket(&self.loc.bucket)
            .send()
            .await
            .map_err(|e| sdk_err("create-bucket", &self.loc.bucket, e))?;
        Ok(())
    }

    pub async fn delete(&self, key: &str) -> io::Result<()> {
        let full = self.full_key(key)?;
        self.client
            .delete_object()
            .bucket(&self.loc.bucket)
            .key(&full)
            .send()
            .await
            .map_err(|e| sdk_err("delete", &full, e))?;
        Ok(())
    }

    /// A URL that lets its holder GET `key` until `ttl` has passed.
    pub async fn presign_get(&self, key: &str, ttl: Duration) -> io::Result<Presigned> {
        let full = self.full_key(key)?;
        let req = self
            .client
            .get_object()
            .bucket(&self.loc.bucket)
            .key(&full)
            .presigned(presigning(ttl)?)
            .await
            .map_err(|e| sdk_err("presign-get", &full, e))?;
        Ok(presigned(&req))
    }

    /// A URL that lets its holder PUT `len` bytes under `key` until `ttl`
    /// has passed; the key is in the signature, so the URL writes nothing
    /// else.
    pub async fn presign_put(&self, key: &str, len: u64, ttl: Duration) -> io::Result<Presigned> {
        let full = self.full_key(key)?;
        let len = i64::try_from(len).map_err(io_err)?;
        let req = self
            .client
            .put_object()
            .bucket(&self.loc.bucket)
            .key(&full)
            .content_length(len)
            .presigned(presigning(ttl)?)
            .await
            .map_err(|e| sdk_err("presign-put", &full, e))?;
        Ok(presigned(&req))
    }

    async fn put_multipart(&self, full: &str, data: Vec<u8>) -> io::Result<()> {
        let up = self
            .client
            .create_multipart_upload()
            .bucket(&self.loc.bucket)
            .key(full)
            .send()
            .await
            .map_err(|e| sdk_err("create-multipart", full, e))?;
        let id = up.upload_id().ok_or_else(|| io_err(format!("S3 gave no upload id for {full}")))?.to_string();
        let result = async {
            // Parts go up UPLOAD_CONCURRENCY at a time: one HTTP stream
            // seldom fills a path to a bucket (or a server's cores).
            let data = bytes::Bytes::from(data);
            let count = data.len().div_ceil(PART_SIZE);
            let mut parts: Vec<Option<CompletedPart>> = vec![None; count];
            let mut running = tokio::task::JoinSet::new();
            let mut next = 0usize;
            loop {
                while next < count && running.len() < UPLOAD_CONCURRENCY {
                    let n = i32::try_from(next + 1).map_err(io_err)?;
                    let chunk = data.slice(next * PART_SIZE..((next + 1) * PART_SIZE).min(data.len()));
                    let req = self
                        .client
                        .upload_part()
                        .bucket(&self.loc.bucket)
                        .key(full)
                        .upload_id(&id)
                        .part_number(n)
                        .body(ByteStream::from(chunk));
                    let key = full.to_string();
                    running.spawn(async move {
                        let part = req.send().await.map_err(|e| sdk_err("upload-part", &key, e))?;
                        let etag = part.e_tag().map(str::to_string);
                        Ok::<_, io::Error>(CompletedPart::builder().part_number(n).set_e_tag(etag).build())
                    });
                    next += 1;
                }
                let Some(done) = running.join_next().await else { break };
                let part = done.map_err(io_err)??;
                let slot = part.part_number().and_then(|n| usize::try_from(n).ok()?.checked_sub(1));
                if let Some(p) = slot.and_then(|i| parts.get_mut(i)) {
                    *p = Some(part);
                }
            }
            let parts: Vec<CompletedPart> = parts.into_iter().flatten().collect();
            if parts.len() != count {
                return Err(io_err(format!("S3 put {full}: {} of {count} parts uploaded", parts.len())));
            }
            self.client
                .complete_multipart_upload()
                .bucket(&self.loc.bucket)
                .key(full)
                .upload_id(&id)
                .multipart_upload(CompletedMultipartUpload::builder().set_parts(Some(parts)).build())
                .send()
                .await
                .map_err(|e| sdk_err("complete-multipart", full, e))?;
            Ok(())
        }
        .await;
        if result.is_err() {
            // Parts of an abandoned upload are billed until aborted.
            let _ = self.client.abort_multipart_upload().bucket(&self.loc.bucket).key(full).upload_id(&id).send().await;
        }
        result
    }

    async fn get_resuming(&self, full: &str) -> io::Result<Vec<u8>> {
        let mut out: Vec<u8> = Vec::new();
        let mut etag: Option<String> = None;
        let mut resumes = 0;
        loop {
            let mut req = self.client.get_object().bucket(&self.loc.bucket).key(full);
            if let Some(tag) = &etag {
                // The rest of the same object, or an error if it changed.
                req = req.range(format!("bytes={}-", out.len())).if_match(tag);
            }
            let resp = req.send().await.map_err(|e| sdk_err("get", full, e))?;
            if etag.is_none() {
                etag = resp.e_tag().map(str::to_string);
                let len = resp.content_length().and_then(|l| usize::try_from(l).ok()).unwrap_or(0);
                out.reserve_exact(len);
            }
            let mut body = resp.body;
            let broke = loop {
                match body.try_next().await {
                    Ok(Some(bytes)) => out.extend_from_slice(&bytes),
                    Ok(None) => break None,
                    Err(e) => break Some(e),
                }
            };
            match broke {
                None => return Ok(out),
                Some(e) if resumes < RESUMES && etag.is_some() => {
                    resumes += 1;
                    tracing::debug!(key = full, at = out.len(), error = %e, "S3 download broke off; resuming");
                }
                Some(e) => {
                    return Err(io_err(format!("S3 get {full}: the download broke off at {} bytes: {e}", out.len())));
                }
            }
        }
    }
}

fn presigning(ttl: Duration) -> io::Result<PresigningConfig> {
    PresigningConfig::expires_in(ttl.min(MAX_PRESIGN_TTL)).map_err(io_err)
}

fn presigned(req: &aws_sdk_s3::presigning::PresignedRequest) -> Presigned {
    Presigned {
        method: req.method().to_string(),
        url: req.uri().to_string(),
        headers: req.headers().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
    }
}

impl ObjectStore for S3Store {
    fn put<'a>(&'a self, key: &'a str, data: Vec<u8>) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            let full = self.full_key(key)?;
            if data.len() > PART_SIZE {
                return self.put_multipart(&full, data).await;
            }
            self.client
                .put_object()
                .bucket(&self.loc.bucket)
                .key(&full)
                .body(ByteStream::from(data))
                .send()
                .await
                .map_err(|e| sdk_err("put", &full, e))?;
            Ok(())
        })
    }

    fn get<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Vec<u8>> {
        Box::pin(async move {
            let full = self.full_key(key)?;
            self.get_resuming(&full).await
        })
    }

    fn list<'a>(&'a self, prefix: &'a str) -> StoreFuture<'a, Vec<String>> {
        Box::pin(async move {
            if !prefix.is_empty() {
                check_key(prefix.trim_end_matches('/'))?;
            }
            let full = format!("{}{prefix}", self.loc.prefix);
            let mut keys = Vec::new();
            let mut token: Option<String> = None;
            loop {
                let resp = self
                    .client
                    .list_objects_v2()
                    .bucket(&self.loc.bucket)
                    .prefix(&full)
                    // Direct children only, as a directory listing.
                    .delimiter("/")
                    .set_continuation_token(token.take())
                    .send()
                    .await
                    .map_err(|e| sdk_err("list", &full, e))?;
                for o in resp.contents() {
                    if let Some(k) = o.key().and_then(|k| k.strip_prefix(&self.loc.prefix)) {
                        keys.push(k.to_string());
                    }
                }
                match resp.next_continuation_token() {
                    Some(t) if resp.is_truncated() == Some(true) => token = Some(t.to_string()),
                    _ => break,
                }
            }
            keys.sort();
            Ok(keys)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locations_parse_and_bad_ones_are_refused() {
        let l =
            S3Location::parse("s3://iota-runs/run-7/", Some("http://127.0.0.1:9000".into()), "us-east-1".into(), true)
                .unwrap();
        assert_eq!((l.bucket.as_str(), l.prefix.as_str()), ("iota-runs", "run-7/"));
        let l = S3Location::parse("s3://iota-runs", None, "eu-west-1".into(), false).unwrap();
        assert_eq!(l.prefix, "");
        for bad in ["iota-runs/x", "s3://", "s3://AB", "s3://Bad_Bucket/x", "s3://ok-bucket/../x", "s3://ok-bucket//x"]
        {
            assert!(S3Location::parse(bad, None, "r".into(), true).is_err(), "{bad}");
        }
    }
}
