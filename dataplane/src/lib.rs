//! iota-dataplane: how miners move tensors between each other.
//!
//! - [`frame`], [`evidence`], [`recompute`]: `iota-checks`' pure checks;
//! - [`tls`]: certificates bound to node identities, peer verification;
//! - [`transport`]: the QUIC endpoint (lanes, reconnects, backpressure);
//! - [`pool`]: bounded receive pools (`HostPool`; CUDA pinned memory later).

// The pure checks (frames, evidence, recompute) are `iota-checks`',
// re-exported under their old paths.
pub use iota_checks::{
    contribution, evidence, evidence_bundle, frame, hashes, inner_step, recompute, slices, sparse, sparse_contribution,
};

pub mod commands;
pub mod corpus;
pub mod fileio;
pub mod granted_store;
pub mod identity_file;
pub mod local_store;
pub mod miner;
pub mod miner_metrics;
pub mod pool;
pub mod prepared_corpus;
pub mod probe;
pub mod sent_frames;
pub mod stats;
pub mod tls;
pub mod transport;

pub use frame::{FrameError, FrameLimits, FrameMeta, RunContext};
pub use pool::{AlignedHeap, BufferPool, HostMemory, HostPool, PinnedHeap, PooledBuf};
pub use stats::StatsSnapshot;
pub use tls::PeerDirectory;
pub use transport::{Congestion, Endpoint, ReceivedFrame, SendError, TransportConfig};

/// How the binaries write their logs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// One line per event for people.
    #[default]
    Text,
    /// One JSON object per line (timestamp, level, target, fields) for
    /// log collectors.
    Json,
}

/// Logging for the binaries: `RUST_LOG` filters (default `info`), to stderr.
pub fn init_logging() {
    init_logging_as(LogFormat::Text, "info");
}

/// Logging in `format`, `RUST_LOG` filtering (`default_filter` without it),
/// to stderr.
pub fn init_logging_as(format: LogFormat, default_filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter));
    let fmt = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => fmt.try_init(),
        LogFormat::Json => fmt.json().with_current_span(false).try_init(),
    };
}
