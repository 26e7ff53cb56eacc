//! `--schedule`: how often the replicas merge and how deep the pipeline
//! runs, chosen for loss at equal tokens or for throughput.
//!
//! Both costs of the swarm against one process at equal tokens come from
//! these two settings (docs/BENCHMARKS.md, convergence): each inner step a
//! replica takes alone between merges, and each micro-batch a stage
//! forwards before the previous one's gradient is back. Buying them down
//! costs merges and idle stages, which are cheap where every miner shares
//! one machine's CPU and dear on GPUs or across the network.

use anyhow::{Result, bail};

/// Inner steps of each replica between merges under `--schedule loss`:
/// `small`, 3 x 2, 288 micro-batches, one micro-batch per pathway in
/// flight, lands 0.8-1.3% above one process at equal tokens in five runs.
/// Every 3 or 4 steps is faster (0.78-0.80x against 0.69x of the
/// throughput schedule) but straddles the 2% target from run to run
/// (+1.6% to +2.1%; docs/BENCHMARKS.md, "The default schedule").
pub const LOSS_MERGE_STEPS: u64 = 2;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Schedule {
    /// Merge every [`LOSS_MERGE_STEPS`] inner steps, one micro-batch per
    /// pathway in flight.
    Loss,
    /// Merge at the end of each `--micro-batches` epoch, two micro-batches
    /// per replica in flight.
    Throughput,
}

impl Schedule {
    pub fn name(self) -> &'static str {
        match self {
            Schedule::Loss => "loss",
            Schedule::Throughput => "throughput",
        }
    }
}

/// What the run's settings resolve to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cadence {
    pub schedule: Schedule,
    /// `--schedule auto` chose it.
    pub auto: bool,
    /// The run's epochs (each ends with a merge) and micro-batches per epoch.
    pub epochs: u64,
    pub micro_batches_per_epoch: u64,
    /// Micro-batches in flight unless `--max-in-flight` says otherwise.
    pub default_max_in_flight: u32,
}

/// The run as the command line gave it, for [`resolve`].
pub struct Asked<'a> {
    pub schedule: &'a str,
    /// Where the miners compute when this command starts them itself on
    /// this machine (`swarm`, the benches); `None` when they join from
    /// elsewhere (`orchestrator`).
    pub local_miner_device: Option<&'a str>,
    /// The run has validators.
    pub validated: bool,
    pub epochs: u64,
    pub micro_batches: u64,
    pub replicas: u32,
    pub grad_accum: u64,
}

/// `auto` takes `loss` for a swarm of CPU miners on this machine, where a
/// merge goes through loopback and the local disk (`small`: about 0.4 s,
/// against 0.4 s a micro-batch) and the miners' threads keep the cores busy
/// with one micro-batch per pathway; `throughput` for GPU miners (a stage
/// idles without a full pipeline, and `1.5b`'s merge took 28 s against 8 s
/// of training an epoch on an H200) and for `orchestrator` (merges cross the
/// network). A validated run keeps `throughput`'s epochs: the validators'
/// floor of samples per miner and epoch would make short epochs a full
/// recompute.
pub fn resolve(a: &Asked) -> Result<Cadence> {
    let local_cpu = a.local_miner_device == Some("cpu");
    let (schedule, auto) = match a.schedule {
        "loss" => (Schedule::Loss, false),
        "throughput" => (Schedule::Throughput, false),
        "auto" if local_cpu && !a.validated => (Schedule::Loss, true),
        "auto" => (Schedule::Throughput, true),
        other => bail!("unknown --schedule '{other}' (auto, loss, throughput)"),
    };
    let replicas = a.replicas.max(1);
    Ok(match schedule {
        Schedule::Throughput => Cadence {
            schedule,
            auto,
            epochs: a.epochs,
            micro_batches_per_epoch: a.micro_batches,
            default_max_in_flight: 2 * replicas,
        },
        Schedule::Loss => {
            // The run's micro-batches cut into shorter epochs, never longer
            // than the ones asked for; a remainder rounds up to a whole
            // epoch (the note says so).
            let total = a.epochs.saturating_mul(a.micro_batches);
            let len = (LOSS_MERGE_STEPS * replicas as u64 * a.grad_accum.max(1)).min(a.micro_batches).max(1);
            Cadence {
                schedule,
                auto,
                epochs: total.div_ceil(len).max(1),
                micro_batches_per_epoch: len,
                default_max_in_flight: replicas,
            }
        }
    })
}

/// The run's first line about its schedule: which, why, and what it makes
/// of the epochs asked for.
pub fn note(c: &Cadence, asked_epochs: u64, asked_micro_batches: u64, max_in_flight: u32) -> String {
    let why = match (c.auto, c.schedule) {
        (true, Schedule::Loss) => " (auto: CPU miners on this machine, where merges are cheap)",
        (true, Schedule::Throughput) => " (auto: miners on GPUs or elsewhere, or validators)",
        (false, _) => "",
    };
    let other = match c.schedule {
        Schedule::Loss => "throughput",
        Schedule::Throughput => "loss",
    };
    let asked = asked_epochs.saturating_mul(asked_micro_batches);
    let total = c.epochs.saturating_mul(c.micro_batches_per_epoch);
    let shape = if c.epochs == asked_epochs && c.micro_batches_per_epoch == asked_micro_batches {
        format!("{} epochs of {} micro-batches", c.epochs, c.micro_batches_per_epoch)
    } else if total == asked {
        format!("{asked} micro-batches in {} epochs of {}", c.epochs, c.micro_batches_per_epoch)
    } else {
        format!(
            "{asked} micro-batches asked, {total} run: {} epochs of {} (the last one whole)",
            c.epochs, c.micro_batches_per_epoch
        )
    };
    format!(
        "schedule: {}{why}: {shape}, each ending with a merge; {max_in_flight} micro-batches in flight \
         (--schedule {other} for the other trade)",
        c.schedule.name()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn asked<'a>(schedule: &'a str, device: Option<&'a str>) -> Asked<'a> {
        Asked {
            schedule,
            local_miner_device: device,
            validated: false,
            epochs: 6,
            micro_batches: 48,
            replicas: 2,
            grad_accum: 1,
        }
    }

    #[test]
    fn auto_buys_loss_only_where_merges_and_idle_stages_are_cheap() {
        let loss = resolve(&asked("auto", Some("cpu"))).unwrap();
        assert_eq!(
            loss,
            Cadence {
                schedule: Schedule::Loss,
                auto: true,
                epochs: 72,
                micro_batches_per_epoch: 4,
                default_max_in_flight: 2
            }
        );
        for device in [Some("cuda"), Some("cuda:1"), None] {
            let c = resolve(&asked("auto", device)).unwrap();
            assert_eq!(
                (c.schedule, c.epochs, c.micro_batches_per_epoch, c.default_max_in_flight),
                (Schedule::Throughput, 6, 48, 4)
            );
        }
        let validated = resolve(&Asked { validated: true, ..asked("auto", Some("cpu")) }).unwrap();
        assert_eq!(validated.schedule, Schedule::Throughput);
        // Named, a schedule is taken wherever the miners are.
        assert_eq!(resolve(&asked("loss", None)).unwrap().schedule, Schedule::Loss);
        assert_eq!(resolve(&asked("throughput", Some("cpu"))).unwrap().schedule, Schedule::Throughput);
        let bad = resolve(&asked("fast", None)).unwrap_err().to_string();
        assert!(bad.contains("auto, loss, throughput"), "{bad}");
    }

    #[test]
    fn the_loss_schedule_keeps_the_runs_micro_batches_and_says_when_it_rounds() {
        // Three replicas accumulating 2 micro-batches a step: a merge every
        // 2 steps is 12 micro-batches.
        let c = resolve(&Asked { replicas: 3, grad_accum: 2, ..asked("loss", None) }).unwrap();
        assert_eq!((c.epochs, c.micro_batches_per_epoch, c.default_max_in_flight), (24, 12, 3));
        let n = note(&c, 6, 48, 3);
        assert!(n.starts_with("schedule: loss: 288 micro-batches in 24 epochs of 12"), "{n}");
        // Never longer epochs than asked for.
        let short = resolve(&Asked { micro_batches: 3, epochs: 1, ..asked("loss", None) }).unwrap();
        assert_eq!((short.epochs, short.micro_batches_per_epoch), (1, 3));
        // 7 x 10 = 70 micro-batches in epochs of 4: 18 epochs, 72 run.
        let odd = resolve(&Asked { epochs: 7, micro_batches: 10, ..asked("auto", Some("cpu")) }).unwrap();
        assert_eq!((odd.epochs, odd.micro_batches_per_epoch), (18, 4));
        let n = note(&odd, 7, 10, 2);
        assert!(n.contains("70 micro-batches asked, 72 run") && n.contains("auto: CPU miners"), "{n}");
        let t = resolve(&asked("throughput", None)).unwrap();
        assert!(note(&t, 6, 48, 4).starts_with("schedule: throughput: 6 epochs of 48"));
    }
}
