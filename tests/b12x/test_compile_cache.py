"""The compile cache: structural keys (R6), the freeze switch (R5) and the disk cache.

The launch path through the cache (host wrappers, split-K, the kind door, the MoE GEMM) is tested
in ``test_launch_cache.py``.

Expectations are independent of the code under test: the ABI version is read from the lock file
with ``json``; a key "changes" is checked by inequality of keys built from specs that differ in
exactly one field.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from b12x.abi import ABI_LOCK_PATH
from b12x.kernels.geometry import GemmGeometry
from b12x.launch import kinds, toolchain
from b12x.launch import specs as kernel_specs
from b12x.launch.specs import KernelSpec, gemm_spec
from b12x.ops.dense import plan_dense
from b12x.runtime import cache_cli, cache_keys, disk_store
from b12x.runtime import compile_cache as cc
from oracle.judge.tiles import DEVICES

BASE = KernelSpec("gemm", "mcg", 6, geometry=GemmGeometry(m_tiles=1, n_tiles=2, warps=4))

# One alternative value per KernelSpec field; a new field without an entry fails the test below.
MUTATIONS = {
    "kind": "decode",
    "fmt": "3inst",  # a name is resolved to its format object once, by KernelSpec
    "bits": 5,
    "bf16": True,
    "in_bf16": True,
    "out_bf16": True,
    "geometry": GemmGeometry(m_tiles=2, n_tiles=2),  # each of its fields: GEOMETRY_MUTATIONS
    "write_partials": True,
}
# One alternative value per GemmGeometry field (the spec embeds it; the key reads every field).
GEOMETRY_MUTATIONS = {
    "m_tiles": 2,
    "n_tiles": 1,
    "warps": 8,
    "unroll": 2,
    "depth": 2,
    "smem_stages": 3,
    "m_warps": 2,
    "shared_rows": 1,
    "wgmma": True,
    "swap_ab": True,
    "cluster": 2,
    "stream_k": True,
}
#: Fields whose mutation is only legal next to another change: the base they are mutated from.
MUTATION_BASES = {
    "m_warps": {"smem_stages": 3},  # the shared-decode mainloop needs its slots
    "wgmma": {"smem_stages": 3, "m_warps": 4},  # a shared decode whose every warp multiplies
    "swap_ab": {"smem_stages": 4, "m_warps": 4, "wgmma": True},  # 4 slots: legal both ways
    "cluster": {"smem_stages": 4, "m_warps": 4, "wgmma": True, "swap_ab": True},
    "stream_k": {"smem_stages": 4, "m_warps": 4, "wgmma": True},
}


@pytest.fixture(autouse=True)
def _restore_freeze():
    yield
    cc.unfreeze()


def test_every_kernelspec_field_has_a_mutation():
    assert {f.name for f in dataclasses.fields(KernelSpec)} == set(MUTATIONS)
    assert {f.name for f in dataclasses.fields(GemmGeometry)} == set(GEOMETRY_MUTATIONS)


@pytest.mark.parametrize("field", sorted(GEOMETRY_MUTATIONS))
def test_each_geometry_field_changes_the_key(field):
    geometry = dataclasses.replace(BASE.geometry, **MUTATION_BASES.get(field, {}))
    mutated = dataclasses.replace(geometry, **{field: GEOMETRY_MUTATIONS[field]})
    base = gemm_spec(BASE.fmt, BASE.bits, geometry)
    assert kinds.launch_key(gemm_spec(BASE.fmt, BASE.bits, mutated), "sm_90") != kinds.launch_key(
        base, "sm_90"
    )


def _mutated(field: str, value) -> KernelSpec:
    """:data:`BASE` with one spec field changed (a decode spec has no geometry)."""
    also = {"geometry": None} if field == "kind" else {}
    return dataclasses.replace(BASE, **{field: value}, **also)


def _shaped(**changes) -> KernelSpec:
    """:data:`BASE` with its geometry's fields changed."""
    return dataclasses.replace(BASE, geometry=dataclasses.replace(BASE.geometry, **changes))


@pytest.mark.parametrize("field", sorted(MUTATIONS))
def test_each_codegen_field_changes_the_key(field):
    mutated = _mutated(field, MUTATIONS[field])
    assert kinds.launch_key(mutated, "sm_90") != kinds.launch_key(BASE, "sm_90")


def test_equal_specs_give_equal_keys_and_hashes():
    twin = KernelSpec("gemm", "mcg", 6, geometry=GemmGeometry(m_tiles=1, n_tiles=2, warps=4))
    assert kinds.launch_key(twin, "sm_90") == kinds.launch_key(BASE, "sm_90")
    assert hash(kinds.launch_key(twin, "sm_90")) == hash(kinds.launch_key(BASE, "sm_90"))


@pytest.mark.parametrize("arch", ["sm_80", "sm_120"])
def test_arch_changes_the_key(arch):
    assert kinds.launch_key(BASE, arch) != kinds.launch_key(BASE, "sm_90")


#: Any real source list will do for keys built by hand (the registry derives the real ones).
SOURCES = ("b12x.kernels.ptx",)


def test_abi_version_in_key_is_the_lock_version():
    locked = json.loads(ABI_LOCK_PATH.read_text())["abi_version"]
    key = kinds.launch_key(BASE, "sm_90")
    assert key.abi_version == locked
    bumped = cc.make_key("gemm", {"bits": 6}, arch="sm_90", modules=SOURCES, abi=locked + 1)
    assert bumped != cc.make_key("gemm", {"bits": 6}, arch="sm_90", modules=SOURCES, abi=locked)


def test_dsl_version_changes_the_key():
    a = cc.make_key("gemm", {"bits": 6}, arch="sm_90", modules=SOURCES, dsl="4.8.1")
    b = cc.make_key("gemm", {"bits": 6}, arch="sm_90", modules=SOURCES, dsl="4.9.0")
    assert a != b
    key = cc.make_key("gemm", {"bits": 6}, arch="sm_90", modules=SOURCES)
    assert key.dsl_version == cc.dsl_version()


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
        cc.make_key("gemm", {"opts": object()}, arch="sm_90", modules=SOURCES)
    with pytest.raises(ValueError, match="arch"):
        cc.make_key("gemm", {}, arch="hopper", modules=SOURCES)


def test_runtime_only_inputs_keep_the_keys():
    """M inside one m-tile bucket and the split count are runtime arguments: same kernels."""
    device = DEVICES[2]  # H200: generic path
    common = dict(k=2048, n=4096, bits=4, codebook="mcg", x_dtype=torch.float16, device=device)
    a = plan_dense(m=40, split_k=2, **common)
    b = plan_dense(m=63, split_k=8, **common)  # 64 and up take decode_matmul (no split-K)
    assert (a.split_k, b.split_k) == (2, 8)
    keys_a = [kinds.launch_key(s, "sm_90") for s in a.kernel_specs]
    keys_b = [kinds.launch_key(s, "sm_90") for s in b.kernel_specs]
    assert keys_a == keys_b


def test_cache_builds_once_per_key():
    cache = cc.CompileCache()
    calls = []
    key = kinds.launch_key(BASE, "sm_90")
    first = cache.get_or_compile(key, lambda: calls.append(1) or "compiled")
    twin = kinds.launch_key(dataclasses.replace(BASE), "sm_90")
    again = cache.get_or_compile(twin, lambda: calls.append(1) or "other")
    assert (first, again, len(calls), cache.hits, cache.misses) == ("compiled", "compiled", 1, 1, 1)


def test_frozen_miss_raises_naming_the_key_and_hit_still_works():
    cache = cc.CompileCache()
    warm = kinds.launch_key(BASE, "sm_90")
    cache.get_or_compile(warm, lambda: "warm")
    cold = kinds.launch_key(_shaped(unroll=3), "sm_90")
    built = []
    with cc.frozen():
        assert cc.is_frozen()
        assert cache.get_or_compile(warm, lambda: "rebuilt") == "warm"
        with pytest.raises(cc.KernelResolutionFrozen, match=r"frozen: gemm\(.*'unroll', 3"):
            cache.get_or_compile(cold, lambda: built.append(1))
    assert not cc.is_frozen() and built == []
    assert cache.get_or_compile(cold, lambda: "now") == "now"


def test_freeze_also_freezes_the_kernel_launch_door():
    cc.freeze()
    with pytest.raises(RuntimeError, match="frozen"):
        kinds.compiled(_shaped(unroll=5), "sm_90")
    cc.unfreeze()
    assert not cc.is_frozen()


def test_compile_during_capture_raises(monkeypatch):
    cache = cc.CompileCache()
    warm = kinds.launch_key(BASE, "sm_90")
    cache.get_or_compile(warm, lambda: "warm")
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert cache.get_or_compile(warm, lambda: "x") == "warm"
    cold = kinds.launch_key(dataclasses.replace(BASE, bits=4), "sm_90")
    with pytest.raises(cc.KernelResolutionFrozen, match="during CUDA graph capture"):
        cache.get_or_compile(cold, lambda: "never")
    assert cold not in cache


# --- the disk cache: persistence across processes, keys and paths, atomic writes, corruption ----
#
# A fake compiler's objects (``_Obj``) and a fake export/load pair stand in for the DSL, so these
# run in milliseconds; ``test_real_kernel_is_loaded_by_a_second_process`` and the GPU test below
# use the real DSL.

TOOL = {"dsl": "test-toolchain", "n": 1}


class _Obj:
    """What the fake compiler returns (exportable, unlike a bare string)."""

    def __init__(self, text: str):
        self.text = text


class _Loaded:
    def __init__(self, text: str, symbol: str):
        self.text, self.symbol = text, symbol


def _fake_export(obj, path, symbol):
    if not isinstance(obj, _Obj):
        return False
    path.write_bytes(f"{symbol}|{obj.text}".encode())
    return True


@pytest.fixture
def disk(tmp_path):
    """A factory of DiskStores over one root, with fake export/load; ``loads`` records loads."""
    loads = []

    def fake_load(path, symbol):
        stored_symbol, _, text = path.read_bytes().decode().partition("|")
        assert stored_symbol == symbol
        loads.append(text)
        return _Loaded(text, symbol)

    def make(**overrides):
        kwargs = dict(toolchain_info=TOOL, export=_fake_export, load=fake_load)
        kwargs.update(overrides)
        return cc.DiskStore(tmp_path / "kernels", **kwargs)

    make.loads = loads
    make.root = tmp_path / "kernels"
    return make


def _never():
    raise AssertionError("compiled although the disk holds the kernel")


def test_cache_root_default_override_and_off(tmp_path):
    assert cc.cache_root({"HOME": "/h"}) == Path("/h/.cache/b12x/kernels")
    assert cc.cache_root({"HOME": "/h", "XDG_CACHE_HOME": "/x"}) == Path("/x/b12x/kernels")
    assert cc.cache_root({"HOME": "/h", "XDG_CACHE_HOME": "rel"}) == Path("/h/.cache/b12x/kernels")
    assert cc.cache_root({"B12X_CACHE_DIR": str(tmp_path), "XDG_CACHE_HOME": "/x"}) == tmp_path
    for off in ("off", "OFF", "0", "none", "false", "no"):
        assert cc.cache_root({"B12X_CACHE_DIR": off, "HOME": "/h"}) is None, off
    assert cc.cache_root({"B12X_CACHE_DIR": "", "HOME": "/h"}) == Path("/h/.cache/b12x/kernels")


def test_a_fresh_cache_loads_from_disk_instead_of_compiling(disk):
    key = kinds.launch_key(BASE, "sm_90")
    first = cc.CompileCache(disk())
    built = first.get_or_compile(key, lambda: _Obj("kernel-A"))
    # the compiling process already runs the object loaded back from its entry
    assert isinstance(built, _Loaded) and built.text == "kernel-A"
    assert first.counters.compiles == 1 and first.counters.disk_writes == 1
    assert disk().path_for(key).is_file()

    second = cc.CompileCache(disk())  # a new process: nothing in memory
    loaded = second.get_or_compile(key, _never)
    assert isinstance(loaded, _Loaded) and loaded.text == "kernel-A"
    assert second.get_or_compile(key, _never) is loaded  # then memory
    s = cc.stats(second)
    assert (s["compiles"], s["disk_loads"], s["memory_hits"], s["memory_misses"]) == (0, 1, 1, 1)
    assert s["cache_dir"] == str(disk.root)
    # the job benchmark counts distinct specialisations from these: built in the first process,
    # only loaded in the second, one key either way
    built_here = cc.stats(first)
    assert built_here["compiled_keys"] == built_here["resolved_keys"] == s["resolved_keys"]
    assert s["compiled_keys"] == [] and len(s["resolved_keys"]) == 1


def test_unexportable_objects_stay_in_memory_only(disk):
    cache = cc.CompileCache(disk())
    key = kinds.launch_key(BASE, "sm_90")
    assert cache.get_or_compile(key, lambda: "plain string") == "plain string"
    assert cache.counters.not_persisted == 1 and not disk().path_for(key).exists()


def test_disk_path_is_versioned_and_changes_with_every_key_part(disk, tmp_path, monkeypatch):
    store = disk()
    key = kinds.launch_key(BASE, "sm_90")
    path = store.path_for(key)
    assert path.parent == disk.root / f"v{cc.DISK_FORMAT}" / "gemm" and path.suffix == ".kobj"
    assert path.parent.parent.name == "v1"
    others = [
        store.path_for(kinds.launch_key(_mutated(f, v), "sm_90")) for f, v in MUTATIONS.items()
    ]
    others.append(store.path_for(kinds.launch_key(BASE, "sm_120")))
    locked = json.loads(ABI_LOCK_PATH.read_text())["abi_version"]
    codegen = {f.name: getattr(BASE, f.name) for f in dataclasses.fields(BASE)}
    sources = kinds.sources(kinds.KINDS["gemm"])
    by_hand = functools.partial(cc.make_key, "gemm", codegen, arch="sm_90", modules=sources)
    others.append(store.path_for(by_hand(abi=locked + 1)))
    others.append(store.path_for(by_hand(dsl="9.9.9")))
    others.append(disk(toolchain_info={**TOOL, "n": 2}).path_for(key))
    others.append(store.path_for(key, ["b12x.formats"]))
    assert by_hand() == key  # the base really is BASE
    assert len({path, *others}) == len(others) + 1


def test_a_source_edit_deep_in_the_import_closure_changes_the_disk_entry(tmp_path, monkeypatch):
    """The digest covers every b12x module the key's sources import, transitively."""
    fake_b12x = tmp_path / "tree" / "b12x"
    (fake_b12x / "kernels").mkdir(parents=True)
    (fake_b12x / "__init__.py").write_text("")
    (fake_b12x / "kernels" / "__init__.py").write_text("")
    (fake_b12x / "kernels" / "top.py").write_text(
        "import torch\nfrom b12x.kernels import mid\n\ndef f():\n    from .leaf import g\n"
    )
    (fake_b12x / "kernels" / "mid.py").write_text("from b12x import helpers\n")
    (fake_b12x / "kernels" / "leaf.py").write_text("def g():\n    return 1\n")
    (fake_b12x / "helpers.py").write_text("X = 1\n")
    (fake_b12x / "unused.py").write_text("Y = 1\n")
    monkeypatch.setattr(cache_keys, "_B12X_DIR", fake_b12x)
    closure = cc.source_closure(["b12x.kernels.top"])
    assert closure == (
        "b12x",
        "b12x.helpers",
        "b12x.kernels",
        "b12x.kernels.leaf",
        "b12x.kernels.mid",
        "b12x.kernels.top",
    )
    before = cc.dependency_hash(["b12x.kernels.top"])
    (fake_b12x / "unused.py").write_text("Y = 2\n")
    assert cc.dependency_hash(["b12x.kernels.top"]) == before
    (fake_b12x / "helpers.py").write_text("X = 2  # two imports away\n")
    assert cc.dependency_hash(["b12x.kernels.top"]) != before


def test_entries_are_written_by_rename_and_a_failed_write_is_only_a_warning(disk, monkeypatch):
    key = kinds.launch_key(BASE, "sm_90")
    renames = []
    real_replace = os.replace

    def recording(src, dst):
        renames.append((Path(src), Path(dst)))
        assert Path(src).read_bytes().startswith(disk_store.MAGIC)  # complete before it is visible
        assert not Path(dst).exists()
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", recording)
    cc.CompileCache(disk()).get_or_compile(key, lambda: _Obj("v1"))
    ((src, dst),) = renames
    assert dst == disk().path_for(key) and src.parent == dst.parent
    assert src.name.startswith(".tmp-") and not src.exists()

    other = kinds.launch_key(_shaped(unroll=4), "sm_90")

    def crash(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", crash)
    cache = cc.CompileCache(disk())
    with pytest.warns(cc.CompileCacheWarning, match="cannot write"):
        got = cache.get_or_compile(other, lambda: _Obj("v2"))
    assert isinstance(got, _Obj) and got.text == "v2"  # the compiled object, kept in memory
    assert not disk().path_for(other).exists()
    assert [p.name for p in disk().path_for(other).parent.iterdir()] == [dst.name]  # no .tmp left


def _entry_bytes(disk, key) -> bytes:
    cc.CompileCache(disk()).get_or_compile(key, lambda: _Obj("good"))
    return disk().path_for(key).read_bytes()


def _flip_last(data: bytes) -> bytes:
    return data[:-1] + bytes([data[-1] ^ 1])


CORRUPTIONS = {
    "truncated": lambda data, foreign: data[:-3],
    "payload-bit-flip": lambda data, foreign: _flip_last(data),
    "bad-magic": lambda data, foreign: b"X" + data[1:],
    "garbage": lambda data, foreign: b"\x00" * 40,
    "empty": lambda data, foreign: b"",
    "header-length-overflow": lambda data, foreign: (
        disk_store.MAGIC + (2**40).to_bytes(8, "little")
    ),
    "another-keys-entry": lambda data, foreign: foreign,
}


@pytest.mark.parametrize("how", sorted(CORRUPTIONS))
def test_a_bad_entry_is_discarded_with_a_warning_and_recompiled(disk, how):
    key = kinds.launch_key(BASE, "sm_90")
    other = kinds.launch_key(_shaped(warps=8), "sm_90")
    data, foreign = _entry_bytes(disk, key), _entry_bytes(disk, other)
    path = disk().path_for(key)
    path.write_bytes(CORRUPTIONS[how](data, foreign))
    disk.loads.clear()
    cache = cc.CompileCache(disk())
    with pytest.warns(cc.CompileCacheWarning, match="discarding"):
        got = cache.get_or_compile(key, lambda: _Obj("recompiled"))
    assert got.text == "recompiled" and cache.counters.compiles == 1
    assert cache.disk.discarded == 1 and disk.loads == ["recompiled"]  # never loaded the bad one
    assert cc.CompileCache(disk()).get_or_compile(key, _never).text == "recompiled"  # rewritten


def test_an_entry_the_dsl_cannot_load_is_discarded(disk):
    key = kinds.launch_key(BASE, "sm_90")
    _entry_bytes(disk, key)

    def refuse(path, symbol):
        raise RuntimeError("JIT session error: Symbols not found")

    cache = cc.CompileCache(disk(load=refuse))
    with pytest.warns(cc.CompileCacheWarning) as caught:
        got = cache.get_or_compile(key, lambda: _Obj("fresh"))
    messages = [str(w.message) for w in caught]
    assert "could not load it" in messages[0] and "does not load back" in messages[1]
    # the fresh object does not load back either: kept in memory, and no entry is left behind
    assert got.text == "fresh" and not disk().path_for(key).exists()
    assert cache.counters.compiles == 1 and cache.counters.not_persisted == 1


def test_frozen_or_capturing_misses_raise_even_when_the_disk_has_the_kernel(disk, monkeypatch):
    """The freeze rule: the disk is consulted only where a compile would be allowed."""
    key = kinds.launch_key(BASE, "sm_90")
    _entry_bytes(disk, key)
    disk.loads.clear()
    cache = cc.CompileCache(disk())
    with cc.frozen(), pytest.raises(cc.KernelResolutionFrozen, match=r"frozen: gemm\("):
        cache.get_or_compile(key, _never)
    with monkeypatch.context() as m:
        m.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
        with pytest.raises(cc.KernelResolutionFrozen, match="during CUDA graph capture"):
            cache.get_or_compile(key, _never)
    assert disk.loads == [] and len(cache) == 0 and cache.misses == 0
    assert cache.get_or_compile(key, _never).text == "good"  # unfrozen: a load, not a compile
    assert (cache.counters.disk_loads, cache.counters.compiles) == (1, 0)
    with cc.frozen():
        assert cache.get_or_compile(key, _never).text == "good"  # warmed: frozen hits still work


def test_concurrent_writers_and_readers_never_see_a_torn_entry(disk):
    """Writers race on one key with large, distinct payloads while readers load it: every read
    is a complete entry (no discard, no warning), as for pytest-xdist workers sharing the root."""
    import threading
    import warnings

    key = kinds.launch_key(BASE, "sm_90")
    big = "x" * (4 << 20)
    stop = threading.Event()
    errors: list[BaseException] = []
    seen: list[str] = []

    def writer(tag: str):
        try:
            for i in range(12):
                cc.CompileCache(disk()).get_or_compile(key, lambda i=i: _Obj(f"{tag}{i}|{big}"))
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    def reader():
        try:
            while not stop.is_set():
                got = disk().load(key)
                if got is not None:
                    assert got.text.endswith(big)
                    seen.append(got.text[:8])
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    with warnings.catch_warnings():
        warnings.simplefilter("error", cc.CompileCacheWarning)
        writers = [threading.Thread(target=writer, args=(t,)) for t in "ab"]
        readers = [threading.Thread(target=reader) for _ in range(2)]
        for t in readers + writers:
            t.start()
        for t in writers:
            t.join()
        stop.set()
        for t in readers:
            t.join()
    assert errors == [] and seen
    assert not [p for p in disk().path_for(key).parent.iterdir() if p.name.startswith(".tmp-")]


def test_clear_removes_entries_and_dumps_but_nothing_else(disk, capsys):
    for unroll in (1, 2):
        _entry_bytes(disk, kinds.launch_key(_shaped(unroll=unroll), "sm_90"))
    (disk.root / "dumps" / "123-x").mkdir(parents=True)
    (disk.root / "v0" / "old").mkdir(parents=True)
    (disk.root / "v0" / "old" / "a.kobj").write_bytes(b"old format")
    (disk.root / "notes.txt").write_text("mine")
    assert cache_cli.main(["--dir", str(disk.root)]) == 0
    assert "entries: 3" in capsys.readouterr().out
    assert cache_cli.main(["--dir", str(disk.root), "--clear"]) == 0
    assert "removed 3 kernel entries" in capsys.readouterr().out
    assert sorted(p.name for p in disk.root.iterdir()) == ["notes.txt"]


def test_compile_options_send_dumps_to_the_private_dump_dir(monkeypatch):
    monkeypatch.delenv("CUTE_DSL_DUMP_DIR", raising=False)
    opts = toolchain.compile_options("sm_90", ptx=True)
    assert opts.split()[:2] == ["--gpu-arch", "sm_90"]  # arch first (callers parse it)
    dump = cc.dump_dir()
    assert opts.endswith(f"--dump-dir={dump}") and dump.is_dir()
    assert Path.cwd() not in (dump, *dump.parents)
    monkeypatch.setenv("CUTE_DSL_DUMP_DIR", "/somewhere/the/user/chose")
    assert "--dump-dir" not in toolchain.compile_options("sm_90", ptx=True)


def test_dump_dirs_of_dead_processes_on_this_host_are_pruned(tmp_path):
    """A process that dies without ``atexit`` (an xdist worker) leaves its dump dir; the next one
    removes it, but never a live process's or another host's."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    dumps = tmp_path / "dumps"
    names = {
        "dead": f"{cc._HOST}-{dead.pid}-abc",
        "live": f"{cc._HOST}-{os.getppid()}-def",
        "other-host": f"elsewhere-{dead.pid}-ghi",
        "foreign": "not-ours",
    }
    for name in names.values():
        (dumps / name).mkdir(parents=True)
        (dumps / name / "x.ptx").write_text("ptx")
    cc._prune_dump_dirs(dumps)
    left = {p.name for p in dumps.iterdir()}
    assert left == {names["live"], names["other-host"], names["foreign"]}


def test_a_ptx_compile_leaves_the_working_directory_empty(tmp_path, monkeypatch):
    """``compile_options(ptx=True)`` (what the oracle's compile checks use) writes no file here."""
    monkeypatch.delenv("CUTE_DSL_DUMP_DIR", raising=False)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    result = kernel_specs.compile_spec(KernelSpec("reduce"), "sm_90", ptx=True)
    ptx = result.fn.artifacts.PTX or ""
    assert ".target sm_90" in ptx  # the PTX was kept, in memory ...
    assert list(cwd.iterdir()) == []  # ... and no file landed in the working directory
    assert any(p.suffix == ".ptx" for p in cc.dump_dir().iterdir())


_PROBE = """
import sys, torch
from b12x.launch import kinds
from b12x.kernels.geometry import GemmGeometry
from b12x.launch.specs import KernelSpec, gemm_spec
fn = kinds.compiled(KernelSpec("reduce"), sys.argv[1])
try:  # CPU tensors: the tvm-ffi contract check answers, naming the kernel's parameters
    fn(torch.zeros(2, 4, 4), torch.zeros(4, 2, dtype=torch.int32))
except ValueError as exc:
    print("CONTRACT", exc)
"""


def _dsl_runtime_arch() -> str:
    """The arch the DSL builds a JIT engine for here (``CUTE_DSL_ARCH``, else its default): a
    kernel compiled for it can be exported."""
    from cutlass.cutlass_dsl import CuTeDSL

    return CuTeDSL._get_dsl().envar.arch


@pytest.mark.deep
def test_real_kernel_is_loaded_by_a_second_process(tmp_path, monkeypatch):
    """The real DSL on CPU: this process compiles and exports; a fresh process loads it (no
    compile), and what it loaded is the kernel (its tvm-ffi signature names the reduce kernel's
    parameters)."""
    arch = _dsl_runtime_arch()
    cache_dir, stats_file = tmp_path / "kernels", tmp_path / "stats.jsonl"
    cache = cc.CompileCache(cc.DiskStore(cache_dir))
    monkeypatch.setattr(cc, "CACHE", cache)
    kinds.compiled(KernelSpec("reduce"), arch)
    assert (cache.counters.compiles, cache.counters.disk_writes) == (1, 1)

    env = {
        **os.environ,
        "B12X_CACHE_DIR": str(cache_dir),
        "B12X_COMPILE_STATS": str(stats_file),
        "CUTE_DSL_ARCH": arch,
        "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
    }
    run = subprocess.run(
        [sys.executable, "-c", _PROBE, arch],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    (line,) = stats_file.read_text().splitlines()
    second = json.loads(line)
    assert (second["compiles"], second["disk_loads"], second["disk_discarded"]) == (0, 1, 0)
    assert "CONTRACT" in run.stdout and "partials" in run.stdout, run.stdout
    assert len(list((cache_dir / f"v{cc.DISK_FORMAT}" / "reduce").glob("*.kobj"))) == 1


_GPU_PROBE = """
import json, torch
from b12x.launch import host
from b12x.runtime import compile_cache as cc
from reference import trellis as ref_trellis
words = torch.randint(-(2**15), 2**15, (16, 16, 64), generator=torch.Generator().manual_seed(5))
payload = words.to(torch.int16)
out = host.decode_weight(payload.cuda(), "mcg")
torch.cuda.synchronize()
exact = torch.equal(out.cpu(), ref_trellis.decode(payload, "mcg"))
print("RESULT", json.dumps({"exact": exact, **cc.stats()}))
"""


@pytest.mark.gpu
def test_gpu_second_process_loads_the_kernel_and_it_decodes_exactly(tmp_path):
    """Two fresh processes on one empty cache dir: the first compiles, the second only loads,
    and both decode bit-exactly against the reference."""
    env = {**os.environ, "B12X_CACHE_DIR": str(tmp_path / "kernels")}
    results = []
    for _ in range(2):
        run = subprocess.run(
            [sys.executable, "-c", _GPU_PROBE], env=env, capture_output=True, text=True
        )
        assert run.returncode == 0, run.stderr[-3000:]
        line = next(x for x in run.stdout.splitlines() if x.startswith("RESULT "))
        results.append(json.loads(line[len("RESULT ") :]))
    first, second = results
    assert first["exact"] and second["exact"]
    assert (first["compiles"], first["disk_writes"], first["disk_loads"]) == (1, 1, 0)
    assert (second["compiles"], second["disk_loads"], second["disk_discarded"]) == (0, 1, 0)


@pytest.mark.parametrize("clear", [False, True])
@pytest.mark.parametrize("where", ["file", "under_file", "env_file"])
def test_cache_cli_refuses_a_root_that_cannot_be_a_directory(
    tmp_path, monkeypatch, capsys, where, clear
):
    """A regular file (or a path under one) as the cache root is exit 2 with one stderr line,
    never "0 entries" / "removed 0" and exit 0; the file is left alone."""
    regular = tmp_path / "cache-file"
    regular.write_text("not a cache")
    root = regular / "x" if where == "under_file" else regular
    argv = ["--clear"] if clear else []
    if where == "env_file":
        monkeypatch.setenv("B12X_CACHE_DIR", str(root))
    else:
        argv += ["--dir", str(root)]
    assert cache_cli.main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1
    assert str(regular) in err and ("B12X_CACHE_DIR" if where == "env_file" else "--dir") in err
    assert regular.read_text() == "not a cache"


@pytest.mark.deep
def test_cache_cli_runs_as_a_module_without_a_runpy_warning(tmp_path):
    env = dict(os.environ, B12X_CACHE_DIR=str(tmp_path / "none-yet"))
    run = subprocess.run(
        [sys.executable, "-m", "b12x.runtime.cache_cli"], capture_output=True, text=True,
        env=env, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0 and run.stderr == "", run.stderr
    assert "entries: 0" in run.stdout


def test_a_same_size_edit_in_a_running_process_changes_the_source_hash(tmp_path, monkeypatch):
    """The digest memo is keyed by (path, mtime_ns, size): an edit that keeps the size (a
    constant changed digit for digit) within the same second must still change the key."""
    monkeypatch.syspath_prepend(str(tmp_path))
    source = tmp_path / "same_size_kernel.py"
    source.write_text("SCALE = 1234\n")
    before = cache_keys.source_hash(["same_size_kernel"])
    stat = source.stat()
    source.write_text("SCALE = 4321\n")
    os.utime(source, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000))  # 1 us later, same size
    assert source.stat().st_size == stat.st_size
    after = cache_keys.source_hash(["same_size_kernel"])
    assert after != before
    assert cache_keys.source_hash(["same_size_kernel"]) == after  # stable when unchanged
