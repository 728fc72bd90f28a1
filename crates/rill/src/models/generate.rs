//! Text generation with a [`Llama`]: prefill, then one compiled decode step per token,
//! a pluggable [`Sampler`], stops (EOS, stop strings, a token budget), and the tokens as
//! a blocking iterator, an async method or a `futures_core::Stream`.
//!
//! A [`Generator`] holds one batch of sequences (one row each, prompts of any lengths)
//! and its own [`KvCache`]; the model is shared. Each step builds the lazy step and the
//! sampler's choice on the model's stream, evaluates only the chosen ids (blocking in
//! [`Generator::next_tokens`], awaited in [`Generator::next_tokens_async`]: the executor
//! thread never blocks), and turns ids into text with a streaming decoder that holds
//! back bytes of a cut character and text that may be the start of a stop string.
//! Nothing here creates a stream, a thread or a task.
//!
//! **Overlap.** Unless the sampler reads the token history on the host
//! ([`Sampler::reads_history`]) or [`GenerateOptions::overlap`] is off, a decode step is
//! built from the previous step's chosen ids as they are on the device, and submitted
//! before those ids are read back: the host builds and launches step `n + 1` while the
//! device computes step `n`, and reads step `n`'s ids while step `n + 1` runs. The
//! tokens are the ones a step-by-step run gives (each row's computation depends on its
//! own ids only; a stopped row's results are dropped either way); a generation that
//! ends computes one step it does not use.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use crate::array::Array;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::io::gguf_tokenizer::StreamDecoder;
use crate::random::Key;
use crate::sync::Arc;

use super::llama::{KvCache, Llama};

const OP: &str = "generate";

/// Cache capacities are rounded up to a multiple of this (one decode trace per bucket).
const CAPACITY_BUCKET: usize = 256;

/// What a [`Sampler`] is told about the step it samples for.
#[derive(Clone, Copy, Debug)]
pub struct SampleContext<'a> {
    /// 0 for the first generated token.
    pub step: usize,
    /// This step's random key (the options' seed folded with the step).
    pub key: Key,
    /// The prompt and the tokens generated so far, per row.
    pub history: &'a [&'a [u32]],
}

/// Chooses the next token of each row from the logits `[B, vocab]` (f32, lazy): returns
/// `[B]` ids of an integer dtype, lazily (an array op graph, evaluated by the generator).
/// Ops build on the model's stream (the generator enters it around the call).
pub trait Sampler: Send + Sync {
    /// The next token of each row.
    fn sample(&self, logits: &Array, ctx: &SampleContext<'_>) -> Result<Array>;

    /// Whether [`Sampler::sample`] reads [`SampleContext::history`] (true unless a sampler
    /// says otherwise). A sampler that does not lets the generator build each step from
    /// the previous step's ids on the device, before they are read back (see the module
    /// docs); its `history` then lacks the token the device is still choosing.
    fn reads_history(&self) -> bool {
        true
    }
}

impl<F> Sampler for F
where
    F: Fn(&Array, &SampleContext<'_>) -> Result<Array> + Send + Sync,
{
    fn sample(&self, logits: &Array, ctx: &SampleContext<'_>) -> Result<Array> {
        self(logits, ctx)
    }
}

/// The most likely token (the first of equal ones).
#[derive(Clone, Copy, Debug, Default)]
pub struct Greedy;

impl Sampler for Greedy {
    fn sample(&self, logits: &Array, _: &SampleContext<'_>) -> Result<Array> {
        logits.argmax(-1, false)
    }
    fn reads_history(&self) -> bool {
        false
    }
}

/// A draw from `softmax(logits / temperature)` (the Gumbel-max trick: the argmax of
/// `logits / T` plus Gumbel noise from the step's key); temperature 0 is greedy.
#[derive(Clone, Copy, Debug)]
pub struct Temperature(pub f64);

impl Sampler for Temperature {
    fn sample(&self, logits: &Array, ctx: &SampleContext<'_>) -> Result<Array> {
        let t = self.0;
        if !(t.is_finite() && t >= 0.0) {
            return Err(Error::invalid(OP, format!("temperature {t} must be finite and >= 0")));
        }
        if t == 0.0 {
            return logits.argmax(-1, false);
        }
        // u in [tiny, 1): -log(-log(u)) is finite.
        let u = crate::random::uniform(ctx.key, logits.shape(), f32::MIN_POSITIVE as f64, 1.0, DType::F32)?;
        let gumbel = u.log()?.neg()?.log()?.neg()?;
        logits.div(t)?.add(&gumbel)?.argmax(-1, false)
    }
    fn reads_history(&self) -> bool {
        false
    }
}

/// [`crate::sample::Sampler`] as a generation sampler: its filters (temperature, top-k,
/// top-p, min-p, repetition penalty over each row's prompt and generated tokens) and its
/// own per-row seeds, drawing at step `ctx.step` (the context's key is not used).
impl Sampler for crate::sample::Sampler {
    fn sample(&self, logits: &Array, ctx: &SampleContext<'_>) -> Result<Array> {
        let history = if self.needs_history() {
            // Token ids [B, longest], negative ids padding the shorter rows.
            let len = ctx.history.iter().map(|h| h.len()).max().unwrap_or(0);
            let mut ids = vec![-1i64; ctx.history.len() * len];
            for (r, row) in ctx.history.iter().enumerate() {
                for (j, &t) in row.iter().enumerate() {
                    ids[r * len + j] = i64::from(t);
                }
            }
            Some(Array::from_vec(ids, &[ctx.history.len(), len])?)
        } else {
            None
        };
        crate::sample::Sampler::sample(self, logits, history.as_ref(), ctx.step as u64)
    }
    fn reads_history(&self) -> bool {
        self.needs_history()
    }
}

/// Why a row stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// It produced the end-of-sequence token.
    Eos,
    /// Its text reached one of the stop strings (which is not part of the text).
    Stop,
    /// It produced `max_tokens` tokens.
    MaxTokens,
    /// Its cache is full.
    Capacity,
}

/// One generated token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Token {
    /// The token id.
    pub id: u32,
    /// The text this token completes: possibly empty (bytes of a cut character, or text
    /// that may start a stop string, are held until they are settled), with any held
    /// text flushed when the row finishes; never the stop string itself.
    pub text: String,
    /// Set on a row's last token.
    pub finish: Option<FinishReason>,
}

/// How to generate.
#[derive(Clone)]
pub struct GenerateOptions {
    /// Tokens to generate per row at most (default 256).
    pub max_tokens: usize,
    /// Stop a row at the tokenizer's end-of-sequence token (default true).
    pub stop_at_eos: bool,
    /// Stop a row when its text contains one of these (default none).
    pub stop: Vec<String>,
    /// Leave control tokens' text out of [`Token::text`] (default true).
    pub skip_special: bool,
    /// The seed of the sampler's keys (default 0).
    pub seed: u64,
    /// How the next token is chosen (default [`Greedy`]).
    pub sampler: Arc<dyn Sampler>,
    /// Positions of the cache (default: prompt plus `max_tokens`, rounded up to a
    /// multiple of 256, at most the model's context).
    pub capacity: Option<usize>,
    /// Build and submit each decode step before the previous step's ids are read back,
    /// when the sampler allows it (default true; see the module docs). Off: every step
    /// waits for the previous one's ids on the host.
    pub overlap: bool,
}

impl Default for GenerateOptions {
    fn default() -> GenerateOptions {
        GenerateOptions {
            max_tokens: 256,
            stop_at_eos: true,
            stop: Vec::new(),
            skip_special: true,
            seed: 0,
            sampler: Arc::new(Greedy),
            capacity: None,
            overlap: true,
        }
    }
}

impl std::fmt::Debug for GenerateOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GenerateOptions")
            .field("max_tokens", &self.max_tokens)
            .field("stop_at_eos", &self.stop_at_eos)
            .field("stop", &self.stop)
            .field("seed", &self.seed)
            .field("capacity", &self.capacity)
            .field("overlap", &self.overlap)
            .finish()
    }
}

struct Row {
    /// The prompt, then every generated token.
    history: Vec<u32>,
    generated: usize,
    decoder: StreamDecoder,
    /// Decoded text not yet given out (it may start a stop string).
    held: String,
    finish: Option<FinishReason>,
}

/// Generation of one batch of sequences (see the module docs). `Send`.
pub struct Generator {
    model: Llama,
    cache: KvCache,
    rows: Vec<Row>,
    /// The prompts, until the prefill has run.
    prompts: Option<Vec<Vec<u32>>>,
    options: GenerateOptions,
    /// Steps built so far (the prefill is step 0): the index of the next step's key.
    launched: usize,
    /// The ids of a step built and submitted before the previous step's ids were read
    /// (overlap), to be read by the next call.
    ahead: Option<Array>,
}

impl std::fmt::Debug for Generator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Generator").field("rows", &self.rows.len()).field("launched", &self.launched).finish()
    }
}

impl Llama {
    /// A generator for one prompt (token ids; see [`GgufTokenizer::encode`](crate::io::gguf_tokenizer::GgufTokenizer::encode)).
    pub fn generate(&self, prompt: &[u32], options: GenerateOptions) -> Result<Generator> {
        Generator::new(self, &[prompt.to_vec()], options)
    }
    /// A generator for several prompts decoded together, each with its own positions and
    /// stops.
    pub fn generate_batch(&self, prompts: &[Vec<u32>], options: GenerateOptions) -> Result<Generator> {
        Generator::new(self, prompts, options)
    }
    /// The text generated for `prompt` (tokenized with the model's tokenizer, a BOS
    /// token first when the file asks for one), blocking until a stop.
    pub fn generate_text(&self, prompt: &str, options: GenerateOptions) -> Result<String> {
        let ids = self.tokenizer().encode(prompt, true)?;
        let mut g = self.generate(&ids, options)?;
        let mut out = String::new();
        while let Some(t) = g.next_token()? {
            out.push_str(&t.text);
        }
        Ok(out)
    }
}

impl Generator {
    /// A generator for `prompts` (each non-empty) on `model`.
    pub fn new(model: &Llama, prompts: &[Vec<u32>], options: GenerateOptions) -> Result<Generator> {
        if prompts.is_empty() || prompts.iter().any(|p| p.is_empty()) {
            return Err(Error::invalid(OP, "every prompt needs at least one token"));
        }
        let context = model.config().context;
        let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
        let capacity = match options.capacity {
            Some(c) => c,
            None => {
                (longest + options.max_tokens).div_ceil(CAPACITY_BUCKET).saturating_mul(CAPACITY_BUCKET).min(context)
            }
        };
        if longest > capacity {
            return Err(Error::invalid(
                OP,
                format!(
                    "a prompt of {longest} tokens does not fit a cache of {capacity} positions (context {context})"
                ),
            ));
        }
        let cache = model.new_cache(prompts.len(), capacity)?;
        let rows = prompts
            .iter()
            .map(|p| Row {
                history: p.clone(),
                generated: 0,
                decoder: StreamDecoder::new(),
                held: String::new(),
                // A budget of no tokens: done before the first step.
                finish: (options.max_tokens == 0).then_some(FinishReason::MaxTokens),
            })
            .collect();
        Ok(Generator {
            model: model.clone(),
            cache,
            rows,
            prompts: Some(prompts.to_vec()),
            options,
            launched: 0,
            ahead: None,
        })
    }

    /// Rows (sequences).
    pub fn batch(&self) -> usize {
        self.rows.len()
    }
    /// The tokens row `row` generated so far.
    pub fn generated(&self, row: usize) -> &[u32] {
        self.rows.get(row).map(|r| &r.history[r.history.len() - r.generated..]).unwrap_or(&[])
    }
    /// Why row `row` stopped (`None` while it runs).
    pub fn finish_reason(&self, row: usize) -> Option<FinishReason> {
        self.rows.get(row).and_then(|r| r.finish)
    }
    /// True when every row has stopped.
    pub fn is_done(&self) -> bool {
        self.rows.iter().all(|r| r.finish.is_some())
    }

    /// The next token of every row (`None` for a row that stopped before this step),
    /// blocking until it is computed; `None` once every row has stopped.
    pub fn next_tokens(&mut self) -> Result<Option<Vec<Option<Token>>>> {
        let Some(ids) = self.launch()? else { return Ok(None) };
        if let Some(next) = self.launch_ahead(&ids)? {
            crate::submit(std::slice::from_ref(&next))?;
            self.ahead = Some(next);
        }
        let v = ids.to_vec::<i32>()?;
        self.absorb(&v).map(Some)
    }

    /// [`Generator::next_tokens`] for async code: awaits the step without blocking the
    /// executor thread.
    pub async fn next_tokens_async(&mut self) -> Result<Option<Vec<Option<Token>>>> {
        let Some(ids) = self.launch()? else { return Ok(None) };
        if let Some(next) = self.launch_ahead(&ids)? {
            // Started now; its future is dropped (that cancels nothing): what it could
            // not submit yet without blocking is submitted when the step is awaited.
            drop(crate::async_eval(std::slice::from_ref(&next)));
            self.ahead = Some(next);
        }
        crate::async_eval(std::slice::from_ref(&ids)).await?;
        let v = ids.to_vec::<i32>()?;
        self.absorb(&v).map(Some)
    }

    /// The next token of a one-row generator, blocking; `None` after its last.
    pub fn next_token(&mut self) -> Result<Option<Token>> {
        self.single()?;
        Ok(self.next_tokens()?.and_then(|mut v| v.swap_remove(0)))
    }

    /// [`Generator::next_token`] for async code.
    pub async fn next_token_async(&mut self) -> Result<Option<Token>> {
        self.single()?;
        Ok(self.next_tokens_async().await?.and_then(|mut v| v.swap_remove(0)))
    }

    /// The tokens of a one-row generator as a `futures_core::Stream` (each step awaited
    /// as in [`Generator::next_token_async`]). An error ends the stream after it.
    pub fn into_stream(self) -> TokenStream {
        TokenStream { state: StreamState::Idle(Box::new(self)) }
    }

    fn single(&self) -> Result<()> {
        if self.rows.len() == 1 {
            Ok(())
        } else {
            Err(Error::invalid(OP, format!("next_token needs one row, this generator has {}", self.rows.len())))
        }
    }

    /// Builds this step's lazy ids `[B]` (i32): the prefill on the first call, then one
    /// decode step. `None` when every row has stopped.
    fn launch(&mut self) -> Result<Option<Array>> {
        if self.is_done() {
            self.ahead = None;
            return Ok(None);
        }
        if let Some(ids) = self.ahead.take() {
            return Ok(Some(ids));
        }
        let logits = match self.prompts.take() {
            Some(p) => {
                let rows: Vec<&[u32]> = p.iter().map(Vec::as_slice).collect();
                self.model.forward(&rows, &mut self.cache)?
            }
            None => {
                let furthest = self.cache.positions().iter().max().copied().unwrap_or(0);
                if furthest >= self.cache.capacity() {
                    for r in self.rows.iter_mut().filter(|r| r.finish.is_none()) {
                        r.finish = Some(FinishReason::Capacity);
                    }
                    return Ok(None);
                }
                // Stopped rows run along (their results are dropped) so the shape stays.
                let last: Vec<u32> = self
                    .rows
                    .iter()
                    .map(|r| if r.finish.is_none() { r.history.last().copied().unwrap_or(0) } else { 0 })
                    .collect();
                let rows: Vec<&[u32]> = last.iter().map(std::slice::from_ref).collect();
                self.model.forward(&rows, &mut self.cache)?
            }
        };
        self.choose(&logits).map(Some)
    }

    /// The step after the one whose ids are `ids` (not yet read), built from `ids` as
    /// they are on the device; `None` when overlap is off or not allowed, or when that
    /// step would not run (every running row reaches its token budget with `ids`, or the
    /// cache is full).
    fn launch_ahead(&mut self, ids: &Array) -> Result<Option<Array>> {
        let o = &self.options;
        if !o.overlap || o.sampler.reads_history() || self.prompts.is_some() {
            return Ok(None);
        }
        let continues = self.rows.iter().any(|r| r.finish.is_none() && r.generated + 1 < o.max_tokens);
        let furthest = self.cache.positions().iter().max().copied().unwrap_or(0);
        if !continues || furthest >= self.cache.capacity() {
            return Ok(None);
        }
        let logits = self.model.forward_ids(ids, &mut self.cache)?;
        self.choose(&logits).map(Some)
    }

    /// The sampler's ids `[B]` (i32, lazy) for the logits of step `launched`.
    fn choose(&mut self, logits: &Array) -> Result<Array> {
        let history: Vec<&[u32]> = self.rows.iter().map(|r| r.history.as_slice()).collect();
        let step = self.launched;
        self.launched += 1;
        let key = Key::new(self.options.seed).fold_in(step as u32);
        let ctx = SampleContext { step, key, history: &history };
        let ids = {
            let _g = self.model.stream().enter();
            self.options.sampler.sample(logits, &ctx)?.to_dtype(DType::I32)?
        };
        if ids.shape() != [self.rows.len()] {
            return Err(Error::shape(
                OP,
                format!("the sampler returned shape {:?} for {} rows", ids.shape(), self.rows.len()),
            ));
        }
        Ok(ids)
    }

    /// Records the chosen ids and turns them into tokens.
    fn absorb(&mut self, ids: &[i32]) -> Result<Vec<Option<Token>>> {
        let tok = self.model.tokenizer();
        let eos = tok.eos_id();
        let vocab = self.model.config().vocab;
        let o = &self.options;
        let mut out = Vec::with_capacity(self.rows.len());
        for (r, &id) in self.rows.iter_mut().zip(ids) {
            if r.finish.is_some() {
                out.push(None);
                continue;
            }
            if id < 0 || id as usize >= vocab {
                return Err(Error::invalid(OP, format!("the sampler chose id {id}, outside the vocabulary ({vocab})")));
            }
            let id = id as u32;
            r.history.push(id);
            r.generated += 1;
            let is_eos = o.stop_at_eos && Some(id) == eos;
            let piece = if is_eos { String::new() } else { r.decoder.push(tok, id, o.skip_special)? };
            r.held.push_str(&piece);
            let mut text;
            if let Some(at) = first_stop(&r.held, &o.stop) {
                text = r.held[..at].to_string();
                r.held.clear();
                r.finish = Some(FinishReason::Stop);
            } else if is_eos || r.generated >= o.max_tokens {
                text = std::mem::take(&mut r.held);
                text.push_str(&r.decoder.finish());
                r.finish = Some(if is_eos { FinishReason::Eos } else { FinishReason::MaxTokens });
            } else {
                let keep = held_suffix(&r.held, &o.stop);
                text = r.held[..r.held.len() - keep].to_string();
                r.held.drain(..r.held.len() - keep);
            }
            out.push(Some(Token { id, text, finish: r.finish }));
        }
        Ok(out)
    }
}

/// The byte offset of the earliest stop string in `s`.
fn first_stop(s: &str, stops: &[String]) -> Option<usize> {
    stops.iter().filter(|t| !t.is_empty()).filter_map(|t| s.find(t.as_str())).min()
}

/// The length of the longest suffix of `s` that is a proper prefix of a stop string
/// (held back: the next tokens may complete it).
fn held_suffix(s: &str, stops: &[String]) -> usize {
    let mut best = 0;
    for (i, _) in s.char_indices() {
        let tail = &s[i..];
        if stops.iter().any(|t| t.len() > tail.len() && t.starts_with(tail)) {
            best = best.max(tail.len());
        }
    }
    best
}

type StepFuture = Pin<Box<dyn Future<Output = (Box<Generator>, Result<Option<Token>>)> + Send>>;

enum StreamState {
    Idle(Box<Generator>),
    Running(StepFuture),
    Done,
}

/// The tokens of a one-row [`Generator`] as a `futures_core::Stream` of
/// `Result<Token>`: it ends after the last token, or after an error.
pub struct TokenStream {
    state: StreamState,
}

impl std::fmt::Debug for TokenStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TokenStream")
    }
}

impl futures_core::Stream for TokenStream {
    type Item = Result<Token>;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Token>>> {
        loop {
            match std::mem::replace(&mut self.state, StreamState::Done) {
                StreamState::Done => return Poll::Ready(None),
                StreamState::Idle(mut g) => {
                    self.state = StreamState::Running(Box::pin(async move {
                        let r = g.next_token_async().await;
                        (g, r)
                    }));
                }
                StreamState::Running(mut fut) => match fut.as_mut().poll(cx) {
                    Poll::Pending => {
                        self.state = StreamState::Running(fut);
                        return Poll::Pending;
                    }
                    Poll::Ready((g, r)) => {
                        return Poll::Ready(match r {
                            Ok(Some(t)) => {
                                self.state = StreamState::Idle(g);
                                Some(Ok(t))
                            }
                            Ok(None) => None,
                            Err(e) => Some(Err(e)),
                        });
                    }
                },
            }
        }
    }
}

impl TokenStream {
    /// The next token, for callers without a `StreamExt`: `None` at the end.
    pub async fn next(&mut self) -> Option<Result<Token>> {
        std::future::poll_fn(|cx| futures_core::Stream::poll_next(Pin::new(&mut *self), cx)).await
    }
}
