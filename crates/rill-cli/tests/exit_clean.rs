//! Runs the exit-torture program many times (see src/bin/exit_torture.rs): every run must
//! end with the status its ending implies, print nothing on stderr but the intended panic,
//! and get no rill error other than `Error::ShutDown`. The driver takes the scenario x
//! ending pairs in turn (6 scenarios x 6 endings), so the default 300 runs cover each pair
//! 8 or 9 times. `RILL_TORTURE_RUNS` overrides the number of runs (300 by default),
//! `RILL_TORTURE_SEED` the seed (printed on failure either way), `RILL_TORTURE_DEVICE=gpu`
//! runs it on GPU 0, `RILL_TORTURE_SCENARIO` / `RILL_TORTURE_ENDING` keep to one scenario
//! or ending.

use std::process::Command;

#[test]
fn exit_torture_runs_end_cleanly() {
    let runs = std::env::var("RILL_TORTURE_RUNS").unwrap_or_else(|_| "300".into());
    // The driver binary: `RILL_TORTURE_BIN`, else the one cargo built, else a packed copy
    // beside this test binary (`bin-exit_torture`, as ../shared/gpu-pack lays them out).
    let beside = std::env::current_exe().ok().and_then(|e| e.parent().map(|d| d.join("bin-exit_torture")));
    let exe = std::env::var("RILL_TORTURE_BIN")
        .map(std::path::PathBuf::from)
        .into_iter()
        .chain([std::path::PathBuf::from(env!("CARGO_BIN_EXE_exit_torture"))])
        .chain(beside)
        .find(|p| p.exists())
        .expect("the exit_torture binary (set RILL_TORTURE_BIN)");
    let mut cmd = Command::new(exe);
    cmd.args(["drive", "--runs", &runs, "--jobs", "2"]);
    if let Ok(device) = std::env::var("RILL_TORTURE_DEVICE") {
        cmd.args(["--device", &device]);
    }
    for (var, flag) in
        [("RILL_TORTURE_SEED", "--seed"), ("RILL_TORTURE_SCENARIO", "--scenario"), ("RILL_TORTURE_ENDING", "--ending")]
    {
        if let Ok(v) = std::env::var(var) {
            cmd.args([flag, &v]);
        }
    }
    let out = cmd.output().expect("run the exit-torture driver");
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    assert!(out.status.success(), "exit torture failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    // The driver's table (`runs/failed` per scenario x ending): every pair ran.
    let filtered = ["RILL_TORTURE_SCENARIO", "RILL_TORTURE_ENDING"].iter().any(|v| std::env::var_os(v).is_some());
    if !filtered && runs.parse::<u64>().is_ok_and(|n| n >= 36) {
        for s in ["mixed", "first-use", "submitters", "tokio", "thread-locals", "shutdown-race"] {
            let row = stdout.lines().find(|l| l.split_whitespace().next() == Some(s));
            let cells: Vec<u64> = row
                .map(|l| {
                    l.split_whitespace().skip(1).take(6).filter_map(|c| c.split('/').next()?.parse().ok()).collect()
                })
                .unwrap_or_default();
            assert!(
                cells.len() == 6 && cells.iter().all(|&n| n > 0),
                "scenario {s} did not run with every ending:\n{stdout}"
            );
        }
    }
}

/// Main returns while a pool thread compiles a large fused kernel (on the GPU: inside
/// NVRTC). rill's exit hook must run before the compiler library's own teardown and wait
/// for the compile; before it was registered again after NVRTC loaded, NVRTC's statics
/// were destroyed under the compiling thread (SIGSEGV). On the GPU when one is present
/// (required with `RILL_REQUIRE_GPU=1`), else on the CPU.
#[test]
fn exit_during_a_kernel_compile_is_clean() {
    let exe = std::path::PathBuf::from(env!("CARGO_BIN_EXE_exit_torture"));
    let beside = std::env::current_exe().ok().and_then(|e| e.parent().map(|d| d.join("bin-exit_torture")));
    let exe = [exe].into_iter().chain(beside).find(|p| p.exists()).expect("the exit_torture binary");
    let require_gpu = std::env::var("RILL_REQUIRE_GPU").as_deref() == Ok("1");
    let device = if require_gpu { "gpu" } else { "auto" };
    for run in 0..8 {
        let out = Command::new(&exe)
            .args(["compile-exit", "--device", device])
            .env("RUST_BACKTRACE", "0")
            // A long drain bound: the hook must wait for the compile, not end the process
            // through its `_exit` fallback, for this run to show the hook's order is right.
            .env("RILL_EXIT_DRAIN_MS", "20000")
            .output()
            .expect("run exit_torture compile-exit");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(0),
            "run {run}: status {:?}\nstdout: {stdout}\nstderr: {stderr}",
            out.status
        );
        assert!(stderr.trim().is_empty(), "run {run}: stderr not empty: {stderr}");
        assert!(stdout.starts_with("compile-exit on "), "run {run}: stdout: {stdout}");
        if run == 0 {
            println!("{}", stdout.trim());
        }
        if require_gpu {
            assert!(stdout.contains("gpu"), "RILL_REQUIRE_GPU=1 but ran on: {stdout}");
        }
    }
}
