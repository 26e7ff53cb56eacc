//! The orchestrator's operator pages (`/metrics`, the dashboard) on the
//! shared read-only HTTP endpoint (`iota_protocol::http_endpoint`).

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Result;
pub use iota_protocol::http_endpoint::{OPENMETRICS, Page, Router, serve};

/// Which operator pages an endpoint serves.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pages {
    /// `/metrics`: Prometheus/OpenMetrics text.
    pub metrics: bool,
    /// `/` (the dashboard) and `/api/state` (its JSON).
    pub dashboard: bool,
}

/// The orchestrator's pages.
pub fn orchestrator_router(svc: crate::service::OrchestratorService, pages: Pages) -> Router {
    Arc::new(move |path: &str| match path {
        "/metrics" if pages.metrics => Some(Page {
            content_type: OPENMETRICS,
            body: svc.with_state(crate::metrics::orchestrator_metrics).into_bytes(),
        }),
        "/" | "/index.html" if pages.dashboard => {
            Some(Page { content_type: "text/html; charset=utf-8", body: crate::dashboard::PAGE.as_bytes().to_vec() })
        }
        "/api/state" if pages.dashboard => {
            let now = iota_protocol::auth::now_ms();
            let state = svc.with_state(|o| crate::dashboard::state(o, now));
            Some(Page { content_type: "application/json", body: state.to_string().into_bytes() })
        }
        "/" => {
            Some(Page { content_type: "text/plain; charset=utf-8", body: b"iota orchestrator: /metrics\n".to_vec() })
        }
        _ => None,
    })
}

/// Starts the operator endpoints asked for: `--metrics ADDR` and
/// `--dashboard ADDR` (one server when both name the same address). Says
/// where each is with `say`; returns the servers' tasks.
pub async fn serve_operator_pages(
    svc: &crate::service::OrchestratorService,
    metrics: Option<SocketAddr>,
    dashboard: Option<SocketAddr>,
    say: impl Fn(String),
) -> Result<Vec<tokio::task::JoinHandle<()>>> {
    let mut wanted: Vec<(SocketAddr, Pages)> = Vec::new();
    for (addr, page) in
        [(metrics, Pages { metrics: true, dashboard: false }), (dashboard, Pages { metrics: false, dashboard: true })]
    {
        let Some(addr) = addr else { continue };
        match wanted.iter_mut().find(|(a, _)| *a == addr && addr.port() != 0) {
            Some((_, p)) => {
                p.metrics |= page.metrics;
                p.dashboard |= page.dashboard;
            }
            None => wanted.push((addr, page)),
        }
    }
    let mut tasks = Vec::new();
    for (addr, pages) in wanted {
        let (at, task) = serve(addr, orchestrator_router(svc.clone(), pages)).await?;
        if pages.dashboard {
            say(format!("dashboard at http://{at}/"));
        }
        if pages.metrics {
            say(format!("metrics at http://{at}/metrics"));
        }
        if !at.ip().is_loopback() {
            say(format!(
                "note: http://{at}/ is reachable from the network; it is read-only and unauthenticated \
                 (give a loopback address to keep it local)"
            ));
        }
        tasks.push(task);
    }
    Ok(tasks)
}
