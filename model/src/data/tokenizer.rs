//! Tokenizers: GPT-2 BPE (r50k ranks embedded in `tiktoken-rs`, so it works
//! offline) and a byte-level one for tests.

use std::sync::Arc;

use rayon::prelude::*;

pub use iota_core::train_config::TokenizerKind;

#[derive(Clone)]
pub enum Tokenizer {
    Gpt2(Arc<tiktoken_rs::CoreBPE>),
    Byte,
}

/// Bytes per parallel tokenisation chunk.
const CHUNK: usize = 64 << 10;

impl Tokenizer {
    /// The tokenizer of `kind` (GPT-2's ranks are embedded: no download).
    pub fn new(kind: TokenizerKind) -> anyhow::Result<Tokenizer> {
        Ok(match kind {
            TokenizerKind::Byte => Tokenizer::Byte,
            TokenizerKind::Gpt2 => Tokenizer::Gpt2(Arc::new(tiktoken_rs::r50k_base()?)),
        })
    }

    pub fn kind(&self) -> TokenizerKind {
        match self {
            Tokenizer::Gpt2(_) => TokenizerKind::Gpt2,
            Tokenizer::Byte => TokenizerKind::Byte,
        }
    }

    /// The end-of-text token that separates documents, if the vocabulary has one.
    pub fn eot(&self) -> Option<u32> {
        match self {
            Tokenizer::Gpt2(_) => Some(50256),
            Tokenizer::Byte => None,
        }
    }

    /// Encodes text. Large texts are cut at newlines followed by a
    /// non-space character and encoded in parallel: GPT-2's pre-tokeniser
    /// never merges across such a point, so the result equals the serial one.
    pub fn encode(&self, text: &str) -> Vec<u32> {
        match self {
            Tokenizer::Byte => text.bytes().map(u32::from).collect(),
            Tokenizer::Gpt2(bpe) => {
                split_points(text).par_iter().map(|piece| bpe.encode_ordinary(piece)).collect::<Vec<_>>().concat()
            }
        }
    }

    /// The bytes of `tokens` (a GPT-2 token can end inside a UTF-8
    /// character: streaming output holds such bytes back until the
    /// character is complete). Unknown ids give no bytes.
    pub fn decode_bytes(&self, tokens: &[u32]) -> Vec<u8> {
        match self {
            Tokenizer::Byte => tokens.iter().filter(|&&t| t < 256).map(|&t| t as u8).collect(),
            Tokenizer::Gpt2(bpe) => tokens.iter().flat_map(|&t| bpe.decode_bytes(&[t]).unwrap_or_default()).collect(),
        }
    }

    pub fn decode(&self, tokens: &[u32]) -> String {
        match self {
            Tokenizer::Byte => {
                String::from_utf8_lossy(&tokens.iter().map(|&t| t as u8).collect::<Vec<_>>()).into_owned()
            }
            Tokenizer::Gpt2(bpe) => bpe.decode(tokens).unwrap_or_else(|_| String::from("<undecodable>")),
        }
    }
}

fn split_points(text: &str) -> Vec<&str> {
    let mut pieces = Vec::new();
    let mut start = 0;
    let b = text.as_bytes();
    while text.len() - start > CHUNK {
        let mut cut = start + CHUNK;
        while cut < b.len() && !(b[cut - 1] == b'\n' && !b[cut].is_ascii_whitespace() && text.is_char_boundary(cut)) {
            cut += 1;
        }
        pieces.push(&text[start..cut]);
        start = cut;
    }
    pieces.push(&text[start..]);
    pieces
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpt2_parallel_encoding_equals_serial_and_round_trips() {
        let tok = Tokenizer::new(TokenizerKind::Gpt2).unwrap();
        let Tokenizer::Gpt2(bpe) = &tok else { unreachable!() };
        let mut text = String::new();
        for i in 0..6000 {
            text.push_str(&format!(
                "In the beginning {i} God created\n\n  the heaven's and earth.\nAnd  it was good\n"
            ));
        }
        assert!(text.len() > 3 * CHUNK);
        let par = tok.encode(&text);
        assert_eq!(par, bpe.encode_ordinary(&text));
        assert_eq!(tok.decode(&par), text);
        assert_eq!(tok.encode("hello world"), vec![31373, 995]);
    }

    #[test]
    fn byte_tokenizer_round_trips() {
        let t = Tokenizer::Byte;
        assert_eq!(t.decode(&t.encode("abc\n")), "abc\n");
        assert_eq!(TokenizerKind::Byte.vocab_padded(), 256);
        assert_eq!(TokenizerKind::Gpt2.vocab_padded(), 50304);
    }
}
