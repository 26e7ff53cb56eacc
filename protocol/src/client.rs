//! A signing client of the orchestrator (used by miners, the swarm and tests).
//!
//! `connect` asks the server who it is (`Hello`) and checks the answer
//! against the pinned orchestrator key, so every request is signed for that
//! orchestrator and run only, and every reply and command that changes what
//! the caller does is checked to come from it.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use iota_core::{Identity, PeerId};
use tonic::transport::{Channel, Endpoint};

use crate::auth::{Audience, now_ms, open_hello, open_server, sign};
use crate::pb::{self, orchestrator_client::OrchestratorClient};

pub use iota_wire::methods::{GRANT, HEARTBEAT, HELLO, REGISTER, REPORT, STATUS, SUBSCRIBE, VALIDATE};

/// How long a connection attempt may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a unary call may wait for its answer. Without a bound, a call
/// sent into a connection the server dropped without closing (a crash, a
/// partition) waits forever, and everything queued behind it with it.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(15);
/// HTTP/2 pings on idle connections too, so a command stream whose server
/// is gone ends (and is re-subscribed) within interval + timeout instead of
/// waiting for commands that will never come.
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(5);
pub const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Clone)]
pub struct ControlClient {
    rpc: OrchestratorClient<Channel>,
    id: Arc<Identity>,
    aud: Audience,
}

fn forged(e: String) -> tonic::Status {
    tonic::Status::unauthenticated(format!("orchestrator reply refused: {e}"))
}

impl ControlClient {
    /// Connects to the orchestrator at `endpoint` (`https://HOST:PORT`) over
    /// TLS, accepting only the certificate of `pinned` (any identity
    /// certificate when None: trust on first use, for one-machine runs),
    /// then checks its signed `Hello` against the same key. A plaintext
    /// `http://` URL is refused: see [`ControlClient::connect_insecure_plaintext`].
    pub async fn connect(endpoint: String, id: Arc<Identity>, pinned: Option<PeerId>) -> anyhow::Result<Self> {
        Self::connect_with(endpoint, id, pinned, false, None).await
    }

    /// Like [`ControlClient::connect`] to an orchestrator with a CA-issued
    /// certificate: TLS checks its chain against `roots` and the URL's host
    /// name; `pinned` is still checked in `Hello` and every signed reply.
    pub async fn connect_ca(
        endpoint: String,
        id: Arc<Identity>,
        pinned: Option<PeerId>,
        roots: Arc<rustls::RootCertStore>,
    ) -> anyhow::Result<Self> {
        Self::connect_with(endpoint, id, pinned, false, Some(roots)).await
    }

    /// Like [`ControlClient::connect`], and also takes a plaintext
    /// `http://` URL (local tests; `--insecure-plaintext`): nothing on the
    /// path is then authenticated but the signed messages themselves.
    pub async fn connect_insecure_plaintext(
        endpoint: String,
        id: Arc<Identity>,
        pinned: Option<PeerId>,
    ) -> anyhow::Result<Self> {
        Self::connect_with(endpoint, id, pinned, true, None).await
    }

    async fn connect_with(
        endpoint: String,
        id: Arc<Identity>,
        pinned: Option<PeerId>,
        plaintext_ok: bool,
        ca: Option<Arc<rustls::RootCertStore>>,
    ) -> anyhow::Result<Self> {
        let builder = |url: String| -> anyhow::Result<Endpoint> {
            Ok(Endpoint::from_shared(url)
                .with_context(|| format!("the orchestrator address {endpoint:?}"))?
                .connect_timeout(CONNECT_TIMEOUT)
                .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
                .keep_alive_timeout(KEEPALIVE_TIMEOUT)
                .keep_alive_while_idle(true)
                .tcp_keepalive(Some(KEEPALIVE_INTERVAL)))
        };
        let channel = if let Some(rest) = endpoint.strip_prefix("https://") {
            // Our own TLS under an http:// URI, so tonic adds none of its
            // own: the pinned identity key, or a CA's chain for the host.
            let (tls, name) = match ca {
                None => (crate::tls_identity::client_config(pinned)?, crate::tls_identity::CONTROL_SERVER_NAME.into()),
                Some(roots) => {
                    let host =
                        rest.rsplit_once(':').map_or(rest, |(h, _)| h).trim_start_matches('[').trim_end_matches(']');
                    (crate::tls_identity::client_config_ca(roots)?, host.to_string())
                }
            };
            let name = rustls::pki_types::ServerName::try_from(name)
                .with_context(|| format!("the orchestrator address {endpoint:?}: no host name to check"))?;
            builder(format!("http://{rest}"))?.connect_with_connector(TlsConnector { tls: Arc::new(tls), name }).await
        } else if endpoint.starts_with("http://") {
            anyhow::ensure!(
                plaintext_ok,
                "{endpoint} is plaintext: the orchestrator's URL is https://... (or allow plaintext explicitly with \
                 --insecure-plaintext, for local tests)"
            );
            builder(endpoint.clone())?.connect().await
        } else {
            anyhow::bail!("the orchestrator's URL must start with https:// (got {endpoint:?})")
        }
        .with_context(|| format!("cannot reach the orchestrator at {endpoint}"))?;
        let mut rpc = OrchestratorClient::new(channel);
        let hello =
            bounded(rpc.hello(pb::HelloRequest {})).await.context("asking the orchestrator who it is")?.into_inner();
        let aud = open_hello(&hello, pinned).map_err(anyhow::Error::msg)?;
        Ok(ControlClient { rpc, id, aud })
    }

    pub fn identity(&self) -> &Arc<Identity> {
        &self.id
    }

    /// The orchestrator and run this client signs for.
    pub fn audience(&self) -> &Audience {
        &self.aud
    }

    pub async fn register(
        &mut self,
        data_addr: String,
        tokens_per_s: f64,
        device: String,
    ) -> Result<pb::RegisterReply, tonic::Status> {
        self.register_stating(data_addr, tokens_per_s, device, (0, String::new())).await
    }

    /// `register`, stating the memory the miner's stage may use (bytes) and
    /// what it computes with ("cpu", "cuda-fp32", "cuda-bf16"): the
    /// orchestrator assigns only a stage that fits and routes it no more
    /// micro-batches than fit.
    pub async fn register_stating(
        &mut self,
        data_addr: String,
        tokens_per_s: f64,
        device: String,
        (memory_bytes, compute): (u64, String),
    ) -> Result<pb::RegisterReply, tonic::Status> {
        let body = pb::RegisterRequest {
            role: pb::Role::Miner as i32,
            data_addr,
            tokens_per_s,
            device,
            memory_bytes,
            compute,
        };
        self.register_body(body).await
    }

    /// Registers as one of the run's validators (the run must list this
    /// identity with a stake).
    pub async fn register_validator(&mut self, device: String) -> Result<pb::RegisterReply, tonic::Status> {
        let body = pb::RegisterRequest { role: pb::Role::Validator as i32, device, ..Default::default() };
        self.register_body(body).await
    }

    async fn register_body(&mut self, body: pb::RegisterRequest) -> Result<pb::RegisterReply, tonic::Status> {
        let s = sign(&self.id, &self.aud, REGISTER, &body, now_ms());
        let reply = bounded(self.rpc.register(s.clone())).await?.into_inner();
        open_server(&self.aud, &self.id.peer_id(), REGISTER, &s.nonce, 0, &reply).map_err(forged)
    }

    /// A validator's ask, verdict or end of its epoch's checks.
    pub async fn validate(&mut self, kind: pb::validator_report::Kind) -> Result<(), tonic::Status> {
        let s = sign(&self.id, &self.aud, VALIDATE, &pb::ValidatorReport { kind: Some(kind) }, now_ms());
        bounded(self.rpc.validate(s)).await?;
        Ok(())
    }

    pub async fn heartbeat(
        &mut self,
        epoch: u64,
        in_flight: u32,
        tokens_per_s: f64,
        commitments: &[iota_core::commitment::EpochHeads],
    ) -> Result<pb::HeartbeatReply, tonic::Status> {
        let commitments = crate::commitments_pb::to_pb(commitments);
        let body = pb::HeartbeatRequest { epoch, in_flight, tokens_per_s, commitments };
        let s = sign(&self.id, &self.aud, HEARTBEAT, &body, now_ms());
        self.raw_heartbeat(s).await
    }

    /// The caller's command stream; each command is checked as it arrives.
    pub async fn subscribe(&mut self) -> Result<CommandStream, tonic::Status> {
        let s = sign(&self.id, &self.aud, SUBSCRIBE, &pb::SubscribeRequest {}, now_ms());
        // Bounded until the stream opens; keepalive watches it after that.
        let inner = bounded(self.rpc.subscribe(s.clone())).await?.into_inner();
        Ok(CommandStream { inner, aud: self.aud, me: self.id.peer_id(), nonce: s.nonce, next_seq: 0 })
    }

    pub async fn report(&mut self, kind: pb::report::Kind) -> Result<(), tonic::Status> {
        let s = sign(&self.id, &self.aud, REPORT, &pb::Report { kind: Some(kind) }, now_ms());
        bounded(self.rpc.report(s)).await?;
        Ok(())
    }

    pub async fn status(&mut self) -> Result<pb::RunStatus, tonic::Status> {
        let s = sign(&self.id, &self.aud, STATUS, &pb::StatusRequest {}, now_ms());
        Ok(bounded(self.rpc.status(s)).await?.into_inner())
    }

    /// Presigned URLs (or, for LIST, the keys) for `asks`, one grant per
    /// ask in order; refused whole if any ask is not the caller's to make.
    pub async fn grant(&mut self, asks: Vec<pb::GrantAsk>) -> Result<Vec<pb::Grant>, tonic::Status> {
        let n = asks.len();
        let s = sign(&self.id, &self.aud, GRANT, &pb::GrantRequest { asks }, now_ms());
        let reply = bounded(self.rpc.grant(s.clone())).await?.into_inner();
        let reply: pb::GrantReply =
            open_server(&self.aud, &self.id.peer_id(), GRANT, &s.nonce, 0, &reply).map_err(forged)?;
        if reply.grants.len() != n {
            return Err(forged(format!("{} grants for {n} asks", reply.grants.len())));
        }
        Ok(reply.grants)
    }

    /// Sends a pre-built envelope as-is (tests of hostile requests); the
    /// reply is checked like any other.
    pub async fn raw_heartbeat(&mut self, s: pb::Signed) -> Result<pb::HeartbeatReply, tonic::Status> {
        let reply = bounded(self.rpc.heartbeat(s.clone())).await?.into_inner();
        open_server(&self.aud, &self.id.peer_id(), HEARTBEAT, &s.nonce, 0, &reply).map_err(forged)
    }
}

/// Dials TCP and runs the TLS handshake that checks the orchestrator's key.
#[derive(Clone)]
struct TlsConnector {
    tls: Arc<rustls::ClientConfig>,
    /// The name the certificate must carry (a CA-issued one) or is asked
    /// for (an identity certificate, whose key is what is checked).
    name: rustls::pki_types::ServerName<'static>,
}

impl tower_service::Service<tonic::codegen::http::Uri> for TlsConnector {
    type Response = hyper_util::rt::TokioIo<tokio_rustls::client::TlsStream<tokio::net::TcpStream>>;
    type Error = std::io::Error;
    type Future = std::pin::Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: tonic::codegen::http::Uri) -> Self::Future {
        let (tls, name) = (self.tls.clone(), self.name.clone());
        Box::pin(async move {
            let authority = uri.authority().ok_or_else(|| std::io::Error::other("no host in the URL"))?.to_string();
            let tcp =
                tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::TcpStream::connect(&authority)).await.map_err(
                    |_| std::io::Error::new(std::io::ErrorKind::TimedOut, format!("connecting to {authority}")),
                )??;
            tcp.set_nodelay(true)?;
            let session =
                tokio::time::timeout(CONNECT_TIMEOUT, tokio_rustls::TlsConnector::from(tls).connect(name, tcp))
                    .await
                    .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "the TLS handshake timed out"))??;
            Ok(hyper_util::rt::TokioIo::new(session))
        })
    }
}

/// `call`, or DEADLINE_EXCEEDED after [`CALL_TIMEOUT`].
async fn bounded<T>(call: impl Future<Output = Result<T, tonic::Status>>) -> Result<T, tonic::Status> {
    tokio::time::timeout(CALL_TIMEOUT, call).await.unwrap_or_else(|_| {
        Err(tonic::Status::deadline_exceeded(format!(
            "the orchestrator did not answer within {} s",
            CALL_TIMEOUT.as_secs()
        )))
    })
}

/// The orchestrator's commands to this caller, checked one by one: signed
/// by the orchestrator for this subscription, in sequence.
pub struct CommandStream {
    inner: tonic::Streaming<pb::ServerSigned>,
    aud: Audience,
    me: PeerId,
    nonce: Vec<u8>,
    next_seq: u64,
}

impl CommandStream {
    /// The next command; `Ok(None)` when the server ended the stream. A
    /// command that fails its check ends the stream with an error (the
    /// caller subscribes again).
    pub async fn next(&mut self) -> Result<Option<pb::Command>, tonic::Status> {
        let Some(m) = self.inner.message().await? else { return Ok(None) };
        let cmd = open_server(&self.aud, &self.me, SUBSCRIBE, &self.nonce, self.next_seq, &m).map_err(forged)?;
        self.next_seq += 1;
        Ok(Some(cmd))
    }
}

/// How a command follower registers its caller again when the server has
/// forgotten it (it restarted without the registration, or let it expire).
#[derive(Clone, Debug)]
pub enum Rejoin {
    Miner {
        data_addr: String,
        device: String,
        /// The miner's last measured throughput (f64 bits).
        tokens_per_s: Arc<std::sync::atomic::AtomicU64>,
        /// The memory it states, and what it computes with.
        memory: (u64, String),
    },
    Validator {
        device: String,
    },
}

/// Follows the caller's command stream until `finished` is set or `tx`
/// closes: each command goes to `tx` (through `wrap`); a stream that ends
/// or fails is subscribed again after 300 ms, registering again first
/// (`rejoin`) when the server no longer knows the caller.
pub fn follow_commands<T: Send + 'static>(
    mut client: ControlClient,
    finished: Arc<std::sync::atomic::AtomicBool>,
    rejoin: Rejoin,
    tx: tokio::sync::mpsc::Sender<T>,
    wrap: fn(pb::command::Kind) -> T,
) -> tokio::task::JoinHandle<()> {
    use std::sync::atomic::Ordering;
    tokio::spawn(async move {
        while !finished.load(Ordering::SeqCst) {
            let mut stream = match client.subscribe().await {
                Ok(s) => s,
                Err(e) => {
                    if e.code() == tonic::Code::FailedPrecondition {
                        let _ = match &rejoin {
                            Rejoin::Miner { data_addr, device, tokens_per_s, memory } => {
                                let tps = f64::from_bits(tokens_per_s.load(Ordering::Relaxed));
                                client.register_stating(data_addr.clone(), tps, device.clone(), memory.clone()).await
                            }
                            Rejoin::Validator { device } => client.register_validator(device.clone()).await,
                        };
                    }
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    continue;
                }
            };
            while let Ok(Some(cmd)) = stream.next().await {
                if let Some(k) = cmd.kind
                    && tx.send(wrap(k)).await.is_err()
                {
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    })
}
