"""The dense GEMM's geometry: one frozen value, validated once.

Layout
------
* :class:`GemmGeometry` holds every launch-shape input of the dense trellis GEMM: the M/N tiling
  (``m_tiles`` M16 blocks and ``n_tiles`` N16 tiles per warp), ``warps`` per CTA, the per-warp
  mainloop's ``unroll`` and register stages ``depth``, the shared decode's ``m_warps``, K16
  ``shared_rows`` per slot and ``smem_stages`` slots, ``wgmma`` / ``swap_ab``, the swap-AB
  ``cluster`` and the ``stream_k`` schedule. :attr:`GemmGeometry.mainloop` names the mainloop
  these select (:data:`MAINLOOPS`).
* :func:`choose_tiles` is the per-warp tiling by M (and N) the planner and the launcher share.
* The planner chooses one (:mod:`b12x.ops.dense.plan`), the kernel spec embeds it
  (:class:`b12x.launch.specs.KernelSpec`, so the compile-cache key reads every field), and the
  kernels are built from it (:class:`b12x.kernels.dense_gemm.DenseTrellisGemmKernel`).

Invariants
----------
* ``__post_init__`` applies :func:`~b12x.kernels.shared_layout.check_dense_mainloop` (the rate-free
  part; a spec adds the shared-memory check at its bits) and the stream-K rule, raising
  ``ValueError`` naming the field: a constructed geometry is one the kernels accept.
* Pure Python: importing it loads no cutlass.
"""

from __future__ import annotations

import dataclasses

from b12x.kernels.shared_layout import check_dense_mainloop

__all__ = ["MAINLOOPS", "GemmGeometry", "choose_tiles"]

#: The mainloops a geometry selects (:attr:`GemmGeometry.mainloop`).
MAINLOOPS = ("per_warp", "shared_decode", "wgmma", "swap_ab")

_POSITIVE = ("m_tiles", "n_tiles", "warps", "unroll")


@dataclasses.dataclass(frozen=True)
class GemmGeometry:
    """Launch shape of one dense GEMM specialisation (module docstring)."""

    m_tiles: int = 1
    n_tiles: int = 1
    warps: int = 4
    unroll: int = 1
    depth: int = 1
    #: 0 = register stages (``depth``); 2..4 = cp.async ring slots of the per-warp mainloop; the
    #: shared decode's slots (3..4), the swap-AB mainloop's (4..8).
    smem_stages: int = 0
    #: 0 = per-warp decode; >= 1 = the shared decode, its warps as ``m_warps x warps/m_warps``.
    m_warps: int = 0
    shared_rows: int = 2
    wgmma: bool = False
    swap_ab: bool = False
    cluster: int = 1
    stream_k: bool = False

    def __post_init__(self) -> None:
        for name in _POSITIVE:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: expected a positive int, got {value!r}")
        if isinstance(self.depth, bool) or not isinstance(self.depth, int) or self.depth < 0:
            raise ValueError(
                f"depth: expected an int >= 0 (0: no register stage), got {self.depth!r}"
            )
        self.check(bits=None)
        if not isinstance(self.stream_k, bool):
            raise ValueError(f"stream_k: expected a bool, got stream_k={self.stream_k!r}")
        if self.stream_k and (not self.wgmma or self.m_warps != self.warps):
            raise ValueError(
                "stream_k: the stream-K schedule runs a wgmma mainloop (wgmma=True, m_warps == "
                f"warps); got wgmma={self.wgmma!r}, m_warps={self.m_warps}, warps={self.warps}"
            )

    def check(self, *, bits: int | None) -> None:
        """The mainloop rules (:func:`check_dense_mainloop`), with the shared-memory check at
        ``bits`` (skipped for None)."""
        check_dense_mainloop(
            swap_ab=self.swap_ab, wgmma=self.wgmma, bits=bits, m_tiles=self.m_tiles,
            n_tiles=self.n_tiles, warps=self.warps, m_warps=self.m_warps, rows=self.shared_rows,
            stages=self.smem_stages, cluster=self.cluster,
        )  # fmt: skip

    @property
    def mainloop(self) -> str:
        """One of :data:`MAINLOOPS`."""
        if self.swap_ab:
            return "swap_ab"
        if self.wgmma:
            return "wgmma"
        return "shared_decode" if self.m_warps else "per_warp"

    @property
    def threads(self) -> int:
        return 32 * self.warps

    @property
    def cta_n(self) -> int:
        """Columns (weight rows of N) one CTA covers."""
        return 16 * self.n_tiles * self.warps

    @property
    def cta_m(self) -> int:
        """Rows (tokens) of A one CTA covers."""
        if self.swap_ab:
            return 16 * self.m_tiles
        return 16 * self.m_tiles * max(1, self.m_warps)

    def geometry(self) -> GemmGeometry:
        """This geometry as a plain :class:`GemmGeometry` (a subclass's extra fields dropped)."""
        names = [f.name for f in dataclasses.fields(GemmGeometry)]
        return GemmGeometry(**{name: getattr(self, name) for name in names})


def choose_tiles(m: int, n: int | None = None) -> tuple[int, int]:
    """(m_tiles, n_tiles) per warp of the per-warp decode at ``m`` rows (the planner's rule and the
    launcher's default): 4 N16 tiles per warp when N allows (the fastest), 4 M16 blocks with 2
    N16 tiles (4×4 exceeds 255 registers for sqg_fp16). Without ``n``: the N-agnostic 2."""
    m_tiles = 1 if m <= 16 else 2 if m <= 32 else 4
    n_tiles = 4 if n is not None and n % 256 == 0 and m_tiles < 4 else 2
    return m_tiles, n_tiles
