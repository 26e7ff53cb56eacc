//! `iota-control data prepare`: tokenizes a corpus once and writes it into
//! a run's object store (a bucket or a directory) as checked chunks with a
//! manifest, so miners on other hosts train on it with no copy of their own
//! (`iota-control orchestrator --prepared-data`).

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Subcommand;
use iota_dataplane::prepared_corpus::{self, DEFAULT_CHUNK_TOKENS, MANIFEST_KEY};
use iota_model::data::{Tokenizer, TokenizerKind, load_tokens};
use iota_protocol::ObjectStore;

#[derive(Subcommand)]
pub enum DataCmd {
    /// Tokenize CORPUS and write it into the run's store: chunks under
    /// data/ and data/manifest.json (each chunk's token count and BLAKE3).
    /// Give the orchestrator the same store (--bucket, or --run-dir whose
    /// store/ is OUT) and --prepared-data. Preparing the same corpus again
    /// changes nothing; a store holding another corpus is refused, never
    /// overwritten.
    Prepare {
        /// The corpus: UTF-8 text, .jsonl (a "text" field per line), .bin
        /// token shards, or a directory of .bin shards.
        #[arg(long)]
        input: PathBuf,
        /// The run's store: s3://BUCKET/PREFIX (credentials from
        /// AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY), or a directory
        /// (for a one-machine run, RUN_DIR/store).
        #[arg(long, value_name = "s3://BUCKET/PREFIX|DIR")]
        out: String,
        /// The tokenizer of the run's model: gpt2 for the presets with a
        /// GPT-2 vocabulary, byte for `tiny`.
        #[arg(long, default_value = "gpt2", value_parser = parse_tokenizer)]
        tokenizer: TokenizerKind,
        /// Size of each chunk in MiB (4 bytes per token).
        #[arg(long, default_value_t = DEFAULT_CHUNK_MIB, value_parser = clap::value_parser!(u64).range(1..=256))]
        chunk_mib: u64,
        /// The S3 service's URL (MinIO, R2, s3s-fs, ...); default: AWS itself.
        #[arg(long, value_name = "URL")]
        s3_endpoint: Option<String>,
        /// The bucket's region.
        #[arg(long, default_value = "us-east-1")]
        s3_region: String,
        /// Path-style addressing (URL/BUCKET/KEY), which MinIO and s3s-fs need.
        #[arg(long)]
        s3_path_style: bool,
    },
}

/// The default chunk size: 64 MiB.
const DEFAULT_CHUNK_MIB: u64 = ((DEFAULT_CHUNK_TOKENS as u64) * 4) >> 20;

fn parse_tokenizer(s: &str) -> Result<TokenizerKind, String> {
    TokenizerKind::parse(s).ok_or_else(|| format!("unknown tokenizer '{s}' (gpt2, byte)"))
}

pub async fn run(cmd: DataCmd) -> Result<()> {
    let DataCmd::Prepare { input, out, tokenizer, chunk_mib, s3_endpoint, s3_region, s3_path_style } = cmd;
    let tok = Tokenizer::new(tokenizer)?;
    eprintln!("tokenizing {} with the {} tokenizer", input.display(), tokenizer.name());
    let tokens = load_tokens(&input, &tok).with_context(|| format!("reading {}", input.display()))?;
    let store: Box<dyn ObjectStore> = if out.starts_with("s3://") {
        use crate::s3_store::{S3Location, S3Secret, S3Store};
        let loc = S3Location::parse(&out, s3_endpoint, s3_region, s3_path_style)?;
        let s = S3Store::new(loc, S3Secret::from_env()?);
        s.ensure_bucket().await.with_context(|| format!("reaching the bucket of {out}"))?;
        Box::new(s)
    } else {
        let dir = iota_dataplane::local_store::LocalDirStore::open(&out, iota_dataplane::fileio::FileIo::start(false))
            .with_context(|| format!("opening the store directory {out}"))?;
        Box::new(dir)
    };
    let chunk_tokens = usize::try_from((chunk_mib << 20) / 4)?;
    let bar = indicatif::ProgressBar::new(tokens.len() as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} tokens ({eta})")
            .expect("a valid template")
            .progress_chars("=> "),
    );
    bar.set_message("uploading");
    let m = prepared_corpus::prepare(&*store, &tokens, tokenizer, chunk_tokens, |n| bar.inc(n)).await?;
    bar.finish_and_clear();
    println!(
        "prepared {} tokens ({} chunks, blake3 {}) in {out}; manifest {MANIFEST_KEY}",
        m.corpus.tokens,
        m.chunks.len(),
        &m.corpus.blake3[..16]
    );
    println!("train on it with: iota-control orchestrator --prepared-data ... (on the same store)");
    Ok(())
}
