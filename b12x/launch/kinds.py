"""The kernel kinds: one registry from a spec to its builder, its kernels and its cache key.

Layout:
* :class:`KernelKind` (frozen, keyword-only): ``name`` (the kernel id of its compile key and its
  disk-cache directory), the dotted names of its ``spec`` class, its ``builder`` (``spec ->
  (kernel object, fake argument tuple)``) and its ``kernels``, the ``selector`` field when kinds
  share a spec class, and ``spill_free`` (compile at the first spill-free optimisation level,
  :func:`b12x.launch.toolchain.compile_spill_free`, or with one plain compile).
* :data:`KINDS`: ``decode``, ``gemm``, ``reduce``, ``rotate_in``, ``rotate_out`` (on
  :class:`~b12x.launch.specs.KernelSpec`), ``moe_gemm`` (:class:`~b12x.kernels.moe_gemm.
  MoeGemmSpec`) and ``moe_boundary`` (:class:`~b12x.kernels.moe_boundary.MoeBoundarySpec`).
* :func:`kind_of` answers a spec's kind; :func:`sources` the modules hashed into its key;
  :func:`launch_key` the key of a spec; :func:`compiled` the compiled callable: THE door every
  launch path resolves a kernel through (:func:`b12x.runtime.compile_cache.compiled_kernel`).

Invariants:
* The key's sources are derived, never listed: the b12x import closure (every import, lazy ones
  included) of the builder's module, the kernel modules and this module (so compile options
  count as codegen); derived once per kind and process.
* A key's codegen is every field of the spec; kernel ids (and the disk layout ``v1/<kind>/``)
  are the kind names.
* Every builder lives in :mod:`b12x.launch`, every kernel class in :mod:`b12x.kernels`
  (:func:`check_registry`, at import); they are named, not imported (resolved with
  :mod:`importlib` on first use), so importing this module loads no cutlass, and a stubbed
  builder is the one called. The full notes: docs/notes/b12x.md.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from b12x.launch import toolchain
from b12x.runtime import compile_cache

__all__ = [
    "KINDS",
    "KernelKind",
    "check_registry",
    "compiled",
    "derive_sources",
    "kind_of",
    "launch_key",
    "sources",
]


def _resolve(dotted: str) -> Any:
    """The object a dotted ``module.attr`` (or ``module.Class``) name stands for."""
    module, _, attr = dotted.rpartition(".")
    return getattr(importlib.import_module(module), attr)


@dataclasses.dataclass(frozen=True, kw_only=True)
class KernelKind:
    """One kind of compiled kernel (module docstring); every reference is a dotted name."""

    name: str
    spec: str
    builder: str
    kernels: tuple[str, ...]
    selector: str | None = None
    spill_free: bool = False

    @property
    def builder_module(self) -> str:
        return self.builder.rpartition(".")[0]

    @property
    def kernel_modules(self) -> tuple[str, ...]:
        """The modules holding the kernel classes, in first-named order, once each."""
        return tuple(dict.fromkeys(k.rpartition(".")[0] for k in self.kernels))

    @property
    def spec_class(self) -> type:
        return _resolve(self.spec)

    def build(self, spec: Any) -> tuple[Any, tuple]:
        """(kernel object, fake argument tuple) of ``spec`` for ``cute.compile``."""
        return _resolve(self.builder)(spec)

    def compile(self, spec: Any, arch: str) -> Any:
        """Compile ``spec`` for ``arch`` (no cache: :func:`compiled` is the cached door); the
        target is :func:`b12x.launch.specs.target_arch` (``sm_90a`` for a ``wgmma`` spec)."""
        from b12x.launch.specs import target_arch

        arch = target_arch(spec, arch)
        if self.spill_free:
            return toolchain.compile_spill_free(functools.partial(self.build, spec), arch).fn
        import cutlass.cute as cute

        kernel, args = self.build(spec)
        return cute.compile(kernel, *args, options=toolchain.compile_options(arch))


def _dense(name: str, kernel: str) -> KernelKind:
    return KernelKind(
        name=name,
        spec="b12x.launch.specs.KernelSpec",
        builder="b12x.launch.specs.build_kernel",
        kernels=(kernel,),
        selector="kind",
        spill_free=True,
    )


_REGISTRY = (
    _dense("decode", "b12x.kernels.trellis_decode.TrellisDecodeKernel"),
    _dense("gemm", "b12x.kernels.dense_gemm.DenseTrellisGemmKernel"),
    _dense("gemm_stream_k", "b12x.kernels.stream_k.DenseStreamKGemmKernel"),
    _dense("reduce", "b12x.kernels.split_k_reduce.SplitKReduceKernel"),
    _dense("rotate_in", "b12x.kernels.hadamard.InputRotationKernel"),
    _dense("rotate_out", "b12x.kernels.hadamard.OutputRotationKernel"),
    KernelKind(
        name="moe_gemm",
        spec="b12x.kernels.moe_gemm.MoeGemmSpec",
        builder="b12x.launch.moe_compile.build_moe_gemm",
        kernels=(
            "b12x.kernels.moe_gemm.MoeGroupedGemmKernel",
            "b12x.kernels.moe_pair_gemm.MoePairGemmKernel",
        ),
    ),
    KernelKind(
        name="moe_boundary",
        spec="b12x.kernels.moe_boundary.MoeBoundarySpec",
        builder="b12x.launch.moe_boundary.build_moe_boundary",
        kernels=(
            "b12x.kernels.moe_boundary.MoeRotateKernel",
            "b12x.kernels.moe_boundary.MoeActivateKernel",
            "b12x.kernels.moe_boundary.MoeReduceKernel",
            "b12x.kernels.moe_pack.MoePackKernel",
        ),
    ),
)

#: Every kind by name (read-only).
KINDS: Mapping[str, KernelKind] = MappingProxyType({k.name: k for k in _REGISTRY})


def check_registry(kinds: Mapping[str, KernelKind]) -> None:
    """``ValueError`` naming the first kind that breaks the registry's rules: keyed by its own
    name; builder in :mod:`b12x.launch`, at least one kernel, all in :mod:`b12x.kernels`, none
    built by two kinds; the kinds of one spec class agree on a selector, and a spec class without
    one has a single kind."""
    by_spec: dict[str, list[KernelKind]] = {}
    owner: dict[str, str] = {}
    for name, kind in kinds.items():
        if kind.name != name:
            raise ValueError(f"kinds: {name!r} holds the kind named {kind.name!r}")
        if not kind.builder.startswith("b12x.launch."):
            raise ValueError(f"kinds: {name}'s builder {kind.builder} is not in b12x.launch")
        if not kind.kernels:
            raise ValueError(f"kinds: {name} names no kernel class")
        for kernel in kind.kernels:
            if not kernel.startswith("b12x.kernels."):
                raise ValueError(f"kinds: {name}'s kernel {kernel} is not in b12x.kernels")
            if kernel in owner:
                raise ValueError(f"kinds: {kernel} is built by both {owner[kernel]} and {name}")
            owner[kernel] = name
        by_spec.setdefault(kind.spec, []).append(kind)
    for spec, group in by_spec.items():
        selectors = {k.selector for k in group}
        if len(selectors) > 1 or (None in selectors and len(group) > 1):
            names = ", ".join(k.name for k in group)
            raise ValueError(f"kinds: {names} share {spec} without one selector field")


check_registry(KINDS)


def _dotted(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


@functools.cache
def _kinds_of_class(dotted: str) -> tuple[KernelKind, ...]:
    return tuple(k for k in KINDS.values() if k.spec == dotted)


def kind_of(spec: Any) -> KernelKind:
    """The kind of ``spec``: ``TypeError`` naming ``spec`` for a type no kind takes,
    ``ValueError`` naming ``spec`` for a selector value that names no kind of its class."""
    candidates = _kinds_of_class(_dotted(type(spec)))
    if not candidates:
        known = sorted({k.spec.rpartition(".")[2] for k in KINDS.values()})
        raise TypeError(f"spec: expected one of {known}, got {type(spec).__name__}")
    selector = candidates[0].selector
    if selector is None:
        return candidates[0]
    value = getattr(spec, selector, None)
    for kind in candidates:
        if kind.name == value:
            return kind
    names = [k.name for k in candidates]
    raise ValueError(
        f"spec: {type(spec).__name__}.{selector} = {value!r} names no kind; expected one of {names}"
    )


def derive_sources(kind: KernelKind) -> tuple[str, ...]:
    """The modules hashed into ``kind``'s key, derived afresh: the b12x import closure of its
    builder's module, its kernel modules and this module (the compile procedure), sorted."""
    return compile_cache.source_closure((__name__, kind.builder_module, *kind.kernel_modules))


_SOURCES: dict[KernelKind, tuple[str, ...]] = {}


def sources(kind: KernelKind) -> tuple[str, ...]:
    """:func:`derive_sources` of ``kind``, once per process."""
    found = _SOURCES.get(kind)
    if found is None:
        found = _SOURCES.setdefault(kind, derive_sources(kind))
    return found


def launch_key(spec: Any, arch: str) -> compile_cache.CompileKey:
    """The compile-cache key of ``spec`` on ``arch`` (kernel id = its kind's name)."""
    kind = kind_of(spec)
    return compile_cache.launch_key(spec, arch, kernel=kind.name, modules=sources(kind))


def compiled(spec: Any, arch: str) -> Any:
    """The compiled (tvm-ffi) callable of ``spec`` for ``arch``, from the one runtime cache.

    Compiled at most once per key; honours the freeze switch and capture detection (a miss then
    raises :class:`~b12x.runtime.compile_cache.KernelResolutionFrozen` naming the key); a kernel
    another process compiled is loaded from the disk cache.
    """
    kind = kind_of(spec)
    return compile_cache.compiled_kernel(
        spec,
        arch,
        kernel=kind.name,
        modules=sources(kind),
        build=functools.partial(kind.compile, spec, arch),
    )
