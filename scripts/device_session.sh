#!/usr/bin/env bash
# One batched device call (the lent H200): the default oracle job cold then warm
# (benchmarks/oracle_job.py), its per-op case counts, then the GPU-marked tests in a shuffled
# order (--shuffle-seed) with whatever time is left of BUDGET_S (TESTS=0: none). Logs under $OUT.
# A cold and a warm run in two calls: RUNS=cold WORK=results/job, then at once (the machine stays
# warm ~30 s and keeps ignored paths) RUNS=warm WORK=results/job.
# QUACK=1 also judges quack-kernels' gemm_w4a16 through its adapter after the job (`oracle run
# --kernel quack`, QUACK_S seconds at most, default 130; needs .device built with the quack
# wheels) and runs `oracle drift` on up to three of its saved failing cases.
#   usage (device tool, carry [".device"]): source .device/env.sh && bash scripts/device_session.sh
set -u
OUT="${OUT:-./results/device}"; mkdir -p "$OUT"
BUDGET_S="${BUDGET_S:-560}"; JOB_TIMEOUT_S="${JOB_TIMEOUT_S:-300}"; SEED="${SEED:-7}"
RUNS="${RUNS:-cold,warm}"; WORK="${WORK:-$OUT/job}"  # RUNS=cold / RUNS=warm: two calls, WORK kept
start=$SECONDS
python3 benchmarks/oracle_job.py --work "$WORK" --out "$OUT/oracle_job.json" \
  --timeout "$JOB_TIMEOUT_S" --runs "$RUNS" > "$OUT/oracle_job.log" 2>&1
echo "oracle_job rc=$? after $((SECONDS - start))s"; tail -n 25 "$OUT/oracle_job.log"
python3 - "$WORK" <<'PY'
import collections, json, sys, pathlib
for name in ("cold", "warm"):
    p = pathlib.Path(sys.argv[1]) / f"{name}.json"
    if not p.is_file():
        print(name, "no report"); continue
    checks = json.loads(p.read_text())["checks"]
    by = collections.Counter()
    for c in checks:
        parts = c["name"].split(".")
        by[(parts[1] if parts[0] == "gpu" and len(parts) > 2 else parts[0], c["status"])] += 1
    print(name, sorted(by.items()))
    for c in checks:
        if c["status"] == "fail":
            print("  FAIL", c["name"], (c.get("reason") or "")[:240])
PY
if [ "${QUACK:-0}" = 1 ]; then
  timeout -k 5 "${QUACK_S:-130}" python3 -m oracle run --kernel quack -q --json "$OUT/quack.json" \
    --results "$OUT/quack_cases" > "$OUT/quack.log" 2>&1
  echo "quack adapter rc=$?"; tail -n 8 "$OUT/quack.log"
  for case in $(ls "$OUT"/quack_cases/*.json 2>/dev/null | head -n 3); do  # localise failures
    timeout -k 5 60 python3 -m oracle drift "$case" --top 5 >> "$OUT/quack_drift.log" 2>&1
  done
  rm -f "$OUT"/quack_cases/*.safetensors  # the saved inputs stay on the device (size)
fi
left=$((BUDGET_S - (SECONDS - start)))
if [ "${TESTS:-1}" = 1 ] && [ "$left" -gt 60 ]; then
  timeout -k 5 "$left" python3 -m pytest tests -m "gpu and not multi_gpu" -n 8 -q --require-gpu \
    -p no:cacheprovider --shuffle-seed "$SEED" -rfE > "$OUT/gpu_tests.log" 2>&1
  echo "gpu tests rc=$? (seed $SEED, ${left}s budget)"
  grep -E "passed|failed" "$OUT/gpu_tests.log" | tail -n 2
  grep -E "^(FAILED|ERROR)" "$OUT/gpu_tests.log" | head -n 40
else
  echo "gpu tests not run: ${left}s left"
fi
