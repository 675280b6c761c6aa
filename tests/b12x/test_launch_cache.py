"""The launch path resolves every kernel through the one runtime compile cache (R5, R6): the
dense host wrappers, the split-K GEMM and reduce, the kind door and the MoE GEMM, each compiled
once per key, frozen and capture-safe; the key's source hash recomputed here from the files.

On CPU the real host launch code runs with a stub compiler (``launch_path``); the GPU test at the
end launches for real. The keys themselves (one field at a time) and the disk cache are tested
in ``test_compile_cache.py``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import importlib.util
import json
from pathlib import Path

import pytest
import torch

from b12x.abi import ABI_LOCK_PATH
from b12x.formats import resolve_format
from b12x.kernels.geometry import GemmGeometry
from b12x.launch import kinds
from b12x.launch import specs as kernel_specs
from b12x.launch.specs import KernelSpec
from b12x.runtime import cache_keys
from b12x.runtime import compile_cache as cc

#: A dense GEMM spec for the kind-door tests.
SPEC = KernelSpec("gemm", "mcg", 6, geometry=GemmGeometry(m_tiles=1, n_tiles=2, warps=4))


#: Modules a key's sources must hold (the registry derives the whole list from imports).
DENSE_SOURCES = (  # the device code of the dense kernels, the spec builder, the toolchain
    "b12x.formats",
    "b12x.kernels.ptx",
    "b12x.kernels.trellis_decode",
    "b12x.kernels.dense_gemm",
    "b12x.kernels.hadamard",
    "b12x.launch.specs",
    "b12x.launch.toolchain",
)
MOE_SOURCES = (
    "b12x.formats",
    "b12x.kernels.ptx",
    "b12x.kernels.trellis_decode",
    "b12x.kernels.dense_gemm",
    "b12x.kernels.moe_gemm",
    "b12x.kernels.moe_pair_gemm",  # paired specs build its kernel: its source is codegen too
    "b12x.launch.moe_compile",  # the builder (fake-argument shapes)
    "b12x.launch.toolchain",  # compile_options
)


def _expected_source_hash(kind: str, must_hold) -> str:
    """The kind's sources hold ``must_hold``; their hash recomputed here from the files:
    SHA-256 over ``name NUL sha256(file)`` per module, in the key's (sorted) order."""
    modules = kinds.sources(kinds.KINDS[kind])
    assert set(must_hold) <= set(modules) and list(modules) == sorted(modules)
    outer = hashlib.sha256()
    for name in modules:
        path = Path(importlib.util.find_spec(name).origin)
        outer.update(name.encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    return outer.hexdigest()


def test_the_real_kernel_closures_hold_their_helpers():
    dense = kinds.sources(kinds.KINDS["gemm"])
    assert set(DENSE_SOURCES) <= set(dense) and "b12x.abi" in dense  # dense_gemm's shared_body
    assert set(MOE_SOURCES) <= set(kinds.sources(kinds.KINDS["moe_gemm"]))
    assert "b12x.kernels.moe_boundary" in kinds.sources(kinds.KINDS["moe_boundary"])
    assert not any(name.startswith("cutlass") for name in dense)


class _Launched:
    """A stand-in for a compiled tvm-ffi kernel: records each launch's arguments."""

    def __init__(self, kernel):
        self.kernel = kernel
        self.launches = []

    def __call__(self, *args):
        self.launches.append(args)


@pytest.fixture
def launch_path(monkeypatch):
    """The real host launch code on CPU tensors: a fresh process cache and a stub compiler.

    Only what needs a GPU is replaced: the CUDA-tensor check, the arch query, the LUT upload and
    ``cute.compile`` (which reports a spill-free ptxas result, so the first level is kept).
    """
    import cutlass.cute as cute

    from b12x.launch import host, moe_compile

    cache = cc.CompileCache()
    monkeypatch.setattr(cc, "CACHE", cache)
    monkeypatch.setattr(host, "_check_tensor", lambda *args, **kwargs: None)
    monkeypatch.setattr(host, "device_arch", lambda device: "sm_90")
    monkeypatch.setattr(host, "_lut_addr", lambda fmt, device: 0)
    monkeypatch.setattr(kernel_specs, "build_kernel", lambda spec: (spec, ()))
    monkeypatch.setattr(moe_compile, "build_moe_gemm", lambda spec: (spec, ()))
    builds = []

    def fake_compile(kernel, *args, options):
        builds.append((kernel, options))
        print("ptxas info    : 0 bytes spill stores, 0 bytes spill loads")
        return _Launched(kernel)

    monkeypatch.setattr(cute, "compile", fake_compile)
    return cache, builds


def _payload(bits: int, k: int = 256, n: int = 256) -> torch.Tensor:
    return torch.zeros(k // 16, n // 16, 16 * bits, dtype=torch.int16)


def test_launch_path_compiles_once_into_the_runtime_cache(launch_path):
    from b12x.launch import host

    cache, builds = launch_path
    out = torch.empty(256, 256, dtype=torch.float16)
    host.decode_weight(_payload(4), "mcg", out=out)
    host.decode_weight(_payload(4), "mcg", out=out)
    assert len(cache) == 1 and len(builds) == 1
    assert (cache.misses, cache.hits) == (1, 1)
    (key,) = cache.compiled_keys()
    assert key.kernel == "decode" and key.arch == "sm_90"
    assert dict(key.codegen) == {
        "kind": "decode",  # every spec field is codegen; the kind also names the kernel id
        "fmt": cache_keys._structural(resolve_format("mcg"), "fmt"),  # the whole format object
        "bits": 4,
        "bf16": False,
        "in_bf16": False,
        "out_bf16": False,
        "geometry": None,  # a GEMM's launch shape (b12x.kernels.geometry); a decode has none
        "write_partials": False,
    }
    assert "--gpu-arch sm_90" in builds[0][1] and "--enable-tvm-ffi" in builds[0][1]
    fn = cache.lookup(key)
    assert len(fn.launches) == 2  # the cached callable is the one launched, twice


def test_launch_key_holds_abi_version_dsl_version_and_source_hash(launch_path):
    from b12x.launch import host

    cache, _ = launch_path
    host.decode_weight(_payload(3), "3inst", out=torch.empty(256, 256, dtype=torch.float16))
    (key,) = cache.compiled_keys()
    assert key.abi_version == json.loads(ABI_LOCK_PATH.read_text())["abi_version"]
    assert key.dsl_version == importlib.metadata.version("nvidia-cutlass-dsl")
    assert key.source_hash == _expected_source_hash("decode", DENSE_SOURCES)
    assert "abi " in key.describe() and key.source_hash[:12] in key.describe()


def test_split_k_launch_resolves_gemm_and_reduce_through_the_cache(launch_path):
    from b12x.launch import host

    cache, builds = launch_path
    a = torch.zeros(8, 256, dtype=torch.bfloat16)
    out = torch.empty(8, 256, dtype=torch.bfloat16)
    scratch = torch.empty(2 * 8 * 256, dtype=torch.float32)
    host.trellis_matmul(a, _payload(4), "mcg", split_k=2, out=out, scratch=scratch, tiles=(1, 2))
    kinds = sorted((k.kernel, dict(k.codegen)["bf16"]) for k in cache.compiled_keys())
    assert kinds == [("gemm", True), ("reduce", True)]
    gemm = next(k for k in cache.compiled_keys() if k.kernel == "gemm")
    assert dict(gemm.codegen)["write_partials"] is True
    assert len(builds) == 2


def test_frozen_launch_path_raises_naming_the_key(launch_path):
    from b12x.launch import host

    cache, builds = launch_path
    out = torch.empty(256, 256, dtype=torch.float16)
    host.decode_weight(_payload(4), "mcg", out=out)
    with cc.frozen():
        host.decode_weight(_payload(4), "mcg", out=out)  # warmed: still launches
        with pytest.raises(cc.KernelResolutionFrozen, match=r"frozen: decode\(.*'name', '3inst'"):
            host.decode_weight(_payload(3), "3inst", out=out)
    assert len(cache) == 1 and len(builds) == 1


def test_launch_during_capture_refuses_to_compile(launch_path, monkeypatch):
    from b12x.launch import host

    cache, builds = launch_path
    out = torch.empty(256, 256, dtype=torch.float16)
    host.decode_weight(_payload(4), "mcg", out=out)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    host.decode_weight(_payload(4), "mcg", out=out)
    with pytest.raises(cc.KernelResolutionFrozen, match=r"decode\(.*during CUDA graph capture"):
        host.decode_weight(_payload(2), "mul1", out=out)
    assert len(builds) == 1


def test_the_kind_door_has_no_cache_of_its_own(launch_path):
    cache, builds = launch_path
    first = kinds.compiled(SPEC, "sm_90")
    assert cache.lookup(kinds.launch_key(SPEC, "sm_90")) is first
    assert kinds.compiled(SPEC, "sm_90") is first and len(builds) == 1
    cache.clear()  # a second, hidden cache would keep answering here
    assert kinds.compiled(SPEC, "sm_90") is not first and len(builds) == 2


def test_moe_launch_goes_through_the_same_cache(launch_path):
    from b12x.kernels.moe_gemm import MoeGemmSpec

    cache, builds = launch_path
    spec = MoeGemmSpec("mcg", 4, False, m_tiles=2, n_tiles=2, warps=4, depth=4)
    kinds.compiled(SPEC, "sm_90")  # a dense kernel shares the cache
    fn = kinds.compiled(spec, "sm_90")
    assert kinds.compiled(spec, "sm_90") is fn and len(builds) == 2 and len(cache) == 2
    (key,) = [k for k in cache.compiled_keys() if k.kernel == "moe_gemm"]
    # every MoeGemmSpec field is a codegen input (the spec's own definition, whatever it grows)
    assert dict(key.codegen) == {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)}
    assert {"codebook", "bits", "bf16", "m_tiles", "n_tiles", "warps", "depth"} <= {
        name for name, _ in key.codegen
    }
    assert key.arch == "sm_90"
    assert key.abi_version == json.loads(ABI_LOCK_PATH.read_text())["abi_version"]
    assert key.source_hash == _expected_source_hash("moe_gemm", MOE_SOURCES)
    assert kinds.compiled(spec, "sm_120") is not fn  # another arch, another key
    with cc.frozen():
        assert kinds.compiled(spec, "sm_90") is fn
        with pytest.raises(cc.KernelResolutionFrozen, match=r"frozen: moe_gemm\(.*warps=2"):
            kinds.compiled(dataclasses.replace(spec, warps=2), "sm_90")
    assert len(cache) == 3


@pytest.mark.gpu
def test_gpu_launch_resolves_through_the_runtime_cache(monkeypatch):
    """On the device: the real compile lands in the runtime cache once, and freezing holds."""
    from b12x.launch import host
    from reference import trellis as ref_trellis

    cache = cc.CompileCache()
    monkeypatch.setattr(cc, "CACHE", cache)
    gen = torch.Generator().manual_seed(3)
    words = torch.randint(-(2**15), 2**15, (16, 16, 64), generator=gen)
    payload = words.to(torch.int16).cuda()
    first = host.decode_weight(payload, "mcg")
    again = host.decode_weight(payload, "mcg")
    torch.cuda.synchronize()
    assert torch.equal(first.cpu(), ref_trellis.decode(payload.cpu(), "mcg"))
    assert torch.equal(first, again)
    (key,) = cache.compiled_keys()
    major, minor = torch.cuda.get_device_capability()
    assert key.kernel == "decode" and key.arch == f"sm_{major}{minor}"
    assert (cache.misses, cache.hits) == (1, 1)
    assert key.abi_version == json.loads(ABI_LOCK_PATH.read_text())["abi_version"]
    assert key.source_hash == _expected_source_hash("decode", DENSE_SOURCES)
    cold = torch.randint(-(2**15), 2**15, (16, 16, 48), generator=gen).to(torch.int16).cuda()
    with cc.frozen():
        assert torch.equal(host.decode_weight(payload, "mcg"), first)
        with pytest.raises(cc.KernelResolutionFrozen, match=r"frozen: decode\(.*'name', '3inst'"):
            host.decode_weight(cold, "3inst")
    assert len(cache) == 1
