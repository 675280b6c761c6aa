"""The cluster reduce of the per-warp dense GEMM (:mod:`b12x.kernels.dense_gemm`, "Cluster
reduce"): the K splits of an output tile form one thread-block cluster and sum their partials
in distributed shared memory.

CPU: every refusal names its field before a launch (a cluster on another mainloop, a size off
2..8, partials written too, a launch of one split), and the planned small-M shape compiles
without a spill at the registers of the partials kernel.

GPU (sm_90): the output is **bit-identical** to the partials path at the same split (fp32
partials in global memory, then the split-ordered reduce), at M = 1, 16 and 29 (a second M
tile: ``row_base`` > 0), splits 3 (uneven K slices; 8 pair chunks dealt unevenly over the
ranks) and 8, a sample of the window regimes, both compute dtypes. One case makes the split
order visible after rounding: split 1's K16 rows repeat split 0's payload rows with negated
activations, so partial 1 cancels partial 0 (about 2^16) and only the ordered sum
``((0 + p_0) + p_1) + … + p_{S-1}`` gives the partials path's bits. The output starts as NaN,
so a pair no rank writes fails too.
"""

from __future__ import annotations

import pytest
import torch

from b12x.kernels.shared_layout import check_reduce_cluster, reduce_cluster_smem_bytes
from b12x.launch import host
from b12x.launch.specs import KernelSpec, compile_spec
from oracle.runners import inputs as case_inputs
from reference import trellis as ref_trellis

#: The small-M per-warp geometry the plan runs (1 M16 block x 2 N16 tiles per warp, 8 warps).
TILES, WARPS = (1, 2), 8
#: A sample of the window regimes: K2, K4, K6 MCG, a K3 3INST and a LUT codebook.
REGIMES = (("mcg", 2), ("3inst", 3), ("mcg", 4), ("mcg", 6), ("sqg_e4m3", 3))
#: Activation scale of the first split in the order case (fp16-safe: |a| stays below 2^16).
LOUD = 2.0**14


def cancelling_case(split_k: int, dtype, m: int = 16, n: int = 256, rows_per_split: int = 4):
    """(a, K4 MCG payload): split 1 repeats split 0's payload rows against its negated, LOUD
    activations, so partial 1 is exactly -partial 0 (about 2^16). In split order the two cancel
    before the others are added, which keep their fine bits; in any other order a running sum
    of about 2^16 rounds them to its grid (2^-7 or coarser, an fp16 ulp of the O(10) outputs)."""
    gen = torch.Generator().manual_seed(split_k)
    k_rows = rows_per_split * split_k
    payload = case_inputs.payload(gen, k_rows, n // 16, 64)
    payload[rows_per_split : 2 * rows_per_split] = payload[:rows_per_split]
    a = torch.randn(m, 16 * k_rows, generator=gen) * 0.5
    first = slice(0, 16 * rows_per_split)
    a[:, first] *= LOUD
    a[:, 16 * rows_per_split : 32 * rows_per_split] = -a[:, first]
    return a.to(dtype), payload


def test_the_order_shows_after_rounding():
    """The premise of the order case, on the CPU with reference partials: summed last split
    first, a fifth of the fp16 outputs or more change."""
    a, payload = cancelling_case(8, torch.float16)
    w = ref_trellis.decode(payload, "mcg").float()
    k = w.shape[0] // 8
    partials = [a[:, s * k : (s + 1) * k].float() @ w[s * k : (s + 1) * k] for s in range(8)]
    forward = torch.zeros_like(partials[0])
    for p in partials:
        forward = forward + p
    backward = torch.zeros_like(partials[0])
    for p in reversed(partials):
        backward = backward + p
    assert (forward.half() != backward.half()).float().mean() > 0.2  # 0.30 measured


def test_refusals_name_the_field():
    with pytest.raises(ValueError, match="reduce_cluster: expected one of"):
        KernelSpec("gemm", "mcg", 4, m_tiles=1, n_tiles=2, warps=8, reduce_cluster=9)
    with pytest.raises(ValueError, match="reduce_cluster: expected one of"):
        KernelSpec("gemm", "mcg", 4, m_tiles=1, n_tiles=2, warps=8, reduce_cluster=True)
    with pytest.raises(ValueError, match="per-warp register mainloop only"):
        KernelSpec("gemm", "mcg", 4, m_tiles=1, n_tiles=2, warps=8, smem_stages=3, reduce_cluster=4)
    with pytest.raises(ValueError, match="per-warp register mainloop only"):
        KernelSpec(
            "gemm", "mcg", 4, m_tiles=2, n_tiles=1, warps=8, m_warps=4, smem_stages=3,
            reduce_cluster=4,
        )  # fmt: skip
    with pytest.raises(ValueError, match="writes no partials"):
        KernelSpec("gemm", "mcg", 4, m_tiles=1, n_tiles=2, warps=8, write_partials=True,
                   reduce_cluster=4)  # fmt: skip
    with pytest.raises(ValueError, match="staging tile"):
        check_reduce_cluster(
            8, swap_ab=False, wgmma=False, m_tiles=4, n_tiles=4, warps=8, m_warps=0, stages=0
        )
    a = torch.zeros(1, 8192, dtype=torch.float16)
    payload = torch.zeros(512, 64, 64, dtype=torch.int16)
    with pytest.raises(ValueError, match="reduce_in_cluster: needs 2..8 K splits"):
        host.trellis_matmul(a, payload, "mcg", split_k=1, tiles=TILES, warps=WARPS,
                            reduce_in_cluster=True)  # fmt: skip
    with pytest.raises(ValueError, match="reduce_cluster: expected one of"):
        host.trellis_matmul(a, payload, "mcg", split_k=15, tiles=TILES, warps=WARPS,
                            reduce_in_cluster=True)  # fmt: skip
    with pytest.raises(TypeError, match="reduce_in_cluster: expected a bool"):
        host.trellis_matmul(a, payload, "mcg", split_k=8, tiles=TILES, warps=WARPS,
                            reduce_in_cluster=1)  # fmt: skip


def test_staging_tile_bytes():
    # 16 rows x (256 + 8 pad) fp32 words: the small-M tile's stage fits 8 CTAs in an SM.
    assert reduce_cluster_smem_bytes(m_tiles=1, n_tiles=2, warps=8) == 16 * 264 * 4


@pytest.mark.parametrize("bits", [4, 6])
def test_compiles_without_spill_at_the_partials_registers(bits):
    partials = compile_spec(
        KernelSpec("gemm", "mcg", bits, m_tiles=1, n_tiles=2, warps=8, write_partials=True),
        "sm_90",
    )
    cluster = compile_spec(
        KernelSpec("gemm", "mcg", bits, m_tiles=1, n_tiles=2, warps=8, reduce_cluster=8), "sm_90"
    )
    assert cluster.spill_bytes == 0
    assert cluster.registers <= partials.registers, (cluster.registers, partials.registers)


# ---------------------------------------------------------------------------------------------
# GPU


@pytest.fixture
def _hopper():
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("thread-block clusters need sm_90+")


def _both_paths(a, payload, codebook, split_k):
    """(partials path, cluster path) outputs of one GEMM, each started as NaN."""
    outs = []
    for in_cluster in (False, True):
        out = torch.full((a.shape[0], payload.shape[1] * 16), float("nan"), dtype=a.dtype,
                         device=a.device)  # fmt: skip
        host.trellis_matmul(
            a, payload, codebook, split_k=split_k, out=out, tiles=TILES, warps=WARPS,
            reduce_in_cluster=in_cluster,
        )  # fmt: skip
        outs.append(out)
    torch.cuda.synchronize()
    return outs


def _assert_bitwise(partials_out, cluster_out, what):
    differ = int((partials_out.view(torch.int16) != cluster_out.view(torch.int16)).sum())
    assert differ == 0, f"{what}: {differ} of {cluster_out.numel()} outputs differ"


@pytest.mark.gpu
@pytest.mark.usefixtures("_hopper")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("split_k", [3, 8])
@pytest.mark.parametrize("m", [1, 16, 29])
@pytest.mark.parametrize(("codebook", "bits"), REGIMES)
def test_bit_identical_to_the_partials_path(codebook, bits, m, split_k, dtype):
    gen = torch.Generator().manual_seed(1000 * bits + 10 * m + split_k)
    k_rows, n = 24, 512  # two CTAs along N; 24 K16 rows: splits of 12, 8 and 3 rows
    payload = case_inputs.payload(gen, k_rows, n // 16, 16 * bits).cuda()
    a = (torch.randn(m, 16 * k_rows, generator=gen) * 0.5).to(dtype).cuda()
    partials_out, cluster_out = _both_paths(a, payload, codebook, split_k)
    assert not torch.isnan(partials_out).any()
    _assert_bitwise(partials_out, cluster_out, f"M={m} S={split_k}")


@pytest.mark.gpu
@pytest.mark.usefixtures("_hopper")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("split_k", [3, 8])
def test_split_order_shows(split_k, dtype):
    """Partial 1 cancels partial 0 exactly (:func:`cancelling_case`): only the split order
    keeps the other splits' fine bits."""
    a, payload = cancelling_case(split_k, dtype)
    partials_out, cluster_out = _both_paths(a.cuda(), payload.cuda(), "mcg", split_k)
    assert not torch.isnan(partials_out).any()
    _assert_bitwise(partials_out, cluster_out, f"cancelling S={split_k}")
