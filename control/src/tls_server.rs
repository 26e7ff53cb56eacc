//! The orchestrator's TLS listener: connections are accepted, their TLS
//! handshakes run concurrently (bounded in number and time, so a client
//! that connects and says nothing holds no one up), and finished sessions
//! are handed to the gRPC server. The certificate is the orchestrator's
//! identity certificate (`iota_protocol::tls_identity`), which miners pin.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::server::{Connected, TcpConnectInfo};

/// Handshakes in progress at once; further connections are closed at once.
pub const MAX_HANDSHAKES: usize = 256;
/// How long a client may take to finish its handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// A finished TLS session over TCP, as the gRPC server takes it.
pub struct TlsConn(tokio_rustls::server::TlsStream<TcpStream>);

impl Connected for TlsConn {
    type ConnectInfo = TcpConnectInfo;
    fn connect_info(&self) -> TcpConnectInfo {
        self.0.get_ref().0.connect_info()
    }
}

impl AsyncRead for TlsConn {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for TlsConn {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }
}

/// The TLS sessions arriving on `listener` (until the stream is dropped).
pub fn incoming(listener: TcpListener, tls: Arc<rustls::ServerConfig>) -> ReceiverStream<io::Result<TlsConn>> {
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(async move {
        let acceptor = tokio_rustls::TlsAcceptor::from(tls);
        let permits = Arc::new(Semaphore::new(MAX_HANDSHAKES));
        while !tx.is_closed() {
            let (tcp, from) = match listener.accept().await {
                Ok(c) => c,
                Err(e) => {
                    // Out of descriptors, say: wait rather than spin.
                    tracing::warn!(error = %e, "accepting a control-plane connection failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let Ok(permit) = permits.clone().try_acquire_owned() else {
                tracing::debug!(%from, "too many TLS handshakes in progress; connection closed");
                continue;
            };
            let _ = tcp.set_nodelay(true);
            let (acceptor, tx) = (acceptor.clone(), tx.clone());
            tokio::spawn(async move {
                let _permit = permit;
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                    Ok(Ok(tls)) => {
                        let _ = tx.send(Ok(TlsConn(tls))).await;
                    }
                    Ok(Err(e)) => tracing::debug!(%from, error = %e, "TLS handshake refused"),
                    Err(_) => tracing::debug!(%from, "TLS handshake timed out"),
                }
            });
        }
    });
    ReceiverStream::new(rx)
}
