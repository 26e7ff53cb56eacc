//! The run's corpus, loaded by every role that needs tokens (head and tail
//! miners, the launcher, validators) exactly as the single-process trainer
//! loads it: same shards, same sample addresses. `data` is where this
//! process finds it (None: the generated toy corpus for the run's seed).

use std::path::Path;

use anyhow::{Result, bail};
use iota_model::data::{Corpus, Tokenizer, load_tokens, synthetic};
use iota_protocol::RunConfig;
use iota_protocol::object_store::ObjectStore;

/// Loads the corpus exactly as the single-process trainer does (same
/// shards, same sample addresses), checking it has `spec.n_shards`.
pub fn load_corpus(cfg: &RunConfig, data: Option<&Path>) -> Result<Corpus> {
    let c = load_corpus_unchecked(cfg, data)?;
    let from = data.map_or("the generated toy corpus".into(), |p| p.display().to_string());
    checked(cfg, c, &from)
}

/// Fetches the run's corpus from its store (`RunConfig::corpus_in_store`),
/// each chunk checked, kept in `cache`; checked like `load_corpus`.
pub async fn load_corpus_from_store(cfg: &RunConfig, store: &dyn ObjectStore, cache: Option<&Path>) -> Result<Corpus> {
    let (_, tokens) = crate::prepared_corpus::fetch(store, cfg.corpus.as_ref(), cfg.train.tokenizer, cache).await?;
    let c = Corpus::new(tokens, cfg.train.seq, cfg.max_shards, cfg.val_fraction).map_err(anyhow::Error::msg)?;
    checked(cfg, c, "the run's store")
}

/// The run's corpus: `data` on this host when given (checked to be the
/// run's), else its store where `cfg` says it is there (blocking on `rt`),
/// else the generated toy corpus.
pub fn load_run_corpus(
    cfg: &RunConfig,
    data: Option<&Path>,
    store: &dyn ObjectStore,
    rt: &tokio::runtime::Handle,
    cache: Option<&Path>,
) -> Result<Corpus> {
    match data {
        None if cfg.corpus_in_store => rt.block_on(load_corpus_from_store(cfg, store, cache)),
        _ => load_corpus(cfg, data),
    }
}

/// `load_run_corpus`, awaited.
pub async fn load_run_corpus_async(
    cfg: &RunConfig,
    data: Option<&Path>,
    store: &dyn ObjectStore,
    cache: Option<&Path>,
) -> Result<Corpus> {
    match data {
        None if cfg.corpus_in_store => load_corpus_from_store(cfg, store, cache).await,
        _ => load_corpus(cfg, data),
    }
}

fn checked(cfg: &RunConfig, c: Corpus, from: &str) -> Result<Corpus> {
    if let Some(want) = &cfg.corpus
        && want != c.id()
    {
        bail!(
            "the corpus loaded ({} tokens, blake3 {}, from {}) is not the run's ({} tokens, blake3 {}): give --data the run's corpus",
            c.id().tokens,
            &c.id().blake3[..16],
            from,
            want.tokens,
            &want.blake3[..16]
        );
    }
    if c.num_shards() as u32 != cfg.spec.n_shards {
        bail!("corpus has {} shards but the run expects {}", c.num_shards(), cfg.spec.n_shards);
    }
    Ok(c)
}

/// Loads the corpus and records its shard count and content in the run
/// configuration (the launcher does this once).
pub fn fix_shards(cfg: &mut RunConfig, data: Option<&Path>) -> Result<Corpus> {
    let c = load_corpus_unchecked(cfg, data)?;
    fix_shards_of(cfg, c)
}

/// Records `c`'s shard count and content in the run configuration.
pub fn fix_shards_of(cfg: &mut RunConfig, c: Corpus) -> Result<Corpus> {
    cfg.spec.n_shards = c.num_shards() as u32;
    cfg.corpus = Some(c.id().clone());
    Ok(c)
}

fn load_corpus_unchecked(cfg: &RunConfig, data: Option<&Path>) -> Result<Corpus> {
    let tok = Tokenizer::new(cfg.train.tokenizer)?;
    let tokens = match data {
        Some(p) => load_tokens(p, &tok)?,
        None => tok.encode(&synthetic::grammar_text(cfg.train.seed, 2_000_000)),
    };
    Corpus::new(tokens, cfg.train.seq, cfg.max_shards, cfg.val_fraction).map_err(anyhow::Error::msg)
}
