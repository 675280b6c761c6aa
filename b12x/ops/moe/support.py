"""The MoE kernels' CPU compile set (and a deprecated view of their variants).

* :func:`supported_moe_variants` — deprecated: the MoE variants are declared once, in
  :data:`b12x.support.OPS` (``op_contract("moe").variants``); this returns the old dict view of
  them (:func:`b12x.support.supported_moe_variants`).
* :func:`moe_kernel_specializations` — the grouped-GEMM specs a representative set of plans
  launches; :func:`compile_moe_specialization` compiles one on the CPU for an arch.
"""

from __future__ import annotations

__all__ = ["compile_moe_specialization", "moe_kernel_specializations", "supported_moe_variants"]


def supported_moe_variants() -> list[dict]:
    """Deprecated: read ``b12x.support.op_contract("moe").variants``; this is their old view."""
    from b12x import support  # lazy: b12x.support imports the op modules on first use

    return support.supported_moe_variants()


def moe_kernel_specializations():
    """Grouped-GEMM specs covering both dtypes, m_tiles 1/2/4, n_tiles 2/4, 2- and 3-word lanes,
    every decoder family (the LUT-reading ones included) and the intra-CTA K split."""
    from b12x.kernels.moe_gemm import MoeGemmSpec  # lazy: device code, loads CUTLASS

    return [
        MoeGemmSpec("mcg", 3, False, m_tiles=1, n_tiles=2, depth=8),
        MoeGemmSpec("mcg", 4, True, m_tiles=2, n_tiles=4, depth=2),
        MoeGemmSpec("mcg", 6, False, m_tiles=4, n_tiles=4, depth=2),
        MoeGemmSpec("sqg_e4m3", 3, False, m_tiles=1, n_tiles=2, depth=8),
        MoeGemmSpec("sqg_fp16", 5, True, m_tiles=2, n_tiles=2, depth=2),
        MoeGemmSpec("3inst", 2, False, m_tiles=1, n_tiles=2, depth=8),
        MoeGemmSpec("mul1", 8, False, m_tiles=4, n_tiles=2, depth=2),
        # intra-CTA K split (plan: FC1 K = 5120 -> 8, FC2 K = 1536 -> 4; b12x.ops.moe.plan)
        MoeGemmSpec("mcg", 4, False, m_tiles=1, n_tiles=2, warps=2, depth=8, k_split=8),
        MoeGemmSpec("mcg", 4, True, m_tiles=4, n_tiles=4, warps=2, depth=2, k_split=2),
        # QSRT pairs (the plan's geometries, b12x.ops.moe.pairs.pair_geometry)
        MoeGemmSpec("mcg", 3, False, m_tiles=1, n_tiles=2, warps=8, depth=8, pair="P24",
                    rate_axis="n"),
        MoeGemmSpec("mcg", 3, True, m_tiles=4, n_tiles=4, warps=4, depth=2, pair="dynamic",
                    rate_axis="n"),
        MoeGemmSpec("mcg", 3, False, m_tiles=1, n_tiles=2, depth=8, pair="P44", rate_axis="k"),
        MoeGemmSpec("mcg", 3, True, m_tiles=4, n_tiles=2, depth=1, pair="dynamic",
                    rate_axis="k"),
        MoeGemmSpec("sqg_e4m3", 3, False, m_tiles=2, n_tiles=4, depth=2, pair="P22",
                    rate_axis="k"),
    ]  # fmt: skip


def compile_moe_specialization(spec, arch: str) -> str:
    """Compile ``spec`` for ``arch`` on the CPU with fake tensors; return the PTX text."""
    # lazy: CUTLASS loads only when a specialisation is compiled
    import cutlass.cute as cute

    from b12x.launch.kinds import kind_of
    from b12x.launch.toolchain import compile_options

    kernel, args = kind_of(spec).build(spec)
    fn = cute.compile(kernel, *args, options=compile_options(arch, ptx=True))
    return fn.artifacts.PTX or ""
