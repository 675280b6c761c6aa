"""The graph-protocol runner's bookkeeping, on CPU with the simulated backend and fake ops.

A correct fake op (``y = x @ w`` through a scratch buffer, a persistent lock workspace, a freeze
switch and a compile probe) passes every step. Each broken op is caught at the right step with the
right reason: allocation in run, an unwritten output row (poison shows through), a buffer the
consumer does not provide, non-determinism, a silently allocated missing buffer, a compile under
capture that does not raise.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from oracle.run.graph_protocol import (
    POISONS,
    ComposedOp,
    ConsumerFixture,
    GraphProtocol,
    SimulatedBackend,
)

M, K, N = 4, 8, 16


class GoodOp:
    name = "fake_linear"

    def __init__(self, backend):
        self.backend = backend
        self.frozen = False
        self.w = torch.arange(K * N, dtype=torch.float32).reshape(K, N) / 64

    def plan(self, problem):
        return {"m": problem["m"]}

    def bind(self, plan, buffers):
        return {"y": buffers["y"], "tmp": buffers["tmp"], "lock": buffers["lock"]}

    def run(self, bound, inputs):
        torch.matmul(inputs["x"], self.w, out=bound["tmp"])
        bound["y"].copy_(bound["tmp"])
        bound["lock"].zero_()

    def freeze(self):
        self.frozen = True

    def unfreeze(self):
        self.frozen = False

    def compile_unwarmed(self, plan):
        if self.frozen:
            raise RuntimeError("compile of fake_linear[m=999] while frozen")


class AllocatingOp(GoodOp):
    def run(self, bound, inputs):
        bound["y"].copy_(inputs["x"] @ self.w)  # x @ w allocates a temporary


class UnwrittenRowOp(GoodOp):
    def run(self, bound, inputs):
        torch.matmul(inputs["x"], self.w, out=bound["tmp"])
        bound["y"][:-1].copy_(bound["tmp"][:-1])  # the tail row is never written


class GreedyOp(GoodOp):
    def bind(self, plan, buffers):
        return {**super().bind(plan, buffers), "c_tmp": buffers["c_tmp"]}


class NondeterministicOp(GoodOp):
    calls = itertools.count()

    def run(self, bound, inputs):
        super().run(bound, inputs)
        bound["y"][0, 0].add_(float(next(self.calls) % 2))


class SelfProvisioningOp(GoodOp):
    """Allocates `tmp` itself when missing, even under capture (the R4 regression)."""

    def bind(self, plan, buffers):
        tmp = buffers["tmp"] if "tmp" in buffers else torch.empty(M, N)
        return {"y": buffers["y"], "tmp": tmp, "lock": buffers["lock"]}


class CompilesInCaptureOp(GoodOp):
    def compile_unwarmed(self, plan):
        return "compiled"


def fixture(seed=0):
    gen = torch.Generator().manual_seed(seed)
    sets = [{"x": torch.randn(M, K, generator=gen)} for _ in range(2)]
    return ConsumerFixture(
        buffers={
            "y": torch.zeros(M, N),
            "tmp": torch.zeros(M, N),
            "lock": torch.zeros(4, dtype=torch.int32),
        },
        inputs={"x": torch.zeros(M, K)},
        input_sets=sets,
        outputs=("y",),
        scratch=("tmp",),
    )


def run_protocol(op_cls, backend=None):
    backend = backend or SimulatedBackend()
    return GraphProtocol(op_cls(backend), {"m": M}, fixture(), backend).run()


def test_correct_op_passes_every_step_in_order():
    verdict = run_protocol(GoodOp)
    assert verdict.passed, verdict.reasons
    assert [s.name for s in verdict.steps] == [
        "plan",
        "bind",
        "warmup",
        "freeze",
        "capture",
        "replay.0",
        "replay.1",
        "replay.2",
        "replay.3",
        "addresses",
        "misuse.missing_buffer",
        "misuse.compile_in_capture",
    ]
    assert verdict.metrics["buffers_read"] == ["y", "tmp", "lock"]
    assert "probed ['y', 'tmp', 'lock']" in verdict.step("misuse.missing_buffer").detail


def test_every_output_and_scratch_is_poisoned_with_both_patterns_each_set():
    class Recording(SimulatedBackend):
        def __init__(self):
            super().__init__()
            self.poisoned = []
            self.loaded = []

        def poison(self, t, pattern):
            self.poisoned.append((t.data_ptr(), pattern))
            super().poison(t, pattern)

    backend = Recording()
    fx = fixture()
    GraphProtocol(GoodOp(backend), {"m": M}, fx, backend).run()
    ptr = {n: t.data_ptr() for n, t in fx.buffers.items()}
    expected = [(ptr[b], p) for p in POISONS for _ in range(2) for b in ("y", "tmp")]
    assert backend.poisoned == expected  # lock (persistent) is never poisoned


def test_allocation_in_run_is_caught_during_capture_and_replay():
    verdict = run_protocol(AllocatingOp)
    assert not verdict.passed
    assert "allocator activity during capture" in verdict.step("capture").detail
    assert "allocator activity during replay" in verdict.step("replay.0").detail


def test_unwritten_output_shows_the_poison():
    verdict = run_protocol(UnwrittenRowOp)
    detail = verdict.step("replay.0").detail
    assert f"output `y` differs from eager (input set 0, poison nan): {N} of {M * N}" in detail
    assert f"{N} elements still hold the nan poison (unwritten)" in detail
    assert "poison 0xff" in verdict.step("replay.2").detail


def test_buffer_not_provided_fails_bind_naming_it():
    verdict = run_protocol(GreedyOp)
    bind = verdict.step("bind")
    assert bind.status == "fail" and "buffer `c_tmp` is not provided" in bind.detail
    assert verdict.step("capture").status == "skip"


def test_nondeterminism_is_caught_at_warmup():
    verdict = run_protocol(NondeterministicOp)
    assert "not deterministic" in verdict.step("warmup").detail


def test_silent_self_provisioning_of_a_missing_buffer_is_caught():
    verdict = run_protocol(SelfProvisioningOp)
    detail = verdict.step("misuse.missing_buffer").detail
    assert verdict.step("misuse.missing_buffer").status == "fail"
    assert "removing `tmp` raised nothing under capture" in detail
    assert "`y`" not in detail  # y and lock removals raise errors naming them


def test_compile_under_capture_must_raise():
    verdict = run_protocol(CompilesInCaptureOp)
    assert (
        verdict.step("misuse.compile_in_capture").detail == "a compile under capture did not raise"
    )
    no_probe = type("NoProbe", (GoodOp,), {"compile_unwarmed": None})
    assert run_protocol(no_probe).step("misuse.compile_in_capture").status == "skip"


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="outputs names unknown buffers"):
        ConsumerFixture({"y": torch.zeros(1)}, {}, [{}], outputs=("z",))
    with pytest.raises(ValueError, match=r"input_sets\[0\]"):
        ConsumerFixture({"y": torch.zeros(1)}, {"x": torch.zeros(1)}, [{}], outputs=("y",))
    with pytest.raises(TypeError, match="`plan`"):
        GraphProtocol(object(), {}, fixture(), SimulatedBackend())
    with pytest.raises(ValueError, match="replays"):
        GraphProtocol(GoodOp(None), {}, fixture(), SimulatedBackend(), replays=1)


def test_poison_patterns_are_bitwise():
    backend = SimulatedBackend()
    t16, ti = torch.zeros(3, dtype=torch.float16), torch.zeros(3, dtype=torch.int32)
    backend.poison(t16, "0xff")
    assert t16.view(torch.uint8).tolist() == [0xFF] * 6
    backend.poison(ti, "nan")
    assert ti.tolist() == [-1, -1, -1]
    assert backend.poison_count(ti, "nan") == 3
    with pytest.raises(ValueError, match="pattern"):
        backend.poison(ti, "zeros")


def test_reference_step_checks_eager_against_an_independent_product():
    w = GoodOp(None).w

    def reference(input_set):  # float64 product, rounded once: independent of the op's kernel
        return {"y": (input_set["x"].double() @ w.double()).float()}

    def close(got, want):
        err = float((got - want).abs().max())
        return err < 1e-5, f"max abs error {err:.3g}"

    backend = SimulatedBackend()
    ok = GraphProtocol(
        GoodOp(backend), {"m": M}, fixture(), backend, reference=reference, judge=close
    )
    assert ok.run().step("reference").status == "pass"

    def wrong(input_set):
        return {"y": reference(input_set)["y"] + 1}

    bad = GraphProtocol(GoodOp(backend), {"m": M}, fixture(), backend, reference=wrong, judge=close)
    assert "`y` (input set 0) vs reference: max abs error 1" in bad.run().step("reference").detail


class ReluStage(GoodOp):
    """Second stage of a composed step: reads the first stage's output buffer `y`."""

    def bind(self, plan, buffers):
        return {"y": buffers["y"], "z": buffers["z"]}

    def run(self, bound, inputs):
        torch.clamp(bound["y"], min=0, out=bound["z"])


def test_full_capture_of_a_composed_step():
    backend = SimulatedBackend()
    base = fixture()
    fx = ConsumerFixture(
        buffers={**base.buffers, "z": torch.zeros(M, N)},
        inputs=base.inputs,
        input_sets=base.input_sets,
        outputs=("z",),
        scratch=("tmp", "y"),
    )
    step = ComposedOp("linear_relu", [GoodOp(backend), ReluStage(backend)])
    verdict = GraphProtocol(step, [{"m": M}, {"m": M}], fx, backend).run()
    assert verdict.passed, verdict.reasons
    assert verdict.metrics["buffers_read"] == ["y", "tmp", "lock", "z"]
    broken = ComposedOp("linear_relu", [UnwrittenRowOp(backend), ReluStage(backend)])
    detail = GraphProtocol(broken, [{"m": M}, {"m": M}], fx, backend).run().step("replay.0").detail
    assert "output `z` differs from eager" in detail  # poisoned y row flows through relu


class CudaElementwiseOp:
    """A capture-safe op on CUDA: elementwise kernels with ``out=`` only (no library workspace)."""

    name = "cuda_elementwise"

    def __init__(self, allocate: bool = False):
        self.allocate = allocate

    def plan(self, problem):
        return problem

    def bind(self, plan, buffers):
        return {"y": buffers["y"], "tmp": buffers["tmp"]}

    def run(self, bound, inputs):
        if self.allocate:
            bound["y"].copy_(inputs["x"] * 3 + 1)
            return
        torch.mul(inputs["x"], 3, out=bound["tmp"])
        torch.add(bound["tmp"], 1, out=bound["y"])

    def freeze(self):
        return None


def cuda_fixture():
    gen = torch.Generator().manual_seed(1)
    sets = [{"x": torch.randn(M, N, generator=gen).cuda()} for _ in range(2)]
    return ConsumerFixture(
        buffers={"y": torch.zeros(M, N, device="cuda"), "tmp": torch.zeros(M, N, device="cuda")},
        inputs={"x": torch.zeros(M, N, device="cuda")},
        input_sets=sets,
        outputs=("y",),
        scratch=("tmp",),
    )


@pytest.mark.gpu
@pytest.mark.graph
def test_cuda_backend_passes_a_capture_safe_op_and_catches_allocation():
    from oracle.run.graph_protocol import CudaBackend

    good = GraphProtocol(CudaElementwiseOp(), {}, cuda_fixture(), CudaBackend()).run()
    assert good.passed, good.reasons
    bad = GraphProtocol(CudaElementwiseOp(allocate=True), {}, cuda_fixture(), CudaBackend()).run()
    assert "allocator activity during capture" in bad.step("capture").detail


# --- a failed capture must not leak into what runs next (GPU tests' order independence) --------


class _FakeCuda:
    """Just enough of ``torch.cuda`` for :func:`capture_graph`'s bookkeeping on CPU: the first
    capture's exit raises as an invalidated ``cudaStreamEndCapture`` does; it records captures
    and the current stream."""

    def __init__(self) -> None:
        self.stream, self.captures, self.fail_next_exit = "main", [], True

    def current_stream(self):
        return self.stream

    def set_stream(self, stream):
        self.stream = stream

    def synchronize(self):
        pass

    def CUDAGraph(self):  # noqa: N802 - mirrors torch.cuda.CUDAGraph
        return object()

    def graph(self, graph, stream=None):
        fake = self

        class _Capture:
            def __enter__(self):
                fake.captures.append(graph)
                fake.stream = "capture-side-stream"

            def __exit__(self, *exc):
                if fake.fail_next_exit:
                    fake.fail_next_exit = False
                    raise RuntimeError("operation failed due to a previous error during capture")
                fake.stream = "main"  # a successful exit restores the stream and the RNG flag
                return False

        return _Capture()


def test_failed_capture_is_undone_before_it_raises(monkeypatch):
    from oracle.run import graph_protocol

    fake = _FakeCuda()
    for name in ("current_stream", "set_stream", "synchronize", "CUDAGraph", "graph"):
        monkeypatch.setattr(graph_protocol.torch.cuda, name, getattr(fake, name))
    with pytest.raises(RuntimeError, match="previous error during capture"):
        graph_protocol.capture_graph(lambda: None)
    # the caller's stream is current again, and one more (empty) capture ran to completion: its
    # epilogue is what clears torch's per-generator capture flag
    assert fake.stream == "main"
    assert len(fake.captures) == 2 and not fake.fail_next_exit


def test_capture_runs_with_the_garbage_collector_paused(monkeypatch):
    """The captured function runs with the cyclic collector off (a collection inside a capture
    can finalise an old CUDA graph, whose reset invalidates the capture), and the collector's
    state comes back after a capture that succeeds, one that fails, and when it was off."""
    import gc

    from oracle.run import graph_protocol

    fake = _FakeCuda()
    fake.fail_next_exit = False
    for name in ("current_stream", "set_stream", "synchronize", "CUDAGraph", "graph"):
        monkeypatch.setattr(graph_protocol.torch.cuda, name, getattr(fake, name))
    seen = []
    was = gc.isenabled()
    try:
        gc.enable()
        graph_protocol.capture_graph(lambda: seen.append(gc.isenabled()))
        assert seen == [False] and gc.isenabled()
        fake.fail_next_exit = True
        with pytest.raises(RuntimeError, match="previous error during capture"):
            graph_protocol.capture_graph(lambda: seen.append(gc.isenabled()))
        assert seen == [False, False] and gc.isenabled()
        gc.disable()
        graph_protocol.capture_graph(lambda: seen.append(gc.isenabled()))
        assert seen == [False] * 3 and not gc.isenabled()
    finally:
        gc.enable() if was else gc.disable()


@pytest.mark.gpu
@pytest.mark.graph
def test_failed_capture_leaves_no_rng_or_stream_state_behind():
    """On the device: a capture invalidated by a synchronize inside it fails; afterwards eager
    draws from the default CUDA generator still work (before the fix they raised "Offset
    increment outside graph capture encountered unexpectedly"), and the stream is the caller's.
    The first half shows, in a separate process, that a raw ``torch.cuda.graph`` failure does
    poison the generator, so this test can fail."""
    import subprocess
    import sys

    from oracle.run.graph_protocol import CudaBackend, capture_graph

    raw = (
        "import torch\n"
        "g = torch.cuda.CUDAGraph()\n"
        "try:\n"
        "    with torch.cuda.graph(g):\n"
        "        torch.cuda.synchronize()\n"
        "except RuntimeError:\n"
        "    pass\n"
        "torch.cuda.set_stream(torch.cuda.default_stream())\n"
        "torch.randint(0, 10, (4,), device='cuda')\n"
    )
    poisoned = subprocess.run([sys.executable, "-c", raw], capture_output=True, text=True)
    assert poisoned.returncode != 0 and "Offset increment outside graph capture" in (
        poisoned.stderr
    ), poisoned.stderr[-2000:]

    stream = torch.cuda.current_stream()
    with pytest.raises(RuntimeError):
        capture_graph(torch.cuda.synchronize)  # illegal while capturing: the capture fails
    assert torch.cuda.current_stream() == stream
    torch.randint(0, 10, (4,), device="cuda")
    assert CudaBackend().capture_probe(torch.cuda.synchronize) is not None
    torch.randint(0, 10, (4,), device="cuda")
    torch.cuda.synchronize()


def test_the_shared_decode_targets_capture_the_wgmma_mainloops_on_an_h200():
    """FULL / PIECEWISE capture must cover the sm_90 tensor-core mainloops: on an H200 the
    ``*.shared_decode`` graph targets plan them (the dense op through the device it runs on,
    the MoE op planned with its device, as a serving engine does)."""
    from b12x.ops.dense.plan import plan_dense
    from b12x.ops.moe.plan import plan_moe
    from oracle.judge.tiles import SimulatedDevice
    from oracle.run.runners import dense, graph, moe
    from oracle.run.runners import inputs as case_inputs

    h200 = SimulatedDevice("H200", 132, 232448, (9, 0))
    targets = {t.name: t for t in graph.TARGETS}
    d = targets["dense.shared_decode"].case(1)
    assert plan_dense(**dense.dense_problem(d), device=h200).geometry.wgmma
    target = targets["moe.shared_decode"]
    assert target.on_device
    c = target.case(1)
    plan = plan_moe(**moe.moe_problem(c, None, case_inputs.moe_choices(c), device=h200))
    assert plan.kernel_specs and all(s.wgmma for s in plan.kernel_specs)
