//! A BERT-family encoder from rill ops, and sentence embeddings on top of it.
//!
//! [`Bert`] is the encoder of a Hugging Face `BertModel`: word, position and token type
//! embeddings summed and layer-normalised, then `num_hidden_layers` layers of
//! self-attention (the padding masked with an additive `[B, 1, 1, T]` mask) and a
//! feed-forward block (`hidden_act`), each followed by a residual add and a layer norm
//! (post-norm, as in BERT). Every size comes from `config.json`; the weights are read
//! from `model.safetensors` with or without a prefix (`bert.`), converted to the
//! requested dtype (f32, f16 or bf16) on the chosen stream.
//!
//! [`Embedder`] is a sentence-transformers model: the tokenizer, the encoder, the pooling
//! of `1_Pooling/config.json` (mean when the directory has none) computed in f32, and L2
//! normalisation when `modules.json` lists a `Normalize` module. A module it does not
//! know (a `Dense` projection, say) is an error, not a silently different embedding.
//!
//! **Batching.** [`Embedder::embed`] tokenizes every sentence, sorts them by token
//! count (longest first) so each batch holds sentences of similar lengths, and pads each
//! batch to a *bucket*: the batch size rounded up to a power of two (at most the
//! configured batch size) and the length rounded up to a multiple of 16 (of 32 past 128,
//! at most the model's maximum). The forward pass is one [`compile`]d function whose cache
//! holds a trace per bucket, so a long-running process traces a bounded number of shapes
//! whatever lengths it sees. Padded positions are masked out of the attention and the
//! pooling, and padded rows are dropped; results come back in input order. Up to two
//! batches are in flight at once, so the host prepares the next batch while the device
//! computes.
//!
//! **Sharing.** An `Embedder` is `Send + Sync` and `embed` takes `&self`: threads and
//! tasks share one set of weights and one compiled function. The weights are captured
//! constants of the compiled function (evaluated arrays: every replay reads the same
//! buffers). All work runs on the stream the embedder was loaded on; embedding creates
//! no stream and no thread.

use std::collections::VecDeque;
use std::path::Path;

use half::{bf16, f16};
use serde_json::Value;

use crate::array::Array;
use crate::compile::{Compiled, compile};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::io::ModelDir;
use crate::io::config::{Activation, BertConfig, PoolingMode};
use crate::io::safetensors::Tensors;
use crate::io::tokenizer::Tokenizer;
use crate::runtime::device::Device;
use crate::runtime::stream::Stream;
use crate::sync::Arc;

const OP: &str = "bert";

/// Batches evaluated ahead of the one being read back.
const IN_FLIGHT: usize = 2;

/// Inputs of at least this many sentences are tokenized in parallel (see `prepare`).
const PARALLEL_TOKENIZE: usize = 8;

fn io_err(path: &Path, msg: impl Into<String>) -> Error {
    Error::Io { op: OP, path: path.display().to_string(), msg: msg.into() }
}

/// One encoder layer's weights; linear weights are stored `[in, out]` (transposed from
/// the file's `[out, in]`) so products read them contiguously.
struct Layer {
    /// Query, key and value projections side by side: `[H, 3H]` and `[3H]`.
    qkv_w: Array,
    qkv_b: Array,
    attn_out_w: Array,
    attn_out_b: Array,
    attn_ln_w: Array,
    attn_ln_b: Array,
    ff_in_w: Array,
    ff_in_b: Array,
    ff_out_w: Array,
    ff_out_b: Array,
    ff_ln_w: Array,
    ff_ln_b: Array,
}

struct Weights {
    word: Array,
    position: Array,
    token_type: Array,
    ln_w: Array,
    ln_b: Array,
    layers: Vec<Layer>,
}

/// A BERT-family encoder: weights on one stream in one dtype (see the module docs).
pub struct Bert {
    config: BertConfig,
    dtype: DType,
    stream: Stream,
    weights: Weights,
}

impl std::fmt::Debug for Bert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bert")
            .field("layers", &self.config.num_hidden_layers)
            .field("hidden_size", &self.config.hidden_size)
            .field("dtype", &self.dtype)
            .field("device", &self.stream.device())
            .finish()
    }
}

/// Reads tensors by their `BertModel` names, whatever prefix the file puts before them.
struct Reader<'a> {
    tensors: &'a Tensors,
    path: &'a Path,
    prefix: String,
    stream: &'a Stream,
    dtype: DType,
}

impl Reader<'_> {
    /// The tensor `name` (first of the alternatives that exists), checked against
    /// `shape`, converted to the model dtype.
    fn get(&self, names: &[&str], shape: &[usize]) -> Result<Array> {
        let full: Vec<String> = names.iter().map(|n| format!("{}{n}", self.prefix)).collect();
        let Some(name) = full.iter().find(|n| self.tensors.contains(n)) else {
            return Err(io_err(self.path, format!("missing tensor {:?}", full[0])));
        };
        let info = self.tensors.info(name).ok_or_else(|| io_err(self.path, format!("missing tensor {name:?}")))?;
        if info.shape() != shape {
            return Err(io_err(
                self.path,
                format!("tensor {name:?} has shape {:?}, the config implies {shape:?}", info.shape()),
            ));
        }
        match info.dtype() {
            Some(DType::F16 | DType::BF16 | DType::F32 | DType::F64) => {}
            _ => {
                return Err(io_err(
                    self.path,
                    format!("tensor {name:?} has dtype {}, not a float dtype", info.file_dtype()),
                ));
            }
        }
        self.tensors.get_on(name, self.stream)?.astype(self.dtype)
    }
    /// A layer norm's weight and bias (`weight`/`bias`, or the older `gamma`/`beta`).
    fn norm(&self, base: &str, h: usize) -> Result<(Array, Array)> {
        let w = self.get(&[&format!("{base}.weight"), &format!("{base}.gamma")], &[h])?;
        let b = self.get(&[&format!("{base}.bias"), &format!("{base}.beta")], &[h])?;
        Ok((w, b))
    }
    /// A linear layer `[out, in]` as `[in, out]` (contiguous) and its bias.
    fn linear(&self, base: &str, inp: usize, out: usize) -> Result<(Array, Array)> {
        let w = self.get(&[&format!("{base}.weight")], &[out, inp])?.t()?.contiguous()?;
        let b = self.get(&[&format!("{base}.bias")], &[out])?;
        Ok((w, b))
    }
}

/// The prefix before `embeddings.word_embeddings.weight` in the file (`""`, `"bert."`).
fn find_prefix(tensors: &Tensors, path: &Path) -> Result<String> {
    const WORD: &str = "embeddings.word_embeddings.weight";
    if tensors.contains(WORD) {
        return Ok(String::new());
    }
    let mut found: Vec<&str> = tensors
        .names()
        .into_iter()
        .filter_map(|n| n.strip_suffix(WORD))
        .filter(|p| p.is_empty() || p.ends_with('.'))
        .collect();
    found.sort_unstable();
    match found.as_slice() {
        [p] => Ok(p.to_string()),
        [] => Err(io_err(path, format!("missing tensor {WORD:?} (with or without a prefix such as \"bert.\")"))),
        several => Err(io_err(path, format!("several encoders in one file (prefixes {several:?})"))),
    }
}

/// The model dtypes: f32, f16 and bf16.
fn check_dtype(dtype: DType) -> Result<()> {
    match dtype {
        DType::F32 | DType::F16 | DType::BF16 => Ok(()),
        DType::Bool | DType::U8 | DType::U32 | DType::I32 | DType::I64 | DType::F64 => {
            Err(Error::dtype(OP, dtype, "a model runs in f32, f16 or bf16"))
        }
    }
}

/// A large finite value of `dtype` whose negation masks a position: half the largest,
/// so adding an attention score to it cannot overflow to -inf (a row of padding stays
/// finite).
fn mask_magnitude(dtype: DType) -> f64 {
    let max = match dtype {
        DType::F16 => f16::MAX.to_f64(),
        DType::BF16 => bf16::MAX.to_f64(),
        _ => f32::MAX as f64,
    };
    max * 0.5
}

impl Bert {
    /// Loads the encoder of `dir` onto `stream` in `dtype` (f32, f16 or bf16); every
    /// weight is converted and evaluated before this returns.
    pub fn load(dir: &ModelDir, stream: &Stream, dtype: DType) -> Result<Bert> {
        check_dtype(dtype)?;
        let path = dir.weights_path();
        let tensors = dir.weights()?;
        Bert::from_tensors(dir.config.clone(), &tensors, &path, stream, dtype)
    }

    /// Builds the encoder from loaded tensors (`path` names the file in errors).
    pub fn from_tensors(
        config: BertConfig,
        tensors: &Tensors,
        path: &Path,
        stream: &Stream,
        dtype: DType,
    ) -> Result<Bert> {
        check_dtype(dtype)?;
        let c = &config;
        let h = c.hidden_size;
        let r = Reader { tensors, path, prefix: find_prefix(tensors, path)?, stream, dtype };
        let word = r.get(&["embeddings.word_embeddings.weight"], &[c.vocab_size, h])?;
        let position = r.get(&["embeddings.position_embeddings.weight"], &[c.max_position_embeddings, h])?;
        let token_type = r.get(&["embeddings.token_type_embeddings.weight"], &[c.type_vocab_size, h])?;
        let (ln_w, ln_b) = r.norm("embeddings.LayerNorm", h)?;
        let mut layers = Vec::with_capacity(c.num_hidden_layers);
        let mut all = vec![word.clone(), position.clone(), token_type.clone(), ln_w.clone(), ln_b.clone()];
        for i in 0..c.num_hidden_layers {
            let base = format!("encoder.layer.{i}");
            let (qw, qb) = r.linear(&format!("{base}.attention.self.query"), h, h)?;
            let (kw, kb) = r.linear(&format!("{base}.attention.self.key"), h, h)?;
            let (vw, vb) = r.linear(&format!("{base}.attention.self.value"), h, h)?;
            let qkv_w = crate::concatenate(&[&qw, &kw, &vw], 1)?;
            let qkv_b = crate::concatenate(&[&qb, &kb, &vb], 0)?;
            let (attn_out_w, attn_out_b) = r.linear(&format!("{base}.attention.output.dense"), h, h)?;
            let (attn_ln_w, attn_ln_b) = r.norm(&format!("{base}.attention.output.LayerNorm"), h)?;
            let (ff_in_w, ff_in_b) = r.linear(&format!("{base}.intermediate.dense"), h, c.intermediate_size)?;
            let (ff_out_w, ff_out_b) = r.linear(&format!("{base}.output.dense"), c.intermediate_size, h)?;
            let (ff_ln_w, ff_ln_b) = r.norm(&format!("{base}.output.LayerNorm"), h)?;
            let layer = Layer {
                qkv_w,
                qkv_b,
                attn_out_w,
                attn_out_b,
                attn_ln_w,
                attn_ln_b,
                ff_in_w,
                ff_in_b,
                ff_out_w,
                ff_out_b,
                ff_ln_w,
                ff_ln_b,
            };
            all.extend(
                [
                    &layer.qkv_w,
                    &layer.qkv_b,
                    &layer.attn_out_w,
                    &layer.attn_out_b,
                    &layer.attn_ln_w,
                    &layer.attn_ln_b,
                    &layer.ff_in_w,
                    &layer.ff_in_b,
                    &layer.ff_out_w,
                    &layer.ff_out_b,
                    &layer.ff_ln_w,
                    &layer.ff_ln_b,
                ]
                .map(Array::clone),
            );
            layers.push(layer);
        }
        // Every conversion and transpose at once; the file's host copies are freed after.
        crate::eval(&all)?;
        let weights = Weights { word, position, token_type, ln_w, ln_b, layers };
        Ok(Bert { config, dtype, stream: stream.clone(), weights })
    }

    /// The architecture.
    pub fn config(&self) -> &BertConfig {
        &self.config
    }
    /// The dtype the weights and activations are in.
    pub fn dtype(&self) -> DType {
        self.dtype
    }
    /// The stream the weights live on.
    pub fn stream(&self) -> &Stream {
        &self.stream
    }

    /// The last hidden states `[B, T, H]` (in the model dtype) of token ids, attention
    /// mask and token type ids, each `[B, T]` of an integer dtype. Lazy, like any op.
    pub fn forward(&self, input_ids: &Array, attention_mask: &Array, token_type_ids: &Array) -> Result<Array> {
        let c = &self.config;
        let w = &self.weights;
        let shape = input_ids.shape().to_vec();
        let [b, t] = shape[..] else {
            return Err(Error::shape(OP, format!("token ids must be [batch, length], got {shape:?}")));
        };
        for (what, a) in [("attention mask", attention_mask), ("token type ids", token_type_ids)] {
            if a.shape() != shape.as_slice() {
                return Err(Error::shape(OP, format!("the {what} is {:?}, the token ids {shape:?}", a.shape())));
            }
        }
        if t > c.max_position_embeddings {
            return Err(Error::shape(
                OP,
                format!("{t} tokens but the model has {} positions", c.max_position_embeddings),
            ));
        }
        let (hs, nh, hd) = (c.hidden_size, c.num_attention_heads, c.head_dim());
        let (bi, ti, hi) = (b as isize, t as isize, hs as isize);
        let dt = self.dtype;

        let positions = w.position.slice_axis(0, Some(0), Some(ti), 1)?;
        let x = w.word.take(input_ids, 0)?.add(&positions)?.add(&w.token_type.take(token_type_ids, 0)?)?;
        let mut x = x.layer_norm(Some(&w.ln_w), Some(&w.ln_b), c.layer_norm_eps)?.reshape(&[bi * ti, hi])?;

        // 0 where a key is a token, a large negative value where it is padding.
        let mask = attention_mask.astype(dt)?.sub(1.0)?.mul(mask_magnitude(dt))?.reshape(&[bi, 1, 1, ti])?;
        let scale = 1.0 / (hd as f64).sqrt();
        for l in &w.layers {
            let qkv = x.matmul(&l.qkv_w)?.add(&l.qkv_b)?;
            // [B*T, 3H] -> [3, B, heads, T, head_dim]
            let qkv = qkv.reshape(&[bi, ti, 3, nh as isize, hd as isize])?.transpose(&[2, 0, 3, 1, 4])?;
            let (q, k, v) = (qkv.index(0, 0)?, qkv.index(0, 1)?, qkv.index(0, 2)?);
            let ctx = attention(&q, &k, &v, &mask, scale)?;
            let ctx = ctx.transpose(&[0, 2, 1, 3])?.reshape(&[bi * ti, hi])?;
            let a = ctx.matmul(&l.attn_out_w)?.add(&l.attn_out_b)?.add(&x)?;
            let a = a.layer_norm(Some(&l.attn_ln_w), Some(&l.attn_ln_b), c.layer_norm_eps)?;
            let f = activation(&a.matmul(&l.ff_in_w)?.add(&l.ff_in_b)?, c.hidden_act)?;
            let f = f.matmul(&l.ff_out_w)?.add(&l.ff_out_b)?.add(&a)?;
            x = f.layer_norm(Some(&l.ff_ln_w), Some(&l.ff_ln_b), c.layer_norm_eps)?;
        }
        x.reshape(&[bi, ti, hi])
    }
}

/// `softmax(q @ kᵀ * scale + mask) @ v` over `[B, heads, T, head_dim]` operands with an
/// additive mask broadcast to `[B, heads, T, T]`.
fn attention(q: &Array, k: &Array, v: &Array, mask_additive: &Array, scale: f64) -> Result<Array> {
    let scores = q.matmul(&k.swapaxes(-1, -2)?)?.mul(scale)?.add(mask_additive)?;
    scores.softmax(-1)?.matmul(v)
}

fn activation(x: &Array, act: Activation) -> Result<Array> {
    match act {
        Activation::Gelu => x.gelu(),
        Activation::GeluTanh => x.gelu_tanh(),
        Activation::Relu => x.relu(),
        Activation::Silu => x.silu(),
    }
}

/// Pools hidden states `[B, T, H]` (f32) over the tokens the mask `[B, T]` (f32, 1 or 0)
/// marks, as sentence-transformers' `Pooling` module does.
fn pool(hidden: &Array, mask: &Array, mode: PoolingMode) -> Result<Array> {
    let m = mask.expand_dims(-1)?;
    let count = || -> Result<Array> { mask.sum(&[1], true)?.maximum(1e-9) };
    match mode {
        PoolingMode::Cls => hidden.index(1, 0),
        PoolingMode::Mean => hidden.mul(&m)?.sum(&[1], false)?.div(&count()?),
        PoolingMode::MeanSqrtLen => hidden.mul(&m)?.sum(&[1], false)?.div(&count()?.sqrt()?),
        PoolingMode::Max => crate::where_(&m.gt(0.0)?, hidden, -1e9)?.max(&[1], false),
        PoolingMode::WeightedMean => {
            let t = hidden.shape()[1];
            let pos = Array::arange(1.0, (t + 1) as f64, 1.0, DType::F32)?;
            let wm = mask.mul(&pos)?;
            let sum = hidden.mul(&wm.expand_dims(-1)?)?.sum(&[1], false)?;
            sum.div(&wm.sum(&[1], true)?.maximum(1e-9)?)
        }
        PoolingMode::LastToken => {
            // The last marked position, whichever side the padding is on.
            let t = hidden.shape()[1];
            let pos = Array::arange(0.0, t as f64, 1.0, DType::F32)?;
            let last = mask.mul(&pos)?.max(&[1], true)?;
            let one_hot = pos.eq(&last)?.astype(DType::F32)?.expand_dims(-1)?;
            hidden.mul(&one_hot)?.sum(&[1], false)
        }
    }
}

/// `x / max(‖x‖, 1e-12)` over the last axis (torch's `F.normalize`).
fn l2_normalize(x: &Array) -> Result<Array> {
    x.div(&x.square()?.sum(&[-1], true)?.sqrt()?.maximum(1e-12)?)
}

/// What `modules.json` says about the pipeline after the encoder: whether it ends in a
/// `Normalize` module. No file: the encoder and the pooling only.
fn read_modules(dir: &Path) -> Result<bool> {
    let path = dir.join("modules.json");
    if !path.is_file() {
        return Ok(false);
    }
    let text = std::fs::read_to_string(&path).map_err(|e| io_err(&path, format!("cannot read: {e}")))?;
    let v: Value = serde_json::from_str(&text).map_err(|e| io_err(&path, format!("not valid JSON: {e}")))?;
    let Value::Array(mods) = v else {
        return Err(io_err(&path, "the top level is not a JSON list"));
    };
    let mut normalize = false;
    for m in &mods {
        let ty = m
            .get("type")
            .and_then(Value::as_str)
            .ok_or_else(|| io_err(&path, format!("a module without a \"type\": {m}")))?;
        let short = ty.rsplit('.').next().unwrap_or(ty);
        match short {
            "Transformer" | "Pooling" => {}
            "Normalize" => normalize = true,
            _ => {
                return Err(io_err(
                    &path,
                    format!("module type {ty:?} is not supported (Transformer, Pooling and Normalize are)"),
                ));
            }
        }
    }
    Ok(normalize)
}

/// The model behind an [`Embedder`], shared with its compiled function.
struct Model {
    bert: Bert,
    pooling: PoolingMode,
    normalize: bool,
}

impl Model {
    /// Normalised (when the model says so) f32 sentence vectors `[B, H]`.
    fn embed_arrays(&self, x: &[Array]) -> Result<Vec<Array>> {
        let [ids, mask, types] = x else {
            return Err(Error::invalid(OP, "the forward pass takes token ids, attention mask and token type ids"));
        };
        let hidden = self.bert.forward(ids, mask, types)?.to_dtype(DType::F32)?;
        let pooled = pool(&hidden, &mask.astype(DType::F32)?, self.pooling)?;
        Ok(vec![if self.normalize { l2_normalize(&pooled)? } else { pooled }])
    }
}

/// One sentence's tokens, unpadded.
struct Encoded {
    ids: Vec<u32>,
    types: Vec<u32>,
}

/// The padded length for a batch whose longest sentence has `n` tokens: a multiple of
/// 16 (of 32 past 128), at most `max`.
fn length_bucket(n: usize, max: usize) -> usize {
    let step = if n > 128 { 32 } else { 16 };
    n.max(1).div_ceil(step).saturating_mul(step).min(max.max(n))
}

/// The padded batch size for `n` sentences: the next power of two, at most `cap`.
fn batch_bucket(n: usize, cap: usize) -> usize {
    n.next_power_of_two().min(cap.max(n))
}

/// Sentence embeddings from a sentence-transformers model directory (see the module
/// docs). `Send + Sync`: share one with `Arc` across threads and tasks.
pub struct Embedder {
    model: Arc<Model>,
    tokenizer: Tokenizer,
    forward: Compiled,
    batch_size: usize,
    max_length: usize,
}

impl std::fmt::Debug for Embedder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Embedder")
            .field("bert", &self.model.bert)
            .field("pooling", &self.model.pooling)
            .field("normalize", &self.model.normalize)
            .field("batch_size", &self.batch_size)
            .finish()
    }
}

impl Embedder {
    /// The default batch size.
    pub const DEFAULT_BATCH_SIZE: usize = 32;

    /// Loads the model in `dir` onto `device`'s default stream, in `dtype` (f32, f16 or
    /// bf16).
    pub fn load(dir: impl AsRef<Path>, device: Device, dtype: DType) -> Result<Embedder> {
        Embedder::load_on(dir, &device.default_stream()?, dtype)
    }

    /// Loads the model in `dir` onto `stream`; every embedding runs there.
    pub fn load_on(dir: impl AsRef<Path>, stream: &Stream, dtype: DType) -> Result<Embedder> {
        check_dtype(dtype)?;
        let md = ModelDir::open(dir.as_ref())?;
        let normalize = read_modules(md.path())?;
        let tokenizer = md.tokenizer()?;
        let bert = Bert::load(&md, stream, dtype)?;
        let pooling = md.pooling.map_or(PoolingMode::Mean, |p| p.mode);
        let model = Arc::new(Model { bert, pooling, normalize });
        let m = model.clone();
        let forward = compile(move |x: &[Array]| m.embed_arrays(x));
        Ok(Embedder {
            model,
            tokenizer,
            forward,
            batch_size: Embedder::DEFAULT_BATCH_SIZE,
            max_length: md.max_length(),
        })
    }

    /// The same embedder with at most `n` sentences per batch (`n >= 1`).
    pub fn with_batch_size(mut self, n: usize) -> Result<Embedder> {
        if n == 0 {
            return Err(Error::invalid(OP, "the batch size must be at least 1"));
        }
        self.batch_size = n;
        Ok(self)
    }

    /// Sentences per batch.
    pub fn batch_size(&self) -> usize {
        self.batch_size
    }
    /// The length of an embedding.
    pub fn dimension(&self) -> usize {
        self.model.bert.config.hidden_size
    }
    /// The longest input in tokens (longer sentences are truncated).
    pub fn max_length(&self) -> usize {
        self.max_length
    }
    /// The encoder.
    pub fn bert(&self) -> &Bert {
        &self.model.bert
    }
    /// The pooling mode.
    pub fn pooling(&self) -> PoolingMode {
        self.model.pooling
    }
    /// True when embeddings are L2-normalised.
    pub fn normalizes(&self) -> bool {
        self.model.normalize
    }
    /// The tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }
    /// The number of batch shapes traced so far (each a bucket; see the module docs).
    pub fn traced_shapes(&self) -> usize {
        self.forward.cache_len()
    }

    /// The token ids the model sees for `sentence` (stripped of surrounding whitespace,
    /// as sentence-transformers does; special tokens included; truncated).
    pub fn token_ids(&self, sentence: &str) -> Result<Vec<u32>> {
        self.tokenizer.encode(sentence.trim())
    }

    /// One embedding per sentence, in input order.
    pub fn embed<S: AsRef<str> + Sync>(&self, sentences: &[S]) -> Result<Vec<Vec<f32>>> {
        self.embed_with(sentences, |_| {})
    }

    /// [`Embedder::embed`], calling `progress(done)` with the number of sentences
    /// embedded so far after each batch.
    pub fn embed_with<S: AsRef<str> + Sync>(
        &self,
        sentences: &[S],
        mut progress: impl FnMut(usize),
    ) -> Result<Vec<Vec<f32>>> {
        let (enc, order) = self.prepare(sentences)?;
        let mut out: Vec<Vec<f32>> = vec![Vec::new(); sentences.len()];
        let mut pending: VecDeque<(&[usize], Array)> = VecDeque::new();
        let mut done = 0;
        for chunk in order.chunks(self.batch_size) {
            let y = self.batch(&enc, chunk)?;
            crate::submit(std::slice::from_ref(&y))?;
            pending.push_back((chunk, y));
            if pending.len() > IN_FLIGHT {
                let (c, y) = pending.pop_front().expect("pending is not empty");
                done += self.scatter(c, &y, &mut out)?;
                progress(done);
            }
        }
        while let Some((c, y)) = pending.pop_front() {
            done += self.scatter(c, &y, &mut out)?;
            progress(done);
        }
        Ok(out)
    }

    /// [`Embedder::embed`] for async code: waits for each batch without blocking the
    /// executor thread.
    pub async fn embed_async<S: AsRef<str> + Sync>(&self, sentences: &[S]) -> Result<Vec<Vec<f32>>> {
        let (enc, order) = self.prepare(sentences)?;
        let mut out: Vec<Vec<f32>> = vec![Vec::new(); sentences.len()];
        for chunk in order.chunks(self.batch_size) {
            let y = self.batch(&enc, chunk)?;
            crate::async_eval(std::slice::from_ref(&y)).await?;
            self.scatter(chunk, &y, &mut out)?;
        }
        Ok(out)
    }

    /// Tokenizes every sentence and orders them longest first (ties in input order).
    /// Large inputs are tokenized in parallel on the runtime's CPU pool (the pool's own
    /// threads; none is started for it), since a batch's tokenization on one thread takes
    /// longer than its forward pass on a GPU.
    fn prepare<S: AsRef<str> + Sync>(&self, sentences: &[S]) -> Result<(Vec<Encoded>, Vec<usize>)> {
        let encode = |i: usize| -> Result<Encoded> {
            let b = self.tokenizer.encode_batch(&[sentences[i].as_ref().trim()])?;
            let n = b.lengths[0];
            let (ids, types) = if b.padded_left {
                (b.input_ids[b.seq_len - n..].to_vec(), b.token_type_ids[b.seq_len - n..].to_vec())
            } else {
                (b.input_ids[..n].to_vec(), b.token_type_ids[..n].to_vec())
            };
            Ok(Encoded { ids, types })
        };
        let n = sentences.len();
        let enc: Vec<Encoded> = if n >= PARALLEL_TOKENIZE {
            crate::runtime::pool::install(|| crate::backend::cpu::par::map(n, encode))
                .into_iter()
                .collect::<Result<_>>()?
        } else {
            (0..n).map(encode).collect::<Result<_>>()?
        };
        let mut order: Vec<usize> = (0..enc.len()).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(enc[i].ids.len()));
        Ok((enc, order))
    }

    /// The lazy embeddings `[bucket, H]` of the sentences `rows` (padded to a bucket).
    fn batch(&self, enc: &[Encoded], rows: &[usize]) -> Result<Array> {
        let longest = rows.iter().map(|&i| enc[i].ids.len()).max().unwrap_or(0);
        let t = length_bucket(longest, self.max_length);
        let b = batch_bucket(rows.len(), self.batch_size);
        let pad_id = self.tokenizer.pad_id() as i32;
        let left = self.tokenizer.pads_left();
        let (mut ids, mut mask, mut types) = (vec![pad_id; b * t], vec![0i32; b * t], vec![0i32; b * t]);
        for (r, &i) in rows.iter().enumerate() {
            let e = &enc[i];
            let n = e.ids.len();
            let start = r * t + if left { t - n } else { 0 };
            for j in 0..n {
                ids[start + j] = e.ids[j] as i32;
                mask[start + j] = 1;
                types[start + j] = e.types[j] as i32;
            }
        }
        let stream = &self.model.bert.stream;
        crate::with_stream(stream, || {
            let inputs =
                [Array::from_vec(ids, &[b, t])?, Array::from_vec(mask, &[b, t])?, Array::from_vec(types, &[b, t])?];
            let mut y = self.forward.call(&inputs)?;
            Ok(y.remove(0))
        })
    }

    /// Copies the rows of `y` that hold `rows`' sentences into `out`.
    fn scatter(&self, rows: &[usize], y: &Array, out: &mut [Vec<f32>]) -> Result<usize> {
        let d = self.dimension();
        let v = y.to_vec::<f32>()?;
        for (r, &i) in rows.iter().enumerate() {
            out[i] = v[r * d..(r + 1) * d].to_vec();
        }
        Ok(rows.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_cover_and_bound() {
        for max in [8usize, 100, 256, 512] {
            let mut seen = std::collections::HashSet::new();
            for n in 0..=max {
                let t = length_bucket(n, max);
                assert!(t >= n && t <= max && t >= 1, "n={n} max={max} t={t}");
                seen.insert(t);
            }
            assert!(seen.len() <= max.min(128) / 16 + max.saturating_sub(128) / 32 + 2, "{max}: {}", seen.len());
        }
        for cap in [1usize, 5, 32, 128] {
            for n in 1..=cap {
                let b = batch_bucket(n, cap);
                assert!(b >= n && b <= cap);
            }
        }
    }
}
