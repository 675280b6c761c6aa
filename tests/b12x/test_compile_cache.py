"""The compile cache: structural keys (R6) and the freeze switch (R5).

Expectations are independent of the code under test: the ABI version is read from the lock file
with ``json``; a key "changes" is checked by inequality of keys built from specs that differ in
exactly one field.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

from b12x.abi import ABI_LOCK_PATH
from b12x.dense import plan_dense
from b12x.kernels import specs as kernel_specs
from b12x.kernels.specs import KernelSpec
from b12x.runtime import compile_cache as cc
from oracle.tiles import DEVICES

BASE = KernelSpec("gemm", "mcg", 6, m_tiles=1, n_tiles=2, warps=4)

# One alternative value per KernelSpec field; a new field without an entry fails the test below.
MUTATIONS = {
    "kind": "decode",
    "codebook": "3inst",
    "bits": 5,
    "bf16": True,
    "in_bf16": True,
    "out_bf16": True,
    "m_tiles": 2,
    "n_tiles": 1,
    "warps": 8,
    "write_partials": True,
    "unroll": 2,
    "depth": 2,
    "smem_stages": 3,
}


@pytest.fixture(autouse=True)
def _restore_freeze():
    yield
    cc.unfreeze()


def test_every_kernelspec_field_has_a_mutation():
    assert {f.name for f in dataclasses.fields(KernelSpec)} == set(MUTATIONS)


@pytest.mark.parametrize("field", sorted(MUTATIONS))
def test_each_codegen_field_changes_the_key(field):
    mutated = dataclasses.replace(BASE, **{field: MUTATIONS[field]})
    assert cc.key_for_spec(mutated, "sm_90") != cc.key_for_spec(BASE, "sm_90")


def test_equal_specs_give_equal_keys_and_hashes():
    twin = KernelSpec("gemm", "mcg", 6, m_tiles=1, n_tiles=2, warps=4)
    assert cc.key_for_spec(twin, "sm_90") == cc.key_for_spec(BASE, "sm_90")
    assert hash(cc.key_for_spec(twin, "sm_90")) == hash(cc.key_for_spec(BASE, "sm_90"))


@pytest.mark.parametrize("arch", ["sm_80", "sm_120"])
def test_arch_changes_the_key(arch):
    assert cc.key_for_spec(BASE, arch) != cc.key_for_spec(BASE, "sm_90")


def test_abi_version_in_key_is_the_lock_version():
    locked = json.loads(ABI_LOCK_PATH.read_text())["abi_version"]
    key = cc.key_for_spec(BASE, "sm_90")
    assert key.abi_version == locked
    bumped = cc.make_key("gemm", {"bits": 6}, arch="sm_90", abi=locked + 1)
    assert bumped != cc.make_key("gemm", {"bits": 6}, arch="sm_90", abi=locked)


def test_dsl_version_changes_the_key():
    a = cc.make_key("gemm", {"bits": 6}, arch="sm_90", dsl="4.8.1")
    b = cc.make_key("gemm", {"bits": 6}, arch="sm_90", dsl="4.9.0")
    assert a != b
    assert cc.make_key("gemm", {"bits": 6}, arch="sm_90").dsl_version == cc.dsl_version()


def test_source_hash_tracks_an_edit(tmp_path, monkeypatch):
    module = tmp_path / "cc_probe_kernel.py"
    module.write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    before = cc.make_key("gemm", {"bits": 6}, arch="sm_90", modules=["cc_probe_kernel"])
    module.write_text("X = 22  # edited\n")
    after = cc.make_key("gemm", {"bits": 6}, arch="sm_90", modules=["cc_probe_kernel"])
    sys.modules.pop("cc_probe_kernel", None)
    assert before.source_hash != after.source_hash
    assert before != after


def test_key_rejects_address_like_values():
    with pytest.raises(TypeError, match=r"codegen\['opts'\]"):
        cc.make_key("gemm", {"opts": object()}, arch="sm_90")
    with pytest.raises(ValueError, match="arch"):
        cc.make_key("gemm", {}, arch="hopper")


def test_runtime_only_inputs_keep_the_keys():
    """M inside one m-tile bucket and the split count are runtime arguments: same kernels."""
    device = DEVICES[2]  # H200: generic path
    common = dict(k=2048, n=4096, bits=4, codebook="mcg", x_dtype=torch.float16, device=device)
    a = plan_dense(m=40, split_k=2, **common)
    b = plan_dense(m=63, split_k=8, **common)  # 64 and up take decode_matmul (no split-K)
    assert (a.split_k, b.split_k) == (2, 8)
    keys_a = [cc.key_for_spec(s, "sm_90") for s in a.kernel_specs]
    keys_b = [cc.key_for_spec(s, "sm_90") for s in b.kernel_specs]
    assert keys_a == keys_b


def test_cache_builds_once_per_key():
    cache = cc.CompileCache()
    calls = []
    key = cc.key_for_spec(BASE, "sm_90")
    first = cache.get_or_compile(key, lambda: calls.append(1) or "compiled")
    twin = cc.key_for_spec(dataclasses.replace(BASE), "sm_90")
    again = cache.get_or_compile(twin, lambda: calls.append(1) or "other")
    assert (first, again, len(calls), cache.hits, cache.misses) == ("compiled", "compiled", 1, 1, 1)


def test_frozen_miss_raises_naming_the_key_and_hit_still_works():
    cache = cc.CompileCache()
    warm = cc.key_for_spec(BASE, "sm_90")
    cache.get_or_compile(warm, lambda: "warm")
    cold = cc.key_for_spec(dataclasses.replace(BASE, unroll=3), "sm_90")
    built = []
    with cc.frozen():
        assert cc.is_frozen()
        assert cache.get_or_compile(warm, lambda: "rebuilt") == "warm"
        with pytest.raises(cc.KernelResolutionFrozen, match=r"frozen: gemm\(.*unroll=3"):
            cache.get_or_compile(cold, lambda: built.append(1))
    assert not cc.is_frozen() and built == []
    assert cache.get_or_compile(cold, lambda: "now") == "now"


def test_freeze_also_freezes_the_kernel_launch_cache():
    cc.freeze()
    with pytest.raises(RuntimeError, match="frozen"):
        kernel_specs.compiled(dataclasses.replace(BASE, unroll=5), "sm_90")
    cc.unfreeze()
    assert not cc.is_frozen()
    kernel_specs.freeze(True)  # the kernels' alias flips the one switch, both ways
    assert cc.is_frozen()
    kernel_specs.freeze(False)
    assert not cc.is_frozen()


def test_compile_during_capture_raises(monkeypatch):
    cache = cc.CompileCache()
    warm = cc.key_for_spec(BASE, "sm_90")
    cache.get_or_compile(warm, lambda: "warm")
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert cache.get_or_compile(warm, lambda: "x") == "warm"
    cold = cc.key_for_spec(dataclasses.replace(BASE, bits=4), "sm_90")
    with pytest.raises(cc.KernelResolutionFrozen, match="during CUDA graph capture"):
        cache.get_or_compile(cold, lambda: "never")
    assert cold not in cache


# --- the launch path: host wrappers and the MoE GEMM resolve through the one runtime cache -------

DENSE_SOURCES = (  # the device code of the dense kernels and the spec builder (issue 4)
    "b12x.formats",
    "b12x.kernels.ptx",
    "b12x.kernels.trellis_decode",
    "b12x.kernels.dense_gemm",
    "b12x.kernels.hadamard",
    "b12x.kernels.specs",
)
MOE_SOURCES = (
    "b12x.formats",
    "b12x.kernels.ptx",
    "b12x.kernels.trellis_decode",
    "b12x.kernels.dense_gemm",
    "b12x.kernels.moe_gemm",
    "b12x.kernels.moe_pair_gemm",  # paired specs build its subclass: its source is codegen too
    "b12x.kernels.specs",
)


def _expected_source_hash(modules) -> str:
    """Recomputed here from the files: SHA-256 over ``name NUL sha256(file)`` per module."""
    outer = hashlib.sha256()
    for name in modules:
        path = Path(importlib.util.find_spec(name).origin)
        outer.update(name.encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    return outer.hexdigest()


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

    from b12x.kernels import host, moe_gemm

    cache = cc.CompileCache()
    monkeypatch.setattr(cc, "CACHE", cache)
    monkeypatch.setattr(host, "_check_tensor", lambda *args, **kwargs: None)
    monkeypatch.setattr(host, "device_arch", lambda device: "sm_90")
    monkeypatch.setattr(host, "_lut_addr", lambda fmt, device: 0)
    monkeypatch.setattr(kernel_specs, "build_kernel", lambda spec: (spec, ()))
    monkeypatch.setattr(moe_gemm, "build_moe_gemm", lambda spec: (spec, ()))
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
    from b12x.kernels import host

    cache, builds = launch_path
    out = torch.empty(256, 256, dtype=torch.float16)
    host.decode_weight(_payload(4), "mcg", out=out)
    host.decode_weight(_payload(4), "mcg", out=out)
    assert len(cache) == 1 and len(builds) == 1
    assert (cache.misses, cache.hits) == (1, 1)
    (key,) = cache.compiled_keys()
    assert key.kernel == "decode" and key.arch == "sm_90"
    assert dict(key.codegen) == {
        "codebook": "mcg",
        "bits": 4,
        "bf16": False,
        "in_bf16": False,
        "out_bf16": False,
        "m_tiles": 1,
        "n_tiles": 1,
        "warps": 4,
        "write_partials": False,
        "unroll": 1,
        "depth": 1,
        "smem_stages": 0,
    }
    assert "--gpu-arch sm_90" in builds[0][1] and "--enable-tvm-ffi" in builds[0][1]
    fn = cache.lookup(key)
    assert len(fn.launches) == 2  # the cached callable is the one launched, twice


def test_launch_key_holds_abi_version_dsl_version_and_source_hash(launch_path):
    from b12x.kernels import host

    cache, _ = launch_path
    host.decode_weight(_payload(3), "3inst", out=torch.empty(256, 256, dtype=torch.float16))
    (key,) = cache.compiled_keys()
    assert key.abi_version == json.loads(ABI_LOCK_PATH.read_text())["abi_version"]
    assert key.dsl_version == importlib.metadata.version("nvidia-cutlass-dsl")
    assert key.source_hash == _expected_source_hash(DENSE_SOURCES)
    assert "abi " in key.describe() and key.source_hash[:12] in key.describe()


def test_split_k_launch_resolves_gemm_and_reduce_through_the_cache(launch_path):
    from b12x.kernels import host

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
    from b12x.kernels import host

    cache, builds = launch_path
    out = torch.empty(256, 256, dtype=torch.float16)
    host.decode_weight(_payload(4), "mcg", out=out)
    with cc.frozen():
        host.decode_weight(_payload(4), "mcg", out=out)  # warmed: still launches
        with pytest.raises(cc.KernelResolutionFrozen, match=r"frozen: decode\(.*codebook='3inst'"):
            host.decode_weight(_payload(3), "3inst", out=out)
    assert len(cache) == 1 and len(builds) == 1


def test_launch_during_capture_refuses_to_compile(launch_path, monkeypatch):
    from b12x.kernels import host

    cache, builds = launch_path
    out = torch.empty(256, 256, dtype=torch.float16)
    host.decode_weight(_payload(4), "mcg", out=out)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    host.decode_weight(_payload(4), "mcg", out=out)
    with pytest.raises(cc.KernelResolutionFrozen, match=r"decode\(.*during CUDA graph capture"):
        host.decode_weight(_payload(2), "mul1", out=out)
    assert len(builds) == 1


def test_kernel_specs_alias_has_no_cache_of_its_own(launch_path):
    cache, builds = launch_path
    first = kernel_specs.compiled(BASE, "sm_90")
    assert cache.lookup(cc.key_for_spec(BASE, "sm_90")) is first
    assert kernel_specs.compiled(BASE, "sm_90") is first and len(builds) == 1
    cache.clear()  # a second, hidden cache would keep answering here
    assert kernel_specs.compiled(BASE, "sm_90") is not first and len(builds) == 2


def test_moe_launch_goes_through_the_same_cache(launch_path):
    from b12x.kernels.moe_gemm import MoeGemmSpec, compiled_moe_gemm

    cache, builds = launch_path
    spec = MoeGemmSpec("mcg", 4, False, m_tiles=2, n_tiles=2, warps=4, depth=4)
    kernel_specs.compiled(BASE, "sm_90")  # a dense kernel shares the cache
    fn = compiled_moe_gemm(spec, "sm_90")
    assert compiled_moe_gemm(spec, "sm_90") is fn and len(builds) == 2 and len(cache) == 2
    (key,) = [k for k in cache.compiled_keys() if k.kernel == "moe_gemm"]
    # every MoeGemmSpec field is a codegen input (the spec's own definition, whatever it grows)
    assert dict(key.codegen) == {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)}
    assert {"codebook", "bits", "bf16", "m_tiles", "n_tiles", "warps", "depth"} <= {
        name for name, _ in key.codegen
    }
    assert key.arch == "sm_90"
    assert key.abi_version == json.loads(ABI_LOCK_PATH.read_text())["abi_version"]
    assert key.source_hash == _expected_source_hash(MOE_SOURCES)
    assert compiled_moe_gemm(spec, "sm_120") is not fn  # another arch, another key
    with cc.frozen():
        assert compiled_moe_gemm(spec, "sm_90") is fn
        with pytest.raises(cc.KernelResolutionFrozen, match=r"frozen: moe_gemm\(.*warps=2"):
            compiled_moe_gemm(dataclasses.replace(spec, warps=2), "sm_90")
    assert len(cache) == 3


@pytest.mark.gpu
def test_gpu_launch_resolves_through_the_runtime_cache(monkeypatch):
    """On the device: the real compile lands in the runtime cache once, and freezing holds."""
    from b12x.kernels import host
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
    assert key.source_hash == _expected_source_hash(DENSE_SOURCES)
    cold = torch.randint(-(2**15), 2**15, (16, 16, 48), generator=gen).to(torch.int16).cuda()
    with cc.frozen():
        assert torch.equal(host.decode_weight(payload, "mcg"), first)
        with pytest.raises(cc.KernelResolutionFrozen, match=r"frozen: decode\(.*codebook='3inst'"):
            host.decode_weight(cold, "3inst")
    assert len(cache) == 1
