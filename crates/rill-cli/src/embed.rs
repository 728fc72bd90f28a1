//! `rill embed`: sentence embeddings on the command line (docs/MODELS.md).
//!
//! Sentences come from the arguments, or one per line from `--input FILE` (`-` is
//! stdin; an empty line is an empty sentence), or from stdin when it is not a terminal.
//! Without `--output` each embedding is printed as a JSON line
//! `{"index": i, "embedding": [...]}` in input order; `--output FILE.npy` writes an
//! `N x D` float32 array instead. Without `--model` the default model is used, fetched
//! into the model cache on first use (`rill info` prints the folder).

use std::io::{BufWriter, IsTerminal, Read, Write};
use std::path::{Path, PathBuf};

use clap::{Args, ValueEnum};
use rill::DType;
use rill::models::bert::Embedder;

use crate::DeviceArg;

/// `--dtype`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum DtypeArg {
    /// 32-bit floats.
    F32,
    /// IEEE half precision.
    F16,
    /// bfloat16.
    Bf16,
}

impl DtypeArg {
    pub fn dtype(self) -> DType {
        match self {
            DtypeArg::F32 => DType::F32,
            DtypeArg::F16 => DType::F16,
            DtypeArg::Bf16 => DType::BF16,
        }
    }
}

#[derive(Args)]
pub struct EmbedArgs {
    /// The model directory (Hugging Face / sentence-transformers layout); default: the
    /// default model, fetched into the model cache on first use
    #[arg(long, value_name = "DIR")]
    pub model: Option<PathBuf>,
    /// Read sentences from FILE, one per line (`-` for stdin)
    #[arg(long, value_name = "FILE", conflicts_with = "sentences")]
    pub input: Option<String>,
    /// Write an N x D float32 .npy file instead of JSON lines on stdout
    #[arg(long, value_name = "FILE.npy")]
    pub output: Option<PathBuf>,
    /// The device (default: the best present)
    #[arg(long, value_enum)]
    pub device: Option<DeviceArg>,
    /// Sentences per batch
    #[arg(long, default_value_t = Embedder::DEFAULT_BATCH_SIZE, value_parser = positive)]
    pub batch_size: usize,
    /// The dtype the model runs in (embeddings are written as float32)
    #[arg(long, value_enum, default_value = "f32")]
    pub dtype: DtypeArg,
    /// Sentences to embed
    #[arg(value_name = "SENTENCE")]
    pub sentences: Vec<String>,
}

/// A count of at least 1.
fn positive(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

/// The lines of `text`: an empty line is an empty sentence; a final newline ends the
/// last line rather than starting an empty one; `\r\n` counts as one line end.
fn lines_of(text: &str) -> Vec<String> {
    text.lines().map(str::to_string).collect()
}

fn read_input(args: &EmbedArgs) -> Result<Vec<String>, String> {
    let mut bytes = Vec::new();
    let name = match args.input.as_deref() {
        Some("-") => {
            std::io::stdin().read_to_end(&mut bytes).map_err(|e| format!("cannot read stdin: {e}"))?;
            "stdin".to_string()
        }
        Some(path) => {
            bytes = std::fs::read(path).map_err(|e| format!("cannot read {path}: {e}"))?;
            path.to_string()
        }
        None if !args.sentences.is_empty() => return Ok(args.sentences.clone()),
        None if std::io::stdin().is_terminal() => {
            return Err("no sentences: give them as arguments, or --input FILE (- for stdin)".into());
        }
        None => {
            std::io::stdin().read_to_end(&mut bytes).map_err(|e| format!("cannot read stdin: {e}"))?;
            "stdin".to_string()
        }
    };
    let text = String::from_utf8(bytes).map_err(|e| format!("{name} is not UTF-8 text: {e}"))?;
    Ok(lines_of(&text))
}

/// The bytes of an `N x D` little-endian float32 `.npy` file (format version 1.0).
pub fn npy_bytes(rows: &[Vec<f32>], d: usize) -> Vec<u8> {
    let dict = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': ({}, {}), }}", rows.len(), d);
    // Magic (6) + version (2) + length (2) + dict + padding + '\n', a multiple of 64.
    let unpadded = 10 + dict.len() + 1;
    let pad = unpadded.next_multiple_of(64) - unpadded;
    let mut out = Vec::with_capacity(unpadded + pad + rows.len() * d * 4);
    out.extend_from_slice(b"\x93NUMPY\x01\x00");
    out.extend_from_slice(&((dict.len() + pad + 1) as u16).to_le_bytes());
    out.extend_from_slice(dict.as_bytes());
    out.extend(std::iter::repeat_n(b' ', pad));
    out.push(b'\n');
    for r in rows {
        for x in r {
            out.extend_from_slice(&x.to_le_bytes());
        }
    }
    out
}

fn write_npy(path: &Path, rows: &[Vec<f32>], d: usize) -> Result<(), String> {
    std::fs::write(path, npy_bytes(rows, d)).map_err(|e| format!("cannot write {}: {e}", path.display()))
}

fn write_json_lines(rows: &[Vec<f32>]) -> Result<(), String> {
    let mut out = BufWriter::new(std::io::stdout().lock());
    for (i, r) in rows.iter().enumerate() {
        let mut line = format!("{{\"index\": {i}, \"embedding\": [");
        for (j, x) in r.iter().enumerate() {
            if j > 0 {
                line.push_str(", ");
            }
            line.push_str(&x.to_string());
        }
        line.push_str("]}\n");
        out.write_all(line.as_bytes()).map_err(|e| format!("cannot write to stdout: {e}"))?;
    }
    out.flush().map_err(|e| format!("cannot write to stdout: {e}"))
}

pub fn run(args: &EmbedArgs) -> Result<(), String> {
    let sentences = read_input(args)?;
    let device = crate::device_of(args.device)?;
    let dir = match &args.model {
        Some(d) => d.clone(),
        None => rill::io::cache::default_model().map_err(|e| format!("cannot get the default model: {e}"))?,
    };
    let embedder = Embedder::load(&dir, device, args.dtype.dtype())
        .and_then(|e| e.with_batch_size(args.batch_size))
        .map_err(|e| format!("cannot load the model: {e}"))?;
    // A bar only where someone watches, and only when there is more than one batch.
    let bar = (std::io::stderr().is_terminal() && sentences.len() > args.batch_size)
        .then(|| indicatif::ProgressBar::new(sentences.len() as u64));
    let rows = embedder
        .embed_with(&sentences, |done| {
            if let Some(b) = &bar {
                b.set_position(done as u64);
            }
        })
        .map_err(|e| e.to_string())?;
    if let Some(b) = &bar {
        b.finish_and_clear();
    }
    match &args.output {
        Some(path) => write_npy(path, &rows, embedder.dimension()),
        None => write_json_lines(&rows),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn npy_header_is_aligned_and_describes_the_array() {
        for (n, d) in [(0usize, 384usize), (1, 1), (3, 7), (1000, 768)] {
            let rows: Vec<Vec<f32>> = (0..n).map(|i| (0..d).map(|j| (i * d + j) as f32).collect()).collect();
            let b = npy_bytes(&rows, d);
            assert_eq!(&b[..8], b"\x93NUMPY\x01\x00");
            let hl = u16::from_le_bytes([b[8], b[9]]) as usize;
            assert_eq!((10 + hl) % 64, 0);
            let header = std::str::from_utf8(&b[10..10 + hl]).unwrap();
            assert!(header.ends_with('\n'));
            assert!(header.contains(&format!("'shape': ({n}, {d})")), "{header}");
            assert_eq!(b.len(), 10 + hl + n * d * 4);
            let body = &b[10 + hl..];
            for (k, c) in body.chunks(4).enumerate() {
                assert_eq!(f32::from_le_bytes(c.try_into().unwrap()), k as f32);
            }
        }
    }

    #[test]
    fn lines_keep_empty_sentences() {
        assert_eq!(lines_of("a\n\nb\n"), vec!["a", "", "b"]);
        assert_eq!(lines_of("a\r\n\r\nb"), vec!["a", "", "b"]);
        assert_eq!(lines_of("\n"), vec![""]);
        assert!(lines_of("").is_empty());
    }
}
