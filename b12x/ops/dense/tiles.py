"""The tile registry: ONE list of tile configurations and ONE qualification predicate (spec §5.4).

Layout:
* :class:`Tile` ``(tile_k, tile_n, cta_threads)`` (positive ints, checked at construction) with
  its registry ``name`` (not part of its identity). :data:`ENTRIES` are the named entries:
  ``square`` ``(128,128,256)``, ``narrow`` ``(64,128,128)``, ``deep`` ``(128,64,128)``, the
  dense default ``wide`` ``(64,256,256)`` and the FC2-only ``wave_fc2`` ``(32,512,256)``.
  :func:`entry` finds one by name; :func:`parse_tile` is the one parser of a tile argument
  (name, ``KxNxT``, list) for qualify, pin, ``explain``, ``run --tile`` and the FC2 plan.
  Adding one: docs/adding_a_tile.md.
* :class:`TileProblem`: phase (``"dense"``, ``"fc1"``, ``"fc2"``), M, K, N, bits, the K/32 scale
  group, ``cta_m_blocks`` and, for FC2, the FC1 launch it follows (the wave rule reads it).
* :func:`footprint` is the §5.4 shared-memory model; :func:`qualify` is the ONLY predicate
  (membership, phase, divisibility, floors, threads, shared memory against
  ``device.max_shared_mem - 512``); :func:`auto_select` and :func:`pin` both go through it.
* :func:`serialize` / :func:`deserialize` carry a tile across the custom-op schema;
  :func:`check_device` validates the device facts; :data:`REGISTRY` bundles it all for
  :mod:`oracle.judge.tiles`; :func:`gemm_geometry` maps a tile to its
  :class:`~b12x.kernels.geometry.GemmGeometry`; :func:`specializations` lists every kernel
  specialisation a pinned launch compiles. Nothing here imports :mod:`b12x.ops.moe`.

The wave-balanced FC2 tile follows PR #146 (the merged contract, spec §7 item 6), not PR #137: it
waives the ``tile_k >= 64`` floor for FC2 only. Selection: dense takes ``(64,256,256)`` when it
qualifies, else ``(64,128,128)``, else the best-occupancy entry; FC1 / FC2 the small- or
large-batch table by ``cta_m_blocks``, maximising CTAs/SM from shared memory; the FC2 wave rule is
checked first. The full rules: docs/notes/b12x.md.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import Any

from b12x.kernels.geometry import GemmGeometry, choose_tiles
from b12x.runtime.validate import check_positive_int

__all__ = [
    "ENTRIES",
    "GROUPED_M_TILES",
    "LARGE_BATCH",
    "PHASES",
    "REGISTRY",
    "SMALL_BATCH",
    "WAVE_BALANCED_FC2",
    "DeviceLimits",
    "Tile",
    "TileProblem",
    "auto_select",
    "check_device",
    "choose_tiles",
    "gemm_geometry",
    "deserialize",
    "entry",
    "footprint",
    "kernel_geometry",
    "key",
    "parse_tile",
    "pin",
    "qualify",
    "serialize",
    "specializations",
    "wave_fc2_fits",
    "wave_fc2_takes_decoder",
    "tensor_core_takes_decoder",
    "TENSOR_CORE_MIN_TILE_CAP",
    "WIDE_TILE_CAP",
    "WIDE_TILE_CAPS",
    "WAVE_BALANCED_FC2_DEPTH",
]

PHASES = ("dense", "fc1", "fc2")
SMEM_RESERVE = 512  # bytes of the per-block opt-in maximum that a tile may not use


@dataclasses.dataclass(frozen=True, order=True)
class Tile:
    """A tile shape; a registry entry also carries its ``name`` (not part of its identity: a
    deserialised ``[tile_k, tile_n, cta_threads]`` equals the entry of that shape)."""

    tile_k: int
    tile_n: int
    cta_threads: int
    name: str = dataclasses.field(default="", compare=False)

    def __post_init__(self) -> None:
        for name in ("tile_k", "tile_n", "cta_threads"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"tile: {name} must be an int, got {type(value).__name__}")
            if value < 1:
                raise ValueError(f"tile: {name} must be a positive int, got {value}")
        if not isinstance(self.name, str):
            raise TypeError(f"tile: name must be a str, got {type(self.name).__name__}")

    @property
    def shape(self) -> str:
        """``"KxNxT"``, the shape spelling ``run --tile`` also accepts."""
        return f"{self.tile_k}x{self.tile_n}x{self.cta_threads}"

    def __repr__(self) -> str:
        return f"Tile({self.shape})"


#: The registry: every named tile (one entry each; :func:`parse_tile` finds them by name).
ENTRIES: tuple[Tile, ...] = (
    Tile(128, 128, 256, name="square"),
    Tile(64, 128, 128, name="narrow"),
    Tile(128, 64, 128, name="deep"),
    Tile(64, 256, 256, name="wide"),
    Tile(32, 512, 256, name="wave_fc2"),
)


def entry(name: str) -> Tile:
    """The registry entry called ``name`` (``ValueError`` listing the known names)."""
    for tile in ENTRIES:
        if tile.name == name:
            return tile
    known = ", ".join(tile.name for tile in ENTRIES)
    raise ValueError(f"tile: unknown tile {name!r}; known: {known}")


SMALL_BATCH = (entry("square"), entry("narrow"), entry("deep"))
LARGE_BATCH = (entry("wide"), entry("narrow"), entry("deep"))
DENSE_DEFAULTS = (entry("wide"), entry("narrow"))
WAVE_BALANCED_FC2 = entry("wave_fc2")
#: Register stages of the wave-balanced FC2 launch (``b12x.ops.moe.dispatch``'s FC2_TILE value).
WAVE_BALANCED_FC2_DEPTH = 2


@dataclasses.dataclass(frozen=True)
class DeviceLimits:
    """The device facts a tile needs (``oracle.judge.tiles.SimulatedDevice`` has the same
    fields)."""

    name: str
    sm_count: int
    max_shared_mem: int
    capability: tuple[int, int]


@dataclasses.dataclass(frozen=True)
class TileProblem:
    phase: str
    m: int
    k: int
    n: int
    bits: int
    scale_group: int = 32
    cta_m_blocks: int = 1
    fc1_threads: int | None = None
    fc1_mn_tiles: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.phase, str) or self.phase not in PHASES:
            raise ValueError(f"phase: expected one of {PHASES}, got {self.phase!r}")
        for name in ("m", "k", "n", "bits", "scale_group", "cta_m_blocks"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name}: expected a positive int, got {value!r}")
        for name in ("fc1_threads", "fc1_mn_tiles"):
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value <= 0
            ):
                raise ValueError(f"{name}: expected None or a positive int, got {value!r}")

    def mn_tiles(self, tile_n: int) -> int:
        return -(-self.m // (16 * self.cta_m_blocks)) * -(-self.n // tile_n)


def check_device(device: Any) -> Any:
    """The device facts every tile function reads: ``name`` (str), ``sm_count`` and
    ``max_shared_mem`` (positive ints) and ``capability`` ``(major, minor)`` (two ints ≥ 0).
    Raises ``TypeError``/``ValueError`` naming ``device`` and the field; returns ``device``."""
    for attr in ("name", "sm_count", "max_shared_mem", "capability"):
        if not hasattr(device, attr):
            raise TypeError(
                f"device: expected DeviceLimits or an object with name, sm_count, "
                f"max_shared_mem and capability; {type(device).__name__} lacks `{attr}`"
            )
    if not isinstance(device.name, str):
        raise TypeError(f"device: name must be a str, got {type(device.name).__name__}")
    for attr in ("sm_count", "max_shared_mem"):
        check_positive_int(f"device: {attr}", getattr(device, attr))
    cap = device.capability
    if (
        not isinstance(cap, tuple | list)
        or len(cap) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in cap)
    ):
        raise ValueError(f"device: capability must be (major, minor) ints, got {cap!r}")
    return device


def _check_problem(problem: Any) -> TileProblem:
    if not isinstance(problem, TileProblem):
        raise TypeError(f"problem: expected a TileProblem, got {type(problem).__name__}")
    return problem


def footprint(tile: Tile, problem: TileProblem) -> int:
    """Shared-memory bytes of ``tile`` for ``problem`` (spec §5.4, 4 stages)."""
    cta_m = 16 * problem.cta_m_blocks
    weight_bits = max(4, problem.bits)
    a_bytes = 4 * cta_m * tile.tile_k * 2
    b_bytes = 4 * tile.tile_k * tile.tile_n * weight_bits // 8
    reduce_bytes = cta_m * (tile.tile_n + 8) * 2
    bias_bytes = 2 * tile.tile_n
    staging = max(b_bytes, reduce_bytes, min(b_bytes, reduce_bytes) + bias_bytes)
    scale_bytes = -(-tile.tile_k // problem.scale_group) * tile.tile_n * 2 * 4
    return staging + a_bytes + scale_bytes + 16 * cta_m


def qualify(tile: Any, problem: TileProblem, device: Any) -> tuple[bool, str]:
    """THE qualification predicate: ``(ok, reason)``; every floor lives here and nowhere else.

    Arguments of the wrong kind are not candidates: a ``tile`` that is not a :class:`Tile`, a
    ``problem`` that is not a :class:`TileProblem` or a malformed ``device``
    (:func:`check_device`) raise ``TypeError``/``ValueError`` naming the argument."""
    if not isinstance(tile, Tile):
        raise TypeError(
            f"tile: expected a Tile (deserialize a spec first), got {type(tile).__name__}"
        )
    _check_problem(problem)
    check_device(device)
    fc2_qualified = tile == WAVE_BALANCED_FC2
    if fc2_qualified and problem.phase != "fc2":
        return False, f"{tile!r} is qualified for fc2 only, not {problem.phase}"
    if problem.n % tile.tile_n:
        return False, f"N={problem.n} is not a multiple of tile_n={tile.tile_n}"
    if problem.k % tile.tile_k:
        return False, f"K={problem.k} is not a multiple of tile_k={tile.tile_k}"
    if problem.k % problem.scale_group:
        return False, f"K={problem.k} is not a multiple of the scale group {problem.scale_group}"
    if tile.tile_k % problem.scale_group:
        return False, f"tile_k={tile.tile_k} is not a multiple of the scale group"
    if tile.tile_n < 64:
        return False, f"tile_n={tile.tile_n} is below the floor 64"
    if tile.tile_k < 64 and not fc2_qualified:
        return False, f"tile_k={tile.tile_k} is below the floor 64"
    if tile.cta_threads < 128:
        return False, f"cta_threads={tile.cta_threads} is below the floor 128"
    threads = sorted({t.cta_threads for t in ENTRIES})
    if tile.cta_threads not in threads or tile.cta_threads * 64 != tile.tile_n * tile.tile_k:
        allowed = " or ".join(map(str, threads))
        return False, f"cta_threads={tile.cta_threads} must be tile_n*tile_k/64 and {allowed}"
    if tile not in ENTRIES:
        return False, f"{tile!r} is not a registry entry"
    need = footprint(tile, problem)
    limit = device.max_shared_mem - SMEM_RESERVE
    if need > limit:
        return False, f"shared memory {need} B exceeds {limit} B on {device.name}"
    return True, "ok"


def _occupancy(tile: Tile, problem: TileProblem, device: Any) -> int:
    cap = 4 if problem.cta_m_blocks == 1 else 2
    return min(cap, (device.max_shared_mem - SMEM_RESERVE) // footprint(tile, problem))


def _wave_rule_fires(problem: TileProblem, device: Any) -> bool:
    default = LARGE_BATCH[0]
    if problem.phase != "fc2" or problem.n % WAVE_BALANCED_FC2.tile_n:
        return False
    if problem.fc1_threads is None or problem.fc1_mn_tiles is None:
        return False
    if not qualify(default, problem, device)[0] or problem.fc1_threads != default.cta_threads:
        return False
    fc2_tiles = problem.mn_tiles(default.tile_n)
    return (
        fc2_tiles > problem.fc1_mn_tiles
        and fc2_tiles > device.sm_count
        and -(-fc2_tiles // 2) <= device.sm_count
        and problem.fc1_mn_tiles <= device.sm_count
    )


def _best(candidates: Sequence[Tile], problem: TileProblem, device: Any) -> Tile | None:
    fitting = [t for t in candidates if qualify(t, problem, device)[0]]
    if not fitting:
        return None
    return max(fitting, key=lambda t: (_occupancy(t, problem, device), -fitting.index(t)))


def auto_select(problem: TileProblem, device: Any) -> Tile:
    """The auto-selected tile (module docstring); always one that :func:`qualify` accepts."""
    _check_problem(problem)
    check_device(device)
    if _wave_rule_fires(problem, device) and qualify(WAVE_BALANCED_FC2, problem, device)[0]:
        return WAVE_BALANCED_FC2
    if problem.phase == "dense":
        for tile in DENSE_DEFAULTS:
            if qualify(tile, problem, device)[0]:
                return tile
        table: Sequence[Tile] = ENTRIES
    else:
        table = SMALL_BATCH if problem.cta_m_blocks == 1 else LARGE_BATCH
    chosen = _best(table, problem, device)
    if chosen is None:
        reasons = "; ".join(f"{t!r}: {qualify(t, problem, device)[1]}" for t in table)
        raise ValueError(
            f"problem/device: no tile qualifies for {problem} on device {device.name} ({reasons})"
        )
    return chosen


def parse_tile(spec: Any) -> Tile:
    """THE parser of a tile argument: a registry name (``"wide"``), a shape ``"KxNxT"`` (or
    ``"K,N,T"``), a ``[tile_k, tile_n, cta_threads]`` list, or a :class:`Tile`. A shape of a
    registry entry gives that entry; another shape gives an unnamed :class:`Tile` (which
    :func:`qualify` then refuses); an unknown name raises ``ValueError`` listing the known
    ones."""
    if isinstance(spec, Tile):
        found = spec
    elif isinstance(spec, str):
        text = spec.strip()
        if not re.fullmatch(r"\d+(\s*[x,]\s*\d+)*", text):
            return entry(text)
        found = deserialize([int(v) for v in re.split(r"\s*[x,]\s*", text)])
    else:
        found = deserialize(spec)
    return next((tile for tile in ENTRIES if tile == found), found)


def serialize(tile: Tile) -> list[int]:
    """``[tile_k, tile_n, cta_threads]`` for the custom-op schema (``int[]``)."""
    if not isinstance(tile, Tile):
        raise TypeError(f"tile: expected a Tile, got {type(tile).__name__}")
    return [tile.tile_k, tile.tile_n, tile.cta_threads]


def deserialize(spec: Any) -> Tile:
    """``[tile_k, tile_n, cta_threads]`` (three positive ints) → :class:`Tile`; a registry
    member is not required here (that is :func:`qualify`'s job, through :func:`pin`)."""
    if not isinstance(spec, list | tuple) or len(spec) != 3:
        raise ValueError(f"tile: expected [tile_k, tile_n, cta_threads], got {spec!r}")
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in spec):
        raise TypeError(f"tile: expected three ints, got {spec!r}")
    return Tile(*spec)


def pin(spec: Any, problem: TileProblem, device: Any) -> Tile:
    """An explicit pin, validated by :func:`qualify`; raises ``ValueError`` with its reason."""
    _check_problem(problem)
    check_device(device)
    tile = spec if isinstance(spec, Tile) else deserialize(spec)
    ok, reason = qualify(tile, problem, device)
    tile = parse_tile(tile)  # the registry entry (its name) of an accepted shape
    if not ok:
        raise ValueError(f"tile: pinned {tile!r} rejected: {reason}")
    return tile


def kernel_geometry(tile: Tile) -> tuple[int, int]:
    """``(warps, n_tiles)`` of the dense GEMM kernel for ``tile`` (module docstring)."""
    if not isinstance(tile, Tile):
        raise TypeError(f"tile: expected a Tile, got {type(tile).__name__}")
    warps = tile.cta_threads // 32
    return warps, tile.tile_n // (16 * warps)


def gemm_geometry(tile: Tile, *, m_tiles: int) -> GemmGeometry:
    """The per-warp :class:`~b12x.kernels.geometry.GemmGeometry` a dense launch on ``tile``
    runs with ``m_tiles`` M16 blocks per warp (:func:`kernel_geometry`)."""
    warps, n_tiles = kernel_geometry(tile)
    return GemmGeometry(m_tiles=m_tiles, n_tiles=n_tiles, warps=warps)


def wave_fc2_fits(m_tiles: int, k_split: int) -> bool:
    """Whether the wave-balanced FC2 tile can keep a launch of ``m_tiles`` M16 blocks and an
    intra-CTA K split ``k_split``: 256·k_split threads cannot keep wide accumulators, so not
    both (the ``not_split_and_wide`` condition of ``b12x.ops.moe.fc2_tile.FC2_TILE``)."""
    return not (k_split > 1 and m_tiles > 1)


def wave_fc2_takes_decoder(wide_tile_cap: int) -> bool:
    """Whether a decoder with this tile hint (:attr:`b12x.formats.DecodeFormat.wide_tile_cap`)
    can take the wave-balanced FC2 tile's N16 tiles per warp: D3L's cap 2 spilled 400-700 B
    there (the ``decoder_takes_four_tiles`` condition of ``b12x.ops.moe.fc2_tile.FC2_TILE``)."""
    return wide_tile_cap >= kernel_geometry(WAVE_BALANCED_FC2)[1]


#: Tile hints a decoder may carry (:attr:`b12x.formats.DecodeFormat.wide_tile_cap`): the most N16
#: tiles per warp of a four-block grouped-GEMM CTA. The D3L decoder carries 2 (4 × 4 spills 440 B
#: on sm_90); the MoE geometry tables (:mod:`b12x.ops.moe.geometry`) and the dense mainloop table
#: read them.
WIDE_TILE_CAPS = (2, 4)
#: The cap of a decoder without a hint (four tiles whenever N allows).
WIDE_TILE_CAP = 4
#: The least tile hint (:attr:`b12x.formats.DecodeFormat.wide_tile_cap`) a decoder needs for the
#: sm_90 tensor-core mainloops of the dense GEMM (``b12x.ops.dense.mainloop``: ``TENSOR_DEEP``,
#: ``SWAP_WIDE``, ``SWAP_TALL``), which run one 8-warp CTA per SM at 250-255 registers with 128 fp32
#: accumulators per thread. D3L (sqg_fp16, cap 2) spills in every one of them at K5 and K6
#: (docs/evidence/dense-tensor-core-decoder-spills.md); every other decoder
#: compiles spill-free in all three at every legal rate
#: (``tests/b12x/test_dense_mainloop_table.py::test_every_tensor_core_decoder_compiles_spill_free``,
#: ``-m slow``).
TENSOR_CORE_MIN_TILE_CAP = 4


def tensor_core_takes_decoder(wide_tile_cap: int) -> bool:
    """Whether a decoder with this tile hint can run the sm_90 tensor-core mainloops spill-free
    (:data:`TENSOR_CORE_MIN_TILE_CAP`); D3L (cap 2) takes the mma.sync shared decode instead."""
    return wide_tile_cap >= TENSOR_CORE_MIN_TILE_CAP


#: M16 blocks per CTA (``m_tiles``) a grouped-GEMM launch takes (``b12x.ops.moe.dispatch.M_TILES``).
GROUPED_M_TILES = (1, 2, 4)


def specializations(tile: Tile) -> tuple[Any, ...]:
    """Every kernel specialisation a launch pinned to ``tile`` compiles (module docstring)."""
    if not isinstance(tile, Tile):
        raise TypeError(f"tile: expected a Tile, got {type(tile).__name__}")
    if tile not in ENTRIES:
        raise ValueError(f"tile: {tile!r} is not a registry entry")
    tile = parse_tile(tile)
    from b12x.formats import FORMATS, resolve_format

    legal = [(fmt.name, bits) for fmt in FORMATS.values() for bits in fmt.legal_bits]
    if tile == WAVE_BALANCED_FC2:
        return _fc2_specializations(legal)
    from b12x.launch.specs import KernelSpec, gemm_spec

    # choose_tiles(m)[0] is 1, 2, 4 by M and constant above M = 32
    m_tiles_values = sorted({choose_tiles(m)[0] for m in range(1, 257)})
    specs: list[Any] = [
        gemm_spec(
            resolve_format(codebook, bits),
            bits,
            gemm_geometry(tile, m_tiles=m_tiles),
            bf16=bf16,
            write_partials=partials,
        )  # fmt: skip
        for codebook, bits in legal
        for bf16 in (False, True)
        for m_tiles in m_tiles_values
        for partials in (False, True)
    ]
    specs += [KernelSpec("reduce", bf16=bf16) for bf16 in (False, True)]
    return tuple(specs)


def _fc2_specializations(legal: list[tuple[str, int]]) -> tuple[Any, ...]:
    from b12x.formats import resolve_format
    from b12x.kernels.moe_gemm import K_SPLITS, MoeGemmSpec

    warps, n_tiles = kernel_geometry(WAVE_BALANCED_FC2)
    specs = []
    for codebook, bits in legal:
        if not wave_fc2_takes_decoder(resolve_format(codebook, bits).wide_tile_cap):
            continue  # the FC2 table never gives this decoder the tile
        for bf16 in (False, True):
            for m_tiles in GROUPED_M_TILES:
                for k_split in K_SPLITS:
                    if not wave_fc2_fits(m_tiles, k_split):
                        continue
                    try:
                        spec = MoeGemmSpec(
                            codebook, bits, bf16, m_tiles=m_tiles, n_tiles=n_tiles, warps=warps,
                            depth=WAVE_BALANCED_FC2_DEPTH, k_split=k_split,
                        )  # fmt: skip
                    except ValueError:  # e.g. 8 warps × k_split 8: more than 1024 threads
                        continue
                    specs.append(spec)
    return tuple(specs)


def key(tile: Tile, problem: TileProblem, device: Any) -> tuple:
    """The compile identity a tile contributes: kernel geometry, bits and the device arch."""
    if not isinstance(tile, Tile):
        raise TypeError(f"tile: expected a Tile, got {type(tile).__name__}")
    _check_problem(problem)
    check_device(device)
    warps, n_tiles = kernel_geometry(tile)
    major, minor = device.capability
    return (f"sm_{major}{minor}", problem.bits, warps, n_tiles, tile.tile_k)


def _problems() -> tuple[TileProblem, ...]:
    dense = [
        TileProblem("dense", m, k, n, bits)
        for (k, n) in ((2048, 4096), (6144, 1024), (512, 6144), (4096, 6144))
        for m, bits in ((1, 6), (128, 4), (129, 3))
    ]
    moe = [
        TileProblem("fc1", 8, 4096, 1024, 4),
        TileProblem("fc1", 64, 6144, 1024, 6, cta_m_blocks=2),
        TileProblem("fc2", 8, 512, 4096, 4),
        TileProblem("fc2", 64, 512, 4096, 4, fc1_threads=256, fc1_mn_tiles=40),
        TileProblem("fc2", 512, 512, 4096, 4, cta_m_blocks=2, fc1_threads=256, fc1_mn_tiles=96),
    ]
    return tuple(dense + moe)


@dataclasses.dataclass(frozen=True)
class _Registry:
    """The registry object :mod:`oracle.judge.tiles` checks (module docstring)."""

    name: str = "dense_trellis_tiles"
    problems: tuple[TileProblem, ...] = dataclasses.field(default_factory=_problems)

    @property
    def entries(self) -> tuple[Tile, ...]:
        return ENTRIES  # read at every call: a test may register an entry

    def parse(self, spec: Any) -> Tile:
        return parse_tile(spec)

    def qualify(self, tile: Any, problem: TileProblem, device: Any) -> tuple[bool, str]:
        return qualify(tile, problem, device)

    def auto_select(self, problem: TileProblem, device: Any) -> Tile:
        return auto_select(problem, device)

    def pin(self, spec: Any, problem: TileProblem, device: Any) -> Tile:
        return pin(spec, problem, device)

    def serialize(self, tile: Tile) -> list[int]:
        return serialize(tile)

    def deserialize(self, spec: Any) -> Tile:
        return deserialize(spec)

    def key(self, tile: Tile, problem: TileProblem, device: Any) -> tuple:
        return key(tile, problem, device)

    def specializations(self, tile: Tile) -> tuple[Any, ...]:
        return specializations(tile)


REGISTRY = _Registry()
