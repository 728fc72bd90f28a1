#!/usr/bin/env bash
# Runs the GPU test binaries that ../shared/gpu-pack laid out in .gpu/ under NVIDIA's
# compute-sanitizer: memcheck (out-of-bounds and misaligned accesses, leaks of device
# allocations made by kernels) and racecheck (shared-memory hazards in the reduction and
# softmax kernels). Run on a machine with a GPU and the CUDA toolkit, from the repository
# root:
#
#   bash tools/gpu-sanitize.sh [TEST ...]      # default: the list below
#
# Each (test, tool) pair runs under a time limit (RILL_SANITIZE_LIMIT_S, default 120 s);
# the script prints one line per pair and exits non-zero if any reported an error or
# failed. Logs go to $OUT (or /tmp) as san-TEST-TOOL.txt.
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
cs=${COMPUTE_SANITIZER:-/usr/local/cuda/bin/compute-sanitizer}
[ -x "$cs" ] || { echo "compute-sanitizer not found (set COMPUTE_SANITIZER)"; exit 2; }
[ -d "$root/.gpu/bin" ] || { echo "no .gpu/bin: run ../shared/gpu-pack first"; exit 2; }
limit=${RILL_SANITIZE_LIMIT_S:-120}
logs=${OUT:-/tmp}
tests=("$@")
[ ${#tests[@]} -gt 0 ] || tests=(gpu_free gpu_runtime gpu_shutdown_race ops_movement ops_nn ops_matmul gpu_fused ops_reduce)
export RILL_REQUIRE_GPU=1 CARGO_MANIFEST_DIR="$root/crates/rill"
cd "$root/crates/rill" || exit 2
failed=0
for t in "${tests[@]}"; do
  for tool in memcheck racecheck; do
    log="$logs/san-$t-$tool.txt"
    start=$(date +%s)
    timeout "$limit" "$cs" --tool "$tool" --error-exitcode 99 --print-limit 20 \
      "$root/.gpu/bin/test-$t" --test-threads 1 >"$log" 2>&1
    rc=$?
    summary=$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|^test result' "$log" | tr '\n' ' ')
    echo "$tool $t rc=$rc $(( $(date +%s) - start ))s: $summary"
    [ $rc -eq 0 ] || failed=$((failed + 1))
  done
done
echo "sanitizer runs failed or timed out: $failed"
[ $failed -eq 0 ]
