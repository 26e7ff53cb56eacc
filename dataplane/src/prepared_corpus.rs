//! A corpus tokenized once and kept in the run's object store, so miners on
//! other hosts need no copy of it and no shared path: `iota-control data
//! prepare` writes the tokens as chunk objects under `data/` with a
//! manifest (`data/manifest.json`) naming each chunk's key, token count and
//! BLAKE3; every role that needs tokens fetches the manifest, then each
//! chunk, checks it against the manifest before using it, keeps it in a
//! local cache, and checks the whole against the corpus id the run
//! recorded.
//!
//! The store is untrusted like everything from it: the manifest is bounded
//! and validated before anything is fetched; a chunk whose bytes do not
//! hash to the manifest's BLAKE3 is refused, never cached.

use std::io;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail, ensure};
use iota_core::ids::CorpusId;
use iota_core::train_config::TokenizerKind;
use iota_protocol::object_store::{ObjectStore, check_key};
use serde::{Deserialize, Serialize};

/// Where the manifest lives in the run's store.
pub const MANIFEST_KEY: &str = "data/manifest.json";
/// The manifest format this build reads and writes.
pub const FORMAT: &str = "iota-tokens/1";
/// Largest manifest read (bytes).
pub const MAX_MANIFEST_BYTES: usize = 4 << 20;
/// Most chunks one corpus may have.
pub const MAX_CHUNKS: usize = 65_536;
/// Most tokens in one chunk (256 MiB of u32).
pub const MAX_CHUNK_TOKENS: u64 = 1 << 26;
/// Default tokens per chunk (64 MiB of u32).
pub const DEFAULT_CHUNK_TOKENS: usize = 1 << 24;

/// One chunk: `tokens` little-endian u32 token ids.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Chunk {
    pub key: String,
    pub tokens: u64,
    /// BLAKE3 of the chunk's bytes, hex.
    pub blake3: String,
}

/// What `data prepare` wrote.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub format: String,
    pub tokenizer: TokenizerKind,
    /// The whole corpus, as the run records it (`RunConfig::corpus`).
    pub corpus: CorpusId,
    pub chunks: Vec<Chunk>,
}

impl Manifest {
    /// Parses and checks a manifest from the store: its format, its size,
    /// each chunk's key (under `data/`), count and hash, and that the
    /// chunks add up to the corpus.
    pub fn parse(bytes: &[u8]) -> Result<Manifest> {
        ensure!(bytes.len() <= MAX_MANIFEST_BYTES, "the corpus manifest is {} bytes, over the limit", bytes.len());
        let m: Manifest = serde_json::from_slice(bytes).context("the corpus manifest is not valid JSON")?;
        ensure!(m.format == FORMAT, "corpus manifest format {:?}; this build reads {FORMAT:?}", m.format);
        ensure!(
            !m.chunks.is_empty() && m.chunks.len() <= MAX_CHUNKS,
            "the corpus manifest lists {} chunks",
            m.chunks.len()
        );
        ensure!(is_hash(&m.corpus.blake3), "the corpus manifest's corpus hash is not 64 hex characters");
        let mut total = 0u64;
        for c in &m.chunks {
            check_key(&c.key).map_err(|e| anyhow::anyhow!("chunk key {:?}: {e}", c.key))?;
            ensure!(c.key.starts_with("data/"), "chunk key {:?} is not under data/", c.key);
            ensure!(c.tokens > 0 && c.tokens <= MAX_CHUNK_TOKENS, "chunk {} holds {} tokens", c.key, c.tokens);
            ensure!(is_hash(&c.blake3), "chunk {}: its hash is not 64 hex characters", c.key);
            total = total.saturating_add(c.tokens);
        }
        ensure!(total == m.corpus.tokens, "the chunks hold {total} tokens, the corpus {}", m.corpus.tokens);
        Ok(m)
    }
}

fn is_hash(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
}

fn to_bytes(tokens: &[u32]) -> Vec<u8> {
    tokens.iter().flat_map(|t| t.to_le_bytes()).collect()
}

/// Writes `tokens` into `store` as chunks of at most `chunk_tokens`, then
/// the manifest (last, so a reader never sees a manifest whose chunks are
/// missing). Refuses to replace a manifest of another corpus: that is
/// someone's data.
pub async fn prepare(
    store: &dyn ObjectStore,
    tokens: &[u32],
    tokenizer: TokenizerKind,
    chunk_tokens: usize,
    mut progress: impl FnMut(u64),
) -> Result<Manifest> {
    ensure!(!tokens.is_empty(), "the corpus has no tokens");
    ensure!(
        chunk_tokens > 0 && chunk_tokens as u64 <= MAX_CHUNK_TOKENS,
        "chunks of {chunk_tokens} tokens: want 1 to {MAX_CHUNK_TOKENS}"
    );
    ensure!(tokens.len().div_ceil(chunk_tokens) <= MAX_CHUNKS, "{} tokens make too many chunks", tokens.len());
    let corpus = CorpusId::of(tokens);
    match store.get(MANIFEST_KEY).await {
        Ok(bytes) => {
            let old = Manifest::parse(&bytes).context("a corpus manifest is already there and cannot be read")?;
            ensure!(
                old.corpus == corpus && old.tokenizer == tokenizer,
                "the store already holds another corpus ({} tokens, blake3 {}); prepare into another store or prefix",
                old.corpus.tokens,
                &old.corpus.blake3[..16]
            );
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).context("reading the store's corpus manifest"),
    }
    // Chunk keys carry the corpus hash, so two corpora never share a key.
    let mut chunks = Vec::new();
    for (i, part) in tokens.chunks(chunk_tokens).enumerate() {
        let bytes = to_bytes(part);
        let blake3 = blake3::hash(&bytes).to_hex().to_string();
        let key = format!("data/{}/chunk-{i:05}.u32", &corpus.blake3[..16]);
        store.put(&key, bytes).await.with_context(|| format!("writing {key}"))?;
        progress(part.len() as u64);
        chunks.push(Chunk { key, tokens: part.len() as u64, blake3 });
    }
    let m = Manifest { format: FORMAT.into(), tokenizer, corpus, chunks };
    store.put(MANIFEST_KEY, serde_json::to_vec_pretty(&m)?).await.context("writing the corpus manifest")?;
    Ok(m)
}

/// Fetches the corpus the store's manifest names, each chunk from `cache`
/// when a good copy is there (re-checked), else from the store (checked,
/// then cached). `want`: the run's corpus, refused if the manifest differs.
pub async fn fetch(
    store: &dyn ObjectStore,
    want: Option<&CorpusId>,
    tokenizer: TokenizerKind,
    cache: Option<&Path>,
) -> Result<(Manifest, Vec<u32>)> {
    let bytes =
        store.get(MANIFEST_KEY).await.with_context(|| format!("fetching {MANIFEST_KEY} from the run's store"))?;
    let m = Manifest::parse(&bytes)?;
    ensure!(
        m.tokenizer == tokenizer,
        "the prepared corpus is tokenized with {}, the run's model wants {}",
        m.tokenizer.name(),
        tokenizer.name()
    );
    if let Some(w) = want {
        ensure!(
            *w == m.corpus,
            "the store's corpus ({} tokens, blake3 {}) is not the run's ({} tokens, blake3 {})",
            m.corpus.tokens,
            &m.corpus.blake3[..16],
            w.tokens,
            &w.blake3[..16]
        );
    }
    let vocab = tokenizer.vocab_real() as u32;
    let mut tokens = Vec::with_capacity(usize::try_from(m.corpus.tokens).unwrap_or(0).min(1 << 30));
    for c in &m.chunks {
        let bytes = chunk_bytes(store, c, cache).await?;
        let start = tokens.len();
        tokens.extend(bytes.chunks_exact(4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]])));
        if let Some(t) = tokens[start..].iter().find(|&&t| t >= vocab) {
            bail!("chunk {}: token {t} is outside the tokenizer's vocabulary ({vocab})", c.key);
        }
    }
    ensure!(CorpusId::of(&tokens) == m.corpus, "the chunks do not make up the manifest's corpus");
    Ok((m, tokens))
}

fn cache_path(cache: &Path, c: &Chunk) -> PathBuf {
    cache.join(format!("{}.u32", c.blake3))
}

/// One chunk's bytes, checked against the manifest.
async fn chunk_bytes(store: &dyn ObjectStore, c: &Chunk, cache: Option<&Path>) -> Result<Vec<u8>> {
    let good = |b: &[u8]| b.len() as u64 == c.tokens * 4 && blake3::hash(b).to_hex().as_str() == c.blake3;
    if let Some(dir) = cache
        && let Ok(b) = std::fs::read(cache_path(dir, c))
    {
        if good(&b) {
            return Ok(b);
        }
        tracing::warn!(chunk = %c.key, "cached corpus chunk is damaged; fetching it again");
    }
    let b = store.get(&c.key).await.with_context(|| format!("fetching {}", c.key))?;
    if !good(&b) {
        bail!("chunk {} from the store does not match the manifest (size or BLAKE3): refused", c.key);
    }
    if let Some(dir) = cache {
        // Best effort: a cache that cannot be written costs a download next time.
        let path = cache_path(dir, c);
        let tmp = path.with_extension("part");
        let wrote = std::fs::create_dir_all(dir)
            .and_then(|_| std::fs::write(&tmp, &b))
            .and_then(|_| std::fs::rename(&tmp, &path));
        if let Err(e) = wrote {
            tracing::warn!(error = %e, dir = %dir.display(), "cannot cache a corpus chunk");
        }
    }
    Ok(b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fileio::FileIo;
    use crate::local_store::LocalDirStore;

    fn tokens(n: u32) -> Vec<u32> {
        (0..n).map(|i| (i * 7 + 3) % 256).collect()
    }

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
    }

    #[test]
    fn prepared_tokens_come_back_whole_and_from_the_cache_the_second_time() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalDirStore::open(dir.path().join("store"), FileIo::start(false)).unwrap();
        let t = tokens(10_000);
        rt().block_on(async {
            let m = prepare(&store, &t, TokenizerKind::Byte, 3_000, |_| {}).await.unwrap();
            assert_eq!(m.chunks.len(), 4);
            assert_eq!(m.corpus, CorpusId::of(&t));
            let cache = dir.path().join("cache");
            let (_, got) = fetch(&store, Some(&m.corpus), TokenizerKind::Byte, Some(&cache)).await.unwrap();
            assert_eq!(got, t);
            // With the chunks gone from the store, the cache serves them.
            for c in &m.chunks {
                std::fs::remove_file(dir.path().join("store").join(&c.key)).unwrap();
            }
            let (_, again) = fetch(&store, Some(&m.corpus), TokenizerKind::Byte, Some(&cache)).await.unwrap();
            assert_eq!(again, t);
            // Preparing the same corpus again is a no-op; another is refused.
            prepare(&store, &t, TokenizerKind::Byte, 3_000, |_| {}).await.unwrap();
            let e = prepare(&store, &tokens(9_000), TokenizerKind::Byte, 3_000, |_| {}).await.unwrap_err();
            assert!(e.to_string().contains("another corpus"), "{e}");
        });
    }

    #[test]
    fn a_tampered_chunk_or_manifest_is_refused_and_never_cached() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("store");
        let store = LocalDirStore::open(&root, FileIo::start(false)).unwrap();
        let t = tokens(5_000);
        rt().block_on(async {
            let m = prepare(&store, &t, TokenizerKind::Byte, 2_000, |_| {}).await.unwrap();
            let cache = dir.path().join("cache");
            // One flipped byte in a chunk.
            let p = root.join(&m.chunks[1].key);
            let mut b = std::fs::read(&p).unwrap();
            b[5] ^= 1;
            std::fs::write(&p, &b).unwrap();
            let e = fetch(&store, None, TokenizerKind::Byte, Some(&cache)).await.unwrap_err();
            assert!(e.to_string().contains("does not match the manifest"), "{e:#}");
            assert!(!cache.join(format!("{}.u32", m.chunks[1].blake3)).exists());
            // A damaged cached copy is fetched again, not used.
            b[5] ^= 1;
            std::fs::write(&p, &b).unwrap();
            std::fs::write(cache.join(format!("{}.u32", m.chunks[0].blake3)), b"junk").unwrap();
            let (_, got) = fetch(&store, None, TokenizerKind::Byte, Some(&cache)).await.unwrap();
            assert_eq!(got, t);
            // The wrong tokenizer, the wrong corpus, and manifests that lie.
            let e = fetch(&store, None, TokenizerKind::Gpt2, None).await.unwrap_err();
            assert!(e.to_string().contains("tokenized with byte"), "{e:#}");
            let other = CorpusId::of(&tokens(10));
            let e = fetch(&store, Some(&other), TokenizerKind::Byte, None).await.unwrap_err();
            assert!(e.to_string().contains("is not the run's"), "{e:#}");
            let good = std::fs::read(root.join(MANIFEST_KEY)).unwrap();
            let text = String::from_utf8(good).unwrap();
            for (from, to, why) in [
                ("\"tokens\": 2000", "\"tokens\": 2001", "the chunks hold"),
                (m.chunks[0].key.as_str(), "../../etc/passwd", "chunk key"),
                (m.chunks[0].key.as_str(), "weights/x", "not under data/"),
                ("iota-tokens/1", "iota-tokens/9", "format"),
            ] {
                let bad = text.replacen(from, to, 1);
                assert_ne!(bad, text, "{from}");
                let e = Manifest::parse(bad.as_bytes()).unwrap_err();
                assert!(format!("{e:#}").contains(why), "{from}: {e:#}");
            }
            assert!(Manifest::parse(&vec![b' '; MAX_MANIFEST_BYTES + 1]).is_err());
        });
    }
}
