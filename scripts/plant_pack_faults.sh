#!/usr/bin/env bash
# Plant three faults in the route packer (b12x/kernels/moe_pack.py), one at a time, and run its
# GPU tests against each: every planted fault must fail them (a check that cannot fail is no
# check). The file is restored after each fault. Logs under $OUT.
#   usage (device tool, carry [".device"]): source .device/env.sh && bash scripts/plant_pack_faults.sh
set -u
OUT="${OUT:-./results/device}"; mkdir -p "$OUT"
FILE=b12x/kernels/moe_pack.py
cp "$FILE" "$OUT/moe_pack.orig"
plant() {  # NAME SED-EXPRESSION
  cp "$OUT/moe_pack.orig" "$FILE"
  sed -i "$2" "$FILE"
  if cmp -s "$FILE" "$OUT/moe_pack.orig"; then echo "fault $1: NOT PLANTED (no match)"; return; fi
  timeout -k 5 "${FAULT_S:-60}" python3 -m pytest tests/b12x/test_moe_pack_gpu.py -q -n 4 \
    -p no:cacheprovider > "$OUT/fault_$1.log" 2>&1
  rc=$?
  echo "fault $1: pytest rc=$rc ($( [ $rc -ne 0 ] && echo caught || echo MISSED )):" \
    "$(grep -E '[0-9]+ (passed|failed)' "$OUT/fault_$1.log" | tail -n 1)"
}
plant sentinel 's/packed\[i\] = Int32(n)/packed[i] = Int32(0)/'
plant search_right 's/take = (cand <= experts) \& (end <= start)/take = (cand <= experts) \& (end < start)/'
plant unpadded 's/local = local + (c + block_size - 1) \/\/ block_size \* block_size/local = local + c/'
cp "$OUT/moe_pack.orig" "$FILE"
