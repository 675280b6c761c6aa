#!/usr/bin/env bash
# Where the GPU grid's time goes: a stratified sample of N cases (default 120) judged in ONE
# process under cProfile, with the kernel cache of an earlier job (so nothing compiles unless the
# cache is cold), then the top functions by cumulative and by own time. Logs under $OUT.
#   usage (device tool):  source .device/env.sh && CASES=120 CACHE=results/job/kernels \
#                         bash scripts/profile_grid.sh
set -u
OUT="${OUT:-./results/profile}"; mkdir -p "$OUT"
CASES="${CASES:-120}"
export B12X_CACHE_DIR="${CACHE:-${B12X_CACHE_DIR:-}}"
[ -n "$B12X_CACHE_DIR" ] || unset B12X_CACHE_DIR
start=$SECONDS
python3 -m cProfile -o "$OUT/grid.prof" -m oracle run --max-cases "$CASES" --workers 1 -q \
  --results "$OUT/results" > "$OUT/profile_run.log" 2>&1
echo "profiled run rc=$? in $((SECONDS - start))s ($CASES cases)"; tail -n 3 "$OUT/profile_run.log"
python3 - "$OUT/grid.prof" <<'PY'
import pstats, sys
stats = pstats.Stats(sys.argv[1])
stats.sort_stats("cumulative").print_stats(45)
stats.sort_stats("tottime").print_stats(25)
PY
