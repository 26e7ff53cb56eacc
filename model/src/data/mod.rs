//! Data: tokenizers, corpus loaders (plain text, JSON-lines, uint16 `.bin`
//! shards), deterministic sample addressing, and a generated corpus for tests.

pub mod corpus;
pub mod load;
pub mod synthetic;
pub mod tokenizer;

pub use corpus::{Corpus, CorpusId};
pub use load::{DataError, load_tokens};
pub use tokenizer::{Tokenizer, TokenizerKind};
