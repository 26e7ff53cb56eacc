//! A signing client of the orchestrator (used by miners, the swarm and tests).

use std::sync::Arc;

use iota_core::Identity;
use tonic::transport::Channel;

use crate::auth::{now_ms, sign};
use crate::pb::{self, orchestrator_client::OrchestratorClient};

#[derive(Clone)]
pub struct ControlClient {
    rpc: OrchestratorClient<Channel>,
    id: Arc<Identity>,
}

impl ControlClient {
    /// Connects to `endpoint` (e.g. `http://127.0.0.1:7100`).
    pub async fn connect(endpoint: String, id: Arc<Identity>) -> Result<Self, tonic::transport::Error> {
        Ok(ControlClient { rpc: OrchestratorClient::connect(endpoint).await?, id })
    }

    pub fn identity(&self) -> &Arc<Identity> {
        &self.id
    }

    pub async fn register(
        &mut self,
        data_addr: String,
        tokens_per_s: f64,
        device: String,
    ) -> Result<pb::RegisterReply, tonic::Status> {
        let body = pb::RegisterRequest { role: pb::Role::Miner as i32, data_addr, tokens_per_s, device };
        let s = sign(&self.id, "/iota.v1.Orchestrator/Register", &body, now_ms());
        Ok(self.rpc.register(s).await?.into_inner())
    }

    pub async fn heartbeat(
        &mut self,
        epoch: u64,
        in_flight: u32,
        tokens_per_s: f64,
    ) -> Result<pb::HeartbeatReply, tonic::Status> {
        let body = pb::HeartbeatRequest { epoch, in_flight, tokens_per_s };
        let s = sign(&self.id, "/iota.v1.Orchestrator/Heartbeat", &body, now_ms());
        Ok(self.rpc.heartbeat(s).await?.into_inner())
    }

    pub async fn subscribe(&mut self) -> Result<tonic::Streaming<pb::Command>, tonic::Status> {
        let s = sign(&self.id, "/iota.v1.Orchestrator/Subscribe", &pb::SubscribeRequest {}, now_ms());
        Ok(self.rpc.subscribe(s).await?.into_inner())
    }

    pub async fn report(&mut self, kind: pb::report::Kind) -> Result<(), tonic::Status> {
        let s = sign(&self.id, "/iota.v1.Orchestrator/Report", &pb::Report { kind: Some(kind) }, now_ms());
        self.rpc.report(s).await?;
        Ok(())
    }

    pub async fn status(&mut self) -> Result<pb::RunStatus, tonic::Status> {
        let s = sign(&self.id, "/iota.v1.Orchestrator/Status", &pb::StatusRequest {}, now_ms());
        Ok(self.rpc.status(s).await?.into_inner())
    }

    /// Sends a pre-built envelope as-is (tests of hostile requests).
    pub async fn raw_heartbeat(&mut self, s: pb::Signed) -> Result<pb::HeartbeatReply, tonic::Status> {
        Ok(self.rpc.heartbeat(s).await?.into_inner())
    }
}
