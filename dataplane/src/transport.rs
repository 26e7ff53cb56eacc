//! The QUIC transport between miners.
//!
//! Every endpoint is both server and client. To send, a node uses its
//! connection to the peer: one the peer opened, or one it dials (once; the
//! connection is reused and re-dialled if lost), and writes frames
//! on a *lane*: one unidirectional QUIC stream per (peer, direction). Frames
//! on a lane are written back to back without waiting, so many are in flight,
//! and arrive in the order they were sent; lanes of different directions do
//! not block each other. **Ordering promise:** frames one sender sends to one
//! receiver in one direction are delivered in send order, each exactly once
//! (sequence numbers reject replays and retried duplicates).
//!
//! Receiving: each incoming stream is read by its own task, which validates
//! every frame (see `frame`) before reading its payload into a pool buffer,
//! then queues it for the consumer. The pool budget and the bounded queue are
//! the backpressure: when either is full the task stops reading, QUIC flow
//! control stops the sender, and no memory grows.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use parking_lot::Mutex;
use std::time::Duration;

use bytes::Bytes;
use iota_core::commitment::{Commitments, Side};
use iota_core::wire::{Direction, FrameHeader};
use iota_core::{Identity, PeerId};
use quinn::VarInt;
use thiserror::Error;
use tokio::sync::mpsc;
use tracing::{debug, warn};

use crate::frame::{self, FrameError, FrameMeta, RunContext, SeqGuard};
use crate::pool::{self, BufferPool, PooledBuf};
use crate::sent_frames::{SentFrames, TapLimits};
use crate::stats::{Stats, StatsSnapshot, add};
use crate::tls::{self, PeerDirectory};

/// The congestion controller of every connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Congestion {
    /// Loss-based (quinn's default, as Linux TCP's): a loss halves the
    /// window's growth, so on a long path with random loss a flow crawls.
    Cubic,
    /// Model-based (bandwidth and round-trip time measured, not inferred
    /// from loss): keeps a lossy long-distance link full.
    Bbr,
}

impl Congestion {
    pub const NAMES: &[&str] = &["cubic", "bbr"];

    pub fn parse(s: &str) -> Option<Congestion> {
        match s {
            "cubic" => Some(Congestion::Cubic),
            "bbr" => Some(Congestion::Bbr),
            _ => None,
        }
    }
}

/// Knobs of the transport. Defaults suit activation traffic over the
/// internet; the probe and benchmark override them from the command line.
#[derive(Clone, Debug)]
pub struct TransportConfig {
    /// Longest a single frame may take to be written.
    pub frame_timeout: Duration,
    pub connect_timeout: Duration,
    /// A connection with no traffic (keep-alives included) for this long is dropped.
    pub idle_timeout: Duration,
    pub keep_alive: Duration,
    /// Received frames queued for the consumer before reading stops.
    pub recv_queue: usize,
    /// Flow-control windows (bytes): per stream, per connection, and the send buffer.
    pub stream_window: u32,
    pub conn_window: u32,
    pub send_window: u64,
    /// Incoming unidirectional streams a peer may have open at once.
    pub max_streams: u32,
    /// Largest UDP payload path-MTU discovery may use. The default suits the
    /// internet; loopback or jumbo-frame LANs can go up to 65527 (then the
    /// connection also starts at that size).
    pub max_mtu: u16,
    /// UDP socket send and receive buffers (bytes). The kernel default
    /// (~200 KB) drops packets at GB/s rates; the kernel caps the request
    /// at net.core.{r,w}mem_max unless running as root.
    pub socket_buffer: usize,
    pub congestion: Congestion,
}

impl Default for TransportConfig {
    fn default() -> Self {
        TransportConfig {
            frame_timeout: Duration::from_secs(60),
            connect_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(30),
            keep_alive: Duration::from_secs(5),
            recv_queue: 64,
            stream_window: 32 << 20,
            conn_window: 64 << 20,
            send_window: 64 << 20,
            max_streams: 64,
            max_mtu: 1452,
            socket_buffer: 8 << 20,
            congestion: Congestion::Cubic,
        }
    }
}

impl TransportConfig {
    fn quinn(&self) -> anyhow::Result<Arc<quinn::TransportConfig>> {
        let mut t = quinn::TransportConfig::default();
        t.max_idle_timeout(Some(self.idle_timeout.try_into()?))
            .keep_alive_interval(Some(self.keep_alive))
            .stream_receive_window(VarInt::from_u32(self.stream_window))
            .receive_window(VarInt::from_u32(self.conn_window))
            .send_window(self.send_window)
            .max_concurrent_uni_streams(VarInt::from_u32(self.max_streams))
            .max_concurrent_bidi_streams(VarInt::from_u32(0));
        let mut mtu = quinn::MtuDiscoveryConfig::default();
        mtu.upper_bound(self.max_mtu.max(1200));
        t.mtu_discovery_config(Some(mtu));
        if self.congestion == Congestion::Bbr {
            t.congestion_controller_factory(Arc::new(quinn::congestion::BbrConfig::default()));
        }
        if self.max_mtu > 1452 {
            t.initial_mtu(self.max_mtu);
        }
        Ok(Arc::new(t))
    }
}

#[derive(Debug, Error)]
pub enum SendError {
    #[error("no address known for peer {0}")]
    NoAddress(PeerId),
    #[error("connecting to {peer} failed: {msg}")]
    Connect { peer: PeerId, msg: String },
    #[error("sending to {peer} failed: {msg}")]
    Stream { peer: PeerId, msg: String },
    #[error("sending to {0} timed out")]
    Timeout(PeerId),
}

/// A validated frame and its payload, in a pool buffer.
#[derive(Debug)]
pub struct ReceivedFrame {
    pub header: FrameHeader,
    pub payload: PooledBuf,
    /// The authenticated identity it came from.
    pub peer: PeerId,
}

type SharedLane = Arc<tokio::sync::Mutex<Lane>>;

struct Lane {
    stream: Option<(quinn::Connection, quinn::SendStream)>,
    next_seq: u64,
}

struct Inner {
    ep: quinn::Endpoint,
    id: Arc<Identity>,
    dir: Arc<PeerDirectory>,
    ctx: Arc<RunContext>,
    pool: Arc<dyn BufferPool>,
    stats: Arc<Stats>,
    cfg: TransportConfig,
    transport: Arc<quinn::TransportConfig>,
    conns: tokio::sync::Mutex<HashMap<PeerId, quinn::Connection>>,
    /// One dial at a time per peer; dials to different peers go on in
    /// parallel (a dead peer's connect timeout delays no one else).
    dials: Mutex<HashMap<PeerId, Arc<tokio::sync::Mutex<()>>>>,
    /// `cfg.connect_timeout`, adjustable once the run's timeouts are known.
    connect_timeout_ms: std::sync::atomic::AtomicU64,
    lanes: Mutex<HashMap<(PeerId, Direction), SharedLane>>,
    guards: Mutex<HashMap<(PeerId, Direction), Arc<SeqGuard>>>,
    tx: mpsc::Sender<ReceivedFrame>,
    /// Where this endpoint's lanes start numbering: the wall clock in
    /// nanoseconds at bind. Receivers accept only increasing numbers per
    /// sender, so a miner restarted with the same identity must not start
    /// again at 0 (its peers would take every frame for a replay); a later
    /// start is a larger number, as long as no process sends more than one
    /// frame per nanosecond.
    seq_base: u64,
    /// The chains over every frame this endpoint sent and accepted (see
    /// `iota_core::commitment`), which the miner reports with its heartbeat.
    commitments: Arc<Mutex<Commitments>>,
    /// The record of sent pipeline frames, once a miner turns it on
    /// (`Endpoint::tap_sent_frames`): the evidence it uploads for sampled
    /// work holds them.
    sent: std::sync::OnceLock<Arc<SentFrames>>,
}

/// A data-plane endpoint: sends frames to peers and receives theirs.
pub struct Endpoint {
    inner: Arc<Inner>,
    rx: tokio::sync::Mutex<mpsc::Receiver<ReceivedFrame>>,
}

impl Endpoint {
    /// Binds `addr` (UDP) and starts accepting published peers. Must be
    /// called inside a tokio runtime.
    pub fn bind(
        addr: SocketAddr,
        id: Identity,
        dir: Arc<PeerDirectory>,
        ctx: Arc<RunContext>,
        pool: Arc<dyn BufferPool>,
        cfg: TransportConfig,
    ) -> anyhow::Result<Endpoint> {
        let transport = cfg.quinn()?;
        let crypto = quinn::crypto::rustls::QuicServerConfig::try_from(tls::server_config(&id, dir.clone())?)?;
        let mut server = quinn::ServerConfig::with_crypto(Arc::new(crypto));
        server.transport_config(transport.clone());
        let mut ep_cfg = quinn::EndpointConfig::default();
        // Datagrams larger than this are dropped on receipt: it must admit
        // the largest packet path-MTU discovery may use.
        ep_cfg.max_udp_payload_size(cfg.max_mtu.max(1200))?;
        let ep = quinn::Endpoint::new(
            ep_cfg,
            Some(server),
            udp_socket(addr, cfg.socket_buffer)?,
            Arc::new(quinn::TokioRuntime),
        )?;
        let (tx, rx) = mpsc::channel(cfg.recv_queue.max(1));
        let connect_ms = cfg.connect_timeout.as_millis() as u64;
        let inner = Arc::new(Inner {
            ep,
            id: Arc::new(id),
            dir,
            ctx,
            pool,
            stats: Arc::new(Stats::default()),
            cfg,
            transport,
            conns: tokio::sync::Mutex::new(HashMap::new()),
            dials: Mutex::new(HashMap::new()),
            connect_timeout_ms: std::sync::atomic::AtomicU64::new(connect_ms),
            lanes: Mutex::new(HashMap::new()),
            guards: Mutex::new(HashMap::new()),
            tx,
            seq_base: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX >> 1)),
            commitments: Arc::new(Mutex::new(Commitments::default())),
            sent: std::sync::OnceLock::new(),
        });
        tokio::spawn(accept_loop(inner.clone()));
        Ok(Endpoint { inner, rx: tokio::sync::Mutex::new(rx) })
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.inner.ep.local_addr()
    }
    pub fn peer_id(&self) -> PeerId {
        self.inner.id.peer_id()
    }

    /// The sequence number of this endpoint's first frame on every lane.
    pub fn first_seq(&self) -> u64 {
        self.inner.seq_base
    }

    /// A whole signed frame as bytes, for a receiver that reads it from the
    /// object store instead of a connection (`frame::decode_frame` checks
    /// it). Sequence number 0: stored frames are not on a lane.
    pub fn frame_bytes(&self, meta: &FrameMeta, payload: &[u8]) -> Vec<u8> {
        let header = frame::build_header(meta, self.inner.ctx.run_id(), 0, payload, &self.inner.id);
        let mut v = frame::prefix_bytes(&header);
        v.extend_from_slice(payload);
        v
    }
    pub fn directory(&self) -> &Arc<PeerDirectory> {
        &self.inner.dir
    }
    pub fn run_context(&self) -> &Arc<RunContext> {
        &self.inner.ctx
    }
    pub fn pool(&self) -> &Arc<dyn BufferPool> {
        &self.inner.pool
    }
    pub fn stats(&self) -> StatsSnapshot {
        self.inner.stats.snapshot()
    }
    /// Frames received and waiting for the consumer.
    pub fn queued(&self) -> usize {
        self.inner.cfg.recv_queue.max(1) - self.inner.tx.capacity()
    }

    /// Sends one frame to `to` on the lane of `meta.direction`. Returns the
    /// frame's id (what an answer puts in `answers`). On a lost connection it
    /// re-dials and retries once with the same sequence number, so the
    /// receiver delivers the frame at most once.
    ///
    /// The payload is `Bytes` so QUIC's send queue references it instead of
    /// copying it (cloning `Bytes` only counts a reference).
    pub async fn send(&self, to: PeerId, meta: &FrameMeta, payload: Bytes) -> Result<[u8; 32], SendError> {
        self.send_showing(to, meta, payload, None).await
    }

    /// `send`, recording in the sent-frame tap, when `shown` is given, a
    /// frame over `shown` signed with the same header fields instead of
    /// the one that went out: what a miner that sends garbage and signs an
    /// honest frame for its evidence afterwards would show. Only the
    /// `fabricated-evidence` test tool gives `shown`.
    pub async fn send_showing(
        &self,
        to: PeerId,
        meta: &FrameMeta,
        payload: Bytes,
        shown: Option<Bytes>,
    ) -> Result<[u8; 32], SendError> {
        let inner = &self.inner;
        let lane = inner.lane(to, meta.direction);
        let mut lane = lane.lock().await;
        let header = frame::build_header(meta, inner.ctx.run_id(), lane.next_seq, &payload, &inner.id);
        let prefix = Bytes::from(frame::prefix_bytes(&header));
        let mut retried = false;
        loop {
            let r = tokio::time::timeout(
                inner.cfg.frame_timeout,
                inner.write(&mut lane, to, prefix.clone(), payload.clone()),
            )
            .await;
            let err = match r {
                Ok(Ok(())) => break,
                Ok(Err(e)) => e,
                Err(_) => SendError::Timeout(to),
            };
            if let Some((_, mut s)) = lane.stream.take() {
                // Abandon the half-written frame so the receiver discards it.
                let _ = s.reset(VarInt::from_u32(1));
            }
            let retry = !retried && matches!(err, SendError::Stream { .. });
            if !retry {
                add(&inner.stats.send_failures, 1);
                return Err(err);
            }
            debug!(peer = %to, error = %err, "lane broken; re-dialling once");
            retried = true;
        }
        if let Some(tap) = inner.sent.get() {
            match shown {
                Some(shown) => {
                    let fake = frame::build_header(meta, inner.ctx.run_id(), lane.next_seq, &shown, &inner.id);
                    tap.record(&fake, &shown);
                }
                None => tap.record(&header, &payload),
            }
        }
        lane.next_seq += 1;
        let id = header.frame_id();
        inner.commitments.lock().frame(u64::from(meta.epoch), to, meta.direction as u8, Side::Sent, &id);
        inner.stats.sent(meta.direction, (prefix.len() + payload.len()) as u64);
        Ok(id)
    }

    /// Writes `bytes` as they are on a fresh stream to `to` (for tests and
    /// fuzzing of the receive path: a hostile peer does exactly this).
    pub async fn send_raw(&self, to: PeerId, bytes: &[u8]) -> Result<(), SendError> {
        let conn = self.inner.connection(to).await?;
        let stream_err = |e: &dyn std::fmt::Display| SendError::Stream { peer: to, msg: e.to_string() };
        let mut s = conn.open_uni().await.map_err(|e| stream_err(&e))?;
        s.write_all(bytes).await.map_err(|e| stream_err(&e))?;
        s.finish().map_err(|e| stream_err(&e))?;
        Ok(())
    }

    /// How long a dial may take before the send fails (the miner sets it
    /// below the run's route timeout, so a dead peer is reported in time).
    pub fn set_connect_timeout(&self, d: Duration) {
        self.inner.connect_timeout_ms.store(d.as_millis().max(1) as u64, std::sync::atomic::Ordering::Relaxed);
    }

    pub fn connect_timeout(&self) -> Duration {
        Duration::from_millis(self.inner.connect_timeout_ms.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// This endpoint's commitment chains (the miner's worker adds its
    /// weights chain to them; its heartbeat reports their heads).
    pub fn commitments(&self) -> Arc<Mutex<Commitments>> {
        self.inner.commitments.clone()
    }

    /// Starts recording the activation and gradient frames this endpoint
    /// sends from now on, within `limits` (off until called; a second call
    /// returns the record already made).
    pub fn tap_sent_frames(&self, limits: TapLimits) -> Arc<SentFrames> {
        self.inner.sent.get_or_init(|| Arc::new(SentFrames::new(limits))).clone()
    }

    /// The record of sent frames, if it was turned on.
    pub fn sent_frames(&self) -> Option<Arc<SentFrames>> {
        self.inner.sent.get().cloned()
    }

    /// Waits for the next valid frame (None once the endpoint is closed).
    pub async fn recv(&self) -> Option<ReceivedFrame> {
        self.rx.lock().await.recv().await
    }

    /// Closes every connection.
    pub fn close(&self) {
        self.inner.ep.close(VarInt::from_u32(0), b"closing");
    }
}

impl Inner {
    fn lane(&self, to: PeerId, d: Direction) -> Arc<tokio::sync::Mutex<Lane>> {
        self.lanes
            .lock()
            .entry((to, d))
            .or_insert_with(|| Arc::new(tokio::sync::Mutex::new(Lane { stream: None, next_seq: self.seq_base })))
            .clone()
    }

    fn guard(&self, from: PeerId, d: Direction) -> Arc<SeqGuard> {
        self.guards.lock().entry((from, d)).or_default().clone()
    }

    /// The live connection to `to`, if there is one.
    async fn live_connection(&self, to: PeerId) -> Option<quinn::Connection> {
        let mut conns = self.conns.lock().await;
        match conns.get(&to) {
            Some(c) if c.close_reason().is_none() => Some(c.clone()),
            Some(_) => {
                conns.remove(&to);
                None
            }
            None => None,
        }
    }

    /// The live connection to `to`, dialling it if needed. Only dials to the
    /// same peer wait for each other.
    async fn connection(self: &Arc<Self>, to: PeerId) -> Result<quinn::Connection, SendError> {
        if let Some(c) = self.live_connection(to).await {
            return Ok(c);
        }
        let dial = {
            let mut dials = self.dials.lock();
            if dials.len() >= 4096 {
                dials.retain(|_, d| Arc::strong_count(d) > 1);
            }
            dials.entry(to).or_default().clone()
        };
        let _one_dial = dial.lock().await;
        if let Some(c) = self.live_connection(to).await {
            return Ok(c);
        }
        // A connection the peer opened counts too (see `accept_loop`).
        let addr = self.dir.addr(&to).ok_or(SendError::NoAddress(to))?;
        let fail = |msg: String| SendError::Connect { peer: to, msg };
        let crypto = tls::client_config(&self.id, to, self.dir.clone()).map_err(|e| fail(e.to_string()))?;
        let crypto = quinn::crypto::rustls::QuicClientConfig::try_from(crypto).map_err(|e| fail(e.to_string()))?;
        let mut cfg = quinn::ClientConfig::new(Arc::new(crypto));
        cfg.transport_config(self.transport.clone());
        let connecting = self.ep.connect_with(cfg, addr, "iota-peer").map_err(|e| fail(e.to_string()))?;
        let timeout = Duration::from_millis(self.connect_timeout_ms.load(std::sync::atomic::Ordering::Relaxed));
        let conn = tokio::time::timeout(timeout, connecting)
            .await
            .map_err(|_| fail("timed out".into()))?
            .map_err(|e| fail(e.to_string()))?;
        add(&self.stats.connects, 1);
        self.conns.lock().await.insert(to, conn.clone());
        tokio::spawn(read_connection(self.clone(), to, conn.clone()));
        Ok(conn)
    }

    async fn write(
        self: &Arc<Self>,
        lane: &mut Lane,
        to: PeerId,
        prefix: Bytes,
        payload: Bytes,
    ) -> Result<(), SendError> {
        let stale = lane.stream.as_ref().is_none_or(|(c, _)| c.close_reason().is_some());
        if stale {
            let conn = self.connection(to).await?;
            let s = conn.open_uni().await.map_err(|e| SendError::Stream { peer: to, msg: e.to_string() })?;
            lane.stream = Some((conn, s));
        }
        let (_, s) = lane.stream.as_mut().expect("stream just ensured");
        let err = |e: quinn::WriteError| SendError::Stream { peer: to, msg: e.to_string() };
        s.write_chunk(prefix).await.map_err(err)?;
        s.write_chunk(payload).await.map_err(err)?;
        Ok(())
    }

    /// Reads one frame after its 8-byte prefix. On error, says whether the
    /// stream is still at a frame boundary (the payload was consumed).
    async fn read_frame(
        &self,
        peer: PeerId,
        s: &mut quinn::RecvStream,
        prefix: [u8; 8],
    ) -> Result<ReceivedFrame, (FrameError, bool)> {
        let hl = frame::check_prefix(&prefix).map_err(|e| (e, false))?;
        let mut hb = vec![0u8; hl + frame::padding_len()];
        s.read_exact(&mut hb).await.map_err(|_| (FrameError::Truncated, false))?;
        let h = frame::parse_header(&hb[..hl]).map_err(|e| (e, false))?;
        frame::check_padding(&hb[hl..]).map_err(|e| (e, false))?;
        let checked = if self.dir.contains(&peer) {
            frame::check_header(&h, &self.ctx, peer)
        } else {
            Err(FrameError::UnknownSender(peer))
        };
        if let Err(e) = checked {
            // A bounded payload is skipped so the stream stays usable.
            let skippable = h.payload_len <= self.ctx.limits.max_payload && !matches!(e, FrameError::Shape(_));
            let at_boundary = skippable && skip(s, h.payload_len).await;
            return Err((e, at_boundary));
        }
        let len = h.payload_len as usize;
        let Some(mut buf) = pool::take(&self.pool, len).await else {
            return Err((FrameError::TooLarge { got: h.payload_len, limit: self.pool.budget_bytes() as u64 }, false));
        };
        read_hashed(s, &mut buf, &h.payload_hash).await?;
        add(&self.stats.payload_copies, 1);
        self.guard(peer, h.direction).accept(h.seq_no).map_err(|e| (e, true))?;
        self.commitments.lock().frame(u64::from(h.epoch), peer, h.direction as u8, Side::Received, &h.frame_id());
        // What crossed the wire for it: prefix, header and padding, payload.
        self.stats.received(h.direction, (prefix.len() + hb.len() + len) as u64);
        Ok(ReceivedFrame { header: h, payload: buf, peer })
    }
}

/// A bound UDP socket with the requested buffer sizes: forced past the
/// sysctl cap where we are allowed to (Linux, CAP_NET_ADMIN), otherwise as
/// large as the cap permits.
fn udp_socket(addr: SocketAddr, buffer: usize) -> std::io::Result<std::net::UdpSocket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let s = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    if addr.is_ipv6() {
        let _ = s.set_only_v6(false);
    }
    if !force_buffers(&s, buffer) {
        s.set_recv_buffer_size(buffer)?;
        s.set_send_buffer_size(buffer)?;
    }
    s.bind(&addr.into())?;
    Ok(s.into())
}

#[cfg(target_os = "linux")]
fn force_buffers(s: &socket2::Socket, buffer: usize) -> bool {
    use std::os::fd::AsRawFd;
    let v = buffer.min(i32::MAX as usize) as libc::c_int;
    [libc::SO_RCVBUFFORCE, libc::SO_SNDBUFFORCE].iter().all(|&opt| {
        // SAFETY: setsockopt reads one c_int through a valid pointer.
        unsafe {
            libc::setsockopt(
                s.as_raw_fd(),
                libc::SOL_SOCKET,
                opt,
                &v as *const libc::c_int as *const libc::c_void,
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            ) == 0
        }
    })
}

#[cfg(not(target_os = "linux"))]
fn force_buffers(_: &socket2::Socket, _: usize) -> bool {
    false
}

/// Fills `buf` from the stream (the one copy: QUIC's buffers -> pool) and
/// checks its blake3 hash, hashing each 64 KiB block right after copying it,
/// while it is still in cache, instead of a second pass over the payload.
async fn read_hashed(s: &mut quinn::RecvStream, buf: &mut [u8], want: &[u8; 32]) -> Result<(), (FrameError, bool)> {
    const BLOCK: usize = 64 << 10;
    let mut hasher = blake3::Hasher::new();
    let (mut filled, mut hashed) = (0, 0);
    while filled < buf.len() {
        let chunk = match s.read_chunk(buf.len() - filled, true).await {
            Ok(Some(c)) => c.bytes,
            _ => return Err((FrameError::Truncated, false)),
        };
        buf[filled..filled + chunk.len()].copy_from_slice(&chunk);
        filled += chunk.len();
        if filled - hashed >= BLOCK || filled == buf.len() {
            hasher.update(&buf[hashed..filled]);
            hashed = filled;
        }
    }
    if hasher.finalize().as_bytes() != want {
        return Err((FrameError::HashMismatch, true));
    }
    Ok(())
}

/// Reads and drops `n` bytes; false if the stream ended first.
async fn skip(s: &mut quinn::RecvStream, mut n: u64) -> bool {
    while n > 0 {
        match s.read_chunk(n.min(1 << 20) as usize, true).await {
            Ok(Some(c)) => n -= c.bytes.len() as u64,
            _ => return false,
        }
    }
    true
}

async fn accept_loop(inner: Arc<Inner>) {
    while let Some(incoming) = inner.ep.accept().await {
        let inner = inner.clone();
        tokio::spawn(async move {
            let conn = match incoming.await {
                Ok(c) => c,
                Err(e) => {
                    debug!(error = %e, "incoming connection refused or failed");
                    return;
                }
            };
            let Some(peer) = tls::peer_of_connection(&conn) else {
                conn.close(VarInt::from_u32(3), b"no identity");
                return;
            };
            // Frames to this peer may go back on the connection it opened
            // (no address needed, and it works through NAT).
            inner.conns.lock().await.entry(peer).or_insert_with(|| conn.clone());
            read_connection(inner, peer, conn).await;
        });
    }
}

/// Reads every stream the peer opens on `conn`, whichever side dialled.
async fn read_connection(inner: Arc<Inner>, peer: PeerId, conn: quinn::Connection) {
    while let Ok(stream) = conn.accept_uni().await {
        tokio::spawn(read_stream(inner.clone(), peer, stream));
    }
}

async fn read_stream(inner: Arc<Inner>, peer: PeerId, mut s: quinn::RecvStream) {
    loop {
        let mut prefix = [0u8; 8];
        match s.read_exact(&mut prefix).await {
            Ok(()) => {}
            // The stream ended cleanly at a frame boundary.
            Err(quinn::ReadExactError::FinishedEarly(0)) => return,
            Err(quinn::ReadExactError::FinishedEarly(_)) => {
                inner.stats.reject(&FrameError::Truncated);
                return;
            }
            // Reset by the sender (e.g. an abandoned frame) or connection lost.
            Err(quinn::ReadExactError::ReadError(e)) => {
                debug!(peer = %peer, error = %e, "stream ended");
                return;
            }
        }
        match inner.read_frame(peer, &mut s, prefix).await {
            Ok(f) => {
                if inner.tx.send(f).await.is_err() {
                    return; // the consumer is gone
                }
            }
            Err((e, at_boundary)) => {
                inner.stats.reject(&e);
                warn!(peer = %peer, kind = e.kind(), error = %e, "frame rejected");
                if !at_boundary {
                    let _ = s.stop(VarInt::from_u32(2));
                    return;
                }
            }
        }
    }
}
