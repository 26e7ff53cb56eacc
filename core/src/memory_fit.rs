//! Whether a miner's memory holds a stage of a run, and how many
//! micro-batches it may hold at once: the memory plan (`memory_plan`)
//! evaluated once per run, so the orchestrator can assign and route by it
//! and the miner can check its assignment before it allocates anything.

use crate::config::ModelConfig;
use crate::error::ConfigError;
use crate::layout::StageSpec;
use crate::memory_plan::{ComputeBackend, FIT_RESERVE, InnerOptimizer, Workload, stage_memory};

/// Every backend a miner may state, in a fixed order.
pub const BACKENDS: [ComputeBackend; 3] =
    [ComputeBackend::Cpu, ComputeBackend::CudaF32Gemm, ComputeBackend::CudaBf16Gemm];

/// When a miner recomputes activations in the backward
/// (`Stage::set_recompute`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Recompute {
    /// Where its stated memory holds more micro-batches that way than
    /// keeping every activation (`RunMemoryNeeds::recomputes`); never when
    /// it states no memory.
    #[default]
    Auto,
    /// Always: the least memory, about a third more compute.
    Always,
}

impl Recompute {
    pub fn parse(s: &str) -> Option<Recompute> {
        match s {
            "auto" => Some(Recompute::Auto),
            "always" => Some(Recompute::Always),
            _ => None,
        }
    }
}

/// A run's stages' peak memory on each backend, by micro-batches held,
/// with and without activation recomputation (a miner's own choice: it
/// recomputes where that lets it hold more micro-batches, `recomputes`).
#[derive(Clone, Debug, PartialEq)]
pub struct RunMemoryNeeds {
    /// `[backend][stage][held - 1]`: the peak, in bytes, of a stage holding
    /// `held` micro-batches' activations (a tail always holds one).
    peaks: Vec<Vec<Vec<u64>>>,
    /// The same, recomputing.
    recompute_peaks: Vec<Vec<Vec<u64>>>,
    batch: usize,
    seq: usize,
}

/// Why a miner's memory does not hold a stage, in one line.
#[derive(Clone, Debug, PartialEq)]
pub struct DoesNotFit {
    pub stage: usize,
    pub needs: u64,
    pub usable: u64,
}

impl std::fmt::Display for DoesNotFit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "stage {} needs {:.2} GiB with one micro-batch in flight, more than the {:.2} GiB usable of this \
             miner's memory ({:.0}% kept free for the allocator and the driver)",
            self.stage,
            gib(self.needs),
            gib(self.usable),
            FIT_RESERVE * 100.0
        )
    }
}

fn gib(b: u64) -> f64 {
    b as f64 / (1u64 << 30) as f64
}

/// Bytes of `memory` a plan may fill.
pub fn usable(memory: u64) -> u64 {
    (memory as f64 * (1.0 - FIT_RESERVE)) as u64
}

impl RunMemoryNeeds {
    /// The needs of `cfg` split in `stages`, at `batch` x `seq` per
    /// micro-batch, up to `max_held` micro-batches held at once (weight
    /// stashing on, as the miners run).
    pub fn new(
        cfg: &ModelConfig,
        stages: usize,
        batch: usize,
        seq: usize,
        max_held: usize,
        optimizer: InnerOptimizer,
    ) -> Result<RunMemoryNeeds, ConfigError> {
        let specs = StageSpec::split(cfg, stages)?;
        let max_held = max_held.max(1);
        let table = |recompute: bool| -> Vec<Vec<Vec<u64>>> {
            BACKENDS
                .iter()
                .map(|&backend| {
                    specs
                        .iter()
                        .map(|spec| {
                            (1..=max_held)
                                .map(|in_flight| {
                                    let w = Workload { optimizer, ..Workload::of(backend, batch, seq, in_flight) }
                                        .recomputing(recompute);
                                    stage_memory(cfg, spec, &w).required_peak()
                                })
                                .collect()
                        })
                        .collect()
                })
                .collect()
        };
        Ok(RunMemoryNeeds { peaks: table(false), recompute_peaks: table(true), batch, seq })
    }

    fn table(&self, backend: ComputeBackend, stage: usize, recompute: bool) -> &[u64] {
        let b = BACKENDS.iter().position(|x| *x == backend).unwrap_or(0);
        let t = if recompute { &self.recompute_peaks } else { &self.peaks };
        t[b].get(stage).map_or(&[], Vec::as_slice)
    }

    /// The peak of `stage` holding one micro-batch, recomputing if that
    /// needs less.
    pub fn least(&self, backend: ComputeBackend, stage: usize) -> u64 {
        let first = |r| self.table(backend, stage, r).first().copied().unwrap_or(0);
        first(false).min(first(true))
    }

    /// Micro-batches `stage` may hold at once in `memory` bytes, by one
    /// table: 0 when it does not fit at all, at most the run's own limit.
    fn held_by(&self, backend: ComputeBackend, stage: usize, memory: u64, recompute: bool) -> usize {
        let room = usable(memory);
        self.table(backend, stage, recompute).iter().take_while(|&&p| p <= room).count()
    }

    /// Micro-batches `stage` may hold at once in `memory` bytes, the miner
    /// recomputing where that holds more (`recomputes`): 0 when it does not
    /// fit at all, at most the run's own limit.
    pub fn max_held(&self, backend: ComputeBackend, stage: usize, memory: u64) -> usize {
        self.held_by(backend, stage, memory, false).max(self.held_by(backend, stage, memory, true))
    }

    /// Whether a miner with `memory` holding `stage` recomputes activations:
    /// where that lets it hold more micro-batches than keeping them would
    /// (or fit at all). Recomputing costs about a third more compute, so a
    /// card that holds the run's limit without it does not.
    pub fn recomputes(&self, backend: ComputeBackend, stage: usize, memory: u64) -> bool {
        self.held_by(backend, stage, memory, true) > self.held_by(backend, stage, memory, false)
    }

    /// `Ok` with `max_held` when `stage` fits, else why not.
    pub fn check(&self, backend: ComputeBackend, stage: usize, memory: u64) -> Result<usize, DoesNotFit> {
        match self.max_held(backend, stage, memory) {
            0 => Err(DoesNotFit { stage, needs: self.least(backend, stage), usable: usable(memory) }),
            n => Ok(n),
        }
    }

    pub fn stages(&self) -> usize {
        self.peaks.first().map_or(0, Vec::len)
    }

    /// Sequences and tokens per sequence of the micro-batches counted.
    pub fn shape(&self) -> (usize, usize) {
        (self.batch, self.seq)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn needs() -> RunMemoryNeeds {
        let c = ModelConfig::preset("1.5b").unwrap();
        RunMemoryNeeds::new(&c, 3, 2, 1024, 4, InnerOptimizer::AdamW).unwrap()
    }

    #[test]
    fn more_memory_holds_more_micro_batches_up_to_the_runs_limit() {
        let n = needs();
        let g = 1u64 << 30;
        let b = ComputeBackend::CudaBf16Gemm;
        // The plan's head peaks at 18.26 GiB with 2 held and a stash
        // (docs/BENCHMARKS.md, scale), 13.5 GiB with one; recomputing,
        // three fit.
        assert_eq!(n.held_by(b, 0, 16 * g, false), 1, "a 16 GiB card holds one of the 1.5b head's micro-batches");
        assert_eq!(n.max_held(b, 0, 16 * g), 3, "three, recomputing");
        assert!(n.recomputes(b, 0, 16 * g));
        assert_eq!(n.max_held(b, 0, 12 * g), 0, "a 12 GiB card none, even recomputing");
        assert!(n.max_held(b, 1, 16 * g) >= 2, "the body more");
        let held: Vec<usize> = [16, 24, 32, 80].iter().map(|&m| n.max_held(b, 1, m * g)).collect();
        assert!(held.windows(2).all(|w| w[0] <= w[1]), "{held:?}");
        assert_eq!(n.max_held(b, 1, 1 << 50), 4, "never past the run's own limit");
        // A tail holds one micro-batch whatever its memory.
        assert_eq!(n.max_held(b, 2, 80 * g), 4);
        let err = n.check(b, 0, 12 * g).unwrap_err();
        assert_eq!(err.stage, 0);
        assert!(err.needs > err.usable && err.to_string().contains("GiB"), "{err}");
        assert_eq!(n.stages(), 3);
    }

    /// Issue 24's shape: `1.5b` in 3 stages at batch 4 x 1024, where no
    /// stage keeping its activations fits a 16 GiB card's 14.4 usable GiB
    /// at the run's 2 in flight (`iota-bench scale --plan-only --batch 4`:
    /// head 25.2, body 18.0, tail 15.7 GiB) and the head and tail not even
    /// at one.
    #[test]
    fn recomputing_fits_every_1_5b_stage_on_16_gib_at_batch_4() {
        let c = ModelConfig::preset("1.5b").unwrap();
        let n = RunMemoryNeeds::new(&c, 3, 4, 1024, 2, InnerOptimizer::AdamW).unwrap();
        let (g, b) = (1u64 << 30, ComputeBackend::CudaBf16Gemm);
        let keeping: Vec<usize> = (0..3).map(|s| n.held_by(b, s, 16 * g, false)).collect();
        assert_eq!(keeping, [0, 1, 0], "keeping activations, head and tail do not fit at all");
        let held: Vec<usize> = (0..3).map(|s| n.max_held(b, s, 16 * g)).collect();
        // (A tail runs forward and backward at once: it holds one however
        // many it is routed.)
        assert_eq!(held, [2, 2, 2], "recomputing, every stage fits the run's 2 in flight");
        assert!((0..3).all(|s| n.check(b, s, 16 * g).is_ok()));
        assert!((0..3).all(|s| n.recomputes(b, s, 16 * g)), "each holds more recomputing");
        assert!(n.least(b, 0) < usable(16 * g));
        // A card that holds the run's limit keeping them does not pay for it.
        assert!((0..3).all(|s| !n.recomputes(b, s, 80 * g) && n.max_held(b, s, 80 * g) == 2));
        // Nor does one too small either way.
        assert!(n.check(b, 0, 8 * g).is_err() && !n.recomputes(b, 0, 8 * g));
    }

    #[test]
    fn the_cpu_plan_needs_no_driver_allowance() {
        let n = needs();
        assert!(n.least(ComputeBackend::Cpu, 1) < n.least(ComputeBackend::CudaF32Gemm, 1));
        assert!(n.least(ComputeBackend::CudaF32Gemm, 1) < n.least(ComputeBackend::CudaBf16Gemm, 1));
    }
}
