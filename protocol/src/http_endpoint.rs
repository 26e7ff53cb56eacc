//! A small read-only HTTP/1.1 endpoint for operators (the orchestrator's
//! and the miners' `/metrics`, the dashboard). Every request is hostile
//! until parsed: bounded in size and time, GET or HEAD only, answered once
//! and closed.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Longest request head read (request line and headers).
const MAX_REQUEST: usize = 8 << 10;
/// A client gets this long to send its request.
const READ_TIMEOUT: Duration = Duration::from_secs(5);
/// Connections served at once; more wait in the kernel's backlog.
const MAX_CONNECTIONS: usize = 32;

/// The content type of Prometheus/OpenMetrics text.
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// A page: its content type and body.
pub struct Page {
    pub content_type: &'static str,
    pub body: Vec<u8>,
}

/// What answers a path (None: 404).
pub type Router = Arc<dyn Fn(&str) -> Option<Page> + Send + Sync>;

/// Binds `addr` and serves `router` until the task is aborted; returns the
/// bound address.
pub async fn serve(addr: SocketAddr, router: Router) -> Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = TcpListener::bind(addr).await.with_context(|| format!("binding the HTTP endpoint on {addr}"))?;
    let local = listener.local_addr()?;
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let task = tokio::spawn(async move {
        loop {
            let Ok(permit) = slots.clone().acquire_owned().await else { return };
            let Ok((stream, _)) = listener.accept().await else { continue };
            let router = router.clone();
            tokio::spawn(async move {
                let _ = answer(stream, &router).await;
                drop(permit);
            });
        }
    });
    Ok((local, task))
}

/// The request line's method and path (query dropped), or the status to
/// refuse it with.
fn parse_request(head: &[u8]) -> Result<(bool, String), (u16, &'static str)> {
    let text = std::str::from_utf8(head).map_err(|_| (400, "the request is not UTF-8"))?;
    let line = text.lines().next().unwrap_or_default();
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version)) = (parts.next(), parts.next(), parts.next()) else {
        return Err((400, "malformed request line"));
    };
    if parts.next().is_some() || !version.starts_with("HTTP/1.") || !target.starts_with('/') {
        return Err((400, "malformed request line"));
    }
    let head_only = match method {
        "GET" => false,
        "HEAD" => true,
        _ => return Err((405, "only GET and HEAD are served")),
    };
    let path = target.split(['?', '#']).next().unwrap_or("/");
    Ok((head_only, path.to_string()))
}

async fn answer(mut stream: TcpStream, router: &Router) -> std::io::Result<()> {
    let mut head = Vec::with_capacity(1024);
    let mut buf = [0u8; 1024];
    let complete = tokio::time::timeout(READ_TIMEOUT, async {
        loop {
            let n = stream.read(&mut buf).await?;
            if n == 0 {
                return Ok::<bool, std::io::Error>(false);
            }
            head.extend_from_slice(&buf[..n]);
            if head.len() > MAX_REQUEST {
                return Ok(false);
            }
            if head.windows(4).any(|w| w == b"\r\n\r\n") {
                return Ok(true);
            }
        }
    })
    .await;
    let (status, content_type, body, head_only) = match complete {
        Ok(Ok(true)) => match parse_request(&head) {
            Ok((head_only, path)) => match router(&path) {
                Some(p) => (200, p.content_type, p.body, head_only),
                None => (404, "text/plain; charset=utf-8", format!("no page at {path}\n").into_bytes(), head_only),
            },
            Err((code, why)) => (code, "text/plain; charset=utf-8", format!("{why}\n").into_bytes(), false),
        },
        Ok(Ok(false)) if head.len() > MAX_REQUEST => {
            (431, "text/plain; charset=utf-8", b"request too large\n".to_vec(), false)
        }
        // Closed, timed out or failed before a whole request: nothing to answer.
        _ => return Ok(()),
    };
    let reason = match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        _ => "Request Header Fields Too Large",
    };
    let mut response = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    if !head_only {
        response.extend_from_slice(&body);
    }
    stream.write_all(&response).await?;
    stream.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_parsed_strictly() {
        assert_eq!(parse_request(b"GET /metrics?x=1 HTTP/1.1\r\n\r\n").unwrap(), (false, "/metrics".into()));
        assert_eq!(parse_request(b"HEAD / HTTP/1.0\r\n\r\n").unwrap(), (true, "/".into()));
        assert_eq!(parse_request(b"POST /metrics HTTP/1.1\r\n\r\n").unwrap_err().0, 405);
        for bad in [
            &b"GET\r\n\r\n"[..],
            b"GET metrics HTTP/1.1\r\n\r\n",
            b"GET / SPDY/3\r\n\r\n",
            b"GET / HTTP/1.1 x\r\n",
            b"\xff\xfe",
        ] {
            assert_eq!(parse_request(bad).unwrap_err().0, 400, "{bad:?}");
        }
    }
}
