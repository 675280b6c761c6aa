#!/usr/bin/env bash
# Evidence for the cells of issue 14's table, in one device call. Phases, in this order, each
# under its own timeout: TESTS="paths" runs those GPU tests first; BASE=DIR adds the A/B;
# LAUNCHES=0 and SWEEP=0 skip theirs. Logs under $OUT:
#  * gpu_tests.log: pytest -m gpu over $TESTS;
#  * ab_{base,head}.log: the whole linear at M = 1, 16 (AB_BITS, default K4 and K6;
#    benchmarks/dense_trellis.py, graphed), first with BASE (a copy of an earlier b12x package,
#    e.g. `git archive HEAD b12x | tar -x -C .device/base`, then BASE=.device/base) ahead on
#    PYTHONPATH, then with this tree: the same machine, one call;
#  * launches.log: every kernel of the whole K4 linear and of the cuBLAS anchor at the table's M
#    (benchmarks/profile_launches.py --anchor): where decode_matmul's time over cuBLAS goes;
#  * split_sweep.log: the whole K4 linear at M = 1, 16 at each split of SWEEP_SPLITS and the
#    planned one (benchmarks/dense_trellis.py --split-sweep): what the fp32 partials cost.
# The ncu profile of the small-M GEMM is scripts/profile_small_m.sh (DENSE_BITS="4 6").
#   usage (device tool, carry [".device"]):
#     source .device/env.sh && bash scripts/issue_table_evidence.sh
set -u
OUT="${OUT:-./results/device}"; mkdir -p "$OUT"
if [ -n "${TESTS:-}" ]; then  # GPU tests of what this tree changed, first
  timeout -k 5 "${TESTS_S:-150}" python3 -m pytest $TESTS -m gpu -q -n 8 --require-gpu -p no:cacheprovider \
    -rfE > "$OUT/gpu_tests.log" 2>&1
  echo "gpu tests rc=$?"; grep -E "passed|failed|^(FAILED|ERROR)" "$OUT/gpu_tests.log" | tail -n 20
fi
if [ -n "${BASE:-}" ]; then  # A/B: the whole linear at small M, BASE (a b12x tree) against this one
  for side in base head; do
    pp="$PYTHONPATH"; [ "$side" = base ] && pp="$BASE:$PYTHONPATH"
    PYTHONPATH="$pp" timeout -k 5 "${AB_S:-120}" python3 benchmarks/dense_trellis.py --m 1,16 \
      --bits "${AB_BITS:-4,6}" --no-peer --budget-s "${AB_BUDGET_S:-60}" > "$OUT/ab_$side.log" 2>&1
    echo "A/B $side rc=$?"; grep -v -i warning "$OUT/ab_$side.log" | tail -n 14
  done
fi
if [ "${LAUNCHES:-1}" = 1 ]; then
  timeout -k 5 "${LAUNCH_S:-150}" python3 benchmarks/profile_launches.py --only dense \
    --m "${LAUNCH_M:-1,16,64,256,1024,4096}" --bits 4 --anchor > "$OUT/launches.log" 2>&1
  echo "launches rc=$?"; grep -v -i warning "$OUT/launches.log" | head -n 150
fi
if [ "${SWEEP:-1}" = 1 ]; then
  timeout -k 5 "${SWEEP_S:-150}" python3 benchmarks/dense_trellis.py --m 1,16 --bits 4 --no-peer \
    --split-sweep "${SWEEP_SPLITS:-4,8,15}" --json "$OUT/split_sweep.json" \
    > "$OUT/split_sweep.log" 2>&1
  echo "split sweep rc=$?"; grep -v -i warning "$OUT/split_sweep.log" | tail -n 30
fi
