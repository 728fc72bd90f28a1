//! `rill`: sentence embeddings, the runtime demo and the benchmark driver.
//!
//! `rill embed` embeds sentences with a sentence-transformers model on the best device
//! present (`embed.rs`; docs/MODELS.md).
//! `rill generate` streams text from a llama-family GGUF model (`generate.rs`;
//! docs/MODELS.md).
//! `rill demo` builds and evaluates arrays on the best device present (a GPU when one is
//! usable, else the CPU) from several OS threads and tokio tasks, each on its own
//! stream, and prints results, timings and the runtime's counters.
//! `rill bench` times the operations listed in docs/PERFORMANCE.md; `rill bench matrix`
//! lists or times the generated benchmark matrix (`matrix.rs`); `rill bench generate` times the
//! language model (`bench_generate.rs`).
//! `rill info` prints the devices and the runtime configuration.

mod bench;
mod bench_embed;
mod bench_generate;
mod bench_train;
mod demo;
mod embed;
mod generate;
mod matrix;
mod qmatmul_bench;
mod sdpa_bench;

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};
use rill::Device;

#[derive(Parser)]
#[command(
    name = "rill",
    version,
    propagate_version = true,
    about = "Lazy arrays on explicit streams: sentence embeddings, text generation, the runtime demo, benchmarks"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Embed sentences with a sentence-transformers model (JSON lines or a .npy file)
    Embed(embed::EmbedArgs),
    /// Generate text from a llama-family GGUF model, streamed to stdout
    Generate(generate::GenerateArgs),
    /// Evaluate arrays from several OS threads and tokio tasks, each on its own stream
    Demo(DemoArgs),
    /// Time the benchmarks (all but `embed` when no NAME is given)
    Bench(BenchArgs),
    /// Print the devices and the runtime configuration
    Info,
}

/// `--device cpu|gpu`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum DeviceArg {
    /// The CPU.
    Cpu,
    /// GPU 0.
    Gpu,
}

/// The device named by `--device`; the best device present when absent.
pub fn device_of(arg: Option<DeviceArg>) -> Result<Device, String> {
    match arg {
        None => Ok(Device::best()),
        Some(DeviceArg::Cpu) => Ok(Device::cpu()),
        Some(DeviceArg::Gpu) => Device::gpu(0).map_err(|e| format!("no GPU: {e}")),
    }
}

#[derive(Args)]
struct DemoArgs {
    /// The device (default: the best present)
    #[arg(long, value_enum)]
    device: Option<DeviceArg>,
    /// OS threads evaluating at once
    #[arg(long, default_value_t = 4)]
    threads: usize,
    /// tokio tasks evaluating at once
    #[arg(long, default_value_t = 8)]
    tasks: usize,
}

#[derive(Args)]
#[command(args_conflicts_with_subcommands = true)]
struct BenchArgs {
    #[command(subcommand)]
    sub: Option<BenchCommand>,
    /// List the benchmarks and exit
    #[arg(long)]
    list: bool,
    /// The device (default: the best present)
    #[arg(long, value_enum)]
    device: Option<DeviceArg>,
    /// The model directory of the `embed` benchmark (default: the cached default model)
    #[arg(long, value_name = "DIR")]
    model: Option<PathBuf>,
    /// Benchmarks to run (see --list)
    #[arg(value_name = "NAME")]
    names: Vec<String>,
}

#[derive(Subcommand)]
enum BenchCommand {
    /// List or time the generated benchmark matrix (JSON lines; see crates/rill-cli/src/matrix.rs)
    Matrix(matrix::MatrixArgs),
    /// Time the language model's prefill and decode (JSON lines; see crates/rill-cli/src/bench_generate.rs)
    Generate(bench_generate::GenerateBenchArgs),
}

fn bench(args: &BenchArgs) -> Result<(), String> {
    match &args.sub {
        Some(BenchCommand::Matrix(m)) => return matrix::run(m),
        Some(BenchCommand::Generate(g)) => return bench_generate::run(g),
        None => {}
    }
    if args.list {
        for (name, what) in bench::BENCHMARKS.iter().chain(bench_embed::BENCHMARKS) {
            println!("{name:<14} {what}");
        }
        println!("{:<14} the generated benchmark matrix (rill bench matrix --help)", "matrix");
        println!("{:<14} the language model's prefill and decode (rill bench generate --help)", "generate");
        return Ok(());
    }
    // `train:WORKLOAD[:DTYPE]` runs only the matching cases of `train`.
    let known = |n: &str| {
        let n = if n.starts_with("train:") { "train" } else { n };
        bench::BENCHMARKS.iter().chain(bench_embed::BENCHMARKS).any(|(b, _)| *b == n)
    };
    if let Some(n) = args.names.iter().find(|n| !known(n)) {
        return Err(format!("unknown benchmark {n:?} (rill bench --list names them)"));
    }
    let device = device_of(args.device)?;
    let ops: Vec<String> = args.names.iter().filter(|n| *n != "embed").cloned().collect();
    if args.names.is_empty() || !ops.is_empty() {
        bench::run(device, &ops).map_err(|e| e.to_string())?;
    }
    if args.names.iter().any(|n| n == "embed") {
        bench_embed::run(device, args.model.as_deref())?;
    }
    Ok(())
}

fn info() {
    println!("rill {}", env!("CARGO_PKG_VERSION"));
    println!("cpu worker threads: {}", rill::runtime::cpu_threads());
    println!("gpus: {}", Device::gpu_count());
    match Device::gpu(0) {
        Ok(d) => println!("best device: {d}"),
        Err(e) => println!("best device: cpu ({e})"),
    }
    match rill::io::cache::cache_dir() {
        Ok(d) => println!("model cache: {}", d.display()),
        Err(e) => println!("model cache: none ({e})"),
    }
}

fn main() {
    // Like other Unix tools, end quietly when the reader of stdout goes away (`rill bench |
    // head`): the Rust runtime ignores SIGPIPE, which makes `println!` panic instead.
    #[cfg(unix)]
    // SAFETY: restores the default action of one signal before any thread starts.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let cli = Cli::parse();
    let result = match &cli.command {
        Command::Embed(a) => embed::run(a),
        Command::Generate(a) => generate::run(a),
        Command::Demo(a) => {
            device_of(a.device).and_then(|d| demo::run(d, a.threads, a.tasks).map_err(|e| e.to_string()))
        }
        Command::Bench(a) => bench(a),
        Command::Info => {
            info();
            Ok(())
        }
    };
    if let Err(e) = result {
        eprintln!("rill: {e}");
        std::process::exit(1);
    }
}
