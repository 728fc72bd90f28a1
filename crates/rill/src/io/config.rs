//! Hugging Face model configuration files: `config.json` of a BERT-family encoder, the
//! sentence-transformers pooling module's `1_Pooling/config.json`, and
//! `sentence_bert_config.json` (the sequence length the embedding model was used with).
//!
//! Every value comes from the files; the only defaults are those of the `transformers`
//! `BertConfig` class for fields it lets a file leave out (listed on each field). A missing
//! required field, a value of the wrong JSON type or out of range is an [`Error::Io`]
//! naming the file and the field.

use std::path::Path;

use serde_json::{Map, Value};

use crate::error::{Error, Result};

const OP: &str = "config";

/// The activation of the feed-forward blocks (`hidden_act`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// `gelu`: the exact GELU, `x * Φ(x)` with the error function.
    Gelu,
    /// `gelu_new`, `gelu_pytorch_tanh`, `gelu_fast`: the tanh approximation of GELU.
    GeluTanh,
    /// `relu`.
    Relu,
    /// `silu` or `swish`: `x * sigmoid(x)`.
    Silu,
}

impl Activation {
    /// Parses the `transformers` name of an activation.
    pub fn from_name(name: &str) -> Option<Activation> {
        Some(match name {
            "gelu" => Activation::Gelu,
            "gelu_new" | "gelu_pytorch_tanh" | "gelu_fast" => Activation::GeluTanh,
            "relu" => Activation::Relu,
            "silu" | "swish" => Activation::Silu,
            _ => return None,
        })
    }
}

/// The architecture of a BERT-family encoder, from its `config.json`.
#[derive(Clone, Debug, PartialEq)]
pub struct BertConfig {
    /// `hidden_size`: the width of every token's vector (required).
    pub hidden_size: usize,
    /// `num_hidden_layers`: the number of encoder layers (required).
    pub num_hidden_layers: usize,
    /// `num_attention_heads`: heads per attention block; divides `hidden_size` (required).
    pub num_attention_heads: usize,
    /// `intermediate_size`: the width of the feed-forward block (required).
    pub intermediate_size: usize,
    /// `max_position_embeddings`: rows of the position embedding table, the longest input
    /// the model accepts (required).
    pub max_position_embeddings: usize,
    /// `vocab_size`: rows of the word embedding table (required).
    pub vocab_size: usize,
    /// `type_vocab_size`: rows of the token type embedding table (default 2).
    pub type_vocab_size: usize,
    /// `layer_norm_eps`: the epsilon of every layer norm (default 1e-12).
    pub layer_norm_eps: f64,
    /// `hidden_act`: the feed-forward activation (default `gelu`).
    pub hidden_act: Activation,
    /// `pad_token_id`: the id of the padding token (default 0).
    pub pad_token_id: u32,
    /// `model_type`, when the file names one (`bert`, ...).
    pub model_type: Option<String>,
}

impl BertConfig {
    /// Reads a `config.json`.
    pub fn from_file(path: impl AsRef<Path>) -> Result<BertConfig> {
        let path = path.as_ref();
        BertConfig::from_json(&read(path)?, &path.display().to_string())
    }

    /// Parses the text of a `config.json` (`source` names it in messages).
    pub fn from_json(text: &str, source: &str) -> Result<BertConfig> {
        let f = Fields::parse(text, source)?;
        let hidden_act_name = f.opt_str("hidden_act")?.unwrap_or("gelu");
        let hidden_act = Activation::from_name(hidden_act_name).ok_or_else(|| {
            f.err(format!(
                "\"hidden_act\" is {hidden_act_name:?}; supported: gelu, gelu_new, gelu_pytorch_tanh, gelu_fast, relu, silu, swish"
            ))
        })?;
        match f.opt_str("position_embedding_type")? {
            None | Some("absolute") => {}
            Some(p) => {
                return Err(f.err(format!("\"position_embedding_type\" is {p:?}; only \"absolute\" is supported")));
            }
        }
        let c = BertConfig {
            hidden_size: f.positive("hidden_size")?,
            num_hidden_layers: f.positive("num_hidden_layers")?,
            num_attention_heads: f.positive("num_attention_heads")?,
            intermediate_size: f.positive("intermediate_size")?,
            max_position_embeddings: f.positive("max_position_embeddings")?,
            vocab_size: f.positive("vocab_size")?,
            type_vocab_size: f.opt_uint("type_vocab_size")?.unwrap_or(2),
            layer_norm_eps: f.opt_f64("layer_norm_eps")?.unwrap_or(1e-12),
            hidden_act,
            pad_token_id: match f.opt_uint("pad_token_id")? {
                Some(p) => u32::try_from(p).map_err(|_| f.err(format!("\"pad_token_id\" {p} does not fit u32")))?,
                None => 0,
            },
            model_type: f.opt_str("model_type")?.map(str::to_string),
        };
        if !c.hidden_size.is_multiple_of(c.num_attention_heads) {
            return Err(f.err(format!(
                "\"hidden_size\" {} is not a multiple of \"num_attention_heads\" {}",
                c.hidden_size, c.num_attention_heads
            )));
        }
        if !(c.layer_norm_eps.is_finite() && c.layer_norm_eps > 0.0) {
            return Err(f.err(format!("\"layer_norm_eps\" {} is not a positive number", c.layer_norm_eps)));
        }
        if c.pad_token_id as usize >= c.vocab_size {
            return Err(
                f.err(format!("\"pad_token_id\" {} is outside the vocabulary of {}", c.pad_token_id, c.vocab_size))
            );
        }
        Ok(c)
    }

    /// The width of one attention head (`hidden_size / num_attention_heads`).
    pub fn head_dim(&self) -> usize {
        self.hidden_size / self.num_attention_heads
    }
}

/// How token vectors become one sentence vector (`1_Pooling/config.json`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolingMode {
    /// `pooling_mode_cls_token`: the first token's vector.
    Cls,
    /// `pooling_mode_mean_tokens`: the mean over the unmasked tokens.
    Mean,
    /// `pooling_mode_max_tokens`: the element-wise maximum over the unmasked tokens.
    Max,
    /// `pooling_mode_mean_sqrt_len_tokens`: the sum over the unmasked tokens divided by
    /// the square root of their count.
    MeanSqrtLen,
    /// `pooling_mode_weightedmean_tokens`: the mean weighted by position (1, 2, ...).
    WeightedMean,
    /// `pooling_mode_lasttoken`: the last unmasked token's vector.
    LastToken,
}

/// The pooling module of a sentence-transformers model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolingConfig {
    /// `word_embedding_dimension`: the width of the token vectors it pools.
    pub dimension: usize,
    /// The one mode that is on.
    pub mode: PoolingMode,
}

const POOLING_FLAGS: [(&str, PoolingMode); 6] = [
    ("pooling_mode_cls_token", PoolingMode::Cls),
    ("pooling_mode_mean_tokens", PoolingMode::Mean),
    ("pooling_mode_max_tokens", PoolingMode::Max),
    ("pooling_mode_mean_sqrt_len_tokens", PoolingMode::MeanSqrtLen),
    ("pooling_mode_weightedmean_tokens", PoolingMode::WeightedMean),
    ("pooling_mode_lasttoken", PoolingMode::LastToken),
];

impl PoolingConfig {
    /// Reads a `1_Pooling/config.json`.
    pub fn from_file(path: impl AsRef<Path>) -> Result<PoolingConfig> {
        let path = path.as_ref();
        PoolingConfig::from_json(&read(path)?, &path.display().to_string())
    }

    /// Parses the text of a pooling config. Exactly one `pooling_mode_*` flag must be
    /// true (sentence-transformers concatenates several; rill does not).
    pub fn from_json(text: &str, source: &str) -> Result<PoolingConfig> {
        let f = Fields::parse(text, source)?;
        let dimension = f.positive("word_embedding_dimension")?;
        let mut on = Vec::new();
        for (key, mode) in POOLING_FLAGS {
            if f.opt_bool(key)?.unwrap_or(false) {
                on.push((key, mode));
            }
        }
        match on.as_slice() {
            [(_, mode)] => Ok(PoolingConfig { dimension, mode: *mode }),
            [] => Err(f.err("no pooling_mode_* flag is true")),
            several => Err(f.err(format!(
                "several pooling modes are on ({}); only one is supported",
                several.iter().map(|(k, _)| *k).collect::<Vec<_>>().join(", ")
            ))),
        }
    }
}

/// `sentence_bert_config.json`: how sentence-transformers ran the encoder.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SentenceConfig {
    /// `max_seq_length`: inputs are truncated to this many tokens, special tokens
    /// included (required).
    pub max_seq_length: usize,
    /// `do_lower_case`: whether sentence-transformers lower-cased the text before the
    /// tokenizer (default false).
    pub do_lower_case: bool,
}

impl SentenceConfig {
    /// Reads a `sentence_bert_config.json`.
    pub fn from_file(path: impl AsRef<Path>) -> Result<SentenceConfig> {
        let path = path.as_ref();
        SentenceConfig::from_json(&read(path)?, &path.display().to_string())
    }

    /// Parses the text of a `sentence_bert_config.json`.
    pub fn from_json(text: &str, source: &str) -> Result<SentenceConfig> {
        let f = Fields::parse(text, source)?;
        Ok(SentenceConfig {
            max_seq_length: f.positive("max_seq_length")?,
            do_lower_case: f.opt_bool("do_lower_case")?.unwrap_or(false),
        })
    }
}

pub(crate) fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|e| Error::Io {
        op: OP,
        path: path.display().to_string(),
        msg: e.to_string(),
    })
}

/// A JSON object with typed, error-reporting getters.
struct Fields<'a> {
    source: &'a str,
    obj: Map<String, Value>,
}

impl<'a> Fields<'a> {
    fn parse(text: &str, source: &'a str) -> Result<Fields<'a>> {
        let err = |msg: String| Error::Io { op: OP, path: source.to_string(), msg };
        let v: Value = serde_json::from_str(text).map_err(|e| err(format!("not valid JSON: {e}")))?;
        match v {
            Value::Object(obj) => Ok(Fields { source, obj }),
            _ => Err(err("the top level is not a JSON object".into())),
        }
    }
    fn err(&self, msg: impl Into<String>) -> Error {
        Error::Io { op: OP, path: self.source.to_string(), msg: msg.into() }
    }
    /// The value of `key`, `None` when absent or `null`.
    fn get(&self, key: &str) -> Option<&Value> {
        self.obj.get(key).filter(|v| !v.is_null())
    }
    fn type_err(&self, key: &str, want: &str, v: &Value) -> Error {
        self.err(format!("{key:?} must be {want}, found {v}"))
    }
    fn opt_uint(&self, key: &str) -> Result<Option<usize>> {
        let Some(v) = self.get(key) else { return Ok(None) };
        match v.as_u64().and_then(|x| usize::try_from(x).ok()) {
            Some(x) => Ok(Some(x)),
            None => Err(self.type_err(key, "a non-negative integer", v)),
        }
    }
    fn positive(&self, key: &str) -> Result<usize> {
        match self.opt_uint(key)? {
            Some(0) => Err(self.err(format!("{key:?} must be positive, found 0"))),
            Some(x) => Ok(x),
            None => Err(self.err(format!("missing field {key:?}"))),
        }
    }
    fn opt_f64(&self, key: &str) -> Result<Option<f64>> {
        let Some(v) = self.get(key) else { return Ok(None) };
        v.as_f64().map(Some).ok_or_else(|| self.type_err(key, "a number", v))
    }
    fn opt_str(&self, key: &str) -> Result<Option<&str>> {
        let Some(v) = self.get(key) else { return Ok(None) };
        v.as_str().map(Some).ok_or_else(|| self.type_err(key, "a string", v))
    }
    fn opt_bool(&self, key: &str) -> Result<Option<bool>> {
        let Some(v) = self.get(key) else { return Ok(None) };
        v.as_bool().map(Some).ok_or_else(|| self.type_err(key, "true or false", v))
    }
}
