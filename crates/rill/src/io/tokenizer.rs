//! Tokenization with the Hugging Face `tokenizers` crate (pure Rust: its `fancy-regex`
//! feature, no C code), batched the way sentence-transformers calls it: special tokens
//! added, each sentence truncated to the model's maximum (special tokens included, longest
//! first), the batch padded to its longest sentence, with attention masks and token type
//! ids.
//!
//! The padding and truncation stored in `tokenizer.json` are replaced by these (the file
//! of all-MiniLM-L6-v2, for example, pads every input to 128). Sentences are encoded one
//! after another on the calling thread and padded here, so no call reaches the crate's
//! rayon-parallel batch paths (rill starts no foreign thread pool).

use std::path::Path;

use tokenizers::processors::PostProcessorWrapper;
use tokenizers::tokenizer::PostProcessor;
use tokenizers::{PaddingDirection, TruncationDirection, TruncationParams, TruncationStrategy};

use crate::array::Array;
use crate::dtype::DType;
use crate::error::{Error, Result};

const OP: &str = "tokenizer";

/// A loaded tokenizer with a fixed maximum length.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    source: String,
    max_length: usize,
    pad_id: u32,
    pad_type_id: u32,
    pad_left: bool,
    own_pad: bool,
    lowercase: bool,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer").field("source", &self.source).field("max_length", &self.max_length).finish()
    }
}

/// One batch of encoded sentences, row-major `batch x seq_len`, padded to the longest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Batch {
    /// The number of sentences.
    pub batch: usize,
    /// The padded length (the longest sentence's token count; 0 for an empty batch).
    pub seq_len: usize,
    /// Token ids, padding included.
    pub input_ids: Vec<u32>,
    /// 1 for a real token, 0 for padding.
    pub attention_mask: Vec<u32>,
    /// Segment ids (all 0 for single sentences).
    pub token_type_ids: Vec<u32>,
    /// Each sentence's token count before padding.
    pub lengths: Vec<usize>,
    /// True when the padding is before the tokens.
    pub padded_left: bool,
}

/// A batch as rill arrays of shape `[batch, seq_len]`, all of one integer dtype.
#[derive(Clone, Debug)]
pub struct BatchArrays {
    /// Token ids.
    pub input_ids: Array,
    /// 1 for a real token, 0 for padding.
    pub attention_mask: Array,
    /// Segment ids.
    pub token_type_ids: Array,
}

impl Batch {
    /// The token ids of sentence `i`, padding included.
    pub fn ids(&self, i: usize) -> &[u32] {
        &self.input_ids[i * self.seq_len..(i + 1) * self.seq_len]
    }
    /// The token ids of sentence `i` without padding.
    pub fn unpadded_ids(&self, i: usize) -> &[u32] {
        let row = self.ids(i);
        if self.padded_left { &row[self.seq_len - self.lengths[i]..] } else { &row[..self.lengths[i]] }
    }
    /// The three vectors as `[batch, seq_len]` arrays of `dtype` (i32 or i64), placed as
    /// [`Array::from_slice`] places host data.
    pub fn to_arrays(&self, dtype: DType) -> Result<BatchArrays> {
        let shape = [self.batch, self.seq_len];
        let make = |v: &[u32]| -> Result<Array> {
            match dtype {
                DType::I32 => {
                    let w: Vec<i32> = v
                        .iter()
                        .map(|&x| i32::try_from(x))
                        .collect::<std::result::Result<_, _>>()
                        .map_err(|_| Error::invalid(OP, "a token id does not fit i32"))?;
                    Array::from_slice(&w, &shape)
                }
                DType::I64 => Array::from_slice(&v.iter().map(|&x| x as i64).collect::<Vec<_>>(), &shape),
                _ => Err(Error::dtype(OP, dtype, "token arrays are i32 or i64")),
            }
        };
        Ok(BatchArrays {
            input_ids: make(&self.input_ids)?,
            attention_mask: make(&self.attention_mask)?,
            token_type_ids: make(&self.token_type_ids)?,
        })
    }
}

impl Tokenizer {
    /// Loads a `tokenizer.json`; every encoding is truncated to `max_length` tokens,
    /// special tokens included.
    pub fn from_file(path: impl AsRef<Path>, max_length: usize) -> Result<Tokenizer> {
        let path = path.as_ref();
        let source = path.display().to_string();
        let bytes = std::fs::read(path).map_err(|e| Error::Io {
            op: OP,
            path: source.clone(),
            msg: format!("cannot read: {e}"),
        })?;
        Tokenizer::from_bytes(&bytes, &source, max_length)
    }

    /// Parses the bytes of a `tokenizer.json` (`source` names it in messages).
    pub fn from_bytes(bytes: &[u8], source: &str, max_length: usize) -> Result<Tokenizer> {
        let err = |msg: String| Error::Io { op: OP, path: source.to_string(), msg };
        let mut inner = tokenizers::Tokenizer::from_bytes(bytes).map_err(|e| err(format!("not a tokenizer: {e}")))?;
        let added = inner.get_post_processor().map(|p: &PostProcessorWrapper| p.added_tokens(false)).unwrap_or(0);
        if max_length <= added {
            return Err(err(format!(
                "a maximum length of {max_length} leaves no room beside the {added} special tokens"
            )));
        }
        let (pad_id, pad_type_id, pad_left, own_pad) = match inner.get_padding() {
            Some(p) => (p.pad_id, p.pad_type_id, matches!(p.direction, PaddingDirection::Left), true),
            None => match inner.token_to_id("[PAD]") {
                Some(id) => (id, 0, false, true),
                None => (0, 0, false, false),
            },
        };
        inner.with_padding(None);
        inner
            .with_truncation(Some(TruncationParams {
                direction: TruncationDirection::Right,
                max_length,
                strategy: TruncationStrategy::LongestFirst,
                stride: 0,
            }))
            .map_err(|e| err(format!("cannot set truncation: {e}")))?;
        Ok(Tokenizer {
            inner,
            source: source.to_string(),
            max_length,
            pad_id,
            pad_type_id,
            pad_left,
            own_pad,
            lowercase: false,
        })
    }

    /// Pads with `id` instead of the tokenizer's own padding id (the attention mask marks
    /// padding either way).
    pub fn with_pad_id(mut self, id: u32) -> Tokenizer {
        self.pad_id = id;
        self.own_pad = true;
        self
    }

    /// Lower-cases every sentence before tokenizing (sentence-transformers'
    /// `do_lower_case`).
    pub fn with_lowercase(mut self, on: bool) -> Tokenizer {
        self.lowercase = on;
        self
    }

    /// The maximum number of tokens of one encoding.
    pub fn max_length(&self) -> usize {
        self.max_length
    }
    /// True when the padding id came from the tokenizer (its padding settings or its
    /// `[PAD]` token), false when it is the fallback 0.
    pub fn has_own_pad_id(&self) -> bool {
        self.own_pad
    }
    /// The padding id.
    pub fn pad_id(&self) -> u32 {
        self.pad_id
    }
    /// True when padding goes before the tokens.
    pub fn pads_left(&self) -> bool {
        self.pad_left
    }
    /// The id of a token of the vocabulary.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }
    /// The underlying `tokenizers` tokenizer.
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }

    /// The token ids of one sentence, special tokens included, truncated.
    pub fn encode(&self, sentence: &str) -> Result<Vec<u32>> {
        Ok(self.encode_one(sentence)?.get_ids().to_vec())
    }

    fn encode_one(&self, sentence: &str) -> Result<tokenizers::Encoding> {
        let lowered;
        let s = if self.lowercase {
            lowered = sentence.to_lowercase();
            lowered.as_str()
        } else {
            sentence
        };
        self.inner.encode_fast(s, true).map_err(|e| Error::Io {
            op: OP,
            path: self.source.clone(),
            msg: format!("cannot encode: {e}"),
        })
    }

    /// Encodes `sentences` as one batch padded to the longest.
    pub fn encode_batch<S: AsRef<str>>(&self, sentences: &[S]) -> Result<Batch> {
        let encodings: Vec<tokenizers::Encoding> =
            sentences.iter().map(|s| self.encode_one(s.as_ref())).collect::<Result<_>>()?;
        let seq_len = encodings.iter().map(|e| e.get_ids().len()).max().unwrap_or(0);
        let batch = encodings.len();
        let total = batch * seq_len;
        let (mut input_ids, mut attention_mask, mut token_type_ids) =
            (Vec::with_capacity(total), Vec::with_capacity(total), Vec::with_capacity(total));
        let mut lengths = Vec::with_capacity(batch);
        for e in &encodings {
            let n = e.get_ids().len();
            let pad = seq_len - n;
            lengths.push(n);
            let padding = |v: &mut Vec<u32>, x: u32| v.extend(std::iter::repeat_n(x, pad));
            if self.pad_left {
                padding(&mut input_ids, self.pad_id);
                padding(&mut attention_mask, 0);
                padding(&mut token_type_ids, self.pad_type_id);
            }
            input_ids.extend_from_slice(e.get_ids());
            attention_mask.extend_from_slice(e.get_attention_mask());
            token_type_ids.extend_from_slice(e.get_type_ids());
            if !self.pad_left {
                padding(&mut input_ids, self.pad_id);
                padding(&mut attention_mask, 0);
                padding(&mut token_type_ids, self.pad_type_id);
            }
        }
        Ok(Batch { batch, seq_len, input_ids, attention_mask, token_type_ids, lengths, padded_left: self.pad_left })
    }
}
