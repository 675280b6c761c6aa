"""SHA-256 of the PTX of a representative set of dense kernel specs, compiled on CPU
(optimisation level 2).

Run before and after a host-side refactor and compare the two JSON files: a change that must
not touch codegen leaves every digest equal. Keys are stable spec descriptions
(``arch kind codebook/bits fields``), values the SHA-256 of the PTX text.

    CUTE_DSL_ARCH=sm_90 python scripts/ptx_digest.py --out /tmp/before.json
    python scripts/ptx_digest.py --compare /tmp/before.json /tmp/after.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

#: (arch, kind, codebook, bits, fields): fields are the spec's keywords besides the format.
CASES: tuple[tuple[str, str, str | None, int | None, dict], ...] = (
    ("sm_80", "gemm", "mcg", 4, {"m_tiles": 1, "n_tiles": 4}),
    ("sm_90", "gemm", "mcg", 4, {"m_tiles": 1, "n_tiles": 2}),
    ("sm_90", "gemm", "sqg_e4m3", 2, {"m_tiles": 2, "n_tiles": 4, "write_partials": True}),
    ("sm_90", "gemm", "3inst", 3, {"m_tiles": 4, "n_tiles": 2, "bf16": True}),
    ("sm_90", "gemm", "mcg", 4, {"m_tiles": 1, "n_tiles": 4, "unroll": 2, "depth": 2}),
    ("sm_90", "gemm", "mcg", 4, {"m_tiles": 1, "n_tiles": 4, "smem_stages": 3}),
    ("sm_90", "reduce", None, None, {"bf16": True}),
    ("sm_90", "reduce", None, None, {}),
    ("sm_90", "gemm", "mcg", 4,
     {"m_tiles": 1, "n_tiles": 2, "warps": 4, "m_warps": 2, "write_partials": True,
      "shared_rows": 2, "smem_stages": 3}),  # THIN
    ("sm_80", "gemm", "mcg", 6,
     {"m_tiles": 2, "n_tiles": 1, "warps": 8, "m_warps": 4, "shared_rows": 1,
      "smem_stages": 4}),  # WIDE at K6
    ("sm_90", "gemm", "mcg", 4,
     {"m_tiles": 1, "n_tiles": 2, "warps": 8, "m_warps": 8, "shared_rows": 2,
      "smem_stages": 4, "wgmma": True}),  # TENSOR
    ("sm_90", "gemm_stream_k", "mcg", 4,
     {"m_tiles": 1, "n_tiles": 2, "warps": 8, "m_warps": 8, "shared_rows": 4,
      "smem_stages": 4, "wgmma": True, "bf16": True}),  # TENSOR_DEEP
    ("sm_90", "gemm_stream_k", "mcg", 4,
     {"m_tiles": 8, "n_tiles": 2, "warps": 8, "m_warps": 8, "shared_rows": 2,
      "smem_stages": 6, "wgmma": True, "swap_ab": True}),  # SWAP_WIDE
    ("sm_90", "gemm_stream_k", "mcg", 4,
     {"m_tiles": 16, "n_tiles": 1, "warps": 8, "m_warps": 8, "shared_rows": 4,
      "smem_stages": 4, "wgmma": True, "swap_ab": True, "cluster": 2}),  # SWAP_TALL
    ("sm_90", "gemm", "mcg", 4,
     {"m_tiles": 8, "n_tiles": 2, "warps": 8, "m_warps": 8, "shared_rows": 2,
      "smem_stages": 6, "wgmma": True, "swap_ab": True}),  # SWAP_WIDE, per tile
    ("sm_90", "decode", "sqg_e4m3", 3, {}),
    ("sm_90", "decode", "mcg", 4, {"out_bf16": True}),
    ("sm_90", "rotate_in", None, None, {"in_bf16": True, "out_bf16": True}),
    ("sm_90", "rotate_out", None, None, {}),
)  # fmt: skip


_GEOMETRY_FIELDS = (
    "m_tiles", "n_tiles", "warps", "unroll", "depth", "smem_stages", "m_warps", "shared_rows",
    "wgmma", "swap_ab", "cluster",
)  # fmt: skip


def key(case) -> str:
    arch, kind, codebook, bits, fields = case
    described = " ".join(f"{name}={fields[name]}" for name in sorted(fields))
    return f"{arch} {kind} {codebook}/{bits} {described}".rstrip()


def spec_of(case):
    """The :class:`~b12x.launch.specs.KernelSpec` of one case (a tree from before the geometry
    object took the launch-shape fields flat on the spec: its PTX is the baseline)."""
    from b12x.launch.specs import KernelSpec

    _arch, kind, codebook, bits, fields = case
    try:
        from b12x.kernels.geometry import GemmGeometry
    except ImportError:  # the pre-geometry tree
        return KernelSpec(kind, codebook, bits, **fields)
    shape = {name: value for name, value in fields.items() if name in _GEOMETRY_FIELDS}
    rest = {name: value for name, value in fields.items() if name not in _GEOMETRY_FIELDS}
    if kind.startswith("gemm"):
        geometry = GemmGeometry(**shape, stream_k=kind == "gemm_stream_k")
        return KernelSpec(kind, codebook, bits, geometry=geometry, **rest)
    return KernelSpec(kind, codebook, bits, **rest)


def digest(case) -> tuple[str, str]:
    from b12x.launch.specs import build_kernel, target_arch
    from b12x.launch.toolchain import compile_with_remarks

    spec = spec_of(case)
    remarks = compile_with_remarks(*build_kernel(spec), target_arch(spec, case[0]), ptx=True)
    return key(case), hashlib.sha256(remarks.ptx.encode()).hexdigest()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write the digests here (JSON)")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"))
    args = parser.parse_args(argv)
    if args.compare:
        before, after = (json.loads(Path(path).read_text()) for path in args.compare)
        differ = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
        for name in differ:
            print(f"differs: {name}")
        print(f"{len(before)} / {len(after)} digests, {len(differ)} differ")
        return 1 if differ else 0
    with ProcessPoolExecutor(args.jobs) as pool:
        digests = dict(pool.map(digest, CASES))
    text = json.dumps(digests, indent=1, sort_keys=True)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
