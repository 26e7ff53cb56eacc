//! iota-dataplane: how miners move tensors between each other.
//!
//! - [`frame`]: building frames and validating hostile ones;
//! - [`tls`]: certificates bound to node identities, peer verification;
//! - [`transport`]: the QUIC endpoint (lanes, reconnects, backpressure);
//! - [`pool`]: bounded receive pools (`HostPool`; CUDA pinned memory later).

pub mod fileio;
pub mod frame;
pub mod pool;
pub mod stats;
pub mod tls;
pub mod transport;

pub use frame::{FrameError, FrameLimits, FrameMeta, RunContext};
pub use pool::{BufferPool, HostPool, PooledBuf};
pub use stats::StatsSnapshot;
pub use tls::PeerDirectory;
pub use transport::{Endpoint, ReceivedFrame, SendError, TransportConfig};
