"""Tiny launches of every b12x device path, for compute-sanitizer (driven by scripts/sanitize.sh).

Each case plans, allocates exactly the plan's caller buffers, runs once, synchronises and prints
one line: ``ok <case> <wall s> sum=<finite sum of the output>``, ``skip <case>: <reason>`` or
``FAIL <case>: <error>``; the exit status is 1 when any case failed, 2 when the selection ran
nothing (no case matches, no CUDA device, or every case skipped). Shapes are tiny (the
sanitizers slow kernels down 10-100x) but still cross the boundaries that matter: a tail M that
is not a multiple of 16 and a live M below the planned M, split-K, bf16 compute, codebooks with
and without a look-up table, inactive route ids (−1, E, 2^40) and unmapped tier ids.

Cases (``--only SUBSTRING`` selects, ``--list`` lists):

* ``dense_generic_f16_splitk``: generic path, fp16, split-K 2 (c_tmp + reduce), planned M 48,
  live M 33: the shared decode's wide geometry (128-row CTA, 15 of 16 row blocks past M).
* ``dense_generic_bf16``: generic path, bf16 input and compute, sqg_e4m3 K3 (LUT), M 17: the
  shared decode's thin geometry.
* ``decode_kernel``: the decode kernel for mcg K4, sqg_e4m3 K3 and sqg_fp16 K5.
* ``dense_decode_matmul``: M 1040 > 1024 takes the decode-then-GEMM path.
* ``dense_k6_small_m``: the K6/MCG small-M row is gated to capability (12, 0); it is planned
  here with the device's limits but capability (12, 0) (the plan API takes a device description),
  so its launches (rotation, GEMM into the fp16 output, in-place output rotation) run on this GPU.
* ``moe_uniform_f16``: uniform MCG K3, packed FC1, fp16, planned M 12, live M 10, inactive ids.
* ``moe_uniform_bf16_proj``: uniform MCG K4, proj FC1, bf16 input and compute, inactive ids.
* ``moe_shared_decode``: the grouped GEMMs' shared decode (128-slot route blocks, the K-slice
  fold), planned M 300, live M 290, bf16 compute, inactive ids.
* ``dense_wgmma``: the sm_90 row at M 65..128 (the swap-AB mainloop, planned as stream-K:
  partials and flags), planned M 100, live M 70, bf16 compute;
  ``dense_wgmma_pairs``: its M 129..256 row (stream-K over CTA pairs), planned M 200, live 150;
  ``dense_wgmma_deep``: its M <= 64 row (4 K16 rows per step, stream-K), planned M 64, live 50;
  ``dense_swap_ab``: the swap-AB mainloop launched directly, 256 tokens per CTA, M 290,
  unsplit and split 3; ``dense_swap_cluster``: the same with CTA pairs sharing each token tile
  (TMA multicast), N 512.
* ``moe_tensor_decode``: the shared decode's wgmma geometry pinned, M 300 / 290. These two plan
  the wgmma mainloops, so off sm_90 they are skipped and counted (``driver: … skipped``).
* ``moe_pair_tensor_decode``: QSRT pairs on the pair wgmma shared decode (dynamic FC1, P43
  FC2), M 300 / 290, skipped off sm_90 like the two above.
* ``moe_tiered``: K3/K4 tiers (5 + 3 experts of 10 global ids), unmapped and out-of-range ids.

Usage: ``python3 scripts/sanitize_driver.py [--only S] [--list]`` (needs a CUDA device; the
project root on ``PYTHONPATH``, as ``.device/env.sh`` or ``pip install -e .`` gives it).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
import traceback

import torch

from b12x.kernels.shared_layout import WGMMA_CAPABILITY
from b12x.launch import host
from b12x.ops.dense import allocate_dense_buffers, bind_dense, plan_dense, run_dense
from b12x.ops.dense.plan import device_limits
from b12x.ops.moe.plan import allocate_moe_buffers, bind_moe, plan_moe
from b12x.ops.moe.run import MoeInputs, run_moe
from b12x.ops.moe.tiers import build_tiered_maps, combine_tier_rotations, plan_tiered_moe

F16, BF16 = torch.float16, torch.bfloat16
DEV = "cuda"


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _payload(g, *shape) -> torch.Tensor:
    data = torch.randint(-(2**15), 2**15, shape, generator=g, dtype=torch.int32)
    return data.to(torch.int16).to(DEV)


def _signs(g, *shape, scale=1.0) -> torch.Tensor:
    return (torch.randn(*shape, generator=g).sign() * scale).to(F16).to(DEV)


def _dense(
    m_plan, m_live, k, n, bits, codebook, x_dtype, *, expect_path, seed, expect_wgmma=None,
    expect_stream_k=None, expect_cluster=None, **plan_kw,
):  # fmt: skip
    plan = plan_dense(m=m_plan, k=k, n=n, bits=bits, codebook=codebook, x_dtype=x_dtype, **plan_kw)
    if plan.path != expect_path:
        raise RuntimeError(f"planned path {plan.path!r}, expected {expect_path!r}")
    g = plan.geometry
    got = {"wgmma": g.wgmma, "stream_k": g.stream_k, "cluster": g.cluster}
    want = {"wgmma": expect_wgmma, "stream_k": expect_stream_k, "cluster": expect_cluster}
    wrong = {key: got[key] for key, value in want.items() if value not in (None, got[key])}
    if wrong:  # the case would sanitise another kernel than its name says
        raise RuntimeError(f"planned mainloop {plan.mainloop_reasons[-1]!r}: {wrong}, want {want}")
    bound = bind_dense(plan, **allocate_dense_buffers(plan, DEV))
    g = _gen(seed)
    x = (0.5 * torch.randn(m_live, k, generator=g)).to(x_dtype).to(DEV)
    trellis = _payload(g, k // 16, n // 16, 16 * bits)
    return run_dense(bound, x, trellis, _signs(g, k), _signs(g, n, scale=0.125))


def dense_generic_f16_splitk():
    return _dense(48, 33, 512, 256, 4, "mcg", F16, expect_path="generic", seed=1, split_k=2)


def dense_generic_bf16():
    return _dense(
        17, 17, 256, 256, 3, "sqg_e4m3", BF16, expect_path="generic", seed=2,
        compute_dtype=BF16,
    )  # fmt: skip


def decode_kernel():
    outs = []
    for seed, (codebook, bits) in enumerate((("mcg", 4), ("sqg_e4m3", 3), ("sqg_fp16", 5))):
        payload = _payload(_gen(10 + seed), 64 // 16, 256 // 16, 16 * bits)
        outs.append(host.decode_weight(payload, codebook).float().sum().view(1))
    return torch.cat(outs)


def dense_wgmma():
    """The sm_90 row at M 65..128 (the swap-AB mainloop, 128 tokens x 256 weight rows per CTA,
    planned as stream-K: one CTA per SM, so at this size most K pieces are
    fixed up across CTAs through the partials and flags): planned M 100, live M 70 (tokens past
    it zero-filled), N 512 (two CTA columns), bf16 compute, K3 sqg_e4m3 (a LUT codebook)."""
    return _dense(
        100, 70, 512, 512, 3, "sqg_e4m3", BF16, expect_path="generic", seed=11,
        expect_wgmma=True, expect_stream_k=True, expect_cluster=1, compute_dtype=BF16,
    )  # fmt: skip


def dense_wgmma_pairs():
    """The sm_90 row at M 129..256: swap-AB CTA pairs sharing each token tile (TMA multicast),
    stream-K over the pairs: planned M 200, live M 150, K 1024, N 512, bf16, mcg K4."""
    return _dense(
        200, 150, 1024, 512, 4, "mcg", BF16, expect_path="generic", seed=23,
        expect_wgmma=True, expect_stream_k=True, expect_cluster=2, compute_dtype=BF16,
    )  # fmt: skip


def dense_wgmma_deep():
    """The sm_90 tensor-core row at M <= 64 (4 K16 rows per step, stream-K planned): planned
    M 64, live M 50 (the second warpgroup dead, the first partly live), K 1024 (4 steps of 4
    rows), bf16."""
    return _dense(
        64, 50, 1024, 512, 4, "mcg", BF16, expect_path="generic", seed=13,
        expect_wgmma=True, expect_stream_k=True, expect_cluster=1, compute_dtype=BF16,
    )  # fmt: skip


def dense_swap_ab():
    """The sm_90 swap-AB mainloop launched directly (weights in the wgmma A registers): 256
    tokens per CTA, M 290 (the second token tile 34 live), N 256, K 1024 (the last of 6-slot
    periods partly past K), bf16, mcg K4; unsplit, then split 3 (fp32 partials + reduce)."""
    g = _gen(17)
    payload = _payload(g, 1024 // 16, 256 // 16, 16 * 4)
    a = torch.randn(290, 1024, generator=g).to(BF16).to(DEV)
    outs = []
    for split in (1, 3):
        out = host.trellis_matmul(
            a, payload, "mcg", split_k=split, tiles=(16, 1), warps=8, m_warps=8,
            shared_rows=2, smem_stages=6, wgmma=True, swap_ab=True,
        )  # fmt: skip
        outs.append(out.float().sum().view(1))
    return torch.cat(outs)


def dense_swap_cluster():
    """The swap-AB mainloop whose CTA pairs share each token tile by TMA multicast (the planned
    row above M = 128, its planned 4 x 4 slots): M 290, N 512 (four CTAs, two clusters), K 1024,
    bf16, mcg K4; unsplit, then split 3 (K16 rows past a split's end copied as out-of-bounds
    zeros)."""
    g = _gen(19)
    payload = _payload(g, 1024 // 16, 512 // 16, 16 * 4)
    a = torch.randn(290, 1024, generator=g).to(BF16).to(DEV)
    outs = []
    for split in (1, 3):
        out = host.trellis_matmul(
            a, payload, "mcg", split_k=split, tiles=(16, 1), warps=8, m_warps=8,
            shared_rows=4, smem_stages=4, wgmma=True, swap_ab=True, cluster=2,
        )  # fmt: skip
        outs.append(out.float().sum().view(1))
    return torch.cat(outs)


def dense_decode_matmul():
    return _dense(1040, 1040, 256, 256, 4, "mcg", F16, expect_path="decode_matmul", seed=3)


def dense_k6_small_m():
    limits = dataclasses.replace(device_limits(), capability=(12, 0))
    return _dense(
        16, 16, 512, 256, 6, "mcg", BF16, expect_path="k6_mcg_small_m", seed=4, device=limits
    )


def _experts(g, e, h, i, bits, layout):
    words = 16 * bits
    if layout == "packed":
        w13 = _payload(g, e, h // 16, 2 * i // 16, words)
    else:
        w13 = _payload(g, 2, e, h // 16, i // 16, words)

    def scales(rows, width):
        sign = torch.where(torch.rand(rows, width, generator=g) < 0.5, -1.0, 1.0)
        return (sign * (0.8 + 0.4 * torch.rand(rows, width, generator=g))).half().to(DEV)

    gate = scales(e, h)
    return {
        "w13": w13,
        "w2": _payload(g, e, i // 16, h // 16, words),
        "gate_suh": gate,
        "up_suh": gate if layout == "packed" else scales(e, h),
        "intermediate_rotations": scales(e, 3 * i),
        "down_svh": scales(1, h),
    }


def _routes(g, m, top_k, e, x_dtype, h):
    x = (0.25 * torch.randn(m, h, generator=g)).to(x_dtype)
    ids = torch.stack([torch.randperm(e, generator=g)[:top_k] for _ in range(m)])
    ids[0, 0], ids[1, top_k - 1], ids[m - 1] = -1, e, 2**40  # last token: all routes inactive
    w = torch.rand(m, top_k, generator=g)
    return x.to(DEV), w.to(DEV), ids.to(DEV)


def _uniform(m_plan, m_live, bits, layout, x_dtype, compute_dtype, seed, h=256, i=128, **kw):
    e, top_k = 8, 4
    g = _gen(seed)
    ex = _experts(g, e, h, i, bits, layout)
    plan = plan_moe(
        m=m_plan, top_k=top_k, hidden=h, intermediate=i, codebook="mcg", bits=bits,
        num_experts=e, w13_layout=layout, x_dtype=x_dtype, compute_dtype=compute_dtype, **kw,
    )  # fmt: skip
    bound = bind_moe(plan, **allocate_moe_buffers(plan, DEV))
    x, w, ids = _routes(g, m_live, top_k, e, x_dtype, h)
    inputs = MoeInputs(
        x, w, ids, (ex["w13"],), (ex["w2"],), ex["gate_suh"],
        ex["up_suh"] if layout == "proj" else None, ex["intermediate_rotations"], ex["down_svh"],
    )  # fmt: skip
    return run_moe(bound, inputs)


def moe_uniform_f16():
    return _uniform(12, 10, 3, "packed", F16, F16, seed=5)


def moe_uniform_bf16_proj():
    return _uniform(20, 20, 4, "proj", BF16, BF16, seed=6)


def moe_k_split():
    """H = 1024, I = 512: the plan splits FC1's K over 2 warp groups (smem reduction, barriers)."""
    return _uniform(6, 5, 4, "packed", F16, F16, seed=8, h=1024, i=512)


def moe_shared_decode():
    """H = 1024, I = 512, the shared decode pinned: 128-slot blocks (FC1 folds 2 K slices),
    planned M 300, live M 290 (blocks with padding slots and dead warps), inactive ids."""
    return _uniform(300, 290, 4, "packed", F16, BF16, seed=9, h=1024, i=512, shared_decode="wide")


def moe_tensor_decode():
    """The shared decode's sm_90 tensor geometry pinned (128 x 256 per CTA, wgmma, the K-slice
    fold through shared memory), planned M 300, live M 290, inactive ids."""
    return _uniform(
        300, 290, 4, "packed", F16, BF16, seed=12, h=1024, i=512, shared_decode="tensor",
        device=torch.device(DEV),
    )  # fmt: skip


def moe_pair_tensor_decode():
    """QSRT pairs on the pair wgmma shared decode: dynamic FC1 (N axis, both bodies in one
    allocation) and P43 FC2 (K axis: a record run shorter than the slot), planned M 300, live
    M 290, inactive ids."""
    from oracle.run.runners.inputs import MoeChoices, paired_experts, stack_to

    e, top_k, h, i, m_plan, m_live = 8, 4, 1024, 512, 300, 290
    g = _gen(13)
    choices = MoeChoices("proj", F16, torch.int64, "dynamic", "P43")
    ex = stack_to(paired_experts(g, e, h, i, choices, "mcg"), DEV)
    plan = plan_moe(
        m=m_plan, top_k=top_k, hidden=h, intermediate=i, codebook="mcg", bits=3, num_experts=e,
        w13_layout="proj", x_dtype=F16, compute_dtype=BF16, fc1_pair="dynamic", fc2_pair="P43",
        shared_decode="tensor", device=torch.device(DEV),
    )  # fmt: skip
    bound = bind_moe(plan, **allocate_moe_buffers(plan, DEV))
    x, w, ids = _routes(g, m_live, top_k, e, F16, h)
    inputs = MoeInputs(
        x, w, ids, (ex.w13,), (ex.w2,), ex.gate_suh, ex.up_suh, ex.intermediate_rotations,
        ex.down_svh, None, None, ex.fc1_modes, ex.fc2_modes,
    )  # fmt: skip
    return run_moe(bound, inputs)


def moe_tiered():
    h, i, top_k, m = 256, 128, 2, 16
    g = _gen(7)
    t0, t1 = _experts(g, 5, h, i, 3, "proj"), _experts(g, 3, h, i, 4, "proj")
    t0_ids, t1_ids, num_global = [9, 0, 4, 6, 2], [7, 1, 3], 10  # global 5 and 8 unmapped
    g2c, desc = build_tiered_maps(t0_ids, t1_ids, num_global)
    tables = combine_tier_rotations(t0, t1, (5, 3))
    plan = plan_tiered_moe(
        m=m, top_k=top_k, hidden=h, intermediate=i, codebook="mcg", tier0_bits=3, tier1_bits=4,
        tier0_experts=5, tier1_experts=3, num_global_experts=num_global, w13_layout="proj",
        x_dtype=F16, compute_dtype=F16,
    )  # fmt: skip
    bound = bind_moe(plan, **allocate_moe_buffers(plan, DEV))
    x = (0.25 * torch.randn(m, h, generator=g)).half().to(DEV)
    ids = torch.randint(0, num_global, (m, top_k), generator=g)
    ids[0, 0], ids[1, 1], ids[2, 0], ids[3, 1] = 5, 8, -1, num_global  # unmapped, out of range
    w = torch.rand(m, top_k, generator=g).to(DEV)
    inputs = MoeInputs(
        x, w, ids.to(DEV), (t0["w13"], t1["w13"]), (t0["w2"], t1["w2"]), tables["gate_suh"],
        tables["up_suh"], tables["intermediate_rotations"], tables["down_svh"], g2c.to(DEV),
        desc.to(DEV),
    )  # fmt: skip
    return run_moe(bound, inputs)


#: Cases whose plans need sm_90 (the wgmma mainloops): skipped, and counted, elsewhere.
WGMMA_CASES = (
    "dense_wgmma",
    "dense_wgmma_pairs",
    "dense_wgmma_deep",
    "dense_swap_ab",
    "dense_swap_cluster",
    "moe_tensor_decode",
    "moe_pair_tensor_decode",
)
CASES = {
    f.__name__: f
    for f in (
        dense_generic_f16_splitk,
        dense_generic_bf16,
        dense_wgmma,
        dense_wgmma_pairs,
        dense_wgmma_deep,
        dense_swap_ab,
        dense_swap_cluster,
        decode_kernel,
        dense_decode_matmul,
        dense_k6_small_m,
        moe_uniform_f16,
        moe_uniform_bf16_proj,
        moe_k_split,
        moe_shared_decode,
        moe_tensor_decode,
        moe_pair_tensor_decode,
        moe_tiered,
    )
}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="run the cases whose name contains this")
    parser.add_argument("--list", action="store_true", help="list the cases and exit")
    args = parser.parse_args(argv)
    names = [n for n in CASES if args.only in n]
    if args.list:
        print("\n".join(names))
        return 0
    if not names:  # a selection that matches nothing must not pass as a clean run
        print(f"driver: --only {args.only!r} matches no case (--list lists them)", flush=True)
        return 2
    if not torch.cuda.is_available():
        print("skip all: no CUDA device")
        return 2
    failed = skipped = 0
    hopper = torch.cuda.get_device_capability() == WGMMA_CAPABILITY
    for name in names:
        if name in WGMMA_CASES and not hopper:
            skipped += 1
            print(f"skip {name}: the wgmma mainloops run on sm_90 only", flush=True)
            continue
        start = time.perf_counter()
        try:
            out = CASES[name]()
            torch.cuda.synchronize()
            total = float(out.float().nan_to_num(0.0, 0.0, 0.0).sum())
            finite = bool(torch.isfinite(out).all())
            note = "" if finite else " (non-finite values present)"
            print(f"ok {name} {time.perf_counter() - start:.1f}s sum={total:.6g}{note}", flush=True)
        except Exception as exc:  # noqa: BLE001 - reported per case, the run goes on
            failed += 1
            print(f"FAIL {name}: {type(exc).__name__}: {exc}", flush=True)
            traceback.print_exc()
    ran = len(names) - skipped
    print(f"driver: {ran - failed} ok, {failed} failed, {skipped} skipped", flush=True)
    if not ran:  # e.g. only wgmma cases selected off sm_90: a sanitizer's "0 errors" judged nothing
        print("driver: every selected case was skipped; nothing was sanitised", flush=True)
        return 2
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
