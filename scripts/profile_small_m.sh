#!/usr/bin/env bash
# Where the small-M time goes (issues 14 and 15), in one device call: the launch table of the
# dense linear (K2/K4/K6 at M = 1, 16) and of the MoE step (M = 1, 8) from
# benchmarks/profile_launches.py (MoE: the stacks of STACKS, default uniform,tiers,pair), then an
# ncu profile (--clock-control none) of the trellis GEMM of one dense linear at M = 1 and M = 16
# (K4, MCG; DENSE_BITS="4 6" adds K6): speed of light, warp stall reasons, scheduler,
# occupancy, launch statistics, and the instructions each pipe executed and its busy share (alu,
# fma, fmaheavy, fmalite, fp16, lsu, tensor). DENSE_M=1 profiles M = 1 only (DENSE_M="64 256" the
# stream-K rows); LAUNCHES=0 skips the tables. Logs under $OUT. Exits 1 when an ncu run failed or
# profiled no kernel (its filter, KERNEL_RE, matched no launch).
#   usage (device tool, carry [".device"]):
#     source .device/env.sh && bash scripts/profile_small_m.sh
set -u
OUT="${OUT:-./results/device}"; mkdir -p "$OUT"
NCU="${NCU:-$(command -v ncu || echo /usr/local/cuda/bin/ncu)}"
# the trellis GEMM: the plain kernels and, where the plan takes it (M 33..256 on sm_90), stream-K
KERNEL_RE="${KERNEL_RE:-Dense(TrellisGemm|StreamKGemm)}"
status=0  # 1 when a profile failed or profiled no kernel
if [ "${LAUNCHES:-1}" = 1 ]; then
  timeout -k 5 "${LAUNCH_S:-150}" python3 benchmarks/profile_launches.py --m 1,16 --bits 2,4,6 \
    --only dense > "$OUT/launches_dense.log" 2>&1; echo "launches dense rc=$?"
  timeout -k 5 "${LAUNCH_S:-150}" python3 benchmarks/profile_launches.py --m 1,8 --only moe \
    --stacks "${STACKS:-uniform,tiers,pair}" > "$OUT/launches_moe.log" 2>&1
  echo "launches moe rc=$?"
  cat "$OUT/launches_dense.log" "$OUT/launches_moe.log" | grep -v Warning | head -n 160
fi
for m in ${DENSE_M:-1 16}; do
for b in ${DENSE_BITS:-4}; do
  # the trellis GEMM of the fourth call (after three warm-ups), not the setup kernels before it
  timeout -k 5 "${NCU_S:-150}" "$NCU" --clock-control none --target-processes all \
    --kernel-name "regex:$KERNEL_RE" --launch-skip 3 --launch-count 1 \
    --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
    --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis \
    --section ComputeWorkloadAnalysis --section InstructionStats \
    --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,smsp__inst_executed.sum,regex:smsp__inst_executed_pipe_(alu|fma|fmaheavy|fmalite|fp16|lsu|uniform|tensor.*)\.sum$,regex:sm__pipe_(alu|fma|fmaheavy|fmalite|fp16|shared|tensor.*)_cycles_active\.avg\.pct_of_peak_sustained_active$,regex:sm__inst_executed_pipe_(alu|fma|fmaheavy|fmalite|fp16|lsu)\.avg\.pct_of_peak_sustained_active$" \
    python3 benchmarks/profile_launches.py --m "$m" --bits "$b" --only dense --plain \
    > "$OUT/ncu_dense_m${m}_k$b.log" 2>&1
  rc=$?
  # ncu exits 0 when its filter matched no kernel: say so instead of printing an empty profile
  if grep -qi "no kernels were profiled" "$OUT/ncu_dense_m${m}_k$b.log"; then
    echo "ncu dense M=$m K$b: NO KERNEL PROFILED (no launch matched regex:$KERNEL_RE)"
    status=1
  else
    echo "ncu dense M=$m K$b rc=$rc"; [ "$rc" = 0 ] || status=1
  fi
  grep -E "^  [A-Za-z_].*\(|Duration|Compute \(SM\) Throughput|Memory Throughput|DRAM Throughput|Registers Per|Achieved Occupancy|Theoretical Occupancy|Issued Warp|No Eligible|Active Warps Per|Eligible Warps|Warp Cycles Per Issued|Grid Size|Block Size|Waves Per SM|stalled_[a-z_]*_per_issue_active.ratio +[0-9.]*[1-9]|inst_executed.sum|inst_executed_pipe|pipe_.*cycles_active" \
    "$OUT/ncu_dense_m${m}_k$b.log" | head -n 200
done
done
exit "$status"
