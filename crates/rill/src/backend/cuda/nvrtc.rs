//! NVRTC compilation for the device's architecture and the process-wide kernel cache,
//! keyed by (device, kernel key). Programs are created and destroyed by hand so that no
//! cudarc `Drop` can panic.

use std::collections::HashMap;
use std::ffi::{CStr, CString};
use std::panic::{AssertUnwindSafe, catch_unwind};

use cudarc::driver::{CudaFunction, CudaModule, LaunchConfig};
use cudarc::nvrtc::Ptx;

use crate::error::{Error, Result};
use crate::sync::{Arc, Mutex};

use super::device::DeviceState;
use super::driver::Driver;

/// A loaded module and the functions already looked up in it.
struct Entry {
    module: Arc<CudaModule>,
    funcs: Vec<(String, CudaFunction)>,
}
/// One map per device ordinal, keyed by kernel key (looked up by `&str`: no allocation
/// on a hit, which is every launch after the first).
static CACHE: Mutex<Vec<HashMap<String, Entry>>> = Mutex::new(Vec::new());

/// Threads per block of the elementwise kernels.
pub(crate) const BLOCK: u32 = 256;

/// A launch of one thread per item of `n` for a grid-stride kernel (which loops only past
/// 2^30 blocks). One item per thread, no loop: faster for bandwidth-bound kernels than a
/// small grid that loops (`bench/kernel_lab.py` times both).
pub(crate) fn grid_for(n: usize) -> LaunchConfig {
    grid_1d(n, BLOCK)
}

/// One thread per item of `n` in blocks of `block` threads (at most 2^30 blocks).
pub(crate) fn grid_1d(n: usize, block: u32) -> LaunchConfig {
    let blocks = n.div_ceil(block as usize).clamp(1, 1 << 30);
    LaunchConfig { grid_dim: (blocks as u32, 1, 1), block_dim: (block, 1, 1), shared_mem_bytes: 0 }
}

/// The function `name` of the module cached under `key`, compiling `src()` on a miss.
///
/// A miss compiles on the runtime's pool, never on a user thread (a blocking `eval` runs
/// its GPU stream's batches on the calling thread, `runtime/scheduler.rs`): a thread still
/// inside NVRTC when its process exits must be one that shutdown knows and joins. The
/// cache's lock is not held while compiling, so a compile waiting for a pool thread never
/// blocks the pool threads that look up kernels; two threads missing the same key at once
/// both compile it, and the first module stored is the one kept.
pub(crate) fn function(
    d: Driver<'_>,
    dev: &DeviceState,
    key: &str,
    name: &str,
    src: impl FnOnce() -> String,
) -> Result<CudaFunction> {
    let cached = |g: &mut Vec<HashMap<String, Entry>>| -> Option<Result<CudaFunction>> {
        let entry = g.get_mut(dev.ordinal)?.get_mut(key)?;
        if let Some((_, f)) = entry.funcs.iter().find(|(n, _)| n == name) {
            return Some(Ok(f.clone()));
        }
        // The module's context current on this thread for the lookup (a miss only:
        // launchers do not bind, see `map.rs`).
        let loaded = dev
            .ctx(d)
            .bind_to_thread()
            .and_then(|()| entry.module.load_function(name))
            .map_err(|e| Error::backend("cuda", format!("kernel {key}::{name}: {e:?}")));
        Some(loaded.inspect(|f| entry.funcs.push((name.to_string(), f.clone()))))
    };
    if let Some(found) = cached(&mut CACHE.lock()) {
        return found;
    }
    let src = src();
    let arch = dev.arch.clone();
    let image = crate::runtime::pool::run_on_pool(|| compile_for(&arch, key, &src)).ok_or(Error::ShutDown)??;
    let mut g = CACHE.lock();
    if g.len() <= dev.ordinal {
        g.resize_with(dev.ordinal + 1, HashMap::new);
    }
    if !g[dev.ordinal].contains_key(key) {
        let module = dev
            .ctx(d)
            .load_module(image)
            .map_err(|e| Error::backend("cuda", format!("loading kernel {key}: {e:?}")))?;
        g[dev.ordinal].insert(key.to_string(), Entry { module, funcs: Vec::new() });
    }
    cached(&mut g).unwrap_or_else(|| Err(Error::backend("cuda", format!("kernel {key} missing"))))
}

/// Loads NVRTC and compiles one small kernel, once per process, so that the program's
/// first compile is not also NVRTC's first. NVRTC registers the teardown of its statics
/// (thousands of `__cxa_atexit` entries) when it is loaded and a few more in its first
/// compiles; those registered after rill's exit hook are wrapped to wait for the exit
/// shutdown (`runtime/teardown.rs`). Called when a GPU is initialised and before every
/// compile; without NVRTC it does nothing.
pub(crate) fn warm_up(arch: &str) {
    static WARM: crate::sync::Once = crate::sync::Once::new();
    WARM.call_once(|| {
        let _ = catch_unwind(AssertUnwindSafe(|| compile_inner(arch, "warm-up", &warm_up_source())));
        super::libs::after_first_use(super::libs::Lib::Nvrtc);
    });
}

/// The kernel compiled once before the first real one (see `compile_for`): the prelude
/// every rill kernel starts with, and a small kernel using it.
fn warm_up_source() -> String {
    format!(
        "{}\nextern \"C\" __global__ void rill_warm_up(float* p, const u16* b) {{ p[threadIdx.x] += ld_bf16(b[threadIdx.x]); }}\n",
        super::source::PRELUDE
    )
}

/// Compiles `src` for the architecture `arch` (`sm_90`); needs NVRTC, not a GPU.
pub(crate) fn compile_for(arch: &str, key: &str, src: &str) -> Result<Ptx> {
    warm_up(arch);
    crate::runtime::stats::KERNELS_COMPILED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    if !crate::runtime::pool::on_pool_thread() {
        crate::runtime::stats::KERNELS_COMPILED_ON_USER_THREADS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    let r = catch_unwind(AssertUnwindSafe(|| compile_inner(arch, key, src)));
    // NVRTC 13.0 constructs some statics in a later compile than the warm-up's.
    super::libs::after_first_use(super::libs::Lib::Nvrtc);
    r.unwrap_or_else(|_| {
        Err(super::unsupported("compile", "NVRTC (libnvrtc) could not be loaded; install the CUDA toolkit's NVRTC"))
    })
}

/// `src` with a call of the prelude's `rill_grid_wait()` as the first statement of every
/// kernel (`__global__` function), so that each may run behind a programmatic graph edge
/// (see `launch.rs`), except a kernel whose body starts with `RILL_OWN_WAIT` (it waits
/// itself, after prefetching what it will read). An error when a kernel has no body.
pub(crate) fn with_grid_waits(src: &str) -> Result<String> {
    const GLOBAL: &str = "__global__";
    let mut out = String::with_capacity(src.len() + 64);
    let mut rest = src;
    while let Some(at) = rest.find(GLOBAL) {
        let after = at + GLOBAL.len();
        let Some(brace) = rest[after..].find('{') else {
            return Err(Error::backend("compile", "a kernel without a body"));
        };
        let body = after + brace + 1;
        out.push_str(&rest[..body]);
        if !rest[body..].trim_start().starts_with("RILL_OWN_WAIT") {
            out.push_str(" rill_grid_wait();");
        }
        rest = &rest[body..];
    }
    out.push_str(rest);
    Ok(out)
}

fn compile_inner(arch: &str, key: &str, src: &str) -> Result<Ptx> {
    let t0 = std::time::Instant::now();
    let r = compile_program(arch, key, src);
    if std::env::var_os("RILL_DEBUG_COMPILE").is_some() {
        let what = match &r {
            Ok(_) => "ok".to_string(),
            Err(e) => format!("failed: {e}"),
        };
        eprintln!("rill compile: {key} on {arch} in {:?}: {what}", t0.elapsed());
    }
    r
}

fn compile_program(arch: &str, key: &str, src: &str) -> Result<Ptx> {
    // Loaded at process start or when the device was probed; only a test without a GPU
    // loads it here (`libs.rs`). Nothing is loaded once shutdown has begun.
    if !super::libs::load(super::libs::Lib::Nvrtc) {
        if crate::runtime::lifecycle::is_shutting_down() {
            return Err(Error::ShutDown);
        }
        return Err(super::unsupported("compile", "NVRTC (libnvrtc) was not found"));
    }
    // Compiles run on pool threads, which hold no pass of their own.
    let pass = crate::runtime::lifecycle::backend_pass()?;
    let d = pass.driver();
    let csrc = CString::new(with_grid_waits(src)?).map_err(|e| Error::backend("compile", e))?;
    // The program name only appears in NVRTC's messages: a short, printable prefix of the key.
    let short: String = key.chars().filter(|c| c.is_ascii_alphanumeric() || ":_|,".contains(*c)).take(48).collect();
    let cname = CString::new(format!("{short}.cu")).map_err(|e| Error::backend("compile", e))?;
    let prog = d.nvrtc_create_program(&csrc, Some(&cname)).map_err(|e| Error::backend("compile", format!("{e:?}")))?;
    let mut opts = vec![format!("--gpu-architecture={arch}"), "--std=c++17".to_string(), "-default-device".to_string()];
    opts.extend(include_dirs().into_iter().map(|d| format!("--include-path={d}")));
    // SAFETY: `prog` is live until destroyed at the end of this function.
    let out = unsafe {
        match d.nvrtc_compile_program(prog, &opts) {
            Ok(()) => d
                .nvrtc_cubin(prog)
                .map(Ptx::from_binary)
                .or_else(|_| d.nvrtc_ptx(prog).map(|p| Ptx::from_src(c_chars_to_string(&p)))),
            Err(e) => {
                let log = d.nvrtc_log(prog).map(|l| c_chars_to_string(&l)).unwrap_or_default();
                d.nvrtc_destroy_program(prog);
                return Err(Error::backend("compile", format!("NVRTC failed on kernel {key} ({e:?}): {log}")));
            }
        }
    };
    // SAFETY: destroyed once.
    unsafe { d.nvrtc_destroy_program(prog) };
    out.map_err(|e| Error::backend("compile", format!("{e:?}")))
}

/// Directories holding the CUDA headers (`cuda_fp16.h`, `cuda_bf16.h`) that fused kernels
/// include: under `$CUDA_PATH`/`$CUDA_HOME` and `/usr/local/cuda`, those that exist (CUDA 13
/// keeps the CCCL headers the fp16/bf16 headers may need in `include/cccl`).
fn include_dirs() -> Vec<String> {
    let mut roots: Vec<String> = ["CUDA_PATH", "CUDA_HOME"].iter().filter_map(|v| std::env::var(v).ok()).collect();
    roots.push("/usr/local/cuda".to_string());
    let mut dirs = Vec::new();
    for r in roots {
        for sub in [
            "include",
            "include/cccl",
            "targets/x86_64-linux/include",
            "targets/x86_64-linux/include/cccl",
            "targets/sbsa-linux/include",
        ] {
            let d = format!("{r}/{sub}");
            if std::path::Path::new(&d).is_dir() && !dirs.contains(&d) {
                dirs.push(d);
            }
        }
    }
    dirs
}

fn c_chars_to_string(v: &[std::ffi::c_char]) -> String {
    let bytes: Vec<u8> = v.iter().map(|&c| c as u8).take_while(|&b| b != 0).collect();
    CStr::from_bytes_until_nul(&[bytes.as_slice(), &[0]].concat())
        .map(|c| c.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Test support: compiles generated kernel sources with NVRTC for sm_90 when the library
/// can be loaded (no GPU needed), so that kernel text is checked on machines without one.
/// Returns false (after printing a skip line) when NVRTC is absent, and fails instead when
/// `RILL_REQUIRE_NVRTC=1` (CI, `.ci/nvrtc.sh`).
#[cfg(test)]
pub(crate) fn check_compiles(key: &str, src: &str) -> bool {
    let present = super::libs::load(super::libs::Lib::Nvrtc);
    if !present {
        assert!(
            std::env::var("RILL_REQUIRE_NVRTC").as_deref() != Ok("1"),
            "RILL_REQUIRE_NVRTC=1 but NVRTC was not found"
        );
        println!("skipped: no NVRTC ({key})");
        return false;
    }
    if let Err(e) = compile_for("sm_90", key, src) {
        panic!("kernel {key} does not compile: {e}");
    }
    true
}

#[cfg(test)]
mod tests {
    #[test]
    fn prelude_and_warm_up_compile_for_sm90() {
        // The warm-up kernel is the prelude plus a kernel reading bf16: if it stopped
        // compiling, the warm-up would silently do nothing.
        super::check_compiles("test:warm-up", &super::warm_up_source());
    }

    #[test]
    fn every_kernel_waits_for_its_predecessor_first() {
        let src = "__device__ int f(int x) { return x; }\n\
                   extern \"C\" __global__ void __launch_bounds__(256) a(int* p) { p[0] = f(1); }\n\
                   extern \"C\" __global__ void b(int* p, int n) {\n    if (n) { p[0] = 2; }\n}\n";
        let got = super::with_grid_waits(src).unwrap();
        let want = "__device__ int f(int x) { return x; }\n\
                    extern \"C\" __global__ void __launch_bounds__(256) a(int* p) { rill_grid_wait(); p[0] = f(1); }\n\
                    extern \"C\" __global__ void b(int* p, int n) { rill_grid_wait();\n    if (n) { p[0] = 2; }\n}\n";
        assert_eq!(got, want);
        assert!(super::with_grid_waits("extern \"C\" __global__ void c(int* p);").is_err());
        let own = "extern \"C\" __global__ void d(int* p) { RILL_OWN_WAIT\n    rill_grid_wait(); p[0] = 1; }";
        assert_eq!(super::with_grid_waits(own).unwrap(), own);
        // Every kernel rill generates starts with the wait: the warm-up's, as compiled.
        let warm = super::with_grid_waits(&super::warm_up_source()).unwrap();
        assert_eq!(warm.matches("__global__").count(), warm.matches("rill_grid_wait();").count());
    }
}
