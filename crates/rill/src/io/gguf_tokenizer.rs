//! The tokenizer a GGUF file carries in its metadata (`tokenizer.ggml.*`), as a
//! `tokenizers` byte-level BPE tokenizer built from the vocabulary, the merges and the
//! pre-tokenizer the file names, plus a streaming decoder for generated tokens.
//!
//! | metadata | use |
//! |---|---|
//! | `tokenizer.ggml.model` | `gpt2` (byte-level BPE); other models are refused |
//! | `tokenizer.ggml.pre` | the pre-tokenizer: see [`PRE_TOKENIZERS`] |
//! | `tokenizer.ggml.tokens`, `.merges` | vocabulary (id order) and merge list |
//! | `tokenizer.ggml.token_type` | 3 (control) and 4 (user-defined) are matched whole in text |
//! | `tokenizer.ggml.bos_token_id`, `.eos_token_id`, `.add_bos_token` | special ids |
//! | `tokenizer.chat_template` | the chat template, for the caller to render |
//!
//! Control and user-defined tokens are matched in the text before BPE, as Hugging Face
//! tokenizers match added tokens, so a rendered chat prompt's `<|im_start|>` is one id.

use serde_json::{Value as J, json};

use super::gguf::{Gguf, Value};
use crate::error::{Error, Result};

const OP: &str = "gguf::tokenizer";

/// Names of `tokenizer.ggml.pre` this reader knows, and the split each stands for.
pub const PRE_TOKENIZERS: &[(&str, &str)] = &[
    ("default", "GPT-2 byte-level regex"),
    ("gpt2", "GPT-2 byte-level regex"),
    ("smollm", "each digit alone, then the GPT-2 byte-level regex"),
    ("starcoder", "each digit alone, then the GPT-2 byte-level regex"),
    ("refact", "each digit alone, then the GPT-2 byte-level regex"),
    ("llama-bpe", "the Llama 3 regex (numbers in groups of up to 3), then byte-level"),
    ("llama3", "the Llama 3 regex (numbers in groups of up to 3), then byte-level"),
];

const LLAMA3_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// A GGUF file's tokenizer.
pub struct GgufTokenizer {
    inner: tokenizers::Tokenizer,
    /// Each id's bytes (byte-level tokens unmapped; control tokens as their text).
    bytes: Vec<Vec<u8>>,
    control: Vec<bool>,
    bos: Option<u32>,
    eos: Option<u32>,
    add_bos: bool,
    chat_template: Option<String>,
    /// The BOS and EOS tokens' text, for the chat template.
    bos_text: String,
    eos_text: String,
}

/// One message of a chat, as chat templates read it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ChatMessage {
    /// `system`, `user` or `assistant` (templates may know others).
    pub role: String,
    /// The message's text.
    pub content: String,
}

impl ChatMessage {
    /// A message of `role` with `content`.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> ChatMessage {
        ChatMessage { role: role.into(), content: content.into() }
    }
}

impl std::fmt::Debug for GgufTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufTokenizer").field("vocab", &self.bytes.len()).field("eos", &self.eos).finish()
    }
}

fn err(msg: impl Into<String>) -> Error {
    Error::invalid(OP, msg)
}

/// GPT-2's map from bytes to the printable characters byte-level tokens are written in.
fn byte_chars() -> [char; 256] {
    let mut map = ['\0'; 256];
    let mut extra = 0u32;
    for b in 0..256u32 {
        let printable = (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
        map[b as usize] = if printable {
            char::from_u32(b).unwrap_or('\0')
        } else {
            extra += 1;
            char::from_u32(255 + extra).unwrap_or('\0')
        };
    }
    map
}

fn strings<'a>(g: &'a Gguf, key: &str) -> Result<Vec<&'a str>> {
    let v = g.require(key)?;
    let items = v.as_array().ok_or_else(|| err(format!("{key} is not an array")))?;
    items.iter().map(|s| s.as_str().ok_or_else(|| err(format!("{key} holds a non-string")))).collect()
}

fn id(g: &Gguf, key: &str, vocab: usize) -> Result<Option<u32>> {
    match g.value(key) {
        None => Ok(None),
        Some(v) => match v.as_u64() {
            Some(i) if (i as usize) < vocab => Ok(Some(i as u32)),
            _ => Err(err(format!("{key} is {v:?}, not an id below the vocabulary size {vocab}"))),
        },
    }
}

impl GgufTokenizer {
    /// Builds the tokenizer from a GGUF file's metadata.
    pub fn from_gguf(g: &Gguf) -> Result<GgufTokenizer> {
        let model = g.require_str("tokenizer.ggml.model")?;
        if model != "gpt2" {
            return Err(err(format!(
                "tokenizer model {model:?}: rill reads byte-level BPE (\"gpt2\") tokenizers from GGUF files"
            )));
        }
        let pre = g.value("tokenizer.ggml.pre").and_then(Value::as_str).unwrap_or("default");
        let pre_tokenizer = match pre {
            "default" | "gpt2" => {
                json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true})
            }
            "smollm" | "starcoder" | "refact" => json!({"type": "Sequence", "pretokenizers": [
                {"type": "Digits", "individual_digits": true},
                {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
            ]}),
            "llama-bpe" | "llama3" => json!({"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": LLAMA3_REGEX}, "behavior": "Isolated", "invert": false},
                {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false},
            ]}),
            other => {
                let known: Vec<&str> = PRE_TOKENIZERS.iter().map(|p| p.0).collect();
                return Err(err(format!("pre-tokenizer {other:?}; rill knows {known:?}")));
            }
        };
        let tokens = strings(g, "tokenizer.ggml.tokens")?;
        let merges = strings(g, "tokenizer.ggml.merges")?;
        let n = tokens.len();
        let types: Vec<i64> = match g.value("tokenizer.ggml.token_type") {
            None => vec![1; n],
            Some(v) => {
                let items = v.as_array().ok_or_else(|| err("tokenizer.ggml.token_type is not an array"))?;
                if items.len() != n {
                    return Err(err(format!("{} token types for {n} tokens", items.len())));
                }
                items
                    .iter()
                    .map(|t| t.as_f64().map(|x| x as i64).ok_or_else(|| err("a token type is not a number")))
                    .collect::<Result<_>>()?
            }
        };
        let mut vocab = serde_json::Map::with_capacity(n);
        let mut added = Vec::new();
        for (i, (t, &ty)) in tokens.iter().zip(&types).enumerate() {
            if vocab.insert(t.to_string(), J::from(i)).is_some() {
                return Err(err(format!("token {t:?} appears twice in the vocabulary")));
            }
            if ty == 3 || ty == 4 {
                added.push(json!({"id": i, "content": t, "single_word": false, "lstrip": false, "rstrip": false,
                                  "normalized": false, "special": ty == 3}));
            }
        }
        let spec = json!({
            "version": "1.0",
            "truncation": null,
            "padding": null,
            "added_tokens": added,
            "normalizer": null,
            "pre_tokenizer": pre_tokenizer,
            "post_processor": null,
            "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
            "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                      "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                      "ignore_merges": pre.starts_with("llama"), "vocab": vocab, "merges": merges},
        });
        let text = serde_json::to_vec(&spec).map_err(|e| err(e.to_string()))?;
        let inner =
            tokenizers::Tokenizer::from_bytes(&text).map_err(|e| err(format!("cannot build the tokenizer: {e}")))?;

        let chars = byte_chars();
        let mut unmap = std::collections::HashMap::with_capacity(256);
        for (b, c) in chars.iter().enumerate() {
            unmap.insert(*c, b as u8);
        }
        let control: Vec<bool> = types.iter().map(|&t| t == 3).collect();
        let bytes = tokens
            .iter()
            .zip(&types)
            .map(|(t, &ty)| {
                if ty == 3 || ty == 4 {
                    t.as_bytes().to_vec()
                } else {
                    // A character outside the byte map stands for itself (as UTF-8).
                    let mut v = Vec::with_capacity(t.len());
                    for c in t.chars() {
                        match unmap.get(&c) {
                            Some(&b) => v.push(b),
                            None => v.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
                        }
                    }
                    v
                }
            })
            .collect();
        let bos = id(g, "tokenizer.ggml.bos_token_id", n)?;
        let eos = id(g, "tokenizer.ggml.eos_token_id", n)?;
        let text_of = |i: Option<u32>| i.map(|i| tokens[i as usize].to_string()).unwrap_or_default();
        Ok(GgufTokenizer {
            inner,
            bytes,
            control,
            bos,
            eos,
            bos_text: text_of(bos),
            eos_text: text_of(eos),
            add_bos: g.value("tokenizer.ggml.add_bos_token").and_then(Value::as_bool).unwrap_or(false),
            chat_template: g.value("tokenizer.chat_template").and_then(Value::as_str).map(str::to_string),
        })
    }

    /// The number of ids.
    pub fn vocab_size(&self) -> usize {
        self.bytes.len()
    }
    /// The beginning-of-sequence id, if the file names one.
    pub fn bos_id(&self) -> Option<u32> {
        self.bos
    }
    /// The end-of-sequence id, if the file names one.
    pub fn eos_id(&self) -> Option<u32> {
        self.eos
    }
    /// The chat template, if the file has one.
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }
    /// Renders `messages` through the file's chat template, as Hugging Face renders chat
    /// templates (blocks trimmed and left-stripped; `bos_token`, `eos_token`,
    /// `add_generation_prompt` and `raise_exception` defined; Python string methods).
    /// With `add_generation_prompt` the prompt ends where the assistant's answer begins.
    pub fn apply_chat_template(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String> {
        let Some(src) = &self.chat_template else {
            return Err(err("the file has no chat template (tokenizer.chat_template)"));
        };
        let mut env = minijinja::Environment::new();
        let syntax = minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|e| err(format!("chat template syntax: {e}")))?;
        env.set_syntax(syntax);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", |msg: String| -> std::result::Result<String, minijinja::Error> {
            Err(minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, msg))
        });
        let ctx = minijinja::context! {
            messages => messages
                .iter()
                .map(|m| minijinja::Value::from_pairs([("role", m.role.as_str()), ("content", m.content.as_str())]))
                .collect::<Vec<_>>(),
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_text.as_str(),
            eos_token => self.eos_text.as_str(),
        };
        env.render_str(src, ctx).map_err(|e| err(format!("chat template: {e:#}")))
    }

    /// True for a control token (BOS, EOS, chat markers).
    pub fn is_control(&self, id: u32) -> bool {
        self.control.get(id as usize).copied().unwrap_or(false)
    }

    /// Token ids of `text`; control and user-defined tokens written in the text are
    /// single ids. With `add_bos`, the BOS id goes first when the file asks for it.
    pub fn encode(&self, text: &str, add_bos: bool) -> Result<Vec<u32>> {
        let enc = self.inner.encode(text, false).map_err(|e| err(format!("cannot encode: {e}")))?;
        let mut ids = Vec::with_capacity(enc.len() + 1);
        if add_bos && self.add_bos {
            ids.extend(self.bos);
        }
        ids.extend_from_slice(enc.get_ids());
        Ok(ids)
    }

    /// The bytes of one id (byte-level tokens may hold part of a UTF-8 character).
    pub fn token_bytes(&self, id: u32) -> Result<&[u8]> {
        self.bytes
            .get(id as usize)
            .map(Vec::as_slice)
            .ok_or_else(|| err(format!("id {id} is not below the vocabulary size {}", self.bytes.len())))
    }

    /// The text of `ids` (invalid UTF-8 replaced); control tokens left out when `skip_control`.
    pub fn decode(&self, ids: &[u32], skip_control: bool) -> Result<String> {
        let mut out = Vec::new();
        for &i in ids {
            if !(skip_control && self.is_control(i)) {
                out.extend_from_slice(self.token_bytes(i)?);
            }
        }
        Ok(String::from_utf8_lossy(&out).into_owned())
    }
}

/// Turns generated ids into text as they come: bytes of a character split across tokens
/// are held until the character is whole.
#[derive(Debug, Default)]
pub struct StreamDecoder {
    pending: Vec<u8>,
}

impl StreamDecoder {
    /// A decoder with nothing pending.
    pub fn new() -> StreamDecoder {
        StreamDecoder::default()
    }

    /// The text that `id` completes (possibly empty); control tokens give nothing when
    /// `skip_control`.
    pub fn push(&mut self, tok: &GgufTokenizer, id: u32, skip_control: bool) -> Result<String> {
        if skip_control && tok.is_control(id) {
            return Ok(String::new());
        }
        self.pending.extend_from_slice(tok.token_bytes(id)?);
        let mut out = String::new();
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(s) => {
                    out.push_str(s);
                    self.pending.clear();
                    return Ok(out);
                }
                Err(e) => {
                    let good = e.valid_up_to();
                    // The prefix is valid UTF-8 by `valid_up_to`.
                    out.push_str(std::str::from_utf8(&self.pending[..good]).unwrap_or_default());
                    match e.error_len() {
                        // Invalid bytes, not a cut character: replace them and go on.
                        Some(bad) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            self.pending.drain(..good + bad);
                        }
                        // A character cut at the end: keep its bytes for the next id.
                        None => {
                            self.pending.drain(..good);
                            return Ok(out);
                        }
                    }
                }
            }
        }
    }

    /// Whatever is still pending, with an incomplete character replaced.
    pub fn finish(&mut self) -> String {
        let s = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        s
    }
}
