//! The variants `iota-bench convergence` compares, and their names on the
//! command line.

use anyhow::{Context, Result, bail};
use iota_core::codec::{WireCodec, boundary_cost};
use iota_core::{BottleneckStyle, ModelConfig};

/// One variant of the comparison.
#[derive(Clone, Debug, PartialEq)]
pub enum Variant {
    /// One process, all R x A micro-batches of a step in one optimizer step.
    OneProcess,
    /// One process at a replica's batch, taking R times the steps (the
    /// comparison docs/BENCHMARKS.md used to make).
    OneProcessReplicaBatch,
    /// R replicas, gradients averaged every step.
    SyncDataParallel,
    /// The swarm's algorithm, merging every `interval` inner steps. With
    /// `mixed` pathways (as the orchestrator routes) each stage's replica
    /// for a micro-batch is drawn independently, so a replica's stage
    /// trains on activations from the other replicas' stages too; without,
    /// each replica is a whole pipeline of its own. With `overlap` = D > 0,
    /// the merge of each window lands D inner steps into the next (the
    /// replicas train meanwhile, as a swarm whose merge runs behind
    /// compute; D = `interval`: one window late), and each replica keeps
    /// what it trained since: weights = merged + (own now - own at the
    /// merge's start). The last merge is applied at once.
    ///
    /// With `delay` = D > 0, pipelining's delayed gradients: the gradient
    /// a stage applies at a step was taken on its weights of D_s steps
    /// before (D at the head, falling to 0 at the tail, which runs forward
    /// and backward at once: D_s = ceil(D (P-1-s) / (P-1))), as a stage
    /// with weight stashing and D_s micro-batches ahead of each one does;
    /// after a merge the pipeline refills (the epoch's end drains it), so
    /// the first steps take younger weights. With `predict`, those old
    /// weights moved on by D_s times the step they had just taken
    /// (`Stage::set_weight_prediction`). With `delay_from` = N > 0, the
    /// delay starts at global step N (steps before it run undelayed, as a
    /// swarm with one micro-batch per pathway in flight does): where in
    /// the run the delay's cost arises.
    Swarm {
        interval: u64,
        bottleneck: bool,
        f32_codec: bool,
        mixed: bool,
        overlap: u64,
        delay: u64,
        predict: bool,
        delay_from: u64,
        /// Delayed stages run their backward on their current weights,
        /// recomputing their blocks' forward there (no stashing): only
        /// the gradient from downstream and the saved inputs are stale.
        recompute: bool,
        /// At each merge the replicas' inner optimizer moments (both) are
        /// averaged too, as the weights are: twice more merge traffic.
        average_moments: bool,
        /// Where the merges fall: every `interval` steps, or more often
        /// early in the run.
        ramp: MergeRamp,
    },
    /// One process at the global batch, as `OneProcess`, with another stage
    /// boundary: what the bottleneck and its codec cost at equal tokens.
    Boundary(BoundarySpec),
}

/// A stage boundary: no bottleneck (the d-wide residual crosses, exact
/// f32), or `width` channels of a bottleneck of `style` in `codec`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BoundarySpec {
    /// 0: no bottleneck.
    pub width: usize,
    pub style: BottleneckStyle,
    pub codec: WireCodec,
}

impl BoundarySpec {
    pub const NONE: BoundarySpec = BoundarySpec { width: 0, style: BottleneckStyle::Linear, codec: WireCodec::F32 };

    /// `no-bottleneck`, or `STYLE-bWIDTH-CODEC` (e.g. `residual-b2-int4`).
    pub fn parse(s: &str) -> Result<BoundarySpec> {
        if s == "no-bottleneck" {
            return Ok(BoundarySpec::NONE);
        }
        let usage = || format!("'{s}': a boundary is no-bottleneck or STYLE-bWIDTH-CODEC, e.g. residual-b2-int4");
        let mut parts = s.splitn(3, '-');
        let (style, width, codec) = match (parts.next(), parts.next(), parts.next()) {
            (Some(a), Some(b), Some(c)) => (a, b, c),
            _ => bail!(usage()),
        };
        let style = BottleneckStyle::parse(style).with_context(|| format!("{}: style linear or residual", usage()))?;
        let width: usize = width.strip_prefix('b').and_then(|w| w.parse().ok()).with_context(usage)?;
        let codec = WireCodec::parse(codec).with_context(|| format!("{}: codec int8, int4, bf16 or f32", usage()))?;
        if width == 0 {
            bail!("'{s}': a bottleneck needs at least one channel (or say no-bottleneck)");
        }
        Ok(BoundarySpec { width, style, codec })
    }

    /// Sets the boundary of `model`, returning the wire codec to use.
    pub fn apply(&self, model: &mut ModelConfig) -> WireCodec {
        model.bottleneck = self.width;
        model.bottleneck_style = self.style;
        self.codec
    }

    /// Bytes per token on the wire in one direction, and the compression
    /// against the bf16 d-wide hidden state a pipeline without a bottleneck
    /// would send (below 1 for the exact f32 residual).
    pub fn cost(&self, d_model: usize) -> (usize, f64) {
        let width = if self.width == 0 { d_model } else { self.width };
        let c = boundary_cost(d_model, width, self.codec);
        (c.bytes_per_token, c.ratio)
    }

    pub fn name(&self) -> String {
        if self.width == 0 {
            "no bottleneck (f32)".into()
        } else {
            format!("{} b={} {}", self.style.name(), self.width, self.codec.name())
        }
    }
}

/// Where a swarm variant's merges fall early in the run, where replicas
/// drift apart fastest (the learning rate's warm-up and Adam's largest
/// relative steps), in the manner of post-local SGD (Lin et al., 2020).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub enum MergeRamp {
    /// Every `interval` global steps from the start.
    #[default]
    None,
    /// Every step for the first N global steps, then every `interval`.
    SyncUntil(u64),
    /// Intervals 1, 2, 4, .. doubling up to `interval`, then `interval`.
    Doubling,
}

impl MergeRamp {
    /// Whether a merge follows global step `done` (1-based: steps done so far).
    pub fn merges_after(self, done: u64, interval: u64) -> bool {
        match self {
            MergeRamp::None => done.is_multiple_of(interval),
            MergeRamp::SyncUntil(n) => done <= n || (done - n).is_multiple_of(interval),
            MergeRamp::Doubling => {
                let (mut at, mut next) = (0u64, 1u64);
                while at < done {
                    at += next;
                    next = (next * 2).min(interval);
                }
                at == done
            }
        }
    }

    fn suffix(self) -> String {
        match self {
            MergeRamp::None => String::new(),
            MergeRamp::SyncUntil(n) => format!(", merging every step until step {n}"),
            MergeRamp::Doubling => ", merge interval doubling from 1".into(),
        }
    }
}

impl Variant {
    pub fn parse(s: &str) -> Result<Variant> {
        Ok(match s {
            "one" => Variant::OneProcess,
            "one-replica-batch" => Variant::OneProcessReplicaBatch,
            "sync" => Variant::SyncDataParallel,
            _ if s.starts_with("one-") => Variant::Boundary(BoundarySpec::parse(&s["one-".len()..])?),
            _ => {
                let full = s;
                let (s, average_moments) = match s.strip_suffix("-avg-moments") {
                    Some(rest) => (rest, true),
                    None => (s, false),
                };
                let (s, merge_ramp) = if let Some(rest) = s.strip_suffix("-ramp") {
                    (rest, MergeRamp::Doubling)
                } else {
                    match s.rsplit_once("-sync") {
                        Some((rest, n)) => (
                            rest,
                            MergeRamp::SyncUntil(n.parse().ok().filter(|n| *n > 0).with_context(|| {
                                format!("'{full}': -syncN needs a positive N (the steps merged every step)")
                            })?),
                        ),
                        None => (s, MergeRamp::None),
                    }
                };
                let mut v = Self::parse_swarm(s)?;
                match &mut v {
                    Variant::Swarm { overlap: 0, average_moments: avg, ramp, .. } => {
                        *avg = average_moments;
                        *ramp = merge_ramp;
                    }
                    _ if !average_moments && merge_ramp == MergeRamp::None => {}
                    _ => {
                        bail!("'{full}': -ramp, -syncN and -avg-moments need a swarm variant whose merge lands at once")
                    }
                }
                return Ok(v);
            }
        })
    }

    /// `parse` of a name without the `-avg-moments` modifier.
    fn parse_swarm(s: &str) -> Result<Variant> {
        Ok({
            {
                let rest = s.strip_prefix('h').with_context(|| format!("unknown variant '{s}'"))?;
                let (n, suffix) = rest.split_once('-').unwrap_or((rest, ""));
                let interval: u64 = n.parse().with_context(|| format!("'{s}': H must be a number"))?;
                if interval == 0 {
                    bail!("'{s}': the merge interval must be positive");
                }
                if let Some(d) = suffix.strip_prefix("delay") {
                    let (d, delay_from) = match d.split_once("-from") {
                        Some((d, n)) => (
                            d,
                            n.parse::<u64>().ok().filter(|n| *n > 0).with_context(|| {
                                format!("'{s}': -fromN needs a positive N (the global step the delay starts at)")
                            })?,
                        ),
                        None => (d, 0),
                    };
                    let (d, predict) = match d.strip_suffix("-predict") {
                        Some(d) => (d, true),
                        None => (d, false),
                    };
                    let (d, recompute) = match d.strip_suffix("-recompute") {
                        Some(d) => (d, true),
                        None => (d, false),
                    };
                    if predict && recompute {
                        bail!("'{s}': -predict and -recompute are two answers to the delay; pick one");
                    }
                    let delay: u64 = d.parse().ok().filter(|d| *d > 0).with_context(|| {
                        format!("'{s}': delayD needs a positive D (steps of delay at the head), e.g. h24-delay2")
                    })?;
                    return Ok(Variant::Swarm {
                        interval,
                        bottleneck: true,
                        f32_codec: false,
                        mixed: true,
                        overlap: 0,
                        delay,
                        predict,
                        delay_from,
                        recompute,
                        average_moments: false,
                        ramp: MergeRamp::None,
                    });
                }
                let (bottleneck, f32_codec, mixed, overlap) = match suffix {
                    "" => (true, false, true, 0),
                    "no-bottleneck" => (false, false, true, 0),
                    "f32" => (true, true, true, 0),
                    "fixed" => (true, false, false, 0),
                    "overlap" => (true, false, true, interval),
                    other => match other.strip_prefix("overlap").map(str::parse::<u64>) {
                        Some(Ok(d)) if (1..=interval).contains(&d) => (true, false, true, d),
                        _ => bail!(
                            "'{s}': unknown suffix '{other}' (no-bottleneck, f32, fixed, overlap, overlapD with D in 1..=H, delayD, delayD-predict, delayD-recompute, delayD-fromN; any of them then -avg-moments)"
                        ),
                    },
                };
                Variant::Swarm {
                    interval,
                    bottleneck,
                    f32_codec,
                    mixed,
                    overlap,
                    delay: 0,
                    predict: false,
                    delay_from: 0,
                    recompute: false,
                    average_moments: false,
                    ramp: MergeRamp::None,
                }
            }
        })
    }

    pub fn name(&self) -> String {
        match self {
            Variant::OneProcess => "one process, global batch".into(),
            Variant::OneProcessReplicaBatch => "one process, replica batch, R x steps".into(),
            Variant::SyncDataParallel => "sync data parallel".into(),
            Variant::Swarm {
                interval,
                bottleneck,
                f32_codec,
                mixed,
                overlap,
                delay,
                predict,
                delay_from,
                recompute,
                average_moments,
                ramp,
            } => {
                let mut n = format!("swarm H={interval}");
                n += &ramp.suffix();
                if *average_moments {
                    n += ", moments averaged";
                }
                if *delay > 0 {
                    n += &format!(", gradients {delay} steps late at the head");
                }
                if *delay_from > 0 {
                    n += &format!(" from step {delay_from}");
                }
                if *predict {
                    n += ", predicted weights";
                }
                if *recompute {
                    n += ", backward on current weights";
                }
                if !mixed {
                    n += ", fixed pathways";
                }
                if *overlap == *interval {
                    n += ", merge lands a window late";
                } else if *overlap > 0 {
                    n += &format!(", merge lands {overlap} steps late");
                }
                if !bottleneck {
                    n += ", no bottleneck";
                }
                if *f32_codec {
                    n += ", f32 codec";
                }
                n
            }
            Variant::Boundary(b) => format!("one process, {}", b.name()),
        }
    }
}

/// The runs `--runs` names by default: one process, synchronous data
/// parallel, each interval of `--intervals` and the run's own (`own`), and
/// at the run's own interval its fixed-pathway, no-bottleneck and f32
/// variants.
pub fn default_runs(intervals: &[u64], own: u64) -> Vec<Variant> {
    let mut v = vec![Variant::OneProcess, Variant::SyncDataParallel];
    let mut hs: Vec<u64> = intervals.to_vec();
    if !hs.contains(&own) {
        hs.push(own);
    }
    hs.sort_unstable();
    // By name, as on the command line (each parses).
    let mut names: Vec<String> = hs.iter().map(|h| format!("h{h}")).collect();
    names.extend(["fixed", "no-bottleneck", "f32"].map(|suffix| format!("h{own}-{suffix}")));
    v.extend(names.iter().map(|n| Variant::parse(n).expect("a variant's own name")));
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boundary_variants_parse_and_cost_what_the_codec_says() {
        assert_eq!(Variant::parse("one-no-bottleneck").unwrap(), Variant::Boundary(BoundarySpec::NONE));
        let r = Variant::parse("one-residual-b2-int4").unwrap();
        let want = BoundarySpec { width: 2, style: BottleneckStyle::Residual, codec: WireCodec::Int4Row };
        assert_eq!(r, Variant::Boundary(want));
        assert_eq!(r.name(), "one process, residual b=2 int4");
        // small (d = 192): the bf16 hidden state is 384 bytes a token. int4 rows
        // carry a 2-byte scale: 2 channels are 3 bytes (128x), 8 are 6 (64x), 20 are 12 (32x).
        for (spec, bytes) in
            [("linear-b2-int4", 3), ("linear-b1-int8", 3), ("residual-b8-int4", 6), ("linear-b20-int4", 12)]
        {
            let (b, ratio) = BoundarySpec::parse(spec).unwrap().cost(192);
            assert_eq!((b, ratio), (bytes, 384.0 / bytes as f64), "{spec}");
        }
        assert_eq!(BoundarySpec::NONE.cost(192), (768, 0.5), "the exact f32 residual");
        for bad in
            ["one-residual-2-int4", "one-residual-b0-int4", "one-cubic-b2-int4", "one-linear-b2-int3", "one-linear"]
        {
            assert!(Variant::parse(bad).is_err(), "{bad}");
        }
    }
}
