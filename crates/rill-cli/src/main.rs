//! `rill`: the command-line demo and benchmark driver.
//!
//! `rill demo` builds and evaluates arrays on the best device present (a GPU when one is
//! usable, else the CPU) from several OS threads and tokio tasks, each on its own
//! stream, and prints results, timings and the runtime's counters.
//! `rill bench` times the operations listed in docs/PERFORMANCE.md; `rill bench matrix`
//! lists or times the generated benchmark matrix (`matrix.rs`).
//! `rill info` prints the devices and the runtime configuration.

mod bench;
mod demo;
mod matrix;
mod sdpa_bench;

use rill::Device;

fn usage() -> ! {
    eprintln!(
        "usage: rill <command> [options]\n\n\
         commands:\n  \
         demo [--device cpu|gpu] [--threads N] [--tasks N]   evaluate arrays from threads and tasks\n  \
         bench [--device cpu|gpu] [NAME...]                  time the benchmarks (all when no NAME)\n  \
         bench matrix [--list] [--device cpu|gpu] [--sizes MIN:MAX:STEP] [--family A,B] [--filter TEXT]\n  \
         \x20            [--cases FILE]                          the benchmark matrix (JSON lines: crates/rill-cli/src/matrix.rs)\n  \
         info                                                devices and runtime configuration"
    );
    std::process::exit(2)
}

/// Parses `--device`; the best device present when absent.
fn parse_device(args: &[String]) -> Result<Device, String> {
    match flag(args, "--device").as_deref() {
        None => Ok(Device::best()),
        Some("cpu") => Ok(Device::cpu()),
        Some("gpu") => Device::gpu(0).map_err(|e| e.to_string()),
        Some(other) => Err(format!("unknown device {other:?} (expected cpu or gpu)")),
    }
}

fn flag(args: &[String], name: &str) -> Option<String> {
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1).cloned())
}

fn flag_usize(args: &[String], name: &str, default: usize) -> Result<usize, String> {
    match flag(args, name) {
        None => Ok(default),
        Some(v) => v.parse().map_err(|_| format!("{name} expects a number, got {v:?}")),
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
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(cmd) = args.first().cloned() else { usage() };
    let rest = &args[1..];
    let result = match cmd.as_str() {
        "demo" => parse_device(rest).and_then(|d| {
            let threads = flag_usize(rest, "--threads", 4)?;
            let tasks = flag_usize(rest, "--tasks", 8)?;
            demo::run(d, threads, tasks).map_err(|e| e.to_string())
        }),
        "bench" if rest.first().map(String::as_str) == Some("matrix") => {
            // The cases depend only on the kind of device named (its default sizes), so
            // `--list` needs none.
            let gpu = match flag(rest, "--device").as_deref() {
                Some("gpu") => true,
                Some(_) => false,
                None => Device::best().is_gpu(),
            };
            matrix::run(gpu, || parse_device(rest), &rest[1..])
        }
        "bench" => parse_device(rest).and_then(|d| {
            let names: Vec<String> = rest
                .iter()
                .enumerate()
                .filter(|(i, a)| !a.starts_with("--") && (*i == 0 || !rest[i - 1].starts_with("--")))
                .map(|(_, a)| a.clone())
                .collect();
            bench::run(d, &names).map_err(|e| e.to_string())
        }),
        "info" => {
            println!("rill {}", env!("CARGO_PKG_VERSION"));
            println!("cpu worker threads: {}", rill::runtime::cpu_threads());
            println!("gpus: {}", Device::gpu_count());
            match Device::gpu(0) {
                Ok(d) => println!("best device: {d}"),
                Err(e) => println!("best device: cpu ({e})"),
            }
            Ok(())
        }
        "-h" | "--help" | "help" => usage(),
        other => Err(format!("unknown command {other:?}")),
    };
    if let Err(e) = result {
        eprintln!("rill: {e}");
        std::process::exit(1);
    }
}
