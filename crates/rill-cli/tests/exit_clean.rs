//! Runs the exit-torture program many times (see src/bin/exit_torture.rs): every run must
//! end with the status its ending implies and print nothing from rill on stderr.
//! `RILL_TORTURE_RUNS` overrides the number of runs (300 by default), `RILL_TORTURE_SEED`
//! the seed (printed on failure either way).

use std::process::Command;

#[test]
fn exit_torture_runs_end_cleanly() {
    let runs = std::env::var("RILL_TORTURE_RUNS").unwrap_or_else(|_| "300".into());
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_exit_torture"));
    cmd.args(["drive", "--runs", &runs, "--jobs", "2"]);
    if let Ok(seed) = std::env::var("RILL_TORTURE_SEED") {
        cmd.args(["--seed", &seed]);
    }
    let out = cmd.output().expect("run the exit-torture driver");
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    assert!(out.status.success(), "exit torture failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
}
