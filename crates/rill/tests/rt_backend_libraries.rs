//! When the backend libraries are loaded (docs/RUNTIME.md, "Process exit"): before `main`
//! (Linux), so that none is first loaded, or torn down under a thread using it, while the
//! process exits; and never once shutdown has begun.

use rill::runtime::{LibraryState, backend_libraries};

mod common;

const NAMES: [&str; 4] = ["CUDA driver", "NVRTC", "cuBLAS", "cuBLASLt"];

#[test]
fn every_library_is_loaded_before_main_where_a_gpu_works() {
    let libs = backend_libraries();
    println!("{libs:?}");
    assert_eq!(libs.iter().map(|l| l.name).collect::<Vec<_>>(), NAMES);
    // Read before anything probed a GPU: what the constructor did.
    let at_start = libs.iter().map(|l| l.state).collect::<Vec<_>>();
    if common::gpu().is_none() {
        return;
    }
    if std::env::var("RILL_CUDA_PRELOAD").as_deref() == Ok("0") {
        return;
    }
    assert_eq!(at_start, [LibraryState::LoadedAtStart; 4], "{libs:?}");
    // The first products and compiles, long after: still nothing loaded later.
    let x = rill::Array::full(&[64, 64], 1.0, rill::DType::BF16).unwrap();
    let y = rill::with_stream(&common::gpu().unwrap().default_stream().unwrap(), || x.matmul(&x)).unwrap();
    assert_eq!(y.to_f64_vec().unwrap()[0], 64.0);
    assert_eq!(backend_libraries().iter().map(|l| l.state).collect::<Vec<_>>(), at_start);
    // The C++ libraries construct statics on later calls too; each such teardown entry
    // waits for the exit shutdown (runtime/teardown.rs).
    for l in backend_libraries().iter().filter(|l| l.name != "CUDA driver") {
        assert!(l.teardown_guarded, "{l:?}");
    }
}

/// In a child process without the constructor's loads: after shutdown nothing is loaded,
/// not even by asking for a GPU.
#[test]
fn nothing_is_loaded_after_shutdown() {
    if std::env::var("RILL_LIBS_CHILD").as_deref() == Ok("1") {
        let before = backend_libraries();
        assert!(before.iter().all(|l| l.state == LibraryState::NotLoaded), "{before:?}");
        rill::shutdown();
        assert!(matches!(rill::Device::gpu(0), Err(rill::Error::ShutDown)));
        let after = backend_libraries();
        assert!(after.iter().all(|l| l.state == LibraryState::NotLoaded), "{after:?}");
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let out = std::process::Command::new(exe)
        .args(["--exact", "nothing_is_loaded_after_shutdown", "--nocapture"])
        .env("RILL_LIBS_CHILD", "1")
        .env("RILL_CUDA_PRELOAD", "0")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "child failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("1 passed"), "the child ran the test");
}

/// The child's `atexit` handler: prints whether rill's exit shutdown had already run.
extern "C" fn report_order() {
    use std::io::Write;
    let x = rill::Array::full(&[4], 1.0, rill::DType::F32).and_then(|a| a.add(&a)).and_then(|a| a.eval());
    let shut = matches!(x, Err(rill::Error::ShutDown));
    let mut out = std::io::stdout();
    let _ = writeln!(out, "exit shutdown before an entry older than the libraries: {shut}");
    let _ = out.flush();
}

/// In a child process with `RILL_CUDA_PRELOAD=0`: CPU work starts the runtime (which
/// registers the exit hook), then an `atexit` entry is registered, then the first
/// `Device::gpu` opens the backend libraries. The libraries' own teardown entries come
/// after that entry, so rill's exit shutdown must run before it. Two mechanisms see to
/// it: the hook is registered again once a library is opened (`libs::load`), and on
/// glibc the guarded teardown entries the warm-up's first calls register run the
/// shutdown first; either alone passes this test.
#[test]
fn libraries_opened_late_register_the_exit_hook_again() {
    if std::env::var("RILL_LIBS_CHILD").as_deref() == Ok("late") {
        let cpu = rill::Device::cpu().default_stream().unwrap();
        let x = rill::with_stream(&cpu, || rill::Array::full(&[256], 2.0, rill::DType::F32)).unwrap();
        assert_eq!(rill::with_stream(&cpu, || x.sqrt()).unwrap().to_vec::<f32>().unwrap()[0], 2f32.sqrt());
        let libs = backend_libraries();
        assert!(libs.iter().all(|l| l.state == LibraryState::NotLoaded), "{libs:?}");
        // The runtime started (and registered its hook) before the libraries are opened.
        assert!(rill::runtime::stats().threads_started > 0, "{:?}", rill::runtime::stats());
        // SAFETY: registers a plain function with no captured state.
        assert_eq!(unsafe { libc::atexit(report_order) }, 0);
        let Some(gpu) = common::gpu() else { return };
        let y = rill::with_stream(&gpu.default_stream().unwrap(), || x.mul(&x)).unwrap();
        assert_eq!(y.to_f64_vec().unwrap()[0], 4.0);
        assert!(
            backend_libraries().iter().all(|l| l.state == LibraryState::LoadedAtProbe),
            "{:?}",
            backend_libraries()
        );
        println!("gpu used");
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let out = std::process::Command::new(exe)
        .args(["--exact", "libraries_opened_late_register_the_exit_hook_again", "--nocapture"])
        .env("RILL_LIBS_CHILD", "late")
        .env("RILL_CUDA_PRELOAD", "0")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "child failed: {stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    if !stdout.contains("gpu used") {
        assert!(std::env::var("RILL_REQUIRE_GPU").as_deref() != Ok("1"), "no GPU in the child: {stdout}");
        eprintln!("skipped: no GPU");
        return;
    }
    assert!(stdout.contains("exit shutdown before an entry older than the libraries: true"), "{stdout}");
}
