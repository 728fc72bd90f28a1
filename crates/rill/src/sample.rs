//! Token sampling for text generation: greedy, temperature, top-k, top-p (nucleus),
//! min-p and a repetition penalty, as lazy ops on a batch of logits.
//!
//! A [`Sampler`] turns logits `[batch, vocab]` (f32, bf16 or f16, on any device) into one
//! token id per row, an i64 array `[batch]` on the logits' device. Everything is recorded
//! as ops (no host round trip), so a sampler can be called inside a function given to
//! [`crate::compile()`]: there, pass the random draws in as an input
//! ([`Sampler::uniforms`] then [`Sampler::sample_with`]), since a draw recorded inside the
//! traced function would be replayed with the key it was traced with.
//!
//! The filters follow Hugging Face transformers' logits processors, in the order its
//! `generate` applies them, all computed in f32:
//!
//! 1. repetition penalty `r` (`RepetitionPenaltyLogitsProcessor`): the logit of every token
//!    present in the row's history is divided by `r` when positive, multiplied by `r`
//!    otherwise;
//! 2. temperature `t` (`TemperatureLogitsWarper`): logits divided by `t`; `t = 0` is greedy
//!    decoding, the first maximum of the penalised logits, and ignores the other filters;
//! 3. top-k (`TopKLogitsWarper`): tokens below the `k`-th largest logit are removed (ties
//!    with it stay); `k` above the vocabulary keeps all;
//! 4. top-p (`TopPLogitsWarper`): over the remaining tokens' probabilities, largest first,
//!    a token stays while the probability before it is below `p`: the smallest set reaching
//!    mass `p`, and always the most likely token. Tokens equal to the last one kept also
//!    stay (transformers keeps an arbitrary subset of such ties); `p = 1` keeps all;
//! 5. min-p (`MinPLogitsWarper`): tokens whose probability is below `min_p` times the
//!    largest probability are removed;
//! 6. a draw from the softmax of what remains ([`crate::random::categorical`], the
//!    Gumbel-max trick: the same key gives the same token on the CPU and a GPU).
//!
//! Randomness: the key of row `r` at step `s` is
//! `Key::new(seed).fold_in(s as u32).fold_in((s >> 32) as u32)` with `seed` that row's
//! seed: [`Sampler::per_row`]'s configurations each bring theirs, and [`Sampler::new`]
//! gives row `r` the seed `seed + r`. A request sampled alone with seed `S` therefore
//! draws the same tokens as when it is row `r` of a batch with seed `S` (given the same
//! logits). Each row with its own key is its own random node (`batch` draws a step).
//!
//! Settings may differ per row (`Sampler::per_row`) at the cost of a `[batch, 1]`
//! constant for each setting that differs; top-k then works on the largest `k` of the
//! batch and masks each row to its own. The costs per step, beyond elementwise work: a
//! top-k when top-k is set (its values are sorted, so top-p then works on those `k`
//! only), a sort of the whole vocabulary when top-p is set without top-k, and softmax-like
//! reductions. A repetition penalty over token ids compares every id with the vocabulary
//! (`batch * history * vocab` comparisons): in a decode loop keep a presence mask instead
//! ([`presence_mask`] once, [`add_to_presence`] per step) and pass it as the history.
//!
//! ```
//! use rill::{Array, sample::{Sampler, SamplerConfig}};
//! let logits = Array::from_slice(&[1.0f32, 3.0, 2.0, 0.0, 0.5, 0.25, 4.0, 1.0], &[2, 4])?;
//! // Greedy: the largest logit of each row.
//! let greedy = Sampler::new(SamplerConfig::greedy())?;
//! assert_eq!(greedy.sample(&logits, None, 0)?.to_vec::<i64>()?, [1, 2]);
//! // Top-k 1 leaves one candidate, whatever the draw.
//! let config = SamplerConfig { temperature: 0.7, top_k: Some(1), seed: 42, ..SamplerConfig::default() };
//! let sampler = Sampler::new(config)?;
//! assert_eq!(sampler.sample(&logits, None, 5)?.to_vec::<i64>()?, [1, 2]);
//! # Ok::<(), rill::Error>(())
//! ```

use crate::array::Array;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ops::{IntoOperand, Operand, target_stream};
use crate::primitives::{Primitive, SortSpec};
use crate::random::{Key, gumbel, uniform_on};
use crate::runtime::device::Device;
use crate::runtime::stream::Stream;
use crate::where_;

/// The settings of one row's sampling (see the module docs for what each does).
#[derive(Clone, Debug, PartialEq)]
pub struct SamplerConfig {
    /// Divides the logits; 0 is greedy decoding. Must be finite and at least 0.
    pub temperature: f32,
    /// Keep the `k` most likely tokens; `None`: no top-k. `Some(0)` is an error.
    pub top_k: Option<usize>,
    /// Keep the smallest set of most likely tokens of mass `p`, in `(0, 1]`; `None`: off.
    pub top_p: Option<f32>,
    /// Remove tokens less likely than `min_p` times the most likely one, in `[0, 1]`.
    pub min_p: Option<f32>,
    /// The repetition penalty, finite and above 0 (1: none); needs a history.
    pub repetition_penalty: Option<f32>,
    /// The seed of the row's keys.
    pub seed: u64,
}

impl Default for SamplerConfig {
    /// Plain sampling at temperature 1, no filters, seed 0.
    fn default() -> SamplerConfig {
        SamplerConfig { temperature: 1.0, top_k: None, top_p: None, min_p: None, repetition_penalty: None, seed: 0 }
    }
}

impl SamplerConfig {
    /// Greedy decoding (temperature 0).
    pub fn greedy() -> SamplerConfig {
        SamplerConfig { temperature: 0.0, ..SamplerConfig::default() }
    }

    /// Checks the settings: an `Error::Invalid` names the first one out of range.
    pub fn validate(&self) -> Result<()> {
        let bad = |msg: String| Err(Error::invalid("sampler", msg));
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return bad(format!("temperature {} must be finite and >= 0", self.temperature));
        }
        if self.top_k == Some(0) {
            return bad("top_k must be at least 1 (None turns it off)".into());
        }
        if let Some(p) = self.top_p
            && !(p > 0.0 && p <= 1.0)
        {
            return bad(format!("top_p {p} is not in (0, 1]"));
        }
        if let Some(m) = self.min_p
            && !(0.0..=1.0).contains(&m)
        {
            return bad(format!("min_p {m} is not in [0, 1]"));
        }
        if let Some(r) = self.repetition_penalty
            && !(r.is_finite() && r > 0.0)
        {
            return bad(format!("repetition_penalty {r} must be finite and > 0"));
        }
        Ok(())
    }

    fn greedy_row(&self) -> bool {
        self.temperature == 0.0
    }
}

/// Samples token ids from batches of logits (see the module docs).
#[derive(Clone, Debug)]
pub struct Sampler {
    /// One configuration per row, or one for every row.
    rows: Vec<SamplerConfig>,
    shared: bool,
}

impl Sampler {
    /// The same settings for every row of a batch; row `r` uses the seed `seed + r`.
    pub fn new(config: SamplerConfig) -> Result<Sampler> {
        config.validate()?;
        Ok(Sampler { rows: vec![config], shared: true })
    }

    /// One configuration per row of the batch (the batch must have `configs.len()` rows).
    pub fn per_row(configs: Vec<SamplerConfig>) -> Result<Sampler> {
        if configs.is_empty() {
            return Err(Error::invalid("sampler", "per_row needs at least one configuration"));
        }
        for c in &configs {
            c.validate()?;
        }
        Ok(Sampler { rows: configs, shared: false })
    }

    /// The configuration of row `r`.
    fn row(&self, r: usize) -> &SamplerConfig {
        if self.shared { &self.rows[0] } else { &self.rows[r] }
    }

    /// The seed of row `r`.
    fn seed(&self, r: usize) -> u64 {
        if self.shared { self.rows[0].seed.wrapping_add(r as u64) } else { self.rows[r].seed }
    }

    /// True when some row's repetition penalty reads a history (a penalty other than 1).
    pub fn needs_history(&self) -> bool {
        self.rows.iter().any(|c| c.repetition_penalty.is_some_and(|p| p != 1.0))
    }

    /// The key row `r` draws with at step `step` (see the module docs).
    pub fn key(&self, row: usize, step: u64) -> Key {
        Key::new(self.seed(row)).fold_in(step as u32).fold_in((step >> 32) as u32)
    }

    fn check_batch(&self, batch: usize) -> Result<()> {
        if !self.shared && batch != self.rows.len() {
            return Err(Error::invalid(
                "sampler",
                format!("{} per-row configurations for a batch of {batch} rows", self.rows.len()),
            ));
        }
        Ok(())
    }

    /// The random draws of a step: f32 uniforms `[batch, vocab]` on `device` (on the
    /// innermost stream override when one is active), row `r` drawn with
    /// [`Sampler::key`]`(r, step)`. Pass them to [`Sampler::sample_with`].
    pub fn uniforms(&self, device: &Device, batch: usize, vocab: usize, step: u64) -> Result<Array> {
        self.check_batch(batch)?;
        let stream = match crate::runtime::scope::current_stream_override() {
            Some(s) => s,
            None => device.default_stream()?,
        };
        self.uniforms_on(&stream, batch, vocab, step)
    }

    fn uniforms_on(&self, stream: &Stream, batch: usize, vocab: usize, step: u64) -> Result<Array> {
        crate::runtime::lifecycle::check_running()?;
        if batch == 1 {
            return uniform_on(self.key(0, step), &[1, vocab], stream);
        }
        let rows: Vec<Array> =
            (0..batch).map(|r| uniform_on(self.key(r, step), &[1, vocab], stream)).collect::<Result<_>>()?;
        crate::ops::movement::copies::concatenate(&rows.iter().collect::<Vec<_>>(), 0)
    }

    /// Samples one token id per row of `logits` `[batch, vocab]` at step `step` (the keys
    /// of [`Sampler::key`]): an i64 array `[batch]`. `history` is needed when a repetition
    /// penalty is set: token ids `[batch, len]` (any integer dtype; negative ids are
    /// padding) or a bool presence mask `[batch, vocab]` ([`presence_mask`]).
    pub fn sample(&self, logits: &Array, history: Option<&Array>, step: u64) -> Result<Array> {
        let (batch, vocab) = dims(logits)?;
        self.check_batch(batch)?;
        let stream = target_stream(&[logits])?;
        let u = if (0..batch).all(|r| self.row(r).greedy_row()) {
            None
        } else {
            Some(self.uniforms_on(&stream, batch, vocab, step)?)
        };
        self.process(logits, history, u.as_ref())
    }

    /// [`Sampler::sample`] with the step's draws given (from [`Sampler::uniforms`], f32
    /// `[batch, vocab]` on `[0, 1)`), for a compiled decode step that takes them as an
    /// input. Greedy rows ignore them.
    pub fn sample_with(&self, logits: &Array, history: Option<&Array>, uniforms: &Array) -> Result<Array> {
        let (batch, vocab) = dims(logits)?;
        self.check_batch(batch)?;
        if uniforms.shape() != [batch, vocab] {
            return Err(Error::shape(
                "sampler",
                format!("uniforms of shape {:?} for logits of shape {:?}", uniforms.shape(), logits.shape()),
            ));
        }
        self.process(logits, history, Some(uniforms))
    }

    /// A per-row setting as an operand: a scalar when every row has the same value, else a
    /// `[batch, 1]` f32 column.
    fn setting(&self, batch: usize, f: impl Fn(&SamplerConfig) -> f32) -> Result<Operand> {
        let vals: Vec<f32> = (0..batch).map(|r| f(self.row(r))).collect();
        if vals.iter().all(|v| v.to_bits() == vals[0].to_bits()) {
            return Ok(vals[0].into_operand());
        }
        Ok(Array::from_slice(&vals, &[batch, 1])?.into_operand())
    }

    /// Host values as an array on `like`'s device.
    fn constant<T: crate::Element>(like: &Array, vals: &[T], shape: &[usize]) -> Result<Array> {
        let stream = target_stream(&[like])?;
        Ok(crate::ops::on_device(&Array::from_slice(vals, shape)?, &stream))
    }

    /// The f32 logits `[batch, vocab]` a step draws from: penalised, divided by the
    /// temperature and filtered, removed tokens at `-inf` (their softmax is the
    /// distribution of [`Sampler::sample`]'s tokens). Greedy rows are only penalised: their
    /// token is the first maximum. `history` as for [`Sampler::sample`].
    pub fn filtered_logits(&self, logits: &Array, history: Option<&Array>) -> Result<Array> {
        let (batch, _) = dims(logits)?;
        self.check_batch(batch)?;
        Ok(self.filter(logits, history, false)?.0)
    }

    fn process(&self, logits: &Array, history: Option<&Array>, u: Option<&Array>) -> Result<Array> {
        let (x, greedy) = self.filter(logits, history, true)?;
        let batch = logits.shape()[0];
        if (0..batch).all(|r| self.row(r).greedy_row()) {
            return Ok(greedy.expect("greedy rows have their tokens"));
        }
        let Some(u) = u else { return Err(Error::invalid("sampler", "sampling rows need random draws")) };
        // 6. The draw.
        let drawn = x.add(&gumbel(u, DType::F32)?)?.argmax(-1, false)?;
        match greedy {
            Some(g) => {
                let flags: Vec<u8> = (0..batch).map(|r| self.row(r).greedy_row() as u8).collect();
                where_(&Self::constant(&g, &flags, &[batch])?.ne(0u8)?, &g, &drawn)
            }
            None => Ok(drawn),
        }
    }

    /// The filtered logits, and (with `want_greedy`) the greedy tokens when a row is greedy.
    fn filter(&self, logits: &Array, history: Option<&Array>, want_greedy: bool) -> Result<(Array, Option<Array>)> {
        let (batch, vocab) = dims(logits)?;
        let rows: Vec<&SamplerConfig> = (0..batch).map(|r| self.row(r)).collect();
        let mut x = logits.astype(DType::F32)?;
        // 1. Repetition penalty.
        if rows.iter().any(|c| c.repetition_penalty.is_some_and(|r| r != 1.0)) {
            let Some(h) = history else {
                return Err(Error::invalid("sampler", "a repetition penalty needs a history"));
            };
            let mask = if h.dtype() == DType::Bool { h.clone() } else { presence_mask(h, vocab)? };
            if mask.shape() != [batch, vocab] {
                return Err(Error::shape(
                    "sampler",
                    format!("presence mask of shape {:?} for logits of shape {:?}", mask.shape(), logits.shape()),
                ));
            }
            let r = self.setting(batch, |c| c.repetition_penalty.unwrap_or(1.0))?;
            let penalised = where_(&x.lt(0.0f32)?, x.mul(r.clone())?, x.div(r)?)?;
            x = where_(&mask, &penalised, &x)?;
        }
        let greedy_rows = rows.iter().filter(|c| c.greedy_row()).count();
        let greedy = if greedy_rows > 0 && want_greedy { Some(x.argmax(-1, false)?) } else { None };
        if greedy_rows == batch {
            return Ok((x, greedy));
        }
        let sampling = |c: &SamplerConfig| !c.greedy_row();
        // 2. Temperature (greedy rows divide by 1).
        if rows.iter().any(|c| sampling(c) && c.temperature != 1.0) {
            x = x.div(self.setting(batch, |c| if c.greedy_row() { 1.0 } else { c.temperature })?)?;
        }
        // 3. Top-k: the k-th largest value of each row as a threshold.
        let k_of = |c: &SamplerConfig| match c.top_k {
            Some(k) if sampling(c) => k.min(vocab),
            _ => vocab,
        };
        let kmax = rows.iter().map(|c| k_of(c)).max().unwrap_or(vocab);
        let p_of = |c: &SamplerConfig| c.top_p.filter(|&p| p < 1.0 && sampling(c));
        let mut top: Option<Array> = None;
        if rows.iter().any(|c| k_of(c) < vocab) {
            let vals = topk_values(&x, kmax)?;
            let thr = if rows.iter().all(|c| k_of(c) == kmax) {
                vals.slice_axis(-1, Some(kmax as isize - 1), None, 1)?
            } else {
                let ks: Vec<f32> = rows.iter().map(|c| k_of(c) as f32).collect();
                let pos: Vec<f32> = (0..kmax).map(|i| i as f32).collect();
                let inside = Self::constant(&vals, &pos, &[1, kmax])?.lt(&Self::constant(&vals, &ks, &[batch, 1])?)?;
                where_(&inside, &vals, f32::INFINITY)?.min(&[-1], true)?
            };
            x = where_(&x.lt(&thr)?, f32::NEG_INFINITY, &x)?;
            // The top values, those below the row's threshold removed, still in order.
            top = Some(where_(&vals.lt(&thr)?, f32::NEG_INFINITY, &vals)?);
        }
        // 4. Top-p over the remaining tokens, largest first: a token stays while the mass
        // before it is below p.
        if rows.iter().any(|c| p_of(c).is_some()) {
            let sorted = match top {
                Some(t) => t,
                None => x.sort(-1, true)?,
            };
            let lse = x.logsumexp(&[-1], true)?;
            let before = sorted.sub(&lse)?.exp()?.cumsum_with(-1, false, true)?;
            let keep = before.lt(self.setting(batch, |c| p_of(c).unwrap_or(2.0))?)?;
            let thr = where_(&keep, &sorted, f32::INFINITY)?.min(&[-1], true)?;
            x = where_(&x.lt(&thr)?, f32::NEG_INFINITY, &x)?;
        }
        // 5. Min-p.
        if rows.iter().any(|c| sampling(c) && c.min_p.is_some_and(|m| m > 0.0)) {
            let probs = x.softmax(-1)?;
            let most = probs.max(&[-1], true)?;
            let m = self.setting(batch, |c| if sampling(c) { c.min_p.unwrap_or(0.0) } else { 0.0 })?;
            x = where_(&probs.lt(&most.mul(m)?)?, f32::NEG_INFINITY, &x)?;
        }
        Ok((x, greedy))
    }
}

/// The `[batch, vocab]` of a logits array, or the error.
fn dims(logits: &Array) -> Result<(usize, usize)> {
    match *logits.shape() {
        [b, v] if b > 0 && v > 0 && logits.dtype().is_float() => Ok((b, v)),
        _ => Err(Error::shape(
            "sampler",
            format!(
                "logits must be a non-empty float [batch, vocab] array, got {:?} of {}",
                logits.shape(),
                logits.dtype()
            ),
        )),
    }
}

/// The `k` largest values along the last axis, in decreasing order (one `Sort` node).
fn topk_values(x: &Array, k: usize) -> Result<Array> {
    let stream = target_stream(&[x])?;
    let spec = SortSpec { descending: true, k: Some(k), indices: false };
    let shape = crate::primitives::sort::shape(&spec, x.shape())?;
    Ok(Array::from_op(Primitive::Sort(spec), vec![crate::ops::on_device(x, &stream)], shape, x.dtype(), stream))
}

/// Rows of token ids per element of the comparison `[batch, rows, vocab]` of one step of
/// [`presence_mask`] (bounds its temporary).
const PRESENCE_CHUNK: usize = 1 << 22;

/// Which tokens of a vocabulary of `vocab` appear in each row of `history` (integer token
/// ids `[batch, len]`; negative ids, padding, match nothing): a bool mask `[batch, vocab]`
/// on the history's device, for [`Sampler::sample`]'s repetition penalty.
pub fn presence_mask(history: &Array, vocab: usize) -> Result<Array> {
    let [batch, len] = *history.shape() else {
        return Err(Error::shape("presence_mask", format!("history must be [batch, len], got {:?}", history.shape())));
    };
    if !history.dtype().is_int() {
        return Err(Error::dtype("presence_mask", history.dtype(), "token ids must be integers"));
    }
    let stream = target_stream(&[history])?;
    let ids = vocab_ids(vocab, &stream)?.reshape(&[1, 1, vocab as isize])?;
    let h = history.astype(DType::I64)?;
    let step = (PRESENCE_CHUNK / (batch * vocab).max(1)).clamp(1, len.max(1));
    let mut mask: Option<Array> = None;
    let mut at = 0;
    while at < len {
        let end = (at + step).min(len);
        let part = h.slice_axis(1, Some(at as isize), Some(end as isize), 1)?.expand_dims(-1)?;
        let any = part.eq(&ids)?.astype(DType::U8)?.max(&[1], false)?;
        mask = Some(match mask {
            Some(m) => m.maximum(&any)?,
            None => any,
        });
        at = end;
    }
    match mask {
        Some(m) => m.ne(0u8),
        None => Ok(crate::ops::on_device(&Array::zeros(&[batch, vocab], DType::Bool)?, &stream)),
    }
}

/// `mask` (`[batch, vocab]` bool) with each row's token of `tokens` (`[batch]` integer
/// ids, a sampler's output) marked present: the presence mask of the history one step on.
pub fn add_to_presence(mask: &Array, tokens: &Array) -> Result<Array> {
    let [batch, vocab] = *mask.shape() else {
        return Err(Error::shape("add_to_presence", format!("mask must be [batch, vocab], got {:?}", mask.shape())));
    };
    if tokens.shape() != [batch] || !tokens.dtype().is_int() {
        return Err(Error::shape(
            "add_to_presence",
            format!("tokens must be [{batch}] integers, got {:?} of {}", tokens.shape(), tokens.dtype()),
        ));
    }
    let stream = target_stream(&[mask])?;
    let ids = vocab_ids(vocab, &stream)?.reshape(&[1, vocab as isize])?;
    let hit = tokens.astype(DType::I64)?.expand_dims(-1)?.eq(&ids)?;
    hit.logical_or(mask)
}

/// `0, 1, .., vocab - 1` as i64 on `stream`.
fn vocab_ids(vocab: usize, stream: &Stream) -> Result<Array> {
    crate::shape::checked_size("presence_mask", &[vocab], DType::I64)?;
    Ok(Array::from_op(Primitive::Arange { start: 0.0, step: 1.0 }, Vec::new(), vec![vocab], DType::I64, stream.clone()))
}
