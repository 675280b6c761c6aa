#!/usr/bin/env bash
# One GPU session on the lent H200, batched into phases: the GPU-marked tests, a bounded slice of
# the oracle's differential grid, the dense and MoE benchmarks, compute-sanitizer and the
# GPU-tier mutation gate (and, when asked, tile qualification and the slow CPU compile sweeps,
# which use the box's 16 cores rather than its GPU). Every log lands under $OUT (the device
# tool's output dir) and every phase adds "phase <name>: rc=<rc> <wall>s of <budget>s" plus a
# few result lines to $OUT/summary.txt. Phases are independent: one failing or timing out
# never stops the next. At the end a table lists every phase (ok / FAILED rc=N / TIMED OUT /
# skipped) and the script exits 1 when any phase failed or timed out, 0 only when every phase
# that ran passed.
#   usage (device tool, carry [".device"]):  source .device/env.sh && bash scripts/gpu_tier.sh
# Budgets (seconds; each phase is cut at its budget; the defaults of the phases on by default
# add up to 570 s, inside the device's 600 s per call):
#   TESTS_S=240 GRID_S=60 BENCH_S=55 MOE_BENCH_S=60 SANITIZE_S=70 MUTATE_S=85
# Switches (1 = run, 0 = skip): TESTS, GRID, BENCH, MOE_BENCH, SANITIZE, MUTATE (all default 1)
# and TILE (default 0, budget TILE_S=75): `oracle run --tile` for each tile of TILES (default
# 64x128x128) on TILE_CASES (default 40) stratified cases pinned to it, and SLOW (default 0,
# budget SLOW_S=420): the `slow`-marked tests (the exhaustive CPU compile / spill sweeps for
# sm_80 / sm_90 / sm_120, one item per spec; no GPU needed, but this box has the cores) on
# $(nproc) xdist workers; SLOW_SLICE=I/N runs slice I of N of them (`--slow-slice`), e.g. 0/2
# then 1/2 in two calls when one call's 600 s is not enough:
#   SLOW=1 TESTS=0 GRID=0 BENCH=0 MOE_BENCH=0 SANITIZE=0 MUTATE=0 SLOW_SLICE=0/2 \
#     bash scripts/gpu_tier.sh
# Others: WORKERS (xdist workers, default 8), SHUFFLE_SEED (run the tests shuffled),
# GRID_FILTER, GRID_CASES, MOE_M (default 1,8,64,512,4096), SANITIZE_TOOLS (default
# "memcheck racecheck").
set -u
OUT="${OUT:-./results/gpu}"
mkdir -p "$OUT"
TESTS_S="${TESTS_S:-240}"; GRID_S="${GRID_S:-60}"; BENCH_S="${BENCH_S:-55}"
MOE_BENCH_S="${MOE_BENCH_S:-60}"; SANITIZE_S="${SANITIZE_S:-70}"; MUTATE_S="${MUTATE_S:-85}"
SLOW_S="${SLOW_S:-420}"
summary="$OUT/summary.txt"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv > "$OUT/gpu.txt" 2>&1
total_start=$SECONDS

# Per phase, for the final table: name, verdict, rc, wall seconds, budget.
PHASES=(); VERDICTS=(); RCS=(); WALLS=(); BUDGETS=()

# phase NAME BUDGET LOG CMD...: run CMD under `timeout BUDGET` (SIGTERM at the budget, SIGKILL
# 10 s later) with stdout+stderr in LOG, then record its exit status and wall time (rc 124 or
# 137: cut at the budget). Always returns 0, so the next phase runs.
phase() {
  local name="$1" budget="$2" log="$3" start=$SECONDS rc verdict
  shift 3
  timeout -k 10 "$budget" "$@" > "$log" 2>&1
  rc=$?
  local note=""
  case "$rc" in
    0) verdict="ok" ;;
    124|137) verdict="TIMED OUT"; note=" (timed out)" ;;
    *) verdict="FAILED" ;;
  esac
  echo "phase $name: rc=$rc $((SECONDS - start))s of ${budget}s$note" | tee -a "$summary"
  PHASES+=("$name"); VERDICTS+=("$verdict"); RCS+=("$rc")
  WALLS+=("$((SECONDS - start))"); BUDGETS+=("$budget")
  return 0
}

# skipped NAME: a phase switched off (shown in the table, never a failure).
skipped() {
  PHASES+=("$1"); VERDICTS+=("skipped"); RCS+=("-"); WALLS+=("-"); BUDGETS+=("-")
}

if [ "${TESTS:-1}" = 1 ]; then
  workers="${WORKERS:-8}"   # compiles are CPU-bound; all workers share the one GPU
  phase gpu_tests "$TESTS_S" "$OUT/gpu_tests.log" \
    python3 -m pytest tests -m "gpu and not multi_gpu" -n "$workers" -q --require-gpu \
    -p no:cacheprovider -o addopts="--strict-markers --import-mode=importlib" -rfE \
    ${SHUFFLE_SEED:+--shuffle-seed "$SHUFFLE_SEED"}
  tail -n 40 "$OUT/gpu_tests.log" | grep -E "passed|failed|error" | tail -n 3 | tee -a "$summary"
  grep -E "^(FAILED|ERROR)" "$OUT/gpu_tests.log" | head -n 60 | tee -a "$summary"
else
  skipped gpu_tests
fi

if [ "${GRID:-1}" = 1 ]; then
  phase oracle_grid "$GRID_S" "$OUT/oracle_grid.log" \
    python3 -m oracle run --tier gpu --filter "${GRID_FILTER:-m<=129}" \
    --max-cases "${GRID_CASES:-400}" -q --json "$OUT/oracle_grid.json" --results "$OUT/cases"
  tail -n 5 "$OUT/oracle_grid.log" | tee -a "$summary"
else
  skipped oracle_grid
fi

if [ "${BENCH:-1}" = 1 ]; then
  phase dense_bench "$BENCH_S" "$OUT/dense_bench.log" \
    python3 benchmarks/dense_trellis.py --budget-s "$((BENCH_S > 20 ? BENCH_S - 15 : BENCH_S))" \
    ${DENSE_ARGS:-} --json "$OUT/dense_bench.json"
  tail -n 45 "$OUT/dense_bench.log" | tee -a "$summary"
else
  skipped dense_bench
fi

if [ "${MOE_BENCH:-1}" = 1 ]; then
  # GLM-like defaults of the script: H 5120, I 1536, 128 experts, top-8, MCG K4, packed FC1
  phase moe_bench "$MOE_BENCH_S" "$OUT/moe_bench.log" \
    python3 benchmarks/moe_trellis.py --m "${MOE_M:-1,8,64,512,4096}" \
    --budget-s "$((MOE_BENCH_S > 20 ? MOE_BENCH_S - 15 : MOE_BENCH_S))" --json "$OUT/moe_bench.json"
  grep -E "^(HBM|M=|bf16/trellis|goal)|Error|error" "$OUT/moe_bench.log" | tail -n 14 | tee -a "$summary"
else
  skipped moe_bench
fi

if [ "${SANITIZE:-1}" = 1 ]; then
  # the tools run concurrently inside; each gets the phase budget minus a margin for the summary
  phase sanitize "$SANITIZE_S" "$OUT/sanitize.log" \
    env OUT="$OUT" TOOLS="${SANITIZE_TOOLS:-memcheck racecheck}" \
    TOOL_S="$((SANITIZE_S > 10 ? SANITIZE_S - 5 : SANITIZE_S))" bash scripts/sanitize.sh
  grep -vE "^sanitize: /" "$OUT/sanitize.log" | tail -n 12 | tee -a "$summary"
else
  skipped sanitize
fi

if [ "${MUTATE:-1}" = 1 ]; then
  phase mutate_gpu "$MUTATE_S" "$OUT/mutate_gpu.log" \
    python3 -m oracle mutate --tier gpu --json "$OUT/mutate_gpu.json" -q
  tail -n 15 "$OUT/mutate_gpu.log" | tee -a "$summary"
else
  skipped mutate_gpu
fi

if [ "${TILE:-0}" = 1 ]; then
  for tile in ${TILES:-64x128x128}; do
    phase "tile_$tile" "${TILE_S:-75}" "$OUT/tile_$tile.log" \
      python3 -m oracle run --tile "$tile" --max-cases "${TILE_CASES:-40}" -q \
      --json "$OUT/tile_$tile.json" --results "$OUT/tile_cases"
    tail -n 4 "$OUT/tile_$tile.log" | tee -a "$summary"
  done
else
  skipped tile
fi

if [ "${SLOW:-0}" = 1 ]; then
  # CPU compiles only (fake tensors, ptxas): one xdist worker per core
  phase slow_sweeps "$SLOW_S" "$OUT/slow_sweeps.log" \
    python3 -m pytest tests -m slow -n "$(nproc)" -q -p no:cacheprovider \
    ${SLOW_SLICE:+--slow-slice "$SLOW_SLICE"} -rfE
  tail -n 40 "$OUT/slow_sweeps.log" | grep -E "passed|failed|error" | tail -n 3 | tee -a "$summary"
  grep -E "^(FAILED|ERROR)" "$OUT/slow_sweeps.log" | head -n 60 | tee -a "$summary"
else
  skipped slow_sweeps
fi

echo "gpu tier: $((SECONDS - total_start))s in all" | tee -a "$summary"

# The summary table, and the exit status: non-zero when any phase failed or timed out.
failed=0
{
  printf '%-12s %-10s %5s %7s %7s\n' phase verdict rc wall_s budget
  for i in "${!PHASES[@]}"; do
    printf '%-12s %-10s %5s %7s %7s\n' "${PHASES[$i]}" "${VERDICTS[$i]}" "${RCS[$i]}" \
      "${WALLS[$i]}" "${BUDGETS[$i]}"
  done
} | tee -a "$summary"
for i in "${!PHASES[@]}"; do
  case "${VERDICTS[$i]}" in FAILED|"TIMED OUT") failed=$((failed + 1)) ;; esac
done
if [ "$failed" -gt 0 ]; then
  echo "gpu tier: FAILED ($failed phase(s) failed or timed out)" | tee -a "$summary"
  exit 1
fi
echo "gpu tier: every phase that ran passed" | tee -a "$summary"
exit 0
