//! The tokenizer files of an exported model, so that
//! `transformers.AutoTokenizer.from_pretrained(folder)` gives exactly the ids
//! our [`crate::data::Tokenizer`] gives.
//!
//! Hugging Face's GPT-2 tokenizer is a byte-level BPE: every byte is first
//! mapped to a printable character (GPT-2's `bytes_to_unicode`), and the
//! vocabulary and merges are written in those characters. tiktoken only ships
//! ranks (token bytes -> id), so the merges are derived from the ranks: each
//! token is the merge of the two parts that rank-ordered byte-pair merging,
//! stopped just below the token's own rank, leaves of its bytes. Writing the
//! merges in rank order makes HF's pair priorities equal tiktoken's ranks.
//!
//! The byte tokenizer (id = byte value) is the same machinery with a
//! 256-entry vocabulary and no merges: HF's ByteLevel pre-tokeniser splits the
//! text, but without merges every byte stays its own token.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use serde_json::{Map, Value, json};

use crate::data::TokenizerKind;

/// GPT-2's end-of-text token: our document separator and HF's bos/eos/unk.
const EOT: &str = "<|endoftext|>";
const EOT_ID: u32 = 50256;

/// Writes `tokenizer.json`, `tokenizer_config.json`, `special_tokens_map.json`
/// and, for GPT-2, the slow tokenizer's `vocab.json` and `merges.txt` into
/// `dir` (created if missing). Returns the paths written.
///
/// Refuses, before writing anything, if any of those files already exists:
/// an export must not silently mix with (or clobber) another model's files.
pub fn write_tokenizer_files(dir: &Path, kind: TokenizerKind, model_max_length: usize) -> anyhow::Result<Vec<PathBuf>> {
    let files = match kind {
        TokenizerKind::Gpt2 => gpt2_files(model_max_length)?,
        TokenizerKind::Byte => byte_files(model_max_length)?,
    };
    for (name, _) in &files {
        let path = dir.join(name);
        if path.symlink_metadata().is_ok() {
            bail!("refusing to overwrite existing tokenizer file {}", path.display());
        }
    }
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut written = Vec::with_capacity(files.len());
    for (name, body) in files {
        let path = dir.join(name);
        // `create_new` keeps the no-overwrite promise even against a file
        // that appeared after the check above.
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .with_context(|| format!("creating {}", path.display()))?;
        file.write_all(body.as_bytes()).with_context(|| format!("writing {}", path.display()))?;
        written.push(path);
    }
    Ok(written)
}

/// GPT-2's `bytes_to_unicode`: printable Latin-1 bytes map to themselves, the
/// rest (controls, space, ...) to U+0100 onwards in byte order, so every token
/// is a string of visible characters with no spaces (merge lines split on ' ').
fn byte_to_char() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut shifted = 0u32;
    for (b, slot) in table.iter_mut().enumerate() {
        let printable = matches!(b, 33..=126 | 161..=172 | 174..=255);
        let code = if printable {
            b as u32
        } else {
            shifted += 1;
            255 + shifted
        };
        // 0..=255 and 0x100..0x144 are all Unicode scalar values.
        *slot = char::from_u32(code).expect("byte-level code points are valid chars");
    }
    table
}

fn byte_level(bytes: &[u8], table: &[char; 256]) -> String {
    bytes.iter().map(|&b| table[usize::from(b)]).collect()
}

/// The id -> bytes table of r50k (ids 0..50256; 50256 is `<|endoftext|>`).
fn gpt2_token_bytes() -> anyhow::Result<Vec<Vec<u8>>> {
    let bpe = tiktoken_rs::r50k_base().context("loading the r50k ranks")?;
    let mut tokens = Vec::with_capacity(EOT_ID as usize + 1);
    for id in 0..=EOT_ID {
        tokens.push(bpe.decode_bytes(&[id]).with_context(|| format!("r50k has no token {id}"))?);
    }
    if tokens[EOT_ID as usize] != EOT.as_bytes() {
        bail!("r50k token {EOT_ID} is not {EOT}");
    }
    Ok(tokens)
}

/// The merge of each token of two or more bytes, as (left, right) byte
/// strings, in rank order. `tokens[id]` are the bytes of rank `id`.
///
/// For each such token, its bytes are merged pairwise, always taking the
/// adjacent pair whose concatenation has the lowest rank and only ranks below
/// the token's own; the two parts left are the merge that creates it. Fails if
/// a token does not end in exactly two parts (its ranks are not a BPE).
fn derive_merges(tokens: &[Vec<u8>]) -> anyhow::Result<Vec<(&[u8], &[u8])>> {
    let ranks: HashMap<&[u8], usize> = tokens.iter().enumerate().map(|(id, t)| (t.as_slice(), id)).collect();
    if ranks.len() != tokens.len() {
        bail!("the ranks repeat a token");
    }
    if let Some(b) = (0..=255u8).find(|b| !ranks.contains_key(&[*b][..])) {
        bail!("the ranks lack the single byte {b:#04x}");
    }
    let mut merges = Vec::new();
    for (rank, token) in tokens.iter().enumerate() {
        if token.len() < 2 {
            continue;
        }
        // Part i is token[starts[i]..starts[i + 1]]; adjacent parts are a
        // contiguous slice, so no concatenation needs allocating.
        let mut starts: Vec<usize> = (0..=token.len()).collect();
        loop {
            let best = (0..starts.len().saturating_sub(2))
                .filter_map(|i| ranks.get(&token[starts[i]..starts[i + 2]]).map(|&r| (r, i)))
                .filter(|&(r, _)| r < rank)
                .min();
            match best {
                Some((_, i)) => {
                    starts.remove(i + 1);
                }
                None => break,
            }
        }
        if starts.len() != 3 {
            bail!("token {rank} ({:?}) ends in {} parts, not 2", String::from_utf8_lossy(token), starts.len() - 1);
        }
        merges.push((&token[..starts[1]], &token[starts[1]..]));
    }
    Ok(merges)
}

/// The `tokenizer.json` of a byte-level BPE with `vocab` (byte-level string ->
/// id), `merges` ("left right" lines in priority order) and `added` tokens.
fn tokenizer_json(vocab: &Map<String, Value>, merges: &[String], added: &[(u32, &str)]) -> Value {
    let added: Vec<Value> = added
        .iter()
        .map(|&(id, content)| {
            json!({
                "id": id, "content": content, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": true,
            })
        })
        .collect();
    // GPT-2's own settings: no prefix space, GPT-2's split regex, and offsets
    // left untrimmed (they do not change ids).
    let byte_level = |trim_offsets: bool| json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": trim_offsets, "use_regex": true});
    json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": byte_level(true),
        "post_processor": byte_level(false),
        "decoder": byte_level(true),
        "model": {
            "type": "BPE",
            "dropout": null,
            "unk_token": null,
            "continuing_subword_prefix": "",
            "end_of_word_suffix": "",
            "fuse_unk": false,
            "byte_fallback": false,
            "vocab": vocab,
            "merges": merges,
        },
    })
}

fn pretty(value: &Value) -> anyhow::Result<String> {
    Ok(serde_json::to_string_pretty(value)? + "\n")
}

/// The file names and contents for GPT-2 (r50k).
fn gpt2_files(model_max_length: usize) -> anyhow::Result<Vec<(&'static str, String)>> {
    let table = byte_to_char();
    let tokens = gpt2_token_bytes()?;
    let ordinary = &tokens[..EOT_ID as usize];
    let mut vocab = Map::new();
    for (id, bytes) in ordinary.iter().enumerate() {
        vocab.insert(byte_level(bytes, &table), json!(id));
    }
    // The slow GPT2Tokenizer finds special tokens in vocab.json; the fast
    // one lists them in added_tokens. Both carry it, as HF's gpt2 does.
    vocab.insert(EOT.to_string(), json!(EOT_ID));
    let merges: Vec<String> = derive_merges(ordinary)?
        .into_iter()
        .map(|(l, r)| format!("{} {}", byte_level(l, &table), byte_level(r, &table)))
        .collect();
    let mut merges_txt = String::from("#version: 0.2\n");
    for line in &merges {
        merges_txt.push_str(line);
        merges_txt.push('\n');
    }
    let config = json!({
        "tokenizer_class": "GPT2TokenizerFast",
        "bos_token": EOT, "eos_token": EOT, "unk_token": EOT,
        "add_bos_token": false,
        "add_prefix_space": false,
        // Else transformers rewrites " ." as "." etc. when decoding.
        "clean_up_tokenization_spaces": false,
        "errors": "replace",
        "model_max_length": model_max_length,
    });
    let special = json!({"bos_token": EOT, "eos_token": EOT, "unk_token": EOT});
    Ok(vec![
        ("tokenizer.json", pretty(&tokenizer_json(&vocab, &merges, &[(EOT_ID, EOT)]))?),
        ("tokenizer_config.json", pretty(&config)?),
        ("special_tokens_map.json", pretty(&special)?),
        ("vocab.json", pretty(&Value::Object(vocab))?),
        ("merges.txt", merges_txt),
    ])
}

/// The file names and contents for the byte tokenizer (id = byte value).
fn byte_files(model_max_length: usize) -> anyhow::Result<Vec<(&'static str, String)>> {
    let table = byte_to_char();
    let vocab: Map<String, Value> = table.iter().enumerate().map(|(b, c)| (c.to_string(), json!(b))).collect();
    let config = json!({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "clean_up_tokenization_spaces": false,
        "model_max_length": model_max_length,
    });
    Ok(vec![
        ("tokenizer.json", pretty(&tokenizer_json(&vocab, &[], &[]))?),
        ("tokenizer_config.json", pretty(&config)?),
        ("special_tokens_map.json", pretty(&json!({}))?),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_json(path: &Path) -> Value {
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
    }

    /// HF's byte-level BPE, written independently of `derive_merges`: map the
    /// bytes to characters, then repeatedly merge the adjacent pair that
    /// appears earliest in the merges list, and look the parts up in the vocab.
    fn hf_bpe(piece: &str, vocab: &HashMap<String, u32>, merges: &HashMap<(String, String), usize>) -> Vec<u32> {
        let table = byte_to_char();
        let mut parts: Vec<String> = piece.bytes().map(|b| table[b as usize].to_string()).collect();
        loop {
            let best = (0..parts.len().saturating_sub(1))
                .filter_map(|i| merges.get(&(parts[i].clone(), parts[i + 1].clone())).map(|&p| (p, i)))
                .min();
            let Some((_, i)) = best else { break };
            let right = parts.remove(i + 1);
            parts[i].push_str(&right);
        }
        parts.iter().map(|p| vocab[p]).collect()
    }

    #[test]
    fn gpt2_files_reproduce_tiktoken() {
        let dir = tempfile::tempdir().unwrap();
        let written = write_tokenizer_files(dir.path(), TokenizerKind::Gpt2, 1024).unwrap();
        assert_eq!(written.len(), 5);

        let vocab_json = read_json(&dir.path().join("vocab.json"));
        let vocab: HashMap<String, u32> =
            vocab_json.as_object().unwrap().iter().map(|(k, v)| (k.clone(), v.as_u64().unwrap() as u32)).collect();
        assert_eq!(vocab.len(), 50257);
        assert_eq!(vocab[EOT], 50256);

        let merges_txt = std::fs::read_to_string(dir.path().join("merges.txt")).unwrap();
        let mut lines = merges_txt.lines();
        assert_eq!(lines.next(), Some("#version: 0.2"));
        let merge_lines: Vec<&str> = lines.collect();
        assert_eq!(merge_lines.len(), 50000);
        let merges: HashMap<(String, String), usize> = merge_lines
            .iter()
            .enumerate()
            .map(|(i, l)| {
                let (a, b) = l.split_once(' ').unwrap();
                ((a.to_string(), b.to_string()), i)
            })
            .collect();
        assert_eq!(merges.len(), 50000, "merge lines repeat");

        // The fast tokenizer's file carries the same vocab and merges.
        let tok = read_json(&dir.path().join("tokenizer.json"));
        assert_eq!(tok["model"]["vocab"], vocab_json);
        let fast_merges: Vec<&str> =
            tok["model"]["merges"].as_array().unwrap().iter().map(|m| m.as_str().unwrap()).collect();
        assert_eq!(fast_merges, merge_lines);
        assert_eq!(tok["added_tokens"][0]["id"], 50256);
        assert_eq!(tok["added_tokens"][0]["content"], EOT);
        assert_eq!(tok["pre_tokenizer"]["type"], "ByteLevel");
        let config = read_json(&dir.path().join("tokenizer_config.json"));
        assert_eq!(config["tokenizer_class"], "GPT2TokenizerFast");
        assert_eq!(config["model_max_length"], 1024);
        assert_eq!(config["eos_token"], EOT);

        let bpe = tiktoken_rs::r50k_base().unwrap();
        let pieces = [
            "hello",
            " hello",
            " world",
            " beginning",
            " God",
            "ing",
            " unbelievable",
            " 12345",
            "\n\n",
            " Jerusalem",
            " the",
            "'s",
            " antidisestablishmentarianism",
            " café",
            " —",
            " naïve",
            "!!!",
            "        ",
            " tokenization",
            " Übermensch",
            " 日本語",
        ];
        for piece in pieces {
            assert_eq!(hf_bpe(piece, &vocab, &merges), bpe.encode_ordinary(piece), "piece {piece:?}");
        }
    }

    #[test]
    fn byte_files_map_bytes_to_themselves() {
        let dir = tempfile::tempdir().unwrap();
        let written = write_tokenizer_files(dir.path(), TokenizerKind::Byte, 512).unwrap();
        assert_eq!(written.len(), 3);
        let tok = read_json(&dir.path().join("tokenizer.json"));
        let vocab = tok["model"]["vocab"].as_object().unwrap();
        assert_eq!(vocab.len(), 256);
        let mut ids: Vec<u64> = vocab.values().map(|v| v.as_u64().unwrap()).collect();
        ids.sort();
        assert_eq!(ids, (0..256).collect::<Vec<u64>>());
        // Spot-check GPT-2's byte mapping: printable bytes are themselves,
        // space is 'Ġ' (U+0120), newline 'Ċ' (U+010A), 0x00 is U+0100.
        assert_eq!(vocab["a"], 97);
        assert_eq!(vocab["Ġ"], 32);
        assert_eq!(vocab["Ċ"], 10);
        assert_eq!(vocab["\u{100}"], 0);
        assert_eq!(vocab["ÿ"], 255);
        assert!(tok["model"]["merges"].as_array().unwrap().is_empty());
        assert!(tok["added_tokens"].as_array().unwrap().is_empty());
        assert_eq!(read_json(&dir.path().join("tokenizer_config.json"))["tokenizer_class"], "PreTrainedTokenizerFast");
    }

    #[test]
    fn refuses_to_overwrite() {
        let dir = tempfile::tempdir().unwrap();
        let old = dir.path().join("tokenizer.json");
        std::fs::write(&old, "old").unwrap();
        let err = write_tokenizer_files(dir.path(), TokenizerKind::Byte, 512).unwrap_err();
        assert!(err.to_string().contains("refusing to overwrite"), "{err}");
        assert_eq!(std::fs::read_to_string(&old).unwrap(), "old");
        assert!(!dir.path().join("tokenizer_config.json").exists(), "wrote files before refusing");
    }

    #[test]
    fn derive_merges_rejects_non_bpe_ranks() {
        // "abc" cannot be built from two ranked parts: neither "ab" nor "bc" exists.
        let mut tokens: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
        tokens.push(b"abc".to_vec());
        assert!(derive_merges(&tokens).is_err());
        tokens.insert(256, b"ab".to_vec());
        let merges = derive_merges(&tokens).unwrap();
        assert_eq!(merges, vec![(&b"a"[..], &b"b"[..]), (&b"ab"[..], &b"c"[..])]);
    }
}
