#!/usr/bin/env bash
# Evidence for the cells of issue 14's table, in one device call. Phases run in this order, each
# (tests, A/B, launches, sweep, ncu) under its own timeout, each switchable (TESTS="paths" runs those GPU tests first; BASE=DIR adds
# the A/B; LAUNCHES=0, SWEEP=0 and NCU_CELLS="" skip theirs). Logs under $OUT:
#  * gpu_tests.log — pytest -m gpu over $TESTS;
#  * ab_{base,head}.log — the whole linear at M = 1, 16 (K4, K6; benchmarks/dense_trellis.py,
#    graphed), with BASE (a copy of an earlier
#    b12x package, e.g. `git archive HEAD b12x | tar -x -C .device/base` then BASE=.device/base)
#    first on PYTHONPATH, then with this tree: the same machine, one call;
#  * split_sweep.log — the whole K4 linear at M = 1, 16 at each split of SWEEP_SPLITS and the
#    planned one (benchmarks/dense_trellis.py --split-sweep): what the fp32 partials cost;
#  * launches.log — every kernel of the whole K4 linear and the cuBLAS anchor at the table's M
#    (benchmarks/profile_launches.py --anchor): where decode_matmul's time over cuBLAS goes;
#  * ncu_m<M>_k<B>.log — ncu (--clock-control none) of the trellis GEMM at M = 1 / 16 (K4, K6):
#    issue-slot use, pipes, stalls, DRAM throughput.
#   usage (device tool, carry [".device"]): source .device/env.sh && bash scripts/issue_table_evidence.sh
set -u
OUT="${OUT:-./results/device}"; mkdir -p "$OUT"
NCU="${NCU:-$(command -v ncu || echo /usr/local/cuda/bin/ncu)}"
if [ -n "${TESTS:-}" ]; then  # GPU tests of what this tree changed, first
  timeout -k 5 "${TESTS_S:-150}" python3 -m pytest $TESTS -m gpu -q -n 8 -p no:cacheprovider \
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
    --split-sweep "${SWEEP_SPLITS:-4,8,15}" --json "$OUT/split_sweep.json" > "$OUT/split_sweep.log" 2>&1
  echo "split sweep rc=$?"; grep -v -i warning "$OUT/split_sweep.log" | tail -n 30
fi
for cell in ${NCU_CELLS-1:4 1:6 16:4}; do
  m=${cell%%:*}; b=${cell##*:}
  timeout -k 5 "${NCU_S:-100}" "$NCU" --clock-control none --target-processes all \
    --kernel-name regex:DenseTrellisGemm --launch-skip 3 --launch-count 1 \
    --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
    --section Occupancy --section LaunchStats \
    --metrics "smsp__inst_executed.sum,regex:sm__inst_executed_pipe_(alu|fma|fmaheavy|fp16|lsu)\.avg\.pct_of_peak_sustained_active$,dram__throughput.avg.pct_of_peak_sustained_elapsed,regex:smsp__average_warps_issue_stalled_(long_scoreboard|wait|math_pipe_throttle|not_selected|short_scoreboard|barrier|dispatch_stall|no_instruction)_per_issue_active\.ratio" \
    python3 benchmarks/profile_launches.py --m "$m" --bits "$b" --only dense --plain \
    > "$OUT/ncu_m${m}_k${b}.log" 2>&1
  echo "ncu dense M=$m K$b rc=$?"
  grep -E "Duration|DRAM Throughput|dram__throughput|Registers Per|Achieved Occupancy|Theoretical Occupancy|Issued Warp|No Eligible|Eligible Warps|Warp Cycles Per Issued|Grid Size|Block Size|Waves Per SM|stalled_.*ratio|inst_executed|pct_of_peak" \
    "$OUT/ncu_m${m}_k${b}.log" | head -n 40
done
