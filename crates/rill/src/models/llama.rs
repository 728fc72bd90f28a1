//! A llama-family decoder from rill ops, with a preallocated key/value cache, and text
//! generation on top of it (`generate.rs`).
//!
//! [`Llama`] reads everything from a GGUF file: the sizes from the `{arch}.*` metadata
//! ([`LlamaConfig::from_gguf`]), the tokenizer and chat template from `tokenizer.*`, and
//! the weights by their GGUF names (`token_embd`, `blk.N.attn_q`, ..., `output_norm`,
//! `output`, the head tied to the embedding when the file has no `output.weight`).
//!
//! **The forward pass** of each step: token embedding; per layer RMS norm, the q/k/v
//! projections, rotary embedding ([`crate::rope`], pairs interleaved as llama.cpp's
//! converter lays out the q/k weights; the query and key heads side by side in one
//! rope), the new keys and values written into the cache ([`crate::slice_update`]),
//! grouped-query attention of the queries against the whole
//! cache with a mask of the positions written so far, the output projection and
//! residual; RMS norm, the SwiGLU feed-forward (`down(silu(gate(x)) * up(x))`) and
//! residual; the final norm and the logits of each sequence's last token.
//!
//! **Compiled steps.** One [`compile`]d function runs every step: its inputs are the
//! token ids `[B, T]`, the position each row starts at `[B]`, the index of each row's
//! last real token `[B]` and the caches; its outputs the logits `[B, V]` (f32) and the
//! updated caches. Positions are array inputs, so decoding (`T = 1`) replays one trace for
//! every position; a prompt is padded to a multiple of 16 tokens, so prefills trace once
//! per length bucket. Padding writes keys past a row's real length; the mask hides them
//! and the next tokens overwrite them.
//!
//! **Weights.** The projections and the output head stay in the file's block format
//! (Q4_0, Q4_1, Q8_0) as [`QMatrix`]es, their bytes copied unchanged to the device, and
//! every product reads the packed blocks ([`crate::quant::qmatmul`]): a decode step never
//! dequantizes a whole matrix. Float tensors (and every weight with
//! `LoadOptions::packed` off) are dense arrays of the model dtype (f32, f16 or bf16). The
//! token embedding is dense, for the gather. All products go through one function,
//! `linear`. Projections of one input are joined at load (q, k and v; gate and up: their
//! packed rows stacked, or dense columns joined) so each is one product whose columns
//! are split as views.
//!
//! **Sharing.** A `Llama` is `Send + Sync` and cheap to clone (an `Arc` inside): tasks
//! and threads generating at once share the weights and the compiled steps, each with a
//! cache of its own. Nothing creates a stream or a thread.

use std::path::Path;

use crate::array::Array;
use crate::compile::{Compiled, compile};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::io::gguf::{GgmlType, Gguf, Value};
use crate::io::gguf_tokenizer::GgufTokenizer;
use crate::ops::attention::AttentionMask;
use crate::ops::decode::RopeOptions;
use crate::primitives::RopeLayout;
use crate::quant::QMatrix;
use crate::runtime::device::Device;
use crate::runtime::stream::Stream;
use crate::sync::Arc;

pub use super::generate::{
    FinishReason, GenerateOptions, Generator, Greedy, SampleContext, Sampler, Temperature, Token, TokenStream,
};

const OP: &str = "llama";

/// Prompt lengths are padded to a multiple of this (one prefill trace per bucket).
const LENGTH_BUCKET: usize = 16;

fn io_err(source: &str, msg: impl Into<String>) -> Error {
    Error::Io { op: OP, path: source.to_string(), msg: msg.into() }
}

/// The architecture of a llama-family model, read from GGUF metadata.
#[derive(Clone, Debug, PartialEq)]
pub struct LlamaConfig {
    /// `general.architecture` (`llama`, `mistral`): the prefix of the other keys.
    pub architecture: String,
    /// Decoder layers (`{arch}.block_count`).
    pub layers: usize,
    /// Width of the residual stream (`{arch}.embedding_length`).
    pub hidden: usize,
    /// Query heads (`{arch}.attention.head_count`).
    pub heads: usize,
    /// Key/value heads (`{arch}.attention.head_count_kv`, else `heads`).
    pub kv_heads: usize,
    /// Features per head (`{arch}.attention.key_length`, else `hidden / heads`).
    pub head_dim: usize,
    /// Width of the feed-forward block (`{arch}.feed_forward_length`).
    pub ffn: usize,
    /// Vocabulary size (`{arch}.vocab_size`, else the token embedding's rows).
    pub vocab: usize,
    /// Longest sequence the model was trained for (`{arch}.context_length`).
    pub context: usize,
    /// RoPE frequency base (`{arch}.rope.freq_base`, else 10000).
    pub rope_base: f64,
    /// Features of each head that RoPE rotates (`{arch}.rope.dimension_count`, else
    /// `head_dim`).
    pub rope_dims: usize,
    /// Multiplies positions (`1 / {arch}.rope.scaling.factor` for linear scaling, else 1).
    pub rope_scale: f64,
    /// RMS norm epsilon (`{arch}.attention.layer_norm_rms_epsilon`).
    pub rms_eps: f64,
    /// The output head is the token embedding (the file has no `output.weight`).
    pub tied_embeddings: bool,
}

/// Architectures whose GGUF files this decoder reads (the llama layout and key names).
pub const ARCHITECTURES: &[&str] = &["llama", "mistral"];

impl LlamaConfig {
    /// Reads the architecture from the metadata of `g` (see the field docs for the keys).
    /// Errors: another architecture, a missing or non-numeric key, sizes that disagree
    /// (heads not dividing the width, query heads not a multiple of key/value heads, an
    /// odd or too large RoPE dimension), a RoPE scaling other than none or linear.
    pub fn from_gguf(g: &Gguf) -> Result<LlamaConfig> {
        let src = g.source();
        let arch = g.require_str("general.architecture")?.to_string();
        if !ARCHITECTURES.contains(&arch.as_str()) {
            return Err(io_err(src, format!("architecture {arch:?} is not one of {ARCHITECTURES:?}")));
        }
        let key = |k: &str| format!("{arch}.{k}");
        let req = |k: &str| -> Result<usize> { Ok(g.require_u64(&key(k))? as usize) };
        let opt = |k: &str| -> Option<usize> { g.value(&key(k)).and_then(Value::as_u64).map(|v| v as usize) };
        let layers = req("block_count")?;
        let hidden = req("embedding_length")?;
        let heads = req("attention.head_count")?;
        let kv_heads = opt("attention.head_count_kv").unwrap_or(heads);
        let ffn = req("feed_forward_length")?;
        let context = req("context_length")?;
        if heads == 0 || kv_heads == 0 || hidden == 0 || heads % kv_heads != 0 {
            return Err(io_err(
                src,
                format!("{heads} query heads, {kv_heads} key/value heads and width {hidden} do not fit together"),
            ));
        }
        let head_dim = match opt("attention.key_length") {
            Some(d) => d,
            None if hidden % heads == 0 => hidden / heads,
            None => return Err(io_err(src, format!("width {hidden} is not a multiple of {heads} heads"))),
        };
        let embd = g.tensor("token_embd.weight").ok_or_else(|| io_err(src, "missing tensor \"token_embd.weight\""))?;
        let vocab = match opt("vocab_size") {
            Some(v) => v,
            None => embd.shape().first().copied().unwrap_or(0),
        };
        let rope_base = g.value(&key("rope.freq_base")).and_then(Value::as_f64).unwrap_or(10000.0);
        let rope_dims = opt("rope.dimension_count").unwrap_or(head_dim);
        if rope_dims % 2 != 0 || rope_dims > head_dim || rope_dims == 0 {
            return Err(io_err(src, format!("RoPE dimension {rope_dims} must be even and at most {head_dim}")));
        }
        let rope_scale = match g.value(&key("rope.scaling.type")).and_then(Value::as_str) {
            None | Some("none") => 1.0,
            Some("linear") => {
                let f = g.value(&key("rope.scaling.factor")).and_then(Value::as_f64).unwrap_or(1.0);
                if !(f.is_finite() && f > 0.0) {
                    return Err(io_err(src, format!("RoPE scaling factor {f} is not positive")));
                }
                1.0 / f
            }
            Some(other) => return Err(io_err(src, format!("RoPE scaling {other:?} is not supported (none, linear)"))),
        };
        let rms_eps = g.require_f64(&key("attention.layer_norm_rms_epsilon"))?;
        let tied_embeddings = g.tensor("output.weight").is_none();
        Ok(LlamaConfig {
            architecture: arch,
            layers,
            hidden,
            heads,
            kv_heads,
            head_dim,
            ffn,
            vocab,
            context,
            rope_base,
            rope_dims,
            rope_scale,
            rms_eps,
            tied_embeddings,
        })
    }
}

/// How to load a model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoadOptions {
    /// The dtype weights and activations are in: f32 (the default), f16 or bf16.
    pub dtype: DType,
    /// Keep block-quantized projections packed (the default); off: dequantize every
    /// weight to `dtype` at load.
    pub packed: bool,
}

impl Default for LoadOptions {
    fn default() -> LoadOptions {
        LoadOptions { dtype: DType::F32, packed: true }
    }
}

/// A linear layer's weight, `W [N, K]` as the file stores it (`y = x Wᵀ`).
pub(crate) enum Weight {
    /// Dequantized, stored transposed (`[K, N]`, contiguous) so products read it in order.
    Dense(Array),
    /// The file's packed blocks, read by the product.
    Packed(QMatrix),
}

impl Weight {
    /// Reads the GGUF tensor `name`, which must be `[n, k]`: packed when it is
    /// block-quantized and `packed` is set, else dequantized to `dtype`.
    fn load(g: &Gguf, name: &str, n: usize, k: usize, stream: &Stream, dtype: DType, packed: bool) -> Result<Weight> {
        let quantized = g.tensor(name).is_some_and(|t| matches!(t.ggml_type(), GgmlType::Quant(_)));
        if packed && quantized {
            let t = g.tensor(name).ok_or_else(|| io_err(g.source(), format!("missing tensor {name:?}")))?;
            if t.shape() != [n, k] {
                return Err(io_err(
                    g.source(),
                    format!("tensor {name:?} has shape {:?}, the metadata implies {:?}", t.shape(), [n, k]),
                ));
            }
            return Ok(Weight::Packed(QMatrix::from_gguf(g, name, stream)?));
        }
        let w = tensor(g, name, &[n, k], stream, dtype)?;
        Ok(Weight::Dense(w.t()?.contiguous()?))
    }
    fn array(&self) -> &Array {
        match self {
            Weight::Dense(a) => a,
            Weight::Packed(q) => q.data(),
        }
    }

    /// N, the output features.
    fn cols_out(&self) -> usize {
        match self {
            Weight::Dense(a) => a.shape()[1],
            Weight::Packed(q) => q.rows(),
        }
    }

    /// One weight whose product is the products of `ws` side by side (`[.., ΣN]`): their
    /// packed rows stacked when all are packed in one format, their dense columns joined
    /// when all are dense; `None` when they mix. Each output column is computed as by its
    /// own weight (rows of a packed product are independent), in one launch instead of
    /// several.
    fn join(ws: &[Weight]) -> Result<Option<Weight>> {
        if let Some(qs) =
            ws.iter().map(|w| if let Weight::Packed(q) = w { Some(q) } else { None }).collect::<Option<Vec<_>>>()
        {
            let Some(first) = qs.first() else { return Ok(None) };
            if qs.iter().any(|q| q.format() != first.format() || q.cols() != first.cols()) {
                return Ok(None);
            }
            let f = first.format();
            let data = crate::concatenate(&qs.iter().map(|q| q.data()).collect::<Vec<_>>(), 0)?;
            return Ok(Some(Weight::Packed(QMatrix::from_packed(f, &data)?)));
        }
        if let Some(ds) =
            ws.iter().map(|w| if let Weight::Dense(a) = w { Some(a) } else { None }).collect::<Option<Vec<_>>>()
        {
            return Ok(Some(Weight::Dense(crate::concatenate(&ds, 1)?)));
        }
        Ok(None)
    }
}

/// Projections of one input (q/k/v, gate/up): one joined product whose columns are split
/// after it, or a product each when the weights cannot be joined.
enum Proj {
    Joined(Weight, Vec<usize>),
    Apart(Vec<Weight>),
}

impl Proj {
    fn new(ws: Vec<Weight>) -> Result<Proj> {
        let widths = ws.iter().map(|w| w.cols_out()).collect();
        Ok(match Weight::join(&ws)? {
            Some(j) => Proj::Joined(j, widths),
            None => Proj::Apart(ws),
        })
    }

    /// `x · Wᵢᵀ` for each weight (views of one product when joined).
    fn apply(&self, x: &Array) -> Result<Vec<Array>> {
        match self {
            Proj::Apart(ws) => ws.iter().map(|w| linear(x, w)).collect(),
            Proj::Joined(w, widths) => {
                let y = linear(x, w)?;
                let mut at = 0isize;
                widths
                    .iter()
                    .map(|&n| {
                        let s = y.slice_axis(-1, Some(at), Some(at + n as isize), 1);
                        at += n as isize;
                        s
                    })
                    .collect()
            }
        }
    }

    /// For q/k/v projections: the q and k columns side by side (`[.., q | k]`, a view of
    /// the joined product, or the two joined when the weights are apart) and v.
    fn split_qk_v(&self, x: &Array) -> Result<(Array, Array)> {
        match self {
            Proj::Joined(w, widths) if widths.len() == 3 => {
                let y = linear(x, w)?;
                let qk = (widths[0] + widths[1]) as isize;
                let v = widths[2] as isize;
                Ok((y.slice_axis(-1, Some(0), Some(qk), 1)?, y.slice_axis(-1, Some(qk), Some(qk + v), 1)?))
            }
            _ => {
                let [q, k, v] = <[Array; 3]>::try_from(self.apply(x)?)
                    .map_err(|_| Error::invalid(OP, "q/k/v projections gave the wrong number of parts"))?;
                Ok((crate::concatenate(&[&q, &k], -1)?, v))
            }
        }
    }

    fn arrays(&self) -> Vec<Array> {
        match self {
            Proj::Joined(w, _) => vec![w.array().clone()],
            Proj::Apart(ws) => ws.iter().map(|w| w.array().clone()).collect(),
        }
    }
}

/// `x [..., K] · Wᵀ`: `[..., N]`. Every projection of the model goes through here.
pub(crate) fn linear(x: &Array, w: &Weight) -> Result<Array> {
    match w {
        Weight::Dense(wt) => x.matmul(wt),
        Weight::Packed(q) => crate::quant::qmatmul(x, q),
    }
}

/// The GGUF tensor `name`, checked against `shape`, dequantized to `dtype` on `stream`.
fn tensor(g: &Gguf, name: &str, shape: &[usize], stream: &Stream, dtype: DType) -> Result<Array> {
    let t = g.tensor(name).ok_or_else(|| io_err(g.source(), format!("missing tensor {name:?}")))?;
    if t.shape() != shape {
        return Err(io_err(
            g.source(),
            format!("tensor {name:?} has shape {:?}, the metadata implies {shape:?}", t.shape()),
        ));
    }
    g.get_on(name, stream)?.astype(dtype)
}

struct Layer {
    attn_norm: Array,
    /// q, k and v.
    qkv: Proj,
    o: Weight,
    ffn_norm: Array,
    /// gate and up.
    gate_up: Proj,
    down: Weight,
}

struct Weights {
    embed: Array,
    layers: Vec<Layer>,
    norm: Array,
    head: Weight,
}

/// What the compiled step reads: the architecture and the weights (its captured
/// constants).
struct Core {
    config: LlamaConfig,
    weights: Weights,
}

pub(crate) struct Inner {
    pub(crate) config: LlamaConfig,
    dtype: DType,
    pub(crate) stream: Stream,
    pub(crate) tokenizer: GgufTokenizer,
    step: Compiled,
}

/// A llama-family language model loaded from a GGUF file (see the module docs).
/// `Send + Sync`; clones share everything.
#[derive(Clone)]
pub struct Llama {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for Llama {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let c = &self.inner.config;
        f.debug_struct("Llama")
            .field("architecture", &c.architecture)
            .field("layers", &c.layers)
            .field("hidden", &c.hidden)
            .field("dtype", &self.inner.dtype)
            .field("device", &self.inner.stream.device())
            .finish()
    }
}

/// The key/value cache of a batch of sequences: per layer `[B, Hkv, capacity, D]` keys
/// and values, and how many positions of each row are written.
pub struct KvCache {
    keys: Vec<Array>,
    values: Vec<Array>,
    positions: Vec<usize>,
    capacity: usize,
}

impl std::fmt::Debug for KvCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvCache").field("positions", &self.positions).field("capacity", &self.capacity).finish()
    }
}

impl KvCache {
    /// Positions written in each row (the next token of row `b` goes at `positions()[b]`).
    pub fn positions(&self) -> &[usize] {
        &self.positions
    }
    /// Positions each row holds.
    pub fn capacity(&self) -> usize {
        self.capacity
    }
    /// Rows (sequences).
    pub fn batch(&self) -> usize {
        self.positions.len()
    }
}

fn check_dtype(dtype: DType) -> Result<()> {
    match dtype {
        DType::F32 | DType::F16 | DType::BF16 => Ok(()),
        DType::Bool | DType::U8 | DType::U32 | DType::I32 | DType::I64 | DType::F64 => {
            Err(Error::dtype(OP, dtype, "a model runs in f32, f16 or bf16"))
        }
    }
}

impl Llama {
    /// Loads the GGUF file at `path` onto `device`'s default stream.
    pub fn load(path: impl AsRef<Path>, device: Device, options: LoadOptions) -> Result<Llama> {
        Llama::load_on(path, &device.default_stream()?, options)
    }

    /// Loads the GGUF file at `path` onto `stream`.
    pub fn load_on(path: impl AsRef<Path>, stream: &Stream, options: LoadOptions) -> Result<Llama> {
        let g = Gguf::open(path)?;
        Llama::from_gguf(&g, stream, options)
    }

    /// Builds the model from an opened GGUF file: every weight is loaded (packed, or
    /// dequantized and converted: see the module docs) and evaluated on `stream` before
    /// this returns.
    pub fn from_gguf(g: &Gguf, stream: &Stream, options: LoadOptions) -> Result<Llama> {
        let dtype = options.dtype;
        check_dtype(dtype)?;
        let c = LlamaConfig::from_gguf(g)?;
        let tokenizer = GgufTokenizer::from_gguf(g)?;
        let (h, hd) = (c.hidden, c.head_dim);
        let (qn, kvn) = (c.heads * hd, c.kv_heads * hd);
        let lin = |name: &str, n, k| Weight::load(g, name, n, k, stream, dtype, options.packed);
        let vec = |name: &str, n| tensor(g, name, &[n], stream, dtype);
        let embed = tensor(g, "token_embd.weight", &[c.vocab, h], stream, dtype)?;
        let mut all = vec![embed.clone()];
        let mut layers = Vec::with_capacity(c.layers);
        for i in 0..c.layers {
            let b = format!("blk.{i}");
            let layer = Layer {
                attn_norm: vec(&format!("{b}.attn_norm.weight"), h)?,
                qkv: Proj::new(vec![
                    lin(&format!("{b}.attn_q.weight"), qn, h)?,
                    lin(&format!("{b}.attn_k.weight"), kvn, h)?,
                    lin(&format!("{b}.attn_v.weight"), kvn, h)?,
                ])?,
                o: lin(&format!("{b}.attn_output.weight"), h, qn)?,
                ffn_norm: vec(&format!("{b}.ffn_norm.weight"), h)?,
                gate_up: Proj::new(vec![
                    lin(&format!("{b}.ffn_gate.weight"), c.ffn, h)?,
                    lin(&format!("{b}.ffn_up.weight"), c.ffn, h)?,
                ])?,
                down: lin(&format!("{b}.ffn_down.weight"), h, c.ffn)?,
            };
            all.extend([&layer.attn_norm, &layer.ffn_norm].map(Array::clone));
            all.extend(layer.qkv.arrays());
            all.extend(layer.gate_up.arrays());
            all.extend([&layer.o, &layer.down].map(|w| w.array().clone()));
            layers.push(layer);
            // Evaluate as we go: the host copies of each layer are freed before the next.
            crate::eval(&all)?;
            all.clear();
        }
        let norm = vec("output_norm.weight", h)?;
        // A tied head reads the embedding's own blocks when they are packed.
        let head_name = if c.tied_embeddings { "token_embd.weight" } else { "output.weight" };
        let packed_embed =
            options.packed && g.tensor(head_name).is_some_and(|t| matches!(t.ggml_type(), GgmlType::Quant(_)));
        let head = if c.tied_embeddings && !packed_embed {
            Weight::Dense(embed.t()?.contiguous()?)
        } else {
            lin(head_name, c.vocab, h)?
        };
        all.extend([embed.clone(), norm.clone(), head.array().clone()]);
        crate::eval(&all)?;
        let core = Arc::new(Core { config: c.clone(), weights: Weights { embed, layers, norm, head } });
        let step = compile(move |x: &[Array]| core.step(x));
        let inner = Inner { config: c, dtype, stream: stream.clone(), tokenizer, step };
        Ok(Llama { inner: Arc::new(inner) })
    }

    /// The architecture.
    pub fn config(&self) -> &LlamaConfig {
        &self.inner.config
    }
    /// The tokenizer of the file.
    pub fn tokenizer(&self) -> &GgufTokenizer {
        &self.inner.tokenizer
    }
    /// The dtype of the weights, activations and caches.
    pub fn dtype(&self) -> DType {
        self.inner.dtype
    }
    /// The stream everything runs on.
    pub fn stream(&self) -> &Stream {
        &self.inner.stream
    }
    /// Traces the compiled step holds (one per batch size, length bucket and capacity).
    pub fn traced_shapes(&self) -> usize {
        self.inner.step.cache_len()
    }

    /// The primitives of the compiled step that decodes one token for each of `batch`
    /// rows against caches of `capacity` positions, by name
    /// ([`Compiled::primitive_counts`](crate::Compiled::primitive_counts)): what a token
    /// costs after `compile`'s fusion (on a GPU each non-view node is about one kernel).
    /// For tests and diagnostics; the step runs once on zero caches.
    pub fn decode_primitive_counts(
        &self,
        batch: usize,
        capacity: usize,
    ) -> Result<std::collections::BTreeMap<&'static str, usize>> {
        let cache = self.new_cache(batch, capacity)?;
        let m = &*self.inner;
        let _g = m.stream.enter();
        let zeros = vec![0i32; batch];
        let mut inputs = vec![
            Array::from_slice(&zeros, &[batch, 1])?,
            Array::from_slice(&zeros, &[batch])?,
            Array::from_slice(&zeros, &[batch])?,
        ];
        inputs.extend(cache.keys.iter().cloned());
        inputs.extend(cache.values.iter().cloned());
        m.step.primitive_counts(&inputs)
    }

    /// An empty cache for `batch` sequences of at most `capacity` positions (at most the
    /// model's context length).
    pub fn new_cache(&self, batch: usize, capacity: usize) -> Result<KvCache> {
        let c = &self.inner.config;
        if batch == 0 || capacity == 0 || capacity > c.context {
            return Err(Error::invalid(
                OP,
                format!(
                    "a cache needs batch >= 1 and 1 <= capacity <= {} (context), got {batch}, {capacity}",
                    c.context
                ),
            ));
        }
        let shape = [batch, c.kv_heads, capacity, c.head_dim];
        let _g = self.inner.stream.enter();
        let zeros = || Array::zeros(&shape, self.inner.dtype);
        let keys = (0..c.layers).map(|_| zeros()).collect::<Result<Vec<_>>>()?;
        let values = (0..c.layers).map(|_| zeros()).collect::<Result<Vec<_>>>()?;
        Ok(KvCache { keys, values, positions: vec![0; batch], capacity })
    }

    /// Runs `tokens[b]` (one slice per row of `cache`, each non-empty) through the model
    /// at each row's next positions, writes their keys and values into `cache`, and
    /// returns the logits of each row's last token, `[B, vocab]` f32 (lazy).
    ///
    /// Errors: a row count other than the cache's, an empty row, a token id past the
    /// vocabulary, or positions past the cache's capacity.
    pub fn forward(&self, tokens: &[&[u32]], cache: &mut KvCache) -> Result<Array> {
        let m = &*self.inner;
        let b = cache.batch();
        if tokens.len() != b {
            return Err(Error::invalid(OP, format!("{} rows of tokens for a cache of {b}", tokens.len())));
        }
        let longest = tokens.iter().map(|t| t.len()).max().unwrap_or(0);
        if tokens.iter().any(|t| t.is_empty()) {
            return Err(Error::invalid(OP, "every row needs at least one token"));
        }
        if let Some(&bad) = tokens.iter().flat_map(|t| t.iter()).find(|&&id| id as usize >= m.config.vocab) {
            return Err(Error::invalid(OP, format!("token id {bad} is past the vocabulary ({})", m.config.vocab)));
        }
        let furthest = cache.positions.iter().max().copied().unwrap_or(0);
        let fits = |t: usize| furthest + t <= cache.capacity;
        if !fits(longest) {
            return Err(Error::invalid(
                OP,
                format!("{longest} tokens at position {furthest} do not fit a cache of {} positions", cache.capacity),
            ));
        }
        // Pad to a bucket when it fits (one trace per bucket), else to the longest row.
        let bucket = if longest == 1 { 1 } else { longest.div_ceil(LENGTH_BUCKET) * LENGTH_BUCKET };
        let t = if fits(bucket) { bucket } else { longest };
        let mut ids = vec![0i32; b * t];
        for (row, toks) in tokens.iter().enumerate() {
            for (j, &id) in toks.iter().enumerate() {
                ids[row * t + j] = id as i32;
            }
        }
        let lens: Vec<usize> = tokens.iter().map(|t| t.len()).collect();
        let ids = {
            let _g = m.stream.enter();
            Array::from_slice(&ids, &[b, t])?
        };
        self.run_step(ids, &lens, cache)
    }

    /// One decode step of every row of `cache` from `ids [B]` (an integer array on the
    /// model's stream, lazy or not: a sampler's choice that was not read back), each id
    /// below the vocabulary (not checked: the caller's sampler chose it). Returns the
    /// logits `[B, vocab]` as [`Llama::forward`] does.
    pub(crate) fn forward_ids(&self, ids: &Array, cache: &mut KvCache) -> Result<Array> {
        let b = cache.batch();
        if ids.shape() != [b] {
            return Err(Error::shape(OP, format!("ids of shape {:?} for a cache of {b} rows", ids.shape())));
        }
        if cache.positions.iter().any(|&p| p >= cache.capacity) {
            return Err(Error::invalid(OP, format!("a cache of {} positions is full", cache.capacity)));
        }
        let ids = {
            let _g = self.inner.stream.enter();
            ids.to_dtype(DType::I32)?.reshape(&[b as isize, 1])?
        };
        self.run_step(ids, &vec![1; b], cache)
    }

    /// Runs the compiled step on `ids [B, T]` (i32) whose row `b` holds `lens[b]` real
    /// tokens, and advances the cache.
    fn run_step(&self, ids: Array, lens: &[usize], cache: &mut KvCache) -> Result<Array> {
        let m = &*self.inner;
        let b = cache.batch();
        let start: Vec<i32> = cache.positions.iter().map(|&p| p as i32).collect();
        let last: Vec<i32> = lens.iter().map(|&t| t as i32 - 1).collect();
        let outs = {
            let _g = m.stream.enter();
            let mut inputs = vec![ids, Array::from_slice(&start, &[b])?, Array::from_slice(&last, &[b])?];
            inputs.extend(cache.keys.iter().cloned());
            inputs.extend(cache.values.iter().cloned());
            m.step.call(&inputs)?
        };
        let n = m.config.layers;
        let mut it = outs.into_iter();
        let logits = it.next().ok_or_else(|| Error::invalid(OP, "the step returned nothing"))?;
        let rest: Vec<Array> = it.collect();
        if rest.len() != 2 * n {
            return Err(Error::invalid(OP, "the step returned the wrong number of caches"));
        }
        cache.keys = rest[..n].to_vec();
        cache.values = rest[n..].to_vec();
        for (p, len) in cache.positions.iter_mut().zip(lens) {
            *p += len;
        }
        Ok(logits)
    }
}

impl Core {
    /// The traced step: inputs `ids [B, T]`, `start [B]`, `last [B]` (i32), then the
    /// key caches and the value caches of every layer; outputs the logits `[B, V]` (f32)
    /// of each row's token `last`, then the updated caches in the same order.
    fn step(&self, x: &[Array]) -> Result<Vec<Array>> {
        let c = &self.config;
        let w = &self.weights;
        let n = c.layers;
        if x.len() != 3 + 2 * n {
            return Err(Error::invalid(OP, format!("the step takes {} inputs, got {}", 3 + 2 * n, x.len())));
        }
        let (ids, start, last) = (&x[0], &x[1], &x[2]);
        let (kc, vc) = (&x[3..3 + n], &x[3 + n..]);
        let [b, t] = ids.shape()[..] else { return Err(Error::shape(OP, "token ids must be [batch, length]")) };
        let cap = kc[0].shape()[2];
        let (bi, ti) = (b as isize, t as isize);
        let (hq, hkv, hd) = (c.heads as isize, c.kv_heads as isize, c.head_dim as isize);

        // Query row t of sequence b sits at start[b] + t and attends keys j <= that.
        let qpos = start.reshape(&[bi, 1])?.add(&Array::arange(0, t as i64, 1, DType::I32)?.reshape(&[1, ti])?)?;
        let keys = Array::arange(0, cap as i64, 1, DType::I32)?.reshape(&[1, 1, 1, cap as isize])?;
        let mask = keys.le(&qpos.reshape(&[bi, 1, ti, 1])?)?;
        let rope =
            RopeOptions { dims: c.rope_dims, base: c.rope_base, scale: c.rope_scale, layout: RopeLayout::Interleaved };

        let mut h = w.embed.take(ids, 0)?.reshape(&[bi * ti, c.hidden as isize])?;
        let mut new_k = Vec::with_capacity(n);
        let mut new_v = Vec::with_capacity(n);
        for (i, l) in w.layers.iter().enumerate() {
            let a = h.rms_norm(Some(&l.attn_norm), c.rms_eps)?;
            let heads = |y: Array, nh: isize| y.reshape(&[bi, ti, nh, hd])?.transpose(&[0, 2, 1, 3]);
            // The query and key heads side by side, rotated by one rope.
            let (qk, v) = l.qkv.split_qk_v(&a)?;
            let qk = heads(qk, hq + hkv)?.rope(start, rope)?;
            let q = qk.slice_axis(1, Some(0), Some(hq), 1)?;
            let k = qk.slice_axis(1, Some(hq), Some(hq + hkv), 1)?;
            let v = heads(v, hkv)?;
            let kk = kc[i].slice_update(&k, start, 2)?;
            let vv = vc[i].slice_update(&v, start, 2)?;
            let o = crate::scaled_dot_product_attention(&q, &kk, &vv, AttentionMask::Array(&mask), None)?;
            let o = o.transpose(&[0, 2, 1, 3])?.reshape(&[bi * ti, hq * hd])?;
            h = h.add(&linear(&o, &l.o)?)?;
            let f = h.rms_norm(Some(&l.ffn_norm), c.rms_eps)?;
            let [gate, up] = <[Array; 2]>::try_from(l.gate_up.apply(&f)?)
                .map_err(|_| Error::invalid(OP, "gate/up projections gave the wrong number of parts"))?;
            let g = gate.silu()?.mul(&up)?;
            h = h.add(&linear(&g, &l.down)?)?;
            new_k.push(kk);
            new_v.push(vv);
        }
        // Each row's last real token: row b's is at b * T + last[b].
        let rows = Array::arange(0, (b * t) as i64, t as i64, DType::I32)?.add(last)?;
        let h = h.take(&rows, 0)?.rms_norm(Some(&w.norm), c.rms_eps)?;
        let logits = linear(&h, &w.head)?.to_dtype(DType::F32)?;
        let mut out = vec![logits];
        out.extend(new_k);
        out.extend(new_v);
        Ok(out)
    }
}
