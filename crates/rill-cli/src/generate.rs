//! `rill generate`: text generation from a llama-family GGUF model (docs/MODELS.md).
//!
//! The tokens stream to stdout as they are decoded (the prompt is not echoed); the
//! token count and tokens per second go to stderr at the end. With `--chat` the prompt is
//! one user message rendered through the model's chat template. Without `--model` the
//! default model is used, fetched into the model cache on first use.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use clap::Args;
use rill::io::gguf_tokenizer::ChatMessage;
use rill::models::llama::{FinishReason, GenerateOptions, Greedy, Llama, LoadOptions, Sampler, Temperature};
use rill::sample::SamplerConfig;

use crate::DeviceArg;
use crate::embed::DtypeArg;

/// Which language model to load, where and how (shared by `generate` and `bench generate`).
#[derive(Args)]
pub struct ModelArgs {
    /// The GGUF file; default: the default model, fetched into the model cache on first use
    #[arg(long, value_name = "FILE.gguf")]
    pub model: Option<PathBuf>,
    /// The device (default: the best present)
    #[arg(long, value_enum)]
    pub device: Option<DeviceArg>,
    /// The dtype of the activations and of the float (or dequantized) weights
    #[arg(long, value_enum, default_value = "f32")]
    pub dtype: DtypeArg,
    /// Dequantize block-quantized weights at load instead of reading the packed blocks
    #[arg(long)]
    pub dequantize: bool,
}

impl ModelArgs {
    /// The model these arguments name, loaded.
    pub fn load(&self) -> Result<Llama, String> {
        let device = crate::device_of(self.device)?;
        let path = match &self.model {
            Some(p) => p.clone(),
            None => rill::io::cache::default_llm().map_err(|e| e.to_string())?,
        };
        let options = LoadOptions { dtype: self.dtype.dtype(), packed: !self.dequantize };
        Llama::load(&path, device, options).map_err(|e| e.to_string())
    }
}

#[derive(Args)]
pub struct GenerateArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Tokens to generate at most
    #[arg(long, default_value_t = 256)]
    pub max_tokens: usize,
    /// Sampling temperature (0: greedy, the default)
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub temperature: f64,
    /// Sample from the K most likely tokens only
    #[arg(long, value_name = "K")]
    pub top_k: Option<usize>,
    /// Sample from the smallest set of most likely tokens whose probability reaches P
    #[arg(long, value_name = "P")]
    pub top_p: Option<f64>,
    /// Drop tokens less likely than P times the most likely one
    #[arg(long, value_name = "P")]
    pub min_p: Option<f64>,
    /// Penalise tokens of the prompt and of the text so far (1: none)
    #[arg(long, value_name = "R", allow_negative_numbers = true)]
    pub repetition_penalty: Option<f64>,
    /// Seed of the sampler's random keys
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Put the prompt through the model's chat template as a user message
    #[arg(long)]
    pub chat: bool,
    /// Stop at this text (may be given several times)
    #[arg(long, value_name = "TEXT")]
    pub stop: Vec<String>,
    /// The prompt
    pub prompt: String,
}

fn sampler(args: &GenerateArgs) -> Result<Arc<dyn Sampler>, String> {
    if !(args.temperature.is_finite() && args.temperature >= 0.0) {
        return Err(format!("--temperature must be finite and >= 0, got {}", args.temperature));
    }
    let filtered = args.top_k.is_some() || args.top_p.is_some() || args.min_p.is_some();
    if !filtered && args.repetition_penalty.is_none() {
        return Ok(if args.temperature == 0.0 { Arc::new(Greedy) } else { Arc::new(Temperature(args.temperature)) });
    }
    let config = SamplerConfig {
        temperature: args.temperature as f32,
        top_k: args.top_k,
        top_p: args.top_p.map(|p| p as f32),
        min_p: args.min_p.map(|p| p as f32),
        repetition_penalty: args.repetition_penalty.map(|p| p as f32),
        seed: args.seed,
    };
    Ok(Arc::new(rill::sample::Sampler::new(config).map_err(|e| e.to_string())?))
}

pub fn run(args: &GenerateArgs) -> Result<(), String> {
    let sampler = sampler(args)?;
    let model = args.model.load()?;
    let tok = model.tokenizer();
    let text = if args.chat {
        tok.apply_chat_template(&[ChatMessage::new("user", args.prompt.clone())], true).map_err(|e| e.to_string())?
    } else {
        args.prompt.clone()
    };
    // A chat template writes its own BOS token when it wants one.
    let ids = tok.encode(&text, !args.chat).map_err(|e| e.to_string())?;
    if ids.is_empty() {
        return Err("the prompt has no tokens".into());
    }
    let opts = GenerateOptions {
        max_tokens: args.max_tokens,
        stop: args.stop.clone(),
        seed: args.seed,
        sampler,
        ..Default::default()
    };
    let mut g = model.generate(&ids, opts).map_err(|e| e.to_string())?;
    let mut out = std::io::stdout().lock();
    let start = Instant::now();
    let mut first = None;
    let mut n = 0usize;
    while let Some(t) = g.next_token().map_err(|e| e.to_string())? {
        if first.is_none() {
            first = Some(start.elapsed());
        }
        n += 1;
        out.write_all(t.text.as_bytes()).and_then(|_| out.flush()).map_err(|e| format!("stdout: {e}"))?;
    }
    writeln!(out).map_err(|e| format!("stdout: {e}"))?;
    let total = start.elapsed();
    let prefill = first.unwrap_or(total);
    let decode = total.saturating_sub(prefill);
    let rate = if n > 1 { (n - 1) as f64 / decode.as_secs_f64().max(1e-9) } else { 0.0 };
    eprintln!(
        "rill: {} prompt tokens in {:.1} ms, {n} tokens generated, {rate:.1} tokens/s (stopped: {}; on {})",
        ids.len(),
        prefill.as_secs_f64() * 1e3,
        match g.finish_reason(0) {
            Some(FinishReason::Eos) => "end of sequence",
            Some(FinishReason::Stop) => "stop text",
            Some(FinishReason::MaxTokens) => "max tokens",
            Some(FinishReason::Capacity) => "context full",
            None => "not finished",
        },
        model.stream().device()
    );
    Ok(())
}
