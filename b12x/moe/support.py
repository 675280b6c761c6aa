"""What the MoE kernels support (for ``b12x.support`` to merge), and their CPU compile set.

* :func:`supported_moe_variants` — ``{"op", "codebook", "bits", "w13_layout", "compute_dtype"}``
  dicts: the uniform fused MoE for every legal (codebook, bits) of :mod:`b12x.formats` in both
  FC1 layouts and both compute dtypes, and the mixed tiers (``"op": "moe_tiers"``, codebook
  ``"mcg"``, ``"bits": (3, 4)``), and QSRT pairs (``"op": "moe"``, ``"bits": 3`` (the base),
  ``"pair_kind"`` P22/P33/P24/P43/P44 wherever both record rates are legal for the codebook;
  both phases: FC1 on the N axis, FC2 on the K axis; ``"dynamic"`` P33/P24 mode tables are
  covered by those two kinds).
* :func:`moe_kernel_specializations` — the grouped-GEMM specs a representative set of plans
  launches; :func:`compile_moe_specialization` compiles one on the CPU for an arch.
"""

from __future__ import annotations

from b12x.formats import FORMATS

__all__ = ["compile_moe_specialization", "moe_kernel_specializations", "supported_moe_variants"]

LAYOUTS = ("packed", "proj")
COMPUTE_DTYPES = ("float16", "bfloat16")


def supported_moe_variants() -> list[dict]:
    out = []
    for name, fmt in FORMATS.items():
        for bits in fmt.legal_bits:
            for layout in LAYOUTS:
                for dtype in COMPUTE_DTYPES:
                    out.append(
                        {"op": "moe", "codebook": name, "bits": bits, "w13_layout": layout,
                         "compute_dtype": dtype}
                    )  # fmt: skip
    for layout in LAYOUTS:
        for dtype in COMPUTE_DTYPES:
            out.append(
                {"op": "moe_tiers", "codebook": "mcg", "bits": (3, 4), "w13_layout": layout,
                 "compute_dtype": dtype}
            )  # fmt: skip
    out += _pair_variants()
    return out


def _pair_variants() -> list[dict]:
    from b12x.kernels.moe_gemm import PAIR_BASE_BITS, PAIR_KINDS

    out = []
    for name, fmt in FORMATS.items():
        for kind, rates in PAIR_KINDS.items():
            if not {PAIR_BASE_BITS, *rates} <= set(fmt.legal_bits):
                continue
            for layout in LAYOUTS:
                for dtype in COMPUTE_DTYPES:
                    out.append(
                        {"op": "moe", "codebook": name, "bits": PAIR_BASE_BITS, "pair_kind": kind,
                         "phases": ("fc1", "fc2"), "w13_layout": layout, "compute_dtype": dtype}
                    )  # fmt: skip
    return out


def moe_kernel_specializations():
    """Grouped-GEMM specs covering both dtypes, m_tiles 1/2/4, n_tiles 2/4, 2- and 3-word lanes,
    every decoder family (the LUT-reading ones included) and the intra-CTA K split."""
    from b12x.kernels.moe_gemm import MoeGemmSpec

    return [
        MoeGemmSpec("mcg", 3, False, m_tiles=1, n_tiles=2, depth=8),
        MoeGemmSpec("mcg", 4, True, m_tiles=2, n_tiles=4, depth=2),
        MoeGemmSpec("mcg", 6, False, m_tiles=4, n_tiles=4, depth=2),
        MoeGemmSpec("sqg_e4m3", 3, False, m_tiles=1, n_tiles=2, depth=8),
        MoeGemmSpec("sqg_fp16", 5, True, m_tiles=2, n_tiles=2, depth=2),
        MoeGemmSpec("3inst", 2, False, m_tiles=1, n_tiles=2, depth=8),
        MoeGemmSpec("mul1", 8, False, m_tiles=4, n_tiles=2, depth=2),
        # intra-CTA K split (plan: FC1 K = 5120 -> 4, FC2 K = 1536 -> 2; b12x.moe.plan)
        MoeGemmSpec("mcg", 4, False, m_tiles=1, n_tiles=2, warps=4, depth=8, k_split=4),
        MoeGemmSpec("mcg", 4, True, m_tiles=4, n_tiles=4, warps=2, depth=2, k_split=2),
        # QSRT pairs (the plan's geometries, b12x.moe.pairs.pair_geometry)
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
    import cutlass.cute as cute

    from b12x.kernels.moe_gemm import build_moe_gemm
    from b12x.kernels.specs import compile_options

    kernel, args = build_moe_gemm(spec)
    fn = cute.compile(kernel, *args, options=compile_options(arch, ptx=True))
    return fn.artifacts.PTX or ""
