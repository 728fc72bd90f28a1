//! Runs the exit-torture program many times (see src/bin/exit_torture.rs): every run must
//! end with the status its ending implies and print nothing from rill on stderr.
//! `RILL_TORTURE_RUNS` overrides the number of runs (300 by default), `RILL_TORTURE_SEED`
//! the seed (printed on failure either way), `RILL_TORTURE_DEVICE=gpu` runs it on GPU 0.

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
    if let Ok(seed) = std::env::var("RILL_TORTURE_SEED") {
        cmd.args(["--seed", &seed]);
    }
    let out = cmd.output().expect("run the exit-torture driver");
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    assert!(out.status.success(), "exit torture failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
}
