#!/usr/bin/env bash
# One GPU session on the lent H200, batched: the GPU-marked tests, a bounded slice of the oracle's
# differential grid, and the benchmarks. Every log lands under $OUT (the device tool's output dir).
#   usage (device tool, carry [".device"]):  source .device/env.sh && bash scripts/gpu_tier.sh
# Budgets (seconds) can be set with TESTS_S, GRID_S, BENCH_S; each phase is cut at its budget.
set -u
OUT="${OUT:-./results/gpu}"
mkdir -p "$OUT"
TESTS_S="${TESTS_S:-300}"; GRID_S="${GRID_S:-120}"; BENCH_S="${BENCH_S:-120}"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv > "$OUT/gpu.txt" 2>&1
workers="${WORKERS:-8}"   # compiles are CPU-bound; all workers share the one GPU
timeout "$TESTS_S" python3 -m pytest tests -m "gpu and not multi_gpu" -n "$workers" -q \
  -p no:cacheprovider -o addopts="--strict-markers --import-mode=importlib" -rfE \
  > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests rc=$?" | tee -a "$OUT/summary.txt"
tail -n 40 "$OUT/gpu_tests.log" | grep -E "passed|failed|error" | tail -n 3 | tee -a "$OUT/summary.txt"
grep -E "^(FAILED|ERROR)" "$OUT/gpu_tests.log" | head -n 60 | tee -a "$OUT/summary.txt"
timeout "$GRID_S" python3 -m oracle run --tier gpu --filter "${GRID_FILTER:-m<=129}" \
  --max-cases "${GRID_CASES:-400}" -q --json "$OUT/oracle_grid.json" --results "$OUT/cases" \
  > "$OUT/oracle_grid.log" 2>&1
echo "oracle grid rc=$?" | tee -a "$OUT/summary.txt"
tail -n 5 "$OUT/oracle_grid.log" | tee -a "$OUT/summary.txt"
if [ "${BENCH:-1}" = 1 ]; then
  timeout "$BENCH_S" python3 benchmarks/dense_trellis.py --json "$OUT/dense_bench.json" \
    > "$OUT/dense_bench.log" 2>&1
  echo "dense bench rc=$?" | tee -a "$OUT/summary.txt"
  tail -n 45 "$OUT/dense_bench.log" | tee -a "$OUT/summary.txt"
fi
