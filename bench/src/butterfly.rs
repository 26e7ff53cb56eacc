//! butterfly: one stage's merge with R in-process replicas on loopback QUIC,
//! against the parameter-server merge of the same weights through the same
//! object store, in one run. Bytes per replica (ours: payload bytes sent and
//! received on the data plane; the model 2P(R-1)/R x codec bytes for the
//! scatter and P(R-2)/R for the gather), wall time, and the aggregator's
//! bytes for the parameter server.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use iota_core::merge::{OuterOpt, ReduceRule};
use iota_core::{Identity, Rng, WireCodec};
use iota_dataplane::fileio::FileIo;
use iota_dataplane::local_store::LocalDirStore;
use iota_dataplane::miner::events::Output;
use iota_dataplane::miner::merge::local::{LocalReplica, flat_layout, run_local_butterfly};
use iota_dataplane::miner::merge::{Merge, ParameterServer, load_weights};
use iota_protocol::{MergeMethod, MergeSpec, StoredObject, pb};

#[derive(clap::Args)]
pub struct Args {
    /// Parameters of the stage being merged.
    #[arg(long, default_value_t = 25_000_000)]
    params: usize,
    /// Replica counts to run, comma-separated.
    #[arg(long, default_value = "2,4,8,16", value_delimiter = ',')]
    replicas: Vec<usize>,
    /// Slice codec: bf16, int8, f32, or sparse (contributions as the
    /// largest --sparse-density of each 16,384 values with error feedback,
    /// updates in bf16).
    #[arg(long, default_value = "bf16")]
    codec: String,
    /// With --codec sparse: the share of each block a contribution keeps.
    #[arg(long, default_value_t = iota_protocol::run_spec::DEFAULT_SPARSE_DENSITY)]
    sparse_density: f32,
    /// Reduce rule: centered-clip, trimmed-mean, mean.
    #[arg(long, default_value = "centered-clip")]
    rule: String,
    /// Only compare the reduce rules (no merges).
    #[arg(long)]
    rules_only: bool,
    /// Only the reduce alone against the memory copy (no merges).
    #[arg(long)]
    reduce_only: bool,
}

/// The reduce rules on synthetic pseudo-gradients: R = 8 replicas around a
/// common direction with per-replica noise and different work, honest or
/// with one Byzantine replica; error relative to the honest weighted mean.
fn compare_rules() {
    use iota_core::merge::reduce_slice;
    let (r, n) = (8usize, 1usize << 20);
    let mut rng = Rng::new(3);
    let base: Vec<f32> = (0..n).map(|_| rng.normal() * 0.01).collect();
    let honest: Vec<Vec<f32>> = (0..r).map(|_| base.iter().map(|b| b + rng.normal() * 0.004).collect()).collect();
    let work: Vec<f64> = (0..r).map(|i| 10.0 + 4.0 * i as f64).collect();
    let mean = |xs: &[Vec<f32>], w: &[f64]| -> Vec<f32> {
        let t: f64 = w.iter().sum();
        (0..n).map(|j| (xs.iter().zip(w).map(|(x, w)| w * x[j] as f64).sum::<f64>() / t) as f32).collect()
    };
    let dist = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum::<f64>().sqrt();
    let rules =
        [ReduceRule::Mean, ReduceRule::TrimmedMean { trim: 1 }, ReduceRule::CenteredClip { tau_factor: 2.0, iters: 3 }];
    println!(
        "reduce rules, R = {r}, {n} values, work-weighted; error = |result - honest weighted mean| / |honest mean|"
    );
    println!(
        "  {:<14} {:>10} {:>12} {:>12} {:>12} {:>10}",
        "rule", "honest", "1 huge", "1 flipped", "1 NaN", "ns/value"
    );
    for rule in rules {
        let mut row = Vec::new();
        let mut secs = 0.0;
        for attack in ["none", "huge", "flip", "nan"] {
            let mut xs = honest.clone();
            match attack {
                "huge" => xs[0].iter_mut().for_each(|x| *x *= 1e4),
                "flip" => xs[0].iter_mut().for_each(|x| *x *= -10.0),
                "nan" => xs[0][5] = f32::NAN,
                _ => {}
            }
            // The honest reference: all replicas, or all but the attacker.
            let want = if attack == "none" { mean(&honest, &work) } else { mean(&honest[1..], &work[1..]) };
            let total: f64 = work.iter().sum();
            let w: Vec<f64> = work.iter().map(|x| x / total).collect();
            let refs: Vec<Option<&[f32]>> = xs.iter().map(|x| Some(x.as_slice())).collect();
            let mut m = vec![0.0; n];
            let t0 = Instant::now();
            let (u, _) = reduce_slice(rule, OuterOpt::AVERAGE, &refs, &w, &mut m);
            secs += t0.elapsed().as_secs_f64();
            let norm = dist(&want, &vec![0.0; n]);
            row.push(if u.iter().all(|x| x.is_finite()) { dist(&u, &want) / norm } else { f64::NAN });
        }
        println!(
            "  {:<14} {:>10.4} {:>12.4} {:>12.4} {:>12.4} {:>10.1}",
            rule.name(),
            row[0],
            row[1],
            row[2],
            row[3],
            secs / 4.0 / n as f64 * 1e9
        );
    }
    println!();
}

/// The merge `--codec`, `--sparse-density` and `--rule` describe.
fn spec_of(a: &Args) -> Result<MergeSpec> {
    let codec = match a.codec.as_str() {
        "bf16" | "sparse" => WireCodec::Bf16,
        "int8" => WireCodec::Int8Row,
        "f32" => WireCodec::F32,
        c => anyhow::bail!("unknown codec {c}"),
    };
    let sparse_density = if a.codec == "sparse" { a.sparse_density } else { 0.0 };
    let rule = ReduceRule::parse(&a.rule).context("unknown rule")?;
    Ok(MergeSpec { method: MergeMethod::Butterfly, codec, rule, sparse_density, ..MergeSpec::default() })
}

pub fn run(a: Args) -> Result<()> {
    let spec = spec_of(&a)?;
    let (codec, rule, sparse_density) = (spec.codec, spec.rule, spec.sparse_density);
    compare_rules();
    if a.rules_only {
        return Ok(());
    }
    if sparse_density > 0.0 {
        // Its contributions are a few bytes a value's worth: a copy of them
        // is no baseline for the reduce, which decodes them whole.
        println!(
            "reduce alone: not timed for sparse contributions (decoded whole, then the reference reduce); \
             the merges below time it"
        );
    } else {
        for &r in &a.replicas {
            reduce_alone(&spec, a.params, r)?;
        }
    }
    if a.reduce_only {
        return Ok(());
    }
    let p = a.params;
    let bytes_per_value = codec.payload_bytes(1, 256).unwrap() as f64 / 256.0;
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    println!(
        "butterfly: P = {p} parameters, codec {} ({bytes_per_value:.4} B/value), rule {}; parameter server: f32 safetensors",
        codec.name(),
        rule.name()
    );
    if sparse_density > 0.0 {
        let sparse_bpv = spec.contribution_bytes(p as u64).unwrap_or(0) as f64 / p.max(1) as f64;
        println!(
            "  contributions sparse at density {sparse_density} ({sparse_bpv:.4} B/value, {:.1}x fewer than {}); \
             updates and the ratio columns in {}",
            bytes_per_value / sparse_bpv.max(1e-12),
            codec.name(),
            codec.name()
        );
    }
    println!(
        "\n  {:>3} | {:>10} {:>10} {:>10} {:>8} {:>8} | {:>8} | {:>9} {:>10} {:>8} | {:>6}",
        "R", "sent MB", "recv MB", "2P(R-1)/R", "ratio", "model", "bfly s", "PS s", "aggr MB", "PS/rep", "speed"
    );
    let mut rng = Rng::new(1);
    let prev: Vec<f32> = (0..p).map(|_| rng.normal() * 0.02).collect();
    let prev = Arc::new(prev);
    let mut phases = Vec::new();
    for &r in &a.replicas {
        let reps: Vec<LocalReplica> = (0..r)
            .map(|i| {
                let mut rr = Rng::new(100 + i as u64);
                LocalReplica {
                    params: prev.iter().map(|x| x + rr.normal() * 0.001).collect(),
                    work: 10,
                    fault: None,
                    dies_on_plan: false,
                    isolated: false,
                }
            })
            .collect();
        let dir = tempdir()?;
        let report = rt.block_on(run_local_butterfly(
            spec.clone(),
            0,
            prev.clone(),
            reps.clone(),
            dir.path(),
            Duration::from_secs(1800),
            &[],
        ))?;
        let mean = |v: &[u64]| v.iter().sum::<u64>() as f64 / v.len() as f64;
        let (sent, recv) = (mean(&report.sent_bytes), mean(&report.recv_bytes));
        let phase = |i: usize| report.phase_secs.iter().map(|p| p[i]).sum::<f64>() / r as f64;
        phases.push((r, [phase(0), phase(1), phase(2), phase(3)], report.elapsed.as_secs_f64()));
        let goal = 2.0 * p as f64 * (r as f64 - 1.0) / r as f64 * bytes_per_value;
        // Ours sends the scatter (2P(R-1)/R) plus the gather (P(R-2)/R).
        let model = p as f64 * (3.0 * r as f64 - 4.0) / r as f64 * bytes_per_value;
        drop(dir);

        // The parameter server on the same weights.
        let dir = tempdir()?;
        let (ps_secs, aggr_bytes, per_rep) = parameter_server(&rt, dir.path(), &reps)?;
        drop(dir);
        println!(
            "  {:>3} | {:>10.1} {:>10.1} {:>10.1} {:>7.3}x {:>7.3}x | {:>8.2} | {:>9.2} {:>10.1} {:>8.1} | {:>5.2}x",
            r,
            sent / 1e6,
            recv / 1e6,
            goal / 1e6,
            sent / goal,
            sent / model.max(1.0),
            report.elapsed.as_secs_f64(),
            ps_secs,
            aggr_bytes as f64 / 1e6,
            per_rep as f64 / 1e6,
            ps_secs / report.elapsed.as_secs_f64()
        );
    }
    println!(
        "\n  butterfly time per replica (mean), by phase; the rest is waiting (the network, peers, the coordinator)"
    );
    println!("  {:>3} | {:>8} {:>8} {:>8} {:>8} | {:>8}", "R", "encode", "reduce", "apply", "store", "bfly s");
    for (r, p, total) in &phases {
        println!("  {r:>3} | {:>8.2} {:>8.2} {:>8.2} {:>8.2} | {total:>8.2}", p[0], p[1], p[2], p[3]);
    }
    println!(
        "\n  sent/recv: data-plane payload per replica (mean); ratio: sent / 2P(R-1)/R x codec bytes; model: sent / P(3R-4)/R x codec bytes"
    );
    println!(
        "  PS: every replica uploads f32 weights, one aggregator reads all R and writes the mean, all download it (local store, page cache)"
    );
    println!(
        "  aggr MB: bytes through the aggregator; PS/rep: through every other replica; speed: PS time / butterfly time"
    );
    Ok(())
}

/// GB/s of moving `bytes` in `secs`.
fn gbps(bytes: f64, secs: f64) -> f64 {
    bytes / secs.max(1e-12) / 1e9
}

/// Pairs of copy and reduce `reduce_alone` times.
const PAIRS: usize = 5;

/// Each pair's copy (the faster of its two) over its reduce, in run order.
fn ratios_in_order(pairs: &[(f64, f64, f64)]) -> String {
    pairs.iter().map(|(o, p, t)| format!("{:.2}", o.min(*p) / t)).collect::<Vec<_>>().join(", ")
}

/// The fastest of 3 timed runs of `f`, in seconds.
fn best_of_3(mut f: impl FnMut()) -> f64 {
    (0..3)
        .map(|_| {
            let t0 = Instant::now();
            f();
            t0.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

/// The reduce one owner runs for its share of an R-replica merge of P
/// parameters (each partition has two owners: 2P/R values, R encoded
/// contributions of each), timed alone to what the owner publishes (the
/// update encoded, and its hash): the streamed reduce the miners run
/// (`reduce_partition_published`) and the decode-first reference
/// (`reduce_partition_decoded`, then `update_hash`), as GB/s of
/// contribution bytes read, beside a memory copy of the same bytes in the
/// same run (the faster of one `copy_from_slice` and one split over the
/// rayon pool), ours and the copy alternating in `PAIRS` pairs.
fn reduce_alone(spec: &MergeSpec, p: usize, r: usize) -> Result<()> {
    use iota_dataplane::miner::merge::{encode_slice, reduce_partition_published};
    let len = (2 * p / r.max(1)).max(1);
    let mut rng = Rng::new(9);
    let base: Vec<f32> = (0..len).map(|_| rng.normal() * 0.01).collect();
    let contribs: Vec<Vec<u8>> = (0..r)
        .map(|i| {
            let mut rr = Rng::new(50 + i as u64);
            let x: Vec<f32> = base.iter().map(|b| b + rr.normal() * 0.002).collect();
            encode_slice(spec.codec, &x)
        })
        .collect::<Result<_>>()?;
    drop(base);
    let payloads: Vec<Option<&[u8]>> = contribs.iter().map(|c| Some(c.as_slice())).collect();
    let weights = vec![1.0; r];
    let bytes: usize = contribs.iter().map(Vec::len).sum();
    let src: Vec<u8> = contribs.concat();
    let mut dst = vec![1u8; bytes];
    // The copy and ours alternate in pairs (this VM's memory speed swings
    // from minute to minute): each pair's copy is the faster of one
    // `copy_from_slice` and one split over the rayon pool, and the ratio
    // reported is the median of the pairs' ratios.
    let copy_one = |d: &mut [u8]| d.copy_from_slice(&src);
    let copy_par = |d: &mut [u8]| {
        use rayon::prelude::*;
        d.par_chunks_mut(1 << 22).zip(src.par_chunks(1 << 22)).for_each(|(d, s)| d.copy_from_slice(s));
    };
    // Both to what an owner publishes: the update encoded, and its hash.
    let mut momentum = vec![0.0f32; len];
    let mut ours = None;
    // A first reduce writes a fresh payload buffer (page faults); a
    // miner's later merges reuse the one its last payload gave back, so
    // the pairs start after it.
    let t0 = Instant::now();
    std::hint::black_box(reduce_partition_published(spec, 3, len as u64, &payloads, &weights, &mut momentum).is_ok());
    let first = t0.elapsed().as_secs_f64();
    let mut pairs: Vec<(f64, f64, f64)> = Vec::new();
    for _ in 0..PAIRS {
        let one = best_of_3(|| copy_one(&mut dst));
        let par = best_of_3(|| copy_par(&mut dst));
        let t0 = Instant::now();
        let p = reduce_partition_published(spec, 3, len as u64, &payloads, &weights, &mut momentum);
        let t = t0.elapsed().as_secs_f64();
        ours = std::hint::black_box(p.map(|p| p.hash).ok());
        pairs.push((one, par, t));
    }
    drop((src, dst));
    let min = |f: fn(&(f64, f64, f64)) -> f64| pairs.iter().map(f).fold(f64::INFINITY, f64::min);
    let (copy_one, copy_par, streamed) = (min(|p| p.0), min(|p| p.1), min(|p| p.2));
    let copy = copy_one.min(copy_par);
    let mut ratios: Vec<f64> = pairs.iter().map(|(o, p, t)| o.min(*p) / t).collect();
    ratios.sort_by(f64::total_cmp);
    let median_ratio = ratios[ratios.len() / 2];
    let times: Vec<f64> = pairs.iter().map(|p| p.2).collect();
    let mut theirs = None;
    let reference = best_of_3(|| {
        use iota_dataplane::slices::{reduce_partition_decoded, update_hash};
        let r = reduce_partition_decoded(spec, 3, len as u64, &payloads, &weights, &mut momentum);
        theirs = std::hint::black_box(update_hash(spec.codec, &r.update).map(|p| p.1).ok());
    });
    if ours.is_none() || ours != theirs {
        anyhow::bail!("the streamed reduce did not publish the reference's bytes");
    }
    // With outer momentum the momentum is read and written, and the norms
    // need their own pass first.
    let with_momentum = MergeSpec { outer: iota_core::merge::OuterOpt { lr: 0.7, momentum: 0.9 }, ..spec.clone() };
    let mut m = vec![0.0f32; len];
    let momentum_s = best_of_3(|| {
        let p = reduce_partition_published(&with_momentum, 3, len as u64, &payloads, &weights, &mut m);
        std::hint::black_box(p.map(|p| p.hash).ok());
    });
    let b = bytes as f64;
    println!(
        "reduce alone: R = {r}, {len} values an owner ({:.0} MB of {} contributions); memory copy of the same bytes \
         {:.2} GB/s (one thread {:.2}, rayon {:.2})",
        b / 1e6,
        spec.codec.name(),
        gbps(b, copy),
        gbps(b, copy_one),
        gbps(b, copy_par)
    );
    println!(
        "  streamed (ours) {:.3} s, {:.2} GB/s, {:.2}x the copy | decode-first reference {:.3} s, {:.2} GB/s, {:.2}x \
         | {:.2}x faster",
        streamed,
        gbps(b, streamed),
        copy / streamed,
        reference,
        gbps(b, reference),
        copy / reference,
        reference / streamed
    );
    println!(
        "  with outer momentum 0.9 (two passes; the momentum read and written): {momentum_s:.3} s, {:.2} GB/s, {:.2}x the copy",
        gbps(b, momentum_s),
        copy / momentum_s
    );
    println!(
        "  the same published hash both ways; ours run by run: {} s, after a first on a fresh buffer in {first:.3} s \
         (later ones reuse the one the previous merge's payload gave back)",
        times.iter().map(|t| format!("{t:.3}")).collect::<Vec<_>>().join(", ")
    );
    println!(
        "  in {PAIRS} pairs of copy and reduce, x the copy: {} (median {median_ratio:.2}x)",
        ratios_in_order(&pairs)
    );
    Ok(())
}

/// A fresh folder of the benchmark's own, removed when dropped.
fn tempdir() -> Result<tempfile::TempDir> {
    Ok(tempfile::Builder::new().prefix("iota-bench-bfly-").tempdir()?)
}

/// Upload, aggregate, download: seconds, aggregator bytes, other replicas' bytes.
fn parameter_server(
    rt: &tokio::runtime::Runtime,
    dir: &std::path::Path,
    reps: &[LocalReplica],
) -> Result<(f64, u64, u64)> {
    let store = LocalDirStore::shared(dir, FileIo::start(false))?;
    let n = reps[0].params.len();
    let layout = flat_layout(n);
    let t0 = Instant::now();
    // Uploads run concurrently, as replicas would; each announces its object
    // (the orchestrator's work count is the replica's here).
    let uploads = std::thread::scope(|s| -> Result<Vec<StoredObject>> {
        let hs: Vec<_> = reps
            .iter()
            .map(|r| {
                let (store, layout, h) = (store.clone(), layout.clone(), rt.handle().clone());
                s.spawn(move || -> Result<StoredObject> {
                    let me = Identity::generate().peer_id();
                    let mut ps = ParameterServer::new(store, h, me);
                    let mut out: Vec<Output> = Vec::new();
                    ps.contribute(0, 0, &layout, &r.params, r.work, &mut out)?;
                    match out.pop() {
                        Some(Output::Report(pb::report::Kind::UploadDone(u))) => {
                            let o = StoredObject::from_pb(&u.object.unwrap_or_default(), Some(me))
                                .map_err(anyhow::Error::msg)?;
                            Ok(StoredObject { work: r.work, ..o })
                        }
                        _ => anyhow::bail!("no upload announced"),
                    }
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().map_err(|_| anyhow::anyhow!("upload panicked"))?).collect()
    })?;
    let mut agg = ParameterServer::new(store.clone(), rt.handle().clone(), Identity::generate().peer_id());
    let merged = agg.aggregate(0, 0, &layout, &uploads, &mut Vec::new())?;
    std::thread::scope(|s| -> Result<()> {
        let hs: Vec<_> = (0..reps.len())
            .map(|_| {
                let (store, layout, merged) = (store.clone(), layout.clone(), merged.clone());
                s.spawn(move || -> Result<()> { rt.block_on(load_weights(&store, &[merged], &layout)).0.map(|_| ()) })
            })
            .collect();
        for h in hs {
            h.join().map_err(|_| anyhow::anyhow!("download panicked"))??;
        }
        Ok(())
    })?;
    let secs = t0.elapsed().as_secs_f64();
    let w = (n * 4) as u64;
    let r = reps.len() as u64;
    // The aggregator (one of the replicas) reads the R-1 others' uploads and
    // writes the mean that R-1 others read; the others upload once, download once.
    Ok((secs, 2 * (r - 1) * w, 2 * w))
}
