//! transport: move N bytes as frames of a given size over loopback with (a)
//! our QUIC data plane, (b) plain TCP, (c) TLS 1.3 over TCP (tokio-rustls,
//! same ring provider and certificates), in one run.
//!
//! All three do the same work per frame: the sender writes it, the receiver
//! reads it whole into a buffer. Sender and receiver share the process, so
//! one clock: throughput counts payload bytes from the first write to the
//! last delivery, latency is write start to delivery (queueing included).

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use iota_core::Identity;
use iota_dataplane::probe::{self, percentile};
use iota_dataplane::tls;
use iota_dataplane::{Endpoint, FrameLimits, HostPool, PeerDirectory, RunContext, TransportConfig};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::timing::{ms, process_cpu_time};

#[derive(clap::Args)]
pub struct Args {
    /// GiB moved per transport and frame size.
    #[arg(long, default_value_t = 1.0)]
    gib: f64,
    /// Frame sizes in bytes (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "262144,16777216")]
    sizes: Vec<usize>,
    /// QUIC: largest UDP payload (1200..=65527). 1452 is what the internet
    /// carries; loopback allows jumbo packets (unrealistic for miners).
    #[arg(long, default_value_t = 1452)]
    mtu: u16,
    /// QUIC flow-control windows in MiB (stream, connection, send).
    #[arg(long, default_value_t = 32)]
    window_mib: u32,
    /// QUIC congestion controller (cubic, bbr).
    #[arg(long, default_value = "cubic", value_parser = parse_congestion)]
    congestion: iota_dataplane::Congestion,
}

fn parse_congestion(s: &str) -> Result<iota_dataplane::Congestion, String> {
    iota_dataplane::Congestion::parse(s).ok_or_else(|| format!("unknown congestion controller '{s}'"))
}

struct Row {
    name: &'static str,
    frames: u64,
    size: usize,
    elapsed: Duration,
    cpu: Duration,
    p50: Duration,
    p99: Duration,
}

impl Row {
    /// From per-frame write-start and delivery times (same clock).
    fn one_way(name: &'static str, size: usize, sent: &[Duration], at: &[Duration], cpu: Duration) -> Row {
        let lat: Vec<Duration> = sent.iter().zip(at).map(|(s, a)| a.saturating_sub(*s)).collect();
        let end = at.iter().max().copied().unwrap_or_default();
        Row {
            name,
            frames: sent.len() as u64,
            size,
            elapsed: end - sent.first().copied().unwrap_or_default(),
            cpu,
            p50: percentile(&lat, 0.5),
            p99: percentile(&lat, 0.99),
        }
    }

    fn gbps(&self) -> f64 {
        (self.frames * self.size as u64) as f64 / self.elapsed.as_secs_f64() / 1e9
    }
    fn cpu_per_gib(&self) -> f64 {
        self.cpu.as_secs_f64() / ((self.frames * self.size as u64) as f64 / (1u64 << 30) as f64)
    }
}

fn ids() -> (Identity, Identity, Arc<PeerDirectory>) {
    let (a, b) = (Identity::generate(), Identity::generate());
    let dir = PeerDirectory::new();
    dir.insert(a.peer_id(), None);
    dir.insert(b.peer_id(), None);
    (a, b, dir)
}

async fn quic(frames: u64, size: usize, a: &Args) -> Result<Row> {
    let w = a.window_mib << 20;
    let cfg = TransportConfig {
        stream_window: w,
        conn_window: 2 * w,
        send_window: 2 * w as u64,
        max_mtu: a.mtu,
        congestion: a.congestion,
        ..TransportConfig::default()
    };
    let ctx = Arc::new(RunContext::new(0, FrameLimits::default()));
    let pool = (size * 8).max(64 << 20);
    let mk = |id| {
        Endpoint::bind(
            "127.0.0.1:0".parse().unwrap(),
            id,
            PeerDirectory::new(),
            ctx.clone(),
            HostPool::new(pool),
            cfg.clone(),
        )
    };
    let rx = mk(Identity::generate())?;
    let tx = Arc::new(mk(Identity::generate())?);
    rx.directory().insert(tx.peer_id(), None);
    tx.directory().insert(rx.peer_id(), Some(rx.local_addr()?));
    let to = rx.peer_id();
    let c0 = process_cpu_time();
    let t0 = Instant::now();
    let receiver = tokio::spawn(async move {
        let mut at = vec![Duration::ZERO; frames as usize];
        for _ in 0..frames {
            let f = rx.recv().await.context("endpoint closed")?;
            at[f.header.first_sample as usize] = t0.elapsed();
        }
        anyhow::Ok(at)
    });
    let payload: bytes::Bytes = (0..size).map(|i| (i * 131 % 251) as u8).collect::<Vec<u8>>().into();
    let mut sent = Vec::with_capacity(frames as usize);
    for i in 0..frames {
        sent.push(t0.elapsed());
        tx.send(to, &probe::data_meta(size, i), payload.clone()).await?;
    }
    let at = receiver.await??;
    Ok(Row::one_way("QUIC (ours)", size, &sent, &at, process_cpu_time() - c0))
}

/// Receiver side of the TCP baselines: read each frame whole into a buffer
/// (as ours lands in a pool buffer) and note when it was complete.
async fn tcp_serve<S: AsyncRead + Unpin>(mut s: S, frames: u64, size: usize, t0: Instant) -> Result<Vec<Duration>> {
    let mut buf = vec![0u8; size];
    let mut at = Vec::with_capacity(frames as usize);
    for _ in 0..frames {
        let len = s.read_u64_le().await? as usize;
        anyhow::ensure!(len == size, "frame length {len}");
        s.read_exact(&mut buf).await?;
        at.push(t0.elapsed());
    }
    Ok(at)
}

async fn tcp_push<S: AsyncWrite + Unpin>(mut s: S, frames: u64, size: usize, t0: Instant) -> Result<Vec<Duration>> {
    let payload: Vec<u8> = (0..size).map(|i| (i * 131 % 251) as u8).collect();
    let mut sent = Vec::with_capacity(frames as usize);
    for _ in 0..frames {
        sent.push(t0.elapsed());
        s.write_u64_le(size as u64).await?;
        s.write_all(&payload).await?;
    }
    s.flush().await?;
    // Keep the connection open until the receiver has everything.
    Ok(sent)
}

async fn tcp(frames: u64, size: usize, with_tls: bool) -> Result<Row> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let (server_id, client_id, dir) = ids();
    let server_peer = server_id.peer_id();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls::server_config(&server_id, dir.clone())?));
    let connector = tokio_rustls::TlsConnector::from(Arc::new(tls::client_config(&client_id, server_peer, dir)?));
    let c0 = process_cpu_time();
    let t0 = Instant::now();
    let server = tokio::spawn(async move {
        let (s, _) = listener.accept().await?;
        s.set_nodelay(true)?;
        if with_tls {
            tcp_serve(acceptor.accept(s).await?, frames, size, t0).await
        } else {
            tcp_serve(s, frames, size, t0).await
        }
    });
    let s = TcpStream::connect(addr).await?;
    s.set_nodelay(true)?;
    let (sent, at) = if with_tls {
        let name = rustls::pki_types::ServerName::try_from("iota-peer")?;
        let mut c = connector.connect(name, s).await?;
        let sent = tcp_push(&mut c, frames, size, t0).await?;
        (sent, server.await??)
    } else {
        let mut s = s;
        let sent = tcp_push(&mut s, frames, size, t0).await?;
        (sent, server.await??)
    };
    let name = if with_tls { "TLS 1.3 over TCP" } else { "plain TCP" };
    Ok(Row::one_way(name, size, &sent, &at, process_cpu_time() - c0))
}

pub fn run(a: Args) -> Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    rt.block_on(async {
        println!(
            "transport: {:.2} GiB per run over 127.0.0.1, {} worker threads, QUIC initial MTU {}, windows {} MiB",
            a.gib,
            tokio::runtime::Handle::current().metrics().num_workers(),
            a.mtu,
            a.window_mib
        );
        for &size in &a.sizes {
            anyhow::ensure!(size >= 4 && size % 4 == 0, "frame sizes must be multiples of 4");
            let frames = ((a.gib * (1u64 << 30) as f64) / size as f64).ceil() as u64;
            let rows = vec![
                quic(frames, size, &a).await.context("QUIC run")?,
                tcp(frames, size, false).await.context("TCP run")?,
                tcp(frames, size, true).await.context("TLS run")?,
            ];
            println!("\nframes of {} KiB x {}:", size >> 10, frames);
            println!(
                "  {:<18} {:>8} {:>12} {:>10} {:>10} {:>9} {:>9}",
                "", "GB/s", "CPU s/GiB", "p50 ms", "p99 ms", "vs TCP", "vs TLS"
            );
            let (tcp_g, tls_g) = (rows[1].gbps(), rows[2].gbps());
            for r in &rows {
                println!(
                    "  {:<18} {:>8.3} {:>12.2} {:>10.2} {:>10.2} {:>8.2}x {:>8.2}x",
                    r.name,
                    r.gbps(),
                    r.cpu_per_gib(),
                    ms(r.p50),
                    ms(r.p99),
                    r.gbps() / tcp_g,
                    r.gbps() / tls_g
                );
            }
        }
        Ok(())
    })
}
