"""The compile cache: structural keys (R6) and the freeze switch (R5).

Expectations are independent of the code under test: the ABI version is read from the lock file
with ``json``; a key "changes" is checked by inequality of keys built from specs that differ in
exactly one field.
"""

from __future__ import annotations

import dataclasses
import json
import sys

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
    b = plan_dense(m=64, split_k=8, **common)
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
