#!/usr/bin/env bash
# compute-sanitizer over tiny launches of every b12x device path (scripts/sanitize_driver.py):
# memcheck and racecheck by default (R13: out-of-bounds / misaligned accesses, shared-memory
# hazards), initcheck and synccheck on request. Logs land under $OUT; one summary line per tool
# ("memcheck: 0 errors") goes to stdout and to $OUT/sanitize_summary.txt.
#   usage (device tool, carry [".device"]):  source .device/env.sh && bash scripts/sanitize.sh
# Environment:
#   TOOLS        tools to run (default "memcheck racecheck"; add initcheck / synccheck)
#   PARALLEL     1 (default): the tools run concurrently (kernel compiles are CPU-bound and the
#                H200 host has 16 cores); 0: one after another
#   TOOL_S       per-tool wall-clock limit in seconds (default 150)
#   DRIVER_ARGS  passed to the driver, e.g. "--only moe"
# Exit status: 0 when every gating tool (memcheck, racecheck, synccheck) reports 0 errors and the
# driver ran at least one case and none failed (cases it may not run here, the wgmma ones off
# sm_90, are skipped and counted); 1 otherwise. initcheck is informational: the MoE boundary reads whole
# route-order rows, including the FC1 rows of inactive routes that no kernel writes (by design:
# their results are zeroed before the top-k sum), so initcheck may report those reads.
# PYTORCH_NO_CUDA_MEMORY_CACHING=1 gives every tensor its own allocation, so memcheck sees an
# access past a tensor's end instead of landing in a neighbour inside one cached segment.
set -u
OUT="${OUT:-./results/gpu}"
mkdir -p "$OUT"
TOOLS="${TOOLS:-memcheck racecheck}"
PARALLEL="${PARALLEL:-1}"
TOOL_S="${TOOL_S:-150}"
DRIVER_ARGS="${DRIVER_ARGS:-}"
summary="$OUT/sanitize_summary.txt"
: > "$summary"

cs="$(command -v compute-sanitizer || true)"
if [ -z "$cs" ]; then
  for c in /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda*/bin/compute-sanitizer \
           /usr/local/cuda*/compute-sanitizer/compute-sanitizer; do
    if [ -x "$c" ]; then cs="$c"; break; fi
  done
fi
if [ -z "$cs" ]; then
  echo "sanitize: compute-sanitizer not found (PATH, /usr/local/cuda*/bin)" | tee -a "$summary"
  exit 1
fi
echo "sanitize: $cs ($("$cs" --version 2>/dev/null | grep -Eo 'Version [^ ]+' | head -n1))" \
  | tee -a "$summary"

run_tool() {  # tool -> $OUT/sanitize_<tool>.log and .rc
  local tool="$1" log="$OUT/sanitize_$1.log" start=$SECONDS
  # --report-api-errors no: the first H200 run (2026-12-02) counted 34 "errors" that were all
  # CUDA_ERROR_INVALID_VALUE from cuGetProcAddress_v2 (the runtime probing for driver entry points
  # this driver does not export), none from a kernel. API return codes are not memory errors;
  # device-side findings (out-of-bounds, misaligned, races) are still reported and counted.
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout "$TOOL_S" "$cs" --tool "$tool" --print-limit 50 \
    --report-api-errors no --error-exitcode 86 python3 scripts/sanitize_driver.py $DRIVER_ARGS > "$log" 2>&1
  echo "$?" > "$OUT/sanitize_$tool.rc"
  echo "$((SECONDS - start))" > "$OUT/sanitize_$tool.wall"
}

if [ "$PARALLEL" = 1 ]; then
  for tool in $TOOLS; do run_tool "$tool" & done
  wait
else
  for tool in $TOOLS; do run_tool "$tool"; done
fi

status=0
for tool in $TOOLS; do
  log="$OUT/sanitize_$tool.log"
  rc="$(cat "$OUT/sanitize_$tool.rc" 2>/dev/null || echo '?')"
  wall="$(cat "$OUT/sanitize_$tool.wall" 2>/dev/null || echo '?')"
  errors="$(grep -Eo 'ERROR SUMMARY: [0-9]+ error' "$log" | tail -n 1 | grep -Eo '[0-9]+')"
  if [ -z "$errors" ]; then  # racecheck may only print its own summary
    errors="$(grep -E 'RACECHECK SUMMARY' "$log" | tail -n 1 | grep -Eo '[0-9]+ error' \
      | grep -Eo '[0-9]+')"
  fi
  extra=""
  hazards="$(grep -E 'RACECHECK SUMMARY' "$log" | tail -n 1 | sed -E 's/.*SUMMARY: *//')"
  [ -n "$hazards" ] && extra=" [$hazards]"
  driver="$(grep -E '^driver: ' "$log" | tail -n 1)"
  [ -z "$driver" ] && driver="driver: no summary line"
  if [ -z "$errors" ]; then
    line="$tool: no ERROR SUMMARY (rc=$rc; 124 = timed out after ${TOOL_S}s) | $driver"
  else
    line="$tool: $errors errors$extra | $driver | rc=$rc, ${wall}s"
  fi
  echo "$line" | tee -a "$summary"
  grep -E '^(FAIL|skip) ' "$log" | head -n 10 | sed "s/^/  $tool: /" | tee -a "$summary"
  if [ "$tool" != initcheck ]; then
    # the driver must have run a case: "0 errors" over a run of skips judged nothing
    if [ -z "$errors" ] || [ "$errors" != 0 ] || ! echo "$driver" | grep -q ' 0 failed' \
       || ! echo "$driver" | grep -Eq '^driver: [1-9][0-9]* ok'; then
      status=1
    fi
  fi
done
exit "$status"
