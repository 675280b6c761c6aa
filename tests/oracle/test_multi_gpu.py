"""Several GPUs of one host: worker pinning, the compile cache across devices, CUDA graphs on a
non-zero device and on two devices in sequence (issue 7).

CPU tests (always run):

* the root conftest pins xdist worker ``gwK`` to GPU ``K mod count`` of ``B12X_TEST_GPUS`` /
  ``CUDA_VISIBLE_DEVICES`` without importing torch (so CUDA cannot be initialised before the
  pin), and a worker that replaces a crashed one keeps the crashed worker's GPU (a real
  ``pytest -n 2 --max-worker-restart 1`` run with three GPU ids, where ``gw2 mod 3`` would pick
  a third GPU if the slot were not inherited);
* the kernel cache is keyed by the device's arch: devices of one capability share an entry,
  devices of different capabilities never do (capabilities simulated, compiler stubbed).

GPU tests (``multi_gpu``: skipped at collection below two visible devices; run them in the
serial phase, without xdist, which pins one GPU per worker — see docs/multi_gpu.md): every dense
path (generic with and without split-K, bf16, decode-then-GEMM, the K6 row where the device
routes it) captured and replayed on ``cuda:1`` and then on ``cuda:0``/``cuda:1``/``cuda:0`` in
sequence, bitwise equal to eager on the same device for two input sets, with NaN-poisoned
outputs before each replay and compilation frozen during capture; eager on ``cuda:1`` while
``cuda:0`` is current; the oracle's graph protocol on ``cuda:1``; compiles counted across devices.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
CONFTEST = REPO / "conftest.py"
_PIN_VARS = (
    "PYTEST_XDIST_WORKER",
    "PYTEST_XDIST_WORKER_COUNT",
    "PYTEST_XDIST_TESTRUNUID",
    "CUDA_VISIBLE_DEVICES",
    "B12X_TEST_GPUS",
    "B12X_GPU_SLOT",
    "PYTEST_ADDOPTS",
)


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _PIN_VARS}
    return {**env, **extra}


# --- pinning (CPU) -----------------------------------------------------------------------------

PIN_PROBE = r"""
import json, os, runpy, sys
scenarios, conftest = json.loads(sys.argv[1]), sys.argv[2]
base = dict(os.environ)
pinned = []
for scenario in scenarios:
    os.environ.clear()
    os.environ.update(base)
    os.environ.update(scenario)
    runpy.run_path(conftest)
    pinned.append(os.environ.get("CUDA_VISIBLE_DEVICES"))
after_conftest = "torch" in sys.modules
import oracle.pytest_plugin  # noqa: E402,F401 - the plugin the conftest loads next
print(json.dumps({"pinned": pinned, "torch": [after_conftest, "torch" in sys.modules]}))
"""

SCENARIOS = [
    ({"PYTEST_XDIST_WORKER": "gw0", "B12X_TEST_GPUS": "5,7"}, ["5", "7"], 0),
    ({"PYTEST_XDIST_WORKER": "gw3", "B12X_TEST_GPUS": "5,7"}, ["5", "7"], 3),
    ({"PYTEST_XDIST_WORKER": "gw2", "CUDA_VISIBLE_DEVICES": "2,4,6"}, ["2", "4", "6"], 2),
    ({"PYTEST_XDIST_WORKER": "gw4", "CUDA_VISIBLE_DEVICES": "2,4,6"}, ["2", "4", "6"], 4),
    (  # B12X_TEST_GPUS wins over a CUDA_VISIBLE_DEVICES the parent also set
        {"PYTEST_XDIST_WORKER": "gw1", "B12X_TEST_GPUS": "1,3", "CUDA_VISIBLE_DEVICES": "0,1,2,3"},
        ["1", "3"],
        1,
    ),
    (  # a replacement worker (new id) keeps the slot the controller stamped on its spec
        {"PYTEST_XDIST_WORKER": "gw5", "B12X_TEST_GPUS": "5,7,9", "B12X_GPU_SLOT": "1"},
        ["5", "7", "9"],
        1,
    ),
]


def test_conftest_pins_worker_k_to_gpu_k_mod_count_before_torch_is_imported():
    scenarios = [env for env, _, _ in SCENARIOS]
    expected = [gpus[k % len(gpus)] for _, gpus, k in SCENARIOS]
    scenarios.append({"CUDA_VISIBLE_DEVICES": "2,4"})  # the controller (no worker) is untouched
    expected.append("2,4")
    proc = subprocess.run(
        [sys.executable, "-c", PIN_PROBE, json.dumps(scenarios), str(CONFTEST)],
        env=_clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["pinned"] == expected
    assert result["torch"] == [False, False]  # nothing could have initialised CUDA yet


WORKER_RECORDER = r"""


def pytest_configure(config):
    from pathlib import Path

    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker:
        out = Path(os.environ["PIN_OUT"]) / f"{worker}.txt"
        out.write_text(os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>"))
"""

CRASHING_TESTS = r"""
import os
from pathlib import Path


def test_crash_once():
    marker = Path(os.environ["PIN_OUT"]) / "crashed"
    if not marker.exists():
        marker.write_text(os.environ["PYTEST_XDIST_WORKER"])
        os._exit(1)


def test_other():
    pass
"""


@pytest.mark.deep
def test_replacement_worker_keeps_the_crashed_workers_gpu(tmp_path):
    project = tmp_path / "project"
    out = tmp_path / "out"
    project.mkdir()
    out.mkdir()
    # the pinning is all module-level code; the plugin line only slows every worker's start
    pin_code = [
        ln
        for ln in CONFTEST.read_text().splitlines()
        if ln.split("=")[0].strip() != "pytest_plugins"
    ]
    (project / "conftest.py").write_text("\n".join(pin_code) + WORKER_RECORDER)
    (project / "test_crash.py").write_text(CRASHING_TESTS)
    cmd = [sys.executable, "-m", "pytest", "-n", "2", "--max-worker-restart", "1"]
    cmd += ["-p", "no:cacheprovider", "-p", "no:hypothesispytest", "-q", "--rootdir", str(project)]
    cmd.append(str(project))
    env = _clean_env(PIN_OUT=str(out), B12X_TEST_GPUS="5,7,9")
    proc = subprocess.run(cmd, cwd=project, env=env, capture_output=True, text=True, timeout=120)
    assert "1 failed, 1 passed" in proc.stdout, proc.stdout + proc.stderr  # the crash counts
    seen = {p.stem: p.read_text() for p in out.glob("gw*.txt")}
    crashed = (out / "crashed").read_text()
    assert {seen["gw0"], seen["gw1"]} == {"5", "7"}
    replacements = sorted(set(seen) - {"gw0", "gw1"})
    assert replacements == ["gw2"], seen
    assert seen["gw2"] == seen[crashed]  # not "9" (= 2 mod 3), which a fresh id would pick


# --- the compile cache across devices (CPU, simulated capabilities) ----------------------------


def test_kernel_cache_is_shared_by_identical_devices_only(monkeypatch):
    import cutlass.cute as cute

    from b12x.launch import host, kinds, specs
    from b12x.runtime import compile_cache
    from b12x.runtime.compile_cache import CompileCache

    capabilities = {0: (9, 0), 1: (9, 0), 2: (12, 0)}
    monkeypatch.setattr(
        torch.cuda, "get_device_capability", lambda d=None: capabilities[torch.device(d).index]
    )
    arches = {i: host.device_arch(torch.device("cuda", i)) for i in capabilities}
    assert arches == {0: "sm_90", 1: "sm_90", 2: "sm_120"}

    options: list[str] = []
    launch_cache = CompileCache()
    monkeypatch.setattr(compile_cache, "CACHE", launch_cache)  # the one cache of the launch path
    monkeypatch.setattr(specs, "build_kernel", lambda spec: (spec, ()))
    monkeypatch.setattr(cute, "compile", lambda kernel, *a, options: _compile_stub(options))
    spec = specs.KernelSpec("decode", "mcg", 4)
    _compile_stub.calls = options
    fns = {i: kinds.compiled(spec, arches[i]) for i in capabilities}
    assert fns[0] is fns[1] and fns[2] is not fns[0]
    assert [o.split()[1] for o in options] == ["sm_90", "sm_120"]
    assert len(launch_cache) == 2 and launch_cache.hits == 1

    keys = {i: kinds.launch_key(spec, arches[i]) for i in capabilities}
    assert keys[0] == keys[1] != keys[2]
    cache, builds = CompileCache(), []
    for i in capabilities:
        cache.get_or_compile(keys[i], lambda i=i: builds.append(i) or object())
    assert len(cache) == 2 and builds == [0, 2] and cache.hits == 1


def _compile_stub(options: str) -> object:
    """A compile that reports a spill-free ptxas result, so the first optimisation level wins."""
    _compile_stub.calls.append(options)
    print("ptxas info    : 0 bytes spill stores, 0 bytes spill loads")
    return object()


# --- GPU: graphs on a non-zero device and on two devices in sequence ---------------------------

DENSE_PATHS = {
    "generic_split_k": {"m": 8, "k": 512, "n": 256, "codebook": "mcg", "bits": 4, "split_k": 4},
    "generic": {"m": 17, "k": 256, "n": 256, "codebook": "3inst", "bits": 3, "split_k": 1},
    "generic_bf16": {
        "m": 9,
        "k": 256,
        "n": 256,
        "codebook": "mcg",
        "bits": 4,
        "split_k": 2,
        "x_dtype": torch.bfloat16,
        "compute_dtype": torch.bfloat16,
    },
    "decode_matmul": {"m": 64, "k": 256, "n": 256, "codebook": "mcg", "bits": 4},  # M >= 64
    "k6_or_generic": {"m": 8, "k": 256, "n": 256, "codebook": "mcg", "bits": 6},
}


def _inputs(problem: dict, seed: int, device: torch.device) -> dict[str, torch.Tensor]:
    m, k, n, bits = problem["m"], problem["k"], problem["n"], problem["bits"]
    gen = torch.Generator().manual_seed(seed)
    words = torch.randint(-(1 << 15), 1 << 15, (k // 16, n // 16, 16 * bits), generator=gen)

    def sign(size: int) -> torch.Tensor:
        return torch.where(torch.rand(size, generator=gen) < 0.5, -1.0, 1.0)

    tensors = {
        "x": (torch.randn(m, k, generator=gen) * 0.1).to(problem.get("x_dtype", torch.float16)),
        "trellis": words.to(torch.int16),
        "suh": (sign(k) * (0.5 + torch.rand(k, generator=gen))).half(),
        "svh": (sign(n) * (0.5 + torch.rand(n, generator=gen))).half(),
    }
    return {name: t.to(device) for name, t in tensors.items()}


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16) if t.element_size() == 2 else t.view(torch.int32)


def _graph_vs_eager(device: str, problem: dict) -> tuple[str, list[torch.Tensor]]:
    """Plan/bind/run on ``device``; capture once, replay per input set; bitwise vs eager.
    Returns the plan's path and the eager outputs (on the CPU)."""
    from b12x.ops.dense.plan import allocate_dense_buffers, bind_dense, plan_dense, run_dense
    from b12x.runtime.compile_cache import frozen

    dev = torch.device(device)
    with torch.cuda.device(dev):
        plan = plan_dense(
            m=problem["m"],
            k=problem["k"],
            n=problem["n"],
            bits=problem["bits"],
            codebook=problem["codebook"],
            x_dtype=problem.get("x_dtype", torch.float16),
            compute_dtype=problem.get("compute_dtype", torch.float16),
            split_k=problem.get("split_k"),
            device=dev,
        )
        bound = bind_dense(plan, **allocate_dense_buffers(plan, dev))
        output = bound.buffers["output"]
        sets = [_inputs(problem, seed, dev) for seed in (1, 2)]
        live = {name: t.clone() for name, t in sets[0].items()}
        eager = []
        side = torch.cuda.Stream(dev)
        side.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(side):  # warm-up (compiles) and eager outputs per input set
            for inputs in sets:
                for name, t in inputs.items():
                    live[name].copy_(t)
                run_dense(bound, **live)
                eager.append(output.clone())
        torch.cuda.current_stream(dev).wait_stream(side)
        torch.cuda.synchronize(dev)
        assert output.device == dev
        with frozen():  # nothing may compile during capture
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                run_dense(bound, **live)
            torch.cuda.synchronize(dev)
            for round_ in range(4):
                which = round_ % 2
                for name, t in sets[which].items():
                    live[name].copy_(t)
                output.fill_(float("nan"))
                graph.replay()
                torch.cuda.synchronize(dev)
                assert torch.equal(_bits(output), _bits(eager[which])), (device, plan.path, round_)
        return plan.path, [t.cpu() for t in eager]


@pytest.mark.parametrize("name", sorted(DENSE_PATHS))
@pytest.mark.gpu
@pytest.mark.multi_gpu
@pytest.mark.graph
def test_dense_graph_on_device_1_equals_eager(name):
    before = torch.cuda.memory_allocated(0)
    path, eager = _graph_vs_eager("cuda:1", DENSE_PATHS[name])
    assert torch.cuda.memory_allocated(0) == before  # device 0 untouched
    assert all(torch.isfinite(t.float()).all() for t in eager)
    if name == "decode_matmul":
        assert path == "decode_matmul"
    elif name.startswith("generic"):
        assert path == "generic"


@pytest.mark.parametrize("name", sorted(DENSE_PATHS))
@pytest.mark.gpu
@pytest.mark.multi_gpu
@pytest.mark.graph
def test_dense_graphs_on_two_devices_in_sequence(name):
    problem = DENSE_PATHS[name]
    runs = [(index, *_graph_vs_eager(f"cuda:{index}", problem)) for index in (0, 1, 0)]
    assert runs[0][2][0].shape == runs[1][2][0].shape
    for a, b in zip(runs[0][2], runs[2][2], strict=True):  # device 0 again: same bits
        assert torch.equal(_bits(a), _bits(b))
    props = [torch.cuda.get_device_properties(i) for i in (0, 1)]
    if (props[0].name, props[0].multi_processor_count) == (
        props[1].name,
        props[1].multi_processor_count,
    ):  # identical parts plan identically: the same bits on both
        assert runs[0][1] == runs[1][1]
        for a, b in zip(runs[0][2], runs[1][2], strict=True):
            assert torch.equal(_bits(a), _bits(b))


@pytest.mark.gpu
@pytest.mark.multi_gpu
def test_dense_eager_on_device_1_while_device_0_is_current():
    from b12x.ops.dense.plan import allocate_dense_buffers, bind_dense, plan_dense, run_dense

    problem = DENSE_PATHS["generic_split_k"]
    dev = torch.device("cuda:1")
    torch.cuda.set_device(0)
    plan = plan_dense(
        m=problem["m"],
        k=problem["k"],
        n=problem["n"],
        bits=problem["bits"],
        codebook=problem["codebook"],
        x_dtype=torch.float16,
        split_k=problem["split_k"],
        device=dev,
    )
    bound = bind_dense(plan, **allocate_dense_buffers(plan, dev))
    inputs = _inputs(problem, 3, dev)
    bound.buffers["output"].fill_(float("nan"))
    run_dense(bound, **inputs)  # current device is 0; every tensor lives on 1
    torch.cuda.synchronize(dev)
    got = bound.buffers["output"].clone()
    with torch.cuda.device(dev):
        bound.buffers["output"].fill_(float("nan"))
        run_dense(bound, **inputs)
        torch.cuda.synchronize(dev)
    assert torch.cuda.current_device() == 0
    assert torch.isfinite(got.float()).all()
    assert torch.equal(_bits(got), _bits(bound.buffers["output"]))


@pytest.mark.gpu
@pytest.mark.multi_gpu
@pytest.mark.graph
def test_oracle_graph_protocol_on_device_1():
    """Every graph target captured and replayed on the second GPU (the buffers live there)."""
    from oracle.run.runners.graph import graph_targets, run_targets

    with torch.cuda.device(1):
        results = run_targets(torch.device("cuda", 1))
    assert len(results) == len(graph_targets())
    failed = [(r.name, r.reason) for r in results if r.status != "pass"]
    assert not failed, failed


@pytest.mark.gpu
@pytest.mark.multi_gpu
def test_compiles_are_shared_by_identical_devices_only(monkeypatch):
    import cutlass.cute as cute

    from b12x.launch.host import device_arch

    calls: list[str] = []
    real = cute.compile

    def counting(*args, **kwargs):
        calls.append(kwargs.get("options", ""))
        return real(*args, **kwargs)

    monkeypatch.setattr(cute, "compile", counting)
    problem = {"m": 33, "k": 384, "n": 256, "codebook": "mul1", "bits": 5, "split_k": 3}
    _graph_vs_eager("cuda:0", problem)
    first = len(calls)
    _graph_vs_eager("cuda:1", problem)
    arch0, arch1 = (device_arch(torch.device("cuda", i)) for i in (0, 1))
    if arch0 == arch1:
        assert len(calls) == first, calls[first:]  # the second device reuses every kernel
    else:
        assert len(calls) > first and all(arch1 in options for options in calls[first:])
