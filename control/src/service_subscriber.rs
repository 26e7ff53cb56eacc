//! A miner's open command stream, as the orchestrator's service holds it:
//! every command signed as the stream's next, bound to its Subscribe.

use iota_core::{Identity, PeerId};
use iota_protocol::auth::{Audience, sign_server};
use iota_protocol::client::SUBSCRIBE;
use iota_protocol::pb;
use tokio::sync::mpsc;
use tonic::Status;

/// A miner's open command stream.
pub(crate) struct Subscriber {
    pub(crate) tx: mpsc::Sender<Result<pb::ServerSigned, Status>>,
    /// The Subscribe request's nonce: every command of this stream is
    /// signed bound to it.
    pub(crate) nonce: Vec<u8>,
    pub(crate) next_seq: u64,
}

impl Subscriber {
    /// Signs `cmd` as the stream's next and queues it; gives it back when
    /// the stream has no room (or is gone).
    #[allow(clippy::result_large_err)] // the command itself comes back, to be queued
    pub(crate) fn send(
        &mut self,
        id: &Identity,
        aud: &Audience,
        to: &PeerId,
        cmd: pb::Command,
    ) -> Result<(), pb::Command> {
        if self.tx.is_closed() || self.tx.capacity() == 0 {
            return Err(cmd);
        }
        let signed = sign_server(id, aud, to, SUBSCRIBE, &self.nonce, self.next_seq, &cmd);
        match self.tx.try_send(Ok(signed)) {
            Ok(()) => {
                self.next_seq += 1;
                Ok(())
            }
            Err(_) => Err(cmd),
        }
    }
}
