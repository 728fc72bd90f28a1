//! Model files: safetensors weights, Hugging Face configs, the tokenizer, and the cache
//! that fetches the default model.
//!
//! | piece | file |
//! |---|---|
//! | safetensors load (memory-mapped, checked header) and save | `safetensors.rs` |
//! | `config.json`, `1_Pooling/config.json`, `sentence_bert_config.json` | `config.rs` |
//! | the cache folder and the default model, fetched on first use | `cache.rs` |
//! | batched tokenization over the `tokenizers` crate | `tokenizer.rs` |
//!
//! [`ModelDir`] ties them together for a directory in Hugging Face layout. Every failure
//! (a missing or malformed file) is an [`Error::Io`] naming the file.

pub mod cache;
pub mod config;
pub mod gguf;
pub mod gguf_tokenizer;
pub mod safetensors;
pub mod tokenizer;

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use config::{BertConfig, PoolingConfig, SentenceConfig};

/// A model directory in Hugging Face layout: `config.json`, `model.safetensors`,
/// `tokenizer.json`, and for a sentence-transformers model `1_Pooling/config.json` and
/// `sentence_bert_config.json`.
#[derive(Clone, Debug)]
pub struct ModelDir {
    dir: PathBuf,
    /// The encoder's architecture.
    pub config: BertConfig,
    /// The pooling module, when the directory has one.
    pub pooling: Option<PoolingConfig>,
    /// sentence-transformers' settings, when the directory has them.
    pub sentence: Option<SentenceConfig>,
}

impl ModelDir {
    /// Checks that `dir` holds the model files and reads its configs (not the weights).
    pub fn open(dir: impl AsRef<Path>) -> Result<ModelDir> {
        let dir = dir.as_ref().to_path_buf();
        if !dir.is_dir() {
            return Err(Error::Io { op: "model", path: dir.display().to_string(), msg: "not a directory".into() });
        }
        for f in cache::MODEL_FILES {
            if !dir.join(f).is_file() {
                return Err(Error::Io { op: "model", path: dir.display().to_string(), msg: format!("no {f} here") });
            }
        }
        let config = BertConfig::from_file(dir.join("config.json"))?;
        let pooling_path = dir.join("1_Pooling").join("config.json");
        let pooling = if pooling_path.is_file() { Some(PoolingConfig::from_file(&pooling_path)?) } else { None };
        match &pooling {
            Some(p) if p.dimension != config.hidden_size => {
                return Err(Error::Io {
                    op: "model",
                    path: pooling_path.display().to_string(),
                    msg: format!(
                        "pools vectors of {} but the encoder's hidden size is {}",
                        p.dimension, config.hidden_size
                    ),
                });
            }
            _ => {}
        }
        let sentence_path = dir.join("sentence_bert_config.json");
        let sentence = if sentence_path.is_file() { Some(SentenceConfig::from_file(&sentence_path)?) } else { None };
        Ok(ModelDir { dir, config, pooling, sentence })
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.dir
    }
    /// The weights file.
    pub fn weights_path(&self) -> PathBuf {
        self.dir.join("model.safetensors")
    }
    /// The tokenizer file.
    pub fn tokenizer_path(&self) -> PathBuf {
        self.dir.join("tokenizer.json")
    }
    /// The longest input in tokens, special tokens included: sentence-transformers'
    /// `max_seq_length` when given, never more than the position table.
    pub fn max_length(&self) -> usize {
        let positions = self.config.max_position_embeddings;
        self.sentence.map_or(positions, |s| s.max_seq_length.min(positions))
    }
    /// Memory-maps the weights (see [`safetensors::load`]).
    pub fn weights(&self) -> Result<safetensors::Tensors> {
        safetensors::load(self.weights_path())
    }
    /// The tokenizer, truncating to [`ModelDir::max_length`], padding with its own pad
    /// token (the config's `pad_token_id` when it names none), lower-casing when
    /// sentence-transformers did.
    pub fn tokenizer(&self) -> Result<tokenizer::Tokenizer> {
        let mut t = tokenizer::Tokenizer::from_file(self.tokenizer_path(), self.max_length())?;
        if !t.has_own_pad_id() {
            t = t.with_pad_id(self.config.pad_token_id);
        }
        Ok(t.with_lowercase(self.sentence.is_some_and(|s| s.do_lower_case)))
    }
}
