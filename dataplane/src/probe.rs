//! Transport probe: push N frames of a given size to a peer and measure
//! throughput and per-frame latency. The receiver acknowledges every frame
//! with a small control frame that answers it; latency is from the moment
//! the sender starts writing a frame to the moment its acknowledgement
//! arrives (so it includes queueing under load).

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use std::time::{Duration, Instant};

use iota_core::wire::Direction;
use iota_core::{PeerId, WireCodec};

use crate::frame::FrameMeta;
use crate::transport::Endpoint;

/// Outcome of one probe run, as the sender saw it.
#[derive(Clone, Debug)]
pub struct ProbeReport {
    pub frames: u64,
    pub frame_bytes: usize,
    /// From the first write to the last acknowledgement.
    pub elapsed: Duration,
    pub latencies: Vec<Duration>,
}

impl ProbeReport {
    pub fn bytes(&self) -> u64 {
        self.frames * self.frame_bytes as u64
    }
    pub fn gbps(&self) -> f64 {
        self.bytes() as f64 / self.elapsed.as_secs_f64() / 1e9
    }
    /// Latency percentile, q in [0, 1].
    pub fn latency(&self, q: f64) -> Duration {
        percentile(&self.latencies, q)
    }
}

pub fn percentile(v: &[Duration], q: f64) -> Duration {
    if v.is_empty() {
        return Duration::ZERO;
    }
    let mut s = v.to_vec();
    s.sort();
    s[((s.len() - 1) as f64 * q).round() as usize]
}

/// Metadata of probe data frame `i` (its index travels in `first_sample`).
pub fn data_meta(size: usize, i: u64) -> FrameMeta {
    FrameMeta {
        direction: Direction::Activation,
        codec: WireCodec::F32,
        stage: 0,
        epoch: 0,
        shard: 0,
        first_sample: i,
        samples: 1,
        attempt: 0,
        shape: vec![(size / 4) as u32],
        answers: [0; 32],
    }
}

/// Receives `frames` frames and acknowledges each to its sender.
pub async fn serve(ep: &Endpoint, frames: u64) -> anyhow::Result<()> {
    for _ in 0..frames {
        let f = ep.recv().await.ok_or_else(|| anyhow::anyhow!("endpoint closed"))?;
        let ack = FrameMeta {
            direction: Direction::Control,
            codec: WireCodec::F32,
            stage: 0,
            epoch: f.header.epoch,
            shard: 0,
            first_sample: f.header.first_sample,
            samples: 1,
            attempt: 0,
            shape: vec![1],
            answers: f.header.frame_id(),
        };
        let peer = f.peer;
        drop(f); // give the buffer back before acknowledging
        ep.send(peer, &ack, bytes::Bytes::from_static(&[0; 4])).await?;
    }
    Ok(())
}

/// Sends `frames` frames of `size` bytes (a multiple of 4) to `to` and waits
/// for every acknowledgement.
pub async fn push(ep: Arc<Endpoint>, to: PeerId, frames: u64, size: usize) -> anyhow::Result<ProbeReport> {
    anyhow::ensure!(size.is_multiple_of(4) && size > 0, "frame size must be a positive multiple of 4");
    let payload: bytes::Bytes = (0..size).map(|i| (i * 131 % 251) as u8).collect::<Vec<u8>>().into();
    let sent_at: Arc<Mutex<HashMap<[u8; 32], Instant>>> = Arc::default();
    let acks = {
        let (ep, sent_at) = (ep.clone(), sent_at.clone());
        tokio::spawn(async move {
            let mut lat = Vec::with_capacity(frames as usize);
            while (lat.len() as u64) < frames {
                let f = ep.recv().await.ok_or_else(|| anyhow::anyhow!("endpoint closed"))?;
                let now = Instant::now();
                if f.header.direction != Direction::Control {
                    continue;
                }
                // The ack may overtake the sender's bookkeeping: wait for it.
                loop {
                    if let Some(t) = sent_at.lock().remove(&f.header.answers) {
                        lat.push(now - t);
                        break;
                    }
                    tokio::task::yield_now().await;
                }
            }
            anyhow::Ok((lat, Instant::now()))
        })
    };
    let start = Instant::now();
    for i in 0..frames {
        let meta = data_meta(size, i);
        let t = Instant::now();
        // The frame id is known only after signing; record the start time
        // under it as soon as the send returns.
        let id = ep.send(to, &meta, payload.clone()).await?;
        sent_at.lock().insert(id, t);
    }
    let (latencies, end) = acks.await??;
    Ok(ProbeReport { frames, frame_bytes: size, elapsed: end - start, latencies })
}
