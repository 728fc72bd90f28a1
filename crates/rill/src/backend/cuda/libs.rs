//! The backend libraries (the CUDA driver, NVRTC, cuBLAS, cuBLASLt): when each is loaded
//! and first initialised, so that none is loaded, initialised or torn down while the
//! process exits.
//!
//! Why: `exit` runs the handlers of `atexit`/`on_exit`/`__cxa_atexit` in reverse order of
//! registration, on the exiting thread, while every other thread keeps running. A C++
//! library registers the destructors of its statics there when it is loaded (and for
//! function-local statics on their first use). A library first loaded after rill's exit
//! hook is therefore torn down *before* the hook runs, under any thread still inside it;
//! and loading a library while another thread is already in `exit` runs its constructors
//! and destructors concurrently (SIGSEGV inside `dlopen` of libcublasLt, with cudarc's
//! lazy loading reached from the first matmul, in independent exit tests). cudarc's own
//! `is_culib_present` also opens and closes the library on every call, which unloads a
//! library nobody else holds.
//!
//! The design:
//! 1. *Loaded at process start.* On Linux a constructor in `.init_array` opens the four
//!    libraries before `main` (before any thread of the program exists, so no `exit` can
//!    run concurrently), with `RTLD_NODELETE`, so no later close ever unloads them. The
//!    destructors they register while loading are then registered before anything rill
//!    registers, and run after rill's exit hook. When the driver library is absent
//!    nothing else is opened. `RILL_CUDA_PRELOAD=0` turns this off; then (and on other
//!    platforms) the libraries are opened when the first GPU is probed, which leaves the
//!    window this module exists to close: a process exiting during that first probe.
//! 2. *Initialised when a device initialises.* `Device::gpu` compiles a small kernel
//!    with NVRTC and runs a small product of each matmul dtype through cuBLAS and cuBLASLt
//!    (`warm_up`s in `nvrtc.rs` and `matmul.rs`), under a pass of the backend gate, before
//!    the device is handed out. The first matmul or compile of the program, whenever it
//!    happens, then loads nothing. The exit hook is registered again here, in this module
//!    only, so that it runs before the teardown of what a library registered: after a
//!    library is opened at a probe ([`load`]) and, where a library's teardown is not
//!    guarded, after a call that may have constructed its statics ([`after_first_use`]).
//! 3. *Torn down after the exit shutdown.* Each library is opened with its `__cxa_atexit`
//!    import redirected (`runtime/teardown.rs`): the destructor of a static it constructs
//!    at any later moment (NVRTC 13.0 does, in later compiles) runs only after the exit
//!    shutdown has waited for every thread inside a backend library.
//! 4. *Never after shutdown began.* [`load`] refuses once shutdown has begun, and no code
//!    path calls a library that [`load`] did not report loaded.
//!
//! What remains: with `RILL_CUDA_PRELOAD=0`, a process that calls `exit` on one thread
//! while another opens the libraries in the first `Device::gpu` (docs/RUNTIME.md,
//! "Process exit").

use crate::runtime::lifecycle;
use crate::sync::atomic::{AtomicU8, AtomicU64, AtomicUsize, Ordering::SeqCst};

/// A backend library rill uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Lib {
    Driver = 0,
    Nvrtc = 1,
    Cublas = 2,
    CublasLt = 3,
}

const ALL: [Lib; 4] = [Lib::Driver, Lib::Nvrtc, Lib::Cublas, Lib::CublasLt];

impl Lib {
    /// The name cudarc looks the library up by.
    fn stem(self) -> &'static str {
        match self {
            Lib::Driver => "cuda",
            Lib::Nvrtc => "nvrtc",
            Lib::Cublas => "cublas",
            Lib::CublasLt => "cublasLt",
        }
    }
}

const UNKNOWN: u8 = 0;
const MISSING: u8 = 1;
const AT_START: u8 = 2;
const AT_PROBE: u8 = 3;

static STATE: [AtomicU8; 4] = [const { AtomicU8::new(UNKNOWN) }; 4];
/// How long opening each library took, in microseconds.
static MICROS: [AtomicU64; 4] = [const { AtomicU64::new(0) }; 4];
/// How many `__cxa_atexit` imports of each library were redirected (`runtime/teardown.rs`).
static GUARDED: [AtomicUsize; 4] = [const { AtomicUsize::new(0) }; 4];

/// Opens `lib` under the first name cudarc would try that exists, never to be unloaded.
/// cudarc's later opens of the same name then find it loaded and construct nothing.
fn open(lib: Lib) -> bool {
    let t = std::time::Instant::now();
    let found = open_uncounted(lib);
    MICROS[lib as usize].store(t.elapsed().as_micros().min(u64::MAX as u128) as u64, SeqCst);
    found
}

fn open_uncounted(lib: Lib) -> bool {
    #[cfg(unix)]
    {
        for name in cudarc::get_lib_name_candidates(lib.stem()) {
            let Ok(c) = std::ffi::CString::new(name) else { continue };
            // SAFETY: a plain dlopen of a named library; the handle is kept for ever.
            let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL | libc::RTLD_NODELETE) };
            if !h.is_null() {
                // Before any use: from here on its teardown entries wait for the exit
                // shutdown, whenever they are registered (`runtime/teardown.rs`).
                GUARDED[lib as usize].store(crate::runtime::teardown::guard(h), SeqCst);
                return true;
            }
        }
        false
    }
    #[cfg(not(unix))]
    {
        // SAFETY: only opens the library (cudarc keeps it loaded once used).
        unsafe {
            match lib {
                Lib::Driver => cudarc::driver::sys::is_culib_present(),
                Lib::Nvrtc => cudarc::nvrtc::sys::is_culib_present(),
                Lib::Cublas => cudarc::cublas::sys::is_culib_present(),
                Lib::CublasLt => cudarc::cublaslt::sys::is_culib_present(),
            }
        }
    }
}

/// True when `lib` is loaded (at process start or by an earlier `load`). Opens it when
/// nobody tried yet, unless shutdown has begun (then false: nothing is loaded during
/// shutdown or exit). Never panics.
pub(crate) fn load(lib: Lib) -> bool {
    let st = &STATE[lib as usize];
    match st.load(SeqCst) {
        AT_START | AT_PROBE => return true,
        MISSING => return false,
        _ => {}
    }
    if lifecycle::is_shutting_down() {
        return false;
    }
    let Some(_pass) = lifecycle::enter_backend() else { return false };
    let found = std::panic::catch_unwind(|| open(lib)).unwrap_or(false);
    // A concurrent first load may have won; both saw the same files.
    let won = st.compare_exchange(UNKNOWN, if found { AT_PROBE } else { MISSING }, SeqCst, SeqCst).is_ok();
    if won && found {
        // The teardown entries its constructors registered inside `dlopen` (before the
        // import was redirected) would run before an exit hook registered earlier.
        lifecycle::register_exit_hook();
    }
    matches!(st.load(SeqCst), AT_START | AT_PROBE)
}

/// The `dlopen` handle of the loaded library named `name` (as in [`report`]); never
/// loads it. Used by the teardown tests to register through the library's own import.
#[cfg(unix)]
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) fn loaded_handle(name: &str) -> Option<*mut std::ffi::c_void> {
    let lib = ALL.into_iter().find(|l| l.stem() == name)?;
    if !loaded(lib) {
        return None;
    }
    cudarc::get_lib_name_candidates(lib.stem()).into_iter().find_map(|n| {
        let c = std::ffi::CString::new(n).ok()?;
        // SAFETY: looks up a library already loaded; loads nothing.
        let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
        (!h.is_null()).then_some(h)
    })
}

#[cfg(not(unix))]
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) fn loaded_handle(_name: &str) -> Option<*mut std::ffi::c_void> {
    None
}

/// True when `lib` was loaded; never loads it.
pub(crate) fn loaded(lib: Lib) -> bool {
    matches!(STATE[lib as usize].load(SeqCst), AT_START | AT_PROBE)
}

/// True when every teardown entry `lib` registers from now on runs rill's exit shutdown
/// first (its `__cxa_atexit` import was redirected when it was opened).
pub(crate) fn teardown_guarded(lib: Lib) -> bool {
    GUARDED[lib as usize].load(SeqCst) > 0
}

/// After a call that may have constructed statics of `lib` (its first compile, a new
/// handle's first product): where `lib`'s teardown is not guarded, registers the exit hook
/// again, which puts it ahead of every entry registered so far (not of one registered by a
/// call still running when `exit` begins; `runtime/teardown.rs` is what closes that).
pub(crate) fn after_first_use(lib: Lib) {
    if !teardown_guarded(lib) {
        lifecycle::register_exit_hook();
    }
}

/// Loads every library not loaded yet (when the first GPU is probed).
pub(crate) fn load_all() {
    for lib in ALL {
        load(lib);
    }
}

/// The constructor run before `main` (see the module docs).
#[cfg(all(target_os = "linux", not(loom)))]
extern "C" fn preload_at_start() {
    if std::env::var_os("RILL_CUDA_PRELOAD").is_some_and(|v| v == "0") {
        return;
    }
    let _ = std::panic::catch_unwind(|| {
        for lib in ALL {
            let found = open(lib);
            STATE[lib as usize].store(if found { AT_START } else { MISSING }, SeqCst);
            if !found && lib == Lib::Driver {
                // No driver, no GPU: the rest is of no use; a later probe tries again.
                STATE[lib as usize].store(UNKNOWN, SeqCst);
                return;
            }
        }
    });
}

#[cfg(all(target_os = "linux", not(loom)))]
#[used]
#[unsafe(link_section = ".init_array")]
static PRELOAD: extern "C" fn() = preload_at_start;

/// Keeps the constructor linked into every program that uses the CUDA backend (an
/// unreferenced object of an rlib may be left out by the linker).
pub(crate) fn keep_preload() {
    #[cfg(all(target_os = "linux", not(loom)))]
    std::hint::black_box(&PRELOAD);
}

/// What [`crate::runtime::backend_libraries`] reports.
pub(crate) fn report() -> Vec<crate::runtime::BackendLibrary> {
    keep_preload();
    use crate::runtime::{BackendLibrary, LibraryState};
    ALL.iter()
        .map(|&lib| BackendLibrary {
            name: match lib {
                Lib::Driver => "CUDA driver",
                Lib::Nvrtc => "NVRTC",
                Lib::Cublas => "cuBLAS",
                Lib::CublasLt => "cuBLASLt",
            },
            state: match STATE[lib as usize].load(SeqCst) {
                AT_START => LibraryState::LoadedAtStart,
                AT_PROBE => LibraryState::LoadedAtProbe,
                MISSING => LibraryState::Missing,
                _ => LibraryState::NotLoaded,
            },
            open_micros: MICROS[lib as usize].load(SeqCst),
            teardown_guarded: teardown_guarded(lib),
        })
        .collect()
}
