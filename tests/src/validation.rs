//! The validation scenario shared by the integration tests and
//! `iota-bench adversary`: a `tiny` swarm in process (3x2, or another
//! shape) with two validators and at most one dishonest miner, placed in
//! the head, a middle or the tail stage.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use iota_control::orchestrator::{EpochSummary, VerdictRecord};
use iota_control::validator::ValidatorOptions;
use iota_core::{Identity, PeerId, WireCodec};
use iota_dataplane::miner::{Adversary, MinerOptions};

use crate::{Swarm, tiny_run, with_validators};

/// Where the adversary lands. Stages fill evenly in registration order
/// (0, 1, 2, 0, 1, 2): registered first it holds the head stage, second a
/// middle stage (with three stages or more), last the tail.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Place {
    Head,
    Middle,
    Tail,
}

impl Place {
    /// Its position in the registration order of `stages` x `replicas`
    /// miners, and its stage.
    fn slot(self, stages: u32, replicas: u32) -> (usize, u32) {
        match self {
            Place::Head => (0, 0),
            Place::Middle => (1, 1),
            Place::Tail => ((stages * replicas) as usize - 1, stages - 1),
        }
    }
}

/// What a scenario did.
pub struct ScenarioReport {
    /// The adversary's identity.
    pub bad: Option<PeerId>,
    /// `collude`: the second colluder (the replica after the adversary in
    /// its stage), run with the same mode.
    pub accomplice: Option<PeerId>,
    pub verdicts: Vec<VerdictRecord>,
    pub history: Vec<EpochSummary>,
    /// From the first miner's start to the last honest miner's end.
    pub wall: Duration,
    /// The honest miners' stage workers' busy time, summed.
    pub miner_compute: Duration,
    /// The validators' time checking evidence and evaluating merged
    /// models, summed.
    pub validator_compute: Duration,
    /// Evidence objects the validators checked.
    pub checked: u64,
    /// Evidence asks the orchestrator refused the validators.
    pub asks_refused: u64,
    /// Each validator's emission over the run, in order (the first is the
    /// one `Scenario::first_validator` sets up).
    pub validator_pay: Vec<f64>,
    /// Convictions on a validator's proof of a failed inner step that the
    /// orchestrator re-checked (`counters.step_proofs`).
    pub step_proofs: u64,
    /// The ledger's step proofs re-read from the store and re-checked as
    /// `ledger verify` does: how many, or why one does not hold.
    pub ledger_step_proofs: Result<usize, String>,
}

/// A validated scenario: `tiny` over `shape` for `epochs` x `per_epoch`
/// micro-batches, two validators, at most one adversary at its place (two
/// for the colluding modes). Built from `Scenario::new`, changed field by
/// field, run by `run`.
#[derive(Clone, Copy)]
pub struct Scenario {
    pub adversary: Option<(Adversary, Place)>,
    pub shape: (u32, u32),
    pub epochs: u64,
    pub per_epoch: u64,
    /// The validators' sampling seeds are `seed`, `seed + 1`.
    pub seed: u64,
    /// Sets every miner (the adversary too) up first (its compute, say).
    pub each: fn(&mut MinerOptions),
    /// Changes the run's config (its sample rate, say).
    pub config: fn(&mut iota_protocol::RunConfig),
    /// Sets the first validator up (a dishonest one, say).
    pub first_validator: fn(&mut ValidatorOptions),
    /// Sets every validator up (before `first_validator`, for the first).
    pub every_validator: fn(&mut ValidatorOptions),
}

impl Scenario {
    /// 3 stages x 2 replicas, the validators seeded 1000 and 1001.
    pub fn new(adversary: Option<(Adversary, Place)>, epochs: u64, per_epoch: u64) -> Scenario {
        Scenario {
            adversary,
            shape: (3, 2),
            epochs,
            per_epoch,
            seed: 1000,
            each: |_| {},
            config: |_| {},
            first_validator: |_| {},
            every_validator: |_| {},
        }
    }

    pub fn shaped(self, shape: (u32, u32)) -> Scenario {
        Scenario { shape, ..self }
    }

    pub fn seeded(self, seed: u64) -> Scenario {
        Scenario { seed, ..self }
    }

    pub async fn run(self) -> ScenarioReport {
        run(self).await
    }
}

/// Runs `epochs` x `per_epoch` micro-batches of `tiny` over 3 stages x 2
/// replicas with two validators, and `adversary` at its place (None: six
/// honest miners).
pub async fn run_scenario(adversary: Option<(Adversary, Place)>, epochs: u64, per_epoch: u64) -> ScenarioReport {
    Scenario::new(adversary, epochs, per_epoch).run().await
}

/// `run_scenario` over `(stages, replicas)`.
pub async fn run_scenario_shaped(
    adversary: Option<(Adversary, Place)>,
    shape: (u32, u32),
    epochs: u64,
    per_epoch: u64,
) -> ScenarioReport {
    Scenario::new(adversary, epochs, per_epoch).shaped(shape).run().await
}

/// `run_scenario_shaped`, every miner (the adversary too) set up by
/// `each` first (its compute, say).
pub async fn run_scenario_with(
    adversary: Option<(Adversary, Place)>,
    shape: (u32, u32),
    epochs: u64,
    per_epoch: u64,
    each: fn(&mut MinerOptions),
) -> ScenarioReport {
    Scenario { each, ..Scenario::new(adversary, epochs, per_epoch).shaped(shape) }.run().await
}

/// Whether a mode takes two miners of one stage, each the other's
/// accomplice.
fn colluding(mode: Adversary) -> bool {
    matches!(mode, Adversary::Collude | Adversary::RefereeCollusion)
}

async fn run(sc: Scenario) -> ScenarioReport {
    let Scenario {
        adversary,
        shape: (stages, replicas),
        epochs,
        per_epoch,
        seed,
        each,
        config,
        first_validator,
        every_validator,
    } = sc;
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = tiny_run(stages, replicas, epochs, per_epoch, WireCodec::Int8Row);
    let validators = with_validators(&mut cfg, 2);
    let validator_peers: Vec<PeerId> = validators.iter().map(|id| id.peer_id()).collect();
    cfg.spec.validation.min_per_miner = 3;
    // The scenarios' lazy trainers are caught by the inner steps' recompute.
    cfg.spec.validation.check_inner_steps = true;
    config(&mut cfg);
    let swarm = Swarm::start(&cfg, dir.path().join("state.sqlite")).await;
    let stop = Arc::new(AtomicBool::new(false));
    let vs: Vec<_> = validators
        .into_iter()
        .enumerate()
        .map(|(i, id)| {
            let first = if i == 0 { first_validator } else { |_: &mut ValidatorOptions| {} };
            let change = move |o: &mut ValidatorOptions| {
                every_validator(o);
                first(o);
            };
            swarm.validator_with(id, seed + i as u64, change, stop.clone())
        })
        .collect();
    let registered = |n: usize| swarm.service.with_state(|o| o.miners().count() >= n);
    let wait_for = |n: usize| async move {
        for _ in 0..200 {
            if registered(n) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("{n} miners never registered");
    };
    let t0 = Instant::now();
    let (mut honest, mut bad) = (Vec::new(), Vec::new());
    // `collude` takes two: the adversary's slot and the next one in its
    // stage (stages fill in registration order), each knowing the other.
    let colluders = adversary.filter(|(m, _)| colluding(*m)).map(|(_, place)| {
        let first = place.slot(stages, replicas).0;
        let ids = [Identity::from_seed([0xc0; 32]), Identity::from_seed([0xc1; 32])];
        ([first, first + stages as usize], ids)
    });
    let mut accomplice = None;
    // One at a time, so the registration order (and the stages) are known.
    for i in 0..(stages * replicas) as usize {
        match (adversary, &colluders) {
            (Some((mode, _)), Some((slots, ids))) if slots.contains(&i) => {
                let me = usize::from(slots[1] == i);
                let other = ids[1 - me].peer_id();
                if me == 1 {
                    accomplice = Some(ids[1].peer_id());
                }
                let id = Identity::from_seed([0xc0 + me as u8; 32]);
                bad.push(swarm.miner_as(
                    id,
                    |o| {
                        each(o);
                        o.adversary = Some(mode);
                        o.accomplices = vec![other];
                    },
                    stop.clone(),
                ))
            }
            (Some((mode, place)), _) if place.slot(stages, replicas).0 == i => bad.push(swarm.miner_with(
                |o| {
                    each(o);
                    o.adversary = Some(mode);
                },
                stop.clone(),
            )),
            _ => honest.push(swarm.miner_with(each, stop.clone())),
        }
        wait_for(i + 1).await;
    }
    let bad_peer = adversary.map(|(_, place)| {
        let mut order: Vec<_> = swarm.service.with_state(|o| o.miners().map(|m| (m.index, m.peer, m.stage)).collect());
        order.sort();
        let (slot, want) = place.slot(stages, replicas);
        let (_, peer, stage) = order[slot];
        assert_eq!(stage, want, "the adversary's stage");
        peer
    });
    let mut miner_compute = Duration::ZERO;
    for m in honest {
        let s = tokio::time::timeout(Duration::from_secs(120), m)
            .await
            .expect("honest miner finished in time")
            .unwrap()
            .unwrap();
        miner_compute += s.compute;
    }
    let wall = t0.elapsed();
    stop.store(true, Ordering::SeqCst);
    for b in bad {
        let _ = tokio::time::timeout(Duration::from_secs(10), b).await;
    }
    let (mut validator_compute, mut checked, mut asks_refused) = (Duration::ZERO, 0, 0);
    for v in vs {
        let s = tokio::time::timeout(Duration::from_secs(10), v).await.expect("validator ended").unwrap().unwrap();
        assert!(s.rounds >= 1, "{s:?}");
        validator_compute += s.check_time;
        checked += s.checked;
        asks_refused += s.asks_refused;
    }
    let (verdicts, history, validator_pay, step_proofs) = swarm.service.with_state(|o| {
        let pay = validator_peers.iter().map(|p| o.balances().get(p).copied().unwrap_or(0.0)).collect();
        (o.verdicts().to_vec(), o.history().to_vec(), pay, o.counters().step_proofs)
    });
    let ledger_step_proofs = ledger_step_proofs(&dir.path().join("state.sqlite"), &cfg).await;
    ScenarioReport {
        bad: bad_peer,
        accomplice,
        verdicts,
        history,
        wall,
        miner_compute,
        validator_compute,
        checked,
        asks_refused,
        validator_pay,
        step_proofs,
        ledger_step_proofs,
    }
}

/// The step proofs of the run's ledger (state in `db`, the store beside
/// it), re-read and re-checked as `ledger verify` does.
async fn ledger_step_proofs(db: &std::path::Path, cfg: &iota_protocol::RunConfig) -> Result<usize, String> {
    let entries = iota_control::state_db::StateDb::open(db).and_then(|d| d.ledger()).map_err(|e| format!("{e:#}"))?;
    let mut records = Vec::new();
    for e in &entries {
        let s: iota_control::settlement::ledger::Settlement =
            serde_json::from_str(&e.body).map_err(|e| e.to_string())?;
        records.extend(s.step_proofs);
    }
    let store = db.with_file_name("store");
    iota_control::ledger_cmd::recheck_step_proofs_in(&store, (cfg.clone(), None), &records)
        .await
        .map_err(|e| format!("{e:#}"))
}
