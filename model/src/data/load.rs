//! Loading a corpus into token ids.
//!
//! Formats, chosen by the path:
//! - a directory: every `*.bin` file in it, in name order;
//! - `*.bin`: pre-tokenised little-endian uint16 (raw, as nanoGPT writes it,
//!   or with llm.c's 1024-byte header: magic 20240520, version, count);
//! - `*.jsonl` / `*.json`: one JSON object per line with a `text` field;
//!   documents are separated by the end-of-text token;
//! - anything else: UTF-8 plain text.

use std::path::{Path, PathBuf};

use thiserror::Error;

use super::tokenizer::Tokenizer;

#[derive(Debug, Error)]
pub enum DataError {
    #[error("cannot read {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path}: {msg}")]
    Format { path: PathBuf, msg: String },
    #[error("{path}: token {token} is outside the tokenizer's vocabulary ({vocab})")]
    Token { path: PathBuf, token: u32, vocab: usize },
    #[error("{path}: only {got} tokens; need at least {need}")]
    TooSmall { path: PathBuf, got: usize, need: usize },
}

const LLMC_MAGIC: i32 = 20240520;
const LLMC_HEADER: usize = 256 * 4;

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> DataError + '_ {
    move |source| DataError::Io { path: path.to_path_buf(), source }
}

/// Loads `path` and returns its token ids, every one `< vocab_real`.
pub fn load_tokens(path: &Path, tok: &Tokenizer) -> Result<Vec<u32>, DataError> {
    let vocab = tok.kind().vocab_real();
    let meta = std::fs::metadata(path).map_err(io(path))?;
    let tokens = if meta.is_dir() {
        let mut files: Vec<PathBuf> = std::fs::read_dir(path)
            .map_err(io(path))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "bin"))
            .collect();
        files.sort();
        if files.is_empty() {
            return Err(DataError::Format { path: path.into(), msg: "directory holds no .bin shards".into() });
        }
        let mut all = Vec::new();
        for f in files {
            all.extend(load_bin(&f)?);
        }
        all
    } else {
        match path.extension().and_then(|e| e.to_str()) {
            Some("bin") => load_bin(path)?,
            Some("jsonl") | Some("json") => load_jsonl(path, tok)?,
            _ => {
                let bytes = std::fs::read(path).map_err(io(path))?;
                let text = String::from_utf8(bytes)
                    .map_err(|e| DataError::Format { path: path.into(), msg: format!("not UTF-8 text ({e})") })?;
                tok.encode(&text)
            }
        }
    };
    if let Some(&t) = tokens.iter().find(|&&t| t as usize >= vocab) {
        return Err(DataError::Token { path: path.into(), token: t, vocab });
    }
    Ok(tokens)
}

fn load_bin(path: &Path) -> Result<Vec<u32>, DataError> {
    let bytes = std::fs::read(path).map_err(io(path))?;
    let fmt = |msg: String| DataError::Format { path: path.into(), msg };
    let body = if bytes.len() >= LLMC_HEADER && i32::from_le_bytes(bytes[0..4].try_into().unwrap()) == LLMC_MAGIC {
        let count = i32::from_le_bytes(bytes[8..12].try_into().unwrap());
        let count = usize::try_from(count).map_err(|_| fmt(format!("negative token count {count} in llm.c header")))?;
        let have = (bytes.len() - LLMC_HEADER) / 2;
        if count > have {
            return Err(fmt(format!("llm.c header promises {count} tokens but the file holds {have}")));
        }
        &bytes[LLMC_HEADER..LLMC_HEADER + 2 * count]
    } else {
        if bytes.len() % 2 != 0 {
            return Err(fmt(format!("{} bytes is not a whole number of uint16 tokens", bytes.len())));
        }
        &bytes[..]
    };
    Ok(body.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]]) as u32).collect())
}

fn load_jsonl(path: &Path, tok: &Tokenizer) -> Result<Vec<u32>, DataError> {
    let text = std::fs::read_to_string(path).map_err(io(path))?;
    let mut docs = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let v: serde_json::Value = serde_json::from_str(line)
            .map_err(|e| DataError::Format { path: path.into(), msg: format!("line {}: invalid JSON ({e})", i + 1) })?;
        let t = v.get("text").and_then(|t| t.as_str()).ok_or_else(|| DataError::Format {
            path: path.into(),
            msg: format!("line {}: no string field \"text\"", i + 1),
        })?;
        docs.push(t.to_string());
    }
    let encoded: Vec<Vec<u32>> = docs.iter().map(|d| tok.encode(d)).collect();
    let mut out = Vec::new();
    for d in encoded {
        out.extend(d);
        match tok.eot() {
            Some(e) => out.push(e),
            None => out.extend(tok.encode("\n\n")),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bin_jsonl_and_text_formats() {
        let dir = tempfile::tempdir().unwrap();
        let tok = Tokenizer::Byte;
        // raw uint16
        let raw = dir.path().join("a.bin");
        std::fs::write(&raw, [1u8, 0, 200, 0, 7, 0]).unwrap();
        assert_eq!(load_tokens(&raw, &tok).unwrap(), vec![1, 200, 7]);
        // llm.c header
        let mut h = vec![0u8; LLMC_HEADER];
        h[0..4].copy_from_slice(&LLMC_MAGIC.to_le_bytes());
        h[4..8].copy_from_slice(&1i32.to_le_bytes());
        h[8..12].copy_from_slice(&2i32.to_le_bytes());
        h.extend([5u8, 0, 6, 0]);
        let llmc = dir.path().join("b.bin");
        std::fs::write(&llmc, &h).unwrap();
        assert_eq!(load_tokens(&llmc, &tok).unwrap(), vec![5, 6]);
        // directory of shards, in name order
        assert_eq!(load_tokens(dir.path(), &tok).unwrap(), vec![1, 200, 7, 5, 6]);
        // odd length and lying headers are clear errors
        std::fs::write(&raw, [1u8, 0, 2]).unwrap();
        assert!(matches!(load_tokens(&raw, &tok), Err(DataError::Format { .. })));
        h[8..12].copy_from_slice(&9i32.to_le_bytes());
        std::fs::write(&llmc, &h).unwrap();
        assert!(load_tokens(&llmc, &tok).unwrap_err().to_string().contains("promises 9"));
        // tokens outside the vocabulary
        std::fs::write(&raw, [0u8, 1]).unwrap(); // 256
        assert!(matches!(load_tokens(&raw, &tok), Err(DataError::Token { token: 256, .. })));
        // JSON lines
        let j = dir.path().join("c.jsonl");
        std::fs::write(&j, "{\"text\": \"hi\"}\n\n{\"text\": \"yo\", \"id\": 3}\n").unwrap();
        assert_eq!(tok.decode(&load_tokens(&j, &tok).unwrap()), "hi\n\nyo\n\n");
        std::fs::write(&j, "{\"text\": \"hi\"}\n{\"body\": 1}\n").unwrap();
        assert!(load_tokens(&j, &tok).unwrap_err().to_string().contains("line 2"));
        // plain text, and a missing file
        let t = dir.path().join("d.txt");
        std::fs::write(&t, "abc").unwrap();
        assert_eq!(load_tokens(&t, &tok).unwrap(), vec![97, 98, 99]);
        assert!(matches!(load_tokens(&dir.path().join("nope.txt"), &tok), Err(DataError::Io { .. })));
    }
}
