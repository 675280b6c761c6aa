"""The CUDA-graph protocol runner (docs/moe_graph_capture.md; regression classes R4, R5, R8, R15).

The op protocol: any op with ``plan(problem)`` (host side; may allocate), ``bind(plan, buffers)``
(only views of the caller's named buffers; a missing name raises naming it), ``run(bound,
inputs)`` (writes the bound outputs; never allocates; capture-safe), ``freeze()`` (later compiles
are errors; may return a context manager, else ``unfreeze()`` is called at the end) and optional
``compile_unwarmed(plan)`` (must raise under capture, R5; without it that check is a "skip").

:class:`ConsumerFixture` holds EXACTLY the buffers the consumer provisions, by name and role
(``outputs`` compared bitwise with eager and poisoned before each replay, ``scratch`` poisoned,
anything else persistent), and the captured ``inputs`` and ``input_sets`` (copied in place before
each eager run and replay).

Steps (each a :class:`Step`, pass / fail / skip): ``plan`` → ``bind`` → ``warmup`` (side stream;
set 0 twice, bitwise equal: determinism) → ``reference`` (when given) → ``freeze`` → ``capture``
(no allocator activity) → ``replay.<i>`` (input set ``i mod S`` copied in, outputs and scratch
poisoned, replayed, bitwise equal to eager, no allocation) → ``addresses`` (unchanged) →
``misuse.missing_buffer`` (each buffer removed in turn must raise naming it) →
``misuse.compile_in_capture``. A step after a failure is "skip" with that reason;
:class:`GraphVerdict` passes iff no step failed.

Backends: :class:`SimulatedBackend` (CPU: the bookkeeping testable without a GPU) and
:class:`CudaBackend` (torch.cuda graphs, side stream, memory-stat counters). With ``reference=``
and ``judge=`` the eager outputs of every input set are checked; :class:`ComposedOp` chains ops
into one captured step (FULL; PIECEWISE is the runner per stage). In full: docs/notes/oracle.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import math
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = [
    "POISONS",
    "capture_graph",
    "collector_paused",
    "restore_after_failed_capture",
    "ConsumerFixture",
    "ComposedOp",
    "CudaBackend",
    "GraphProtocol",
    "GraphVerdict",
    "MissingBufferError",
    "SimulatedBackend",
    "Step",
]

POISONS = ("nan", "0xff")
_INT_OF_SIZE = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


class MissingBufferError(KeyError):
    """An op asked the consumer fixture for a buffer it does not provide."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else "missing buffer"


@dataclasses.dataclass(frozen=True)
class ConsumerFixture:
    """Exactly what the consumer provisions (module docstring)."""

    buffers: Mapping[str, torch.Tensor]
    inputs: Mapping[str, torch.Tensor]
    input_sets: Sequence[Mapping[str, torch.Tensor]]
    outputs: tuple[str, ...]
    scratch: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for arg in ("buffers", "inputs"):
            value = getattr(self, arg)
            if not isinstance(value, Mapping):
                raise TypeError(f"ConsumerFixture: {arg} must be a mapping of named tensors")
            for name, t in value.items():
                if not isinstance(t, torch.Tensor):
                    raise TypeError(f"ConsumerFixture: {arg}[{name!r}] is not a torch.Tensor")
        if not self.outputs:
            raise ValueError("ConsumerFixture: outputs must name at least one buffer")
        for role in ("outputs", "scratch"):
            unknown = [n for n in getattr(self, role) if n not in self.buffers]
            if unknown:
                raise ValueError(f"ConsumerFixture: {role} names unknown buffers {unknown}")
        if set(self.outputs) & set(self.scratch):
            raise ValueError("ConsumerFixture: a buffer cannot be both an output and scratch")
        if not self.input_sets:
            raise ValueError("ConsumerFixture: input_sets needs at least one set")
        for i, s in enumerate(self.input_sets):
            if set(s) != set(self.inputs):
                raise ValueError(
                    f"ConsumerFixture: input_sets[{i}] has names {sorted(s)}, "
                    f"inputs has {sorted(self.inputs)}"
                )
            for name, t in s.items():
                if tuple(t.shape) != tuple(self.inputs[name].shape):
                    raise ValueError(f"ConsumerFixture: input_sets[{i}][{name!r}] shape differs")

    @property
    def poisoned(self) -> tuple[str, ...]:
        return (*self.outputs, *self.scratch)


class _TrackedBuffers(Mapping[str, torch.Tensor]):
    """The mapping handed to ``bind``: records which names the op read."""

    def __init__(self, buffers: Mapping[str, torch.Tensor]):
        self._buffers = dict(buffers)
        self.read: list[str] = []

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self.read:
            self.read.append(name)
        if name not in self._buffers:
            raise MissingBufferError(
                f"buffer `{name}` is not provided by the consumer fixture "
                f"(it provides {sorted(self._buffers)})"
            )
        return self._buffers[name]

    def __contains__(self, name: object) -> bool:
        if isinstance(name, str) and name not in self.read:
            self.read.append(name)
        return name in self._buffers

    def __iter__(self) -> Iterator[str]:
        return iter(self._buffers)

    def __len__(self) -> int:
        return len(self._buffers)


@dataclasses.dataclass(frozen=True)
class Step:
    name: str
    status: str  # "pass" | "fail" | "skip"
    detail: str = ""


@dataclasses.dataclass(frozen=True)
class GraphVerdict:
    op: str
    steps: tuple[Step, ...]
    metrics: Mapping[str, Any]

    @property
    def passed(self) -> bool:
        return all(s.status != "fail" for s in self.steps)

    @property
    def reasons(self) -> tuple[str, ...]:
        return tuple(f"{s.name}: {s.detail}" for s in self.steps if s.status == "fail")

    def step(self, name: str) -> Step:
        for s in self.steps:
            if s.name == name:
                return s
        raise KeyError(f"no step named {name!r}; steps: {[s.name for s in self.steps]}")


# --- backends ----------------------------------------------------------------------------------


class _TorchTensorOps:
    """Poisoning and bitwise comparison, shared by both backends."""

    @staticmethod
    def _bits(t: torch.Tensor) -> torch.Tensor:
        return t.view(_INT_OF_SIZE[t.element_size()])

    def poison(self, t: torch.Tensor, pattern: str) -> None:
        if pattern == "nan" and t.is_floating_point():
            t.fill_(math.nan)
        elif pattern in POISONS:
            self._bits(t).fill_(-1)  # every byte 0xFF (an int buffer gets this for "nan" too)
        else:
            raise ValueError(f"poison: pattern must be one of {POISONS}, got {pattern!r}")

    def poison_count(self, t: torch.Tensor, pattern: str) -> int:
        if pattern == "nan" and t.is_floating_point():
            return int(torch.isnan(t).sum())
        return int((self._bits(t) == -1).sum())

    def snapshot(self, t: torch.Tensor) -> torch.Tensor:
        return t.detach().clone()

    def copy_into(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        dst.copy_(src)

    def mismatches(self, a: torch.Tensor, b: torch.Tensor) -> int:
        if a.shape != b.shape or a.dtype != b.dtype:
            return max(a.numel(), b.numel())
        return int((self._bits(a) != self._bits(b).to(a.device)).sum())

    def address(self, t: torch.Tensor) -> int:
        return t.data_ptr()


class _AllocationCounter:
    """Counts aten ops that return a fresh (non-aliasing) tensor while active."""

    def __init__(self) -> None:
        self.count = 0
        self.ops: list[str] = []

    def mode(self) -> Any:
        counter = self

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                for ret in func._schema.returns:
                    if "Tensor" in str(ret.type) and ret.alias_info is None:
                        counter.count += 1
                        counter.ops.append(str(func))
                        break
                return out

        return _Mode()


class SimulatedBackend(_TorchTensorOps):
    """CPU stand-in for CUDA graphs (module docstring). Ops may read ``capturing``."""

    def __init__(self) -> None:
        self.capturing = False
        self.replaying = False
        self._alloc = _AllocationCounter()

    @contextlib.contextmanager
    def side_stream(self) -> Iterator[None]:
        yield

    def synchronize(self) -> None:
        pass

    def _counted(self, fn: Callable[[], Any]) -> Any:
        with self._alloc.mode():
            return fn()

    def capture(self, fn: Callable[[], Any]) -> Callable[[], Any]:
        self.capturing = True
        try:
            self._counted(fn)
        finally:
            self.capturing = False
        return fn

    def capture_probe(self, fn: Callable[[], Any]) -> BaseException | None:
        self.capturing = True
        try:
            self._counted(fn)
        except Exception as exc:  # noqa: BLE001 - the probe's point is to return it
            return exc
        finally:
            self.capturing = False
        return None

    def replay(self, graph: Callable[[], Any]) -> None:
        self.replaying = True
        try:
            self._counted(graph)
        finally:
            self.replaying = False

    def allocator_counters(self) -> dict[str, int]:
        return {"allocations": self._alloc.count}

    def allocation_log(self) -> list[str]:
        return list(self._alloc.ops)


class CudaBackend(_TorchTensorOps):
    """Real CUDA graphs on the current device (GPU tier)."""

    COUNTERS = ("allocation.all.allocated", "segment.all.allocated", "num_alloc_retries")

    def __init__(self) -> None:
        if not torch.cuda.is_available():
            raise RuntimeError("CudaBackend: no CUDA device is available")
        self._sentinel_graph: Any = None
        self._stream = torch.cuda.Stream()  # warm-up AND capture run here (capture_graph)

    @contextlib.contextmanager
    def side_stream(self) -> Iterator[None]:
        main = torch.cuda.current_stream()
        side = self._stream
        side.wait_stream(main)
        with torch.cuda.stream(side):
            yield
        main.wait_stream(side)
        torch.cuda.synchronize()

    def synchronize(self) -> None:
        torch.cuda.synchronize()

    def capture(self, fn: Callable[[], Any]) -> Any:
        return capture_graph(fn, capture_stream=self._stream)

    def capture_probe(self, fn: Callable[[], Any]) -> BaseException | None:
        raised: list[BaseException] = []

        def guarded() -> None:
            try:
                fn()
            except Exception as exc:  # noqa: BLE001 - swallowed so the capture ends cleanly
                raised.append(exc)

        try:
            graph = capture_graph(guarded, capture_stream=self._stream)
        except Exception as exc:  # noqa: BLE001 - capture invalidated by the misuse itself
            if not raised:
                raised.append(exc)
        else:
            del graph
        return raised[0] if raised else None

    def replay(self, graph: Any) -> None:
        graph.replay()
        torch.cuda.synchronize()

    def allocator_counters(self) -> dict[str, int]:
        self._hold_sentinel_graph()
        stats = torch.cuda.memory_stats()
        return {k: int(stats.get(k, 0)) for k in self.COUNTERS}

    def _hold_sentinel_graph(self) -> None:
        """Keep one empty captured graph alive for the backend's lifetime.

        torch allocates per-generator graph RNG state (two small tensors in a fresh private-pool
        segment) when the first *live* graph registers with the default generator, and frees it
        when the last one dies. That is torch's bookkeeping, not the op's: with a sentinel graph
        held from before the first counter reading, any allocation seen around a capture or a
        replay belongs to the op under test (measured on the H200: exactly
        ``{'allocation.all.allocated': 2, 'segment.all.allocated': 1}`` for an op that allocates
        nothing, without the sentinel)."""
        if self._sentinel_graph is None:
            graph = torch.cuda.CUDAGraph()
            with warnings.catch_warnings():  # torch warns the graph is empty: it is meant to be
                warnings.filterwarnings("ignore", message="The CUDA Graph is empty")
                with torch.cuda.graph(graph):
                    pass
            torch.cuda.synchronize()
            self._sentinel_graph = graph


def capture_graph(fn: Callable[[], Any], *, capture_stream: Any = None) -> Any:
    """Capture ``fn`` into a new ``torch.cuda.CUDAGraph`` on the current device and return it;
    ``capture_stream`` (default: torch's capture stream) is the stream it is captured on — pass
    the stream warm-up ran on, as a serving engine does, so per-stream library state (cuBLAS
    workspaces) exists before the capture and the capture allocates nothing.

    A capture that fails leaves torch in a state that outlives it, which made GPU tests depend on
    what ran before them (torch's "Offset increment outside graph capture encountered
    unexpectedly" from a later eager ``torch.randint``). Every capture registers the default CUDA
    generator: ``capture_begin`` sets its ``capturing_`` flag and only ``capture_end``'s epilogue
    clears it; when ``cudaStreamEndCapture`` fails (a capture the op invalidated), ``capture_end``
    raises before that epilogue, and ``torch.cuda.graph.__exit__`` also skips restoring the
    stream it switched to. The flag then stays set, and every later eager draw from the default
    generator, or replay of a graph that draws, raises. On any failure this function therefore
    restores the caller's current stream and runs one empty capture (whose epilogue clears the
    flag) before re-raising, so a failed capture, expected or not, cannot leak into what runs
    next.

    The cyclic garbage collector is paused for the capture (:func:`collector_paused`)."""
    stream = torch.cuda.current_stream()
    graph = torch.cuda.CUDAGraph()
    try:
        with collector_paused(), torch.cuda.graph(graph, stream=capture_stream):
            fn()
        torch.cuda.synchronize()
    except BaseException:
        restore_after_failed_capture(stream)
        raise
    return graph


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Keep the cyclic garbage collector off until the block ends (garbage found later waits for
    the next collection after it; no full collection is forced here, as torch's own capture no
    longer forces one: it is expensive with many objects alive).

    A collection that runs while a stream captures may finalise a ``torch.cuda.CUDAGraph`` an
    earlier capture left in a reference cycle; its destructor resets the graph, which is an
    operation not permitted while a stream is capturing, and the capture in progress is then
    invalidated ("operation failed due to a previous error during capture" at its end), an
    error that depends on when the collector happened to run (seen once in a GPU test run on
    the H200, with CUDAGraph reset warnings in the test's stderr). The collector's previous
    state is restored on every exit."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def restore_after_failed_capture(stream: Any) -> None:
    """Undo what a failed capture leaves behind (see :func:`capture_graph`): make ``stream``
    current again and clear the default generator's capture flag with one empty capture."""
    torch.cuda.set_stream(stream)
    healing = torch.cuda.CUDAGraph()
    with warnings.catch_warnings():  # the healing graph is empty on purpose
        warnings.filterwarnings("ignore", message="The CUDA Graph is empty")
        with torch.cuda.graph(healing):
            pass
    torch.cuda.synchronize()


# --- composing ops: FULL (one capture of the whole step) vs PIECEWISE (one per op) -------------


class ComposedOp:
    """Several plan/bind/run ops as one step, for a FULL capture (module docstring).

    ``plan(problems)`` takes one problem per stage; every stage binds from the SAME consumer
    buffers (a later stage reads an earlier stage's output buffer by name in its ``bind``);
    ``run`` runs the stages in order; ``freeze`` freezes every stage; ``compile_unwarmed`` is the
    first stage's probe. For PIECEWISE, run :class:`GraphProtocol` on each stage on its own."""

    def __init__(self, name: str, stages: Sequence[Any]):
        if not stages:
            raise ValueError("ComposedOp: stages must name at least one op")
        for i, op in enumerate(stages):
            for attr in ("plan", "bind", "run", "freeze"):
                if not callable(getattr(op, attr, None)):
                    raise TypeError(f"ComposedOp: stages[{i}] has no callable `{attr}`")
        self.name, self.stages = name, tuple(stages)
        probes = [getattr(op, "compile_unwarmed", None) for op in self.stages]
        probes = [p for p in probes if callable(p)]
        if probes:
            self._probe = probes[0]
            self.compile_unwarmed = self._compile_unwarmed

    def plan(self, problems: Sequence[Any]) -> list[Any]:
        if len(problems) != len(self.stages):
            raise ValueError(f"ComposedOp {self.name}: {len(self.stages)} problems expected")
        return [op.plan(p) for op, p in zip(self.stages, problems, strict=True)]

    def bind(self, plans: Sequence[Any], buffers: Mapping[str, torch.Tensor]) -> list[Any]:
        return [op.bind(p, buffers) for op, p in zip(self.stages, plans, strict=True)]

    def run(self, bound: Sequence[Any], inputs: Mapping[str, torch.Tensor]) -> None:
        for op, b in zip(self.stages, bound, strict=True):
            op.run(b, inputs)

    @contextlib.contextmanager
    def freeze(self) -> Iterator[None]:
        with contextlib.ExitStack() as stack:
            for op in self.stages:
                handle = op.freeze()
                if hasattr(handle, "__enter__"):
                    stack.enter_context(handle)
                elif callable(getattr(op, "unfreeze", None)):
                    stack.callback(op.unfreeze)
            yield

    def _compile_unwarmed(self, plans: Sequence[Any]) -> Any:
        index = next(i for i, op in enumerate(self.stages) if getattr(op, "compile_unwarmed", None))
        return self._probe(plans[index])


# --- the runner ----------------------------------------------------------------------------


def _counter_delta(before: Mapping[str, int], after: Mapping[str, int]) -> dict[str, int]:
    return {
        k: after.get(k, 0) - before.get(k, 0) for k in after if after.get(k, 0) != before.get(k, 0)
    }


class GraphProtocol:
    """Run the CUDA-graph protocol for one op, problem and consumer fixture."""

    def __init__(
        self,
        op: Any,
        problem: Any,
        fixture: ConsumerFixture,
        backend: Any,
        *,
        replays: int | None = None,
        warmup: int = 2,
        reference: Callable[[Mapping[str, torch.Tensor]], Mapping[str, torch.Tensor]] | None = None,
        judge: Callable[[torch.Tensor, torch.Tensor], tuple[bool, str]] | None = None,
    ) -> None:
        if reference is not None and not callable(reference):
            raise TypeError("GraphProtocol: reference must be callable or None")
        if judge is not None and not callable(judge):
            raise TypeError("GraphProtocol: judge must be callable or None")
        for attr in ("plan", "bind", "run", "freeze"):
            if not callable(getattr(op, attr, None)):
                raise TypeError(f"GraphProtocol: op has no callable `{attr}` (see module docs)")
        if not isinstance(fixture, ConsumerFixture):
            raise TypeError("GraphProtocol: fixture must be a ConsumerFixture")
        n_sets = len(fixture.input_sets)
        replays = 2 * n_sets if replays is None else replays
        if isinstance(replays, bool) or not isinstance(replays, int) or replays < 2:
            raise ValueError(f"GraphProtocol: replays must be an int >= 2, got {replays!r}")
        if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 1:
            raise ValueError(f"GraphProtocol: warmup must be an int >= 1, got {warmup!r}")
        self.op, self.problem, self.fixture, self.backend = op, problem, fixture, backend
        self.replays, self.warmup = replays, warmup
        self.reference, self.judge = reference, judge
        self.name = str(getattr(op, "name", type(op).__name__))

    # Each helper appends Steps and returns what later steps need (None when it failed).

    def _load_set(self, index: int) -> None:
        for name, src in self.fixture.input_sets[index].items():
            self.backend.copy_into(self.fixture.inputs[name], src)

    def _outputs(self) -> dict[str, torch.Tensor]:
        return {n: self.backend.snapshot(self.fixture.buffers[n]) for n in self.fixture.outputs}

    def _warmup(self, bound: Any, steps: list[Step]) -> list[dict[str, torch.Tensor]] | None:
        be, fx = self.backend, self.fixture
        eager: list[dict[str, torch.Tensor]] = []
        try:
            with be.side_stream():
                for index in range(len(fx.input_sets)):
                    self._load_set(index)
                    for _ in range(self.warmup):
                        self.op.run(bound, fx.inputs)
                    be.synchronize()
                    eager.append(self._outputs())
                self._load_set(0)
                self.op.run(bound, fx.inputs)
                be.synchronize()
                again = self._outputs()
        except Exception as exc:  # noqa: BLE001 - reported as the step's failure
            steps.append(Step("warmup", "fail", f"eager run raised {type(exc).__name__}: {exc}"))
            return None
        diffs = {n: be.mismatches(again[n], eager[0][n]) for n in fx.outputs}
        bad = {n: d for n, d in diffs.items() if d}
        if bad:
            steps.append(
                Step("warmup", "fail", f"eager run is not deterministic: {bad} elements differ")
            )
        else:
            steps.append(Step("warmup", "pass", f"{len(eager)} input set(s), x{self.warmup}"))
        return eager

    def _replay_round(self, i: int, graph: Any, eager: list[dict[str, torch.Tensor]]) -> Step:
        be, fx = self.backend, self.fixture
        n_sets = len(fx.input_sets)
        index, pattern = i % n_sets, POISONS[(i // n_sets) % len(POISONS)]
        name = f"replay.{i}"
        self._load_set(index)
        for b in fx.poisoned:
            be.poison(fx.buffers[b], pattern)
        before = be.allocator_counters()
        try:
            be.replay(graph)
        except Exception as exc:  # noqa: BLE001
            return Step(name, "fail", f"replay raised {type(exc).__name__}: {exc}")
        problems = []
        delta = _counter_delta(before, be.allocator_counters())
        if delta:
            problems.append(f"allocator activity during replay: {delta}")
        for out in fx.outputs:
            got = fx.buffers[out]
            diff = be.mismatches(got, eager[index][out])
            if diff:
                shown = be.poison_count(got, pattern)
                note = (
                    f"; {shown} elements still hold the {pattern} poison (unwritten)"
                    if shown
                    else ""
                )
                problems.append(
                    f"output `{out}` differs from eager (input set {index}, poison {pattern}): "
                    f"{diff} of {got.numel()} elements{note}"
                )
        where = f"input set {index}, poison {pattern}"
        return Step(name, "fail", "; ".join(problems)) if problems else Step(name, "pass", where)

    def _bitwise(self, got: torch.Tensor, want: torch.Tensor) -> tuple[bool, str]:
        diff = self.backend.mismatches(got, want)
        return (not diff, f"{diff} of {got.numel()} elements differ bitwise" if diff else "")

    def _reference_step(self, eager: list[dict[str, torch.Tensor]]) -> Step:
        """Eager outputs of every input set against ``reference(input_set)`` (closeness)."""
        judge = self.judge or self._bitwise
        problems = []
        for index, input_set in enumerate(self.fixture.input_sets):
            expected = self.reference(input_set)
            for out in self.fixture.outputs:
                if out not in expected:
                    problems.append(f"reference gives no `{out}`")
                    continue
                ok, why = judge(eager[index][out], expected[out])
                if not ok:
                    problems.append(f"`{out}` (input set {index}) vs reference: {why}")
        if problems:
            return Step("reference", "fail", "; ".join(problems))
        return Step("reference", "pass", f"{len(self.fixture.input_sets)} input set(s)")

    def _missing_buffer_probes(self, plan: Any, read: Sequence[str]) -> Step:
        failures, probed = [], []
        for name in read:
            if name not in self.fixture.buffers:
                continue
            probed.append(name)
            reduced = {k: v for k, v in self.fixture.buffers.items() if k != name}

            def attempt(reduced: Mapping[str, torch.Tensor] = reduced) -> None:
                bound = self.op.bind(plan, _TrackedBuffers(reduced))
                self.op.run(bound, self.fixture.inputs)

            exc = self.backend.capture_probe(attempt)
            if exc is None:
                failures.append(f"removing `{name}` raised nothing under capture")
            elif name not in str(exc):
                failures.append(
                    f"removing `{name}` raised {type(exc).__name__} without naming it: {exc}"
                )
        if failures:
            return Step("misuse.missing_buffer", "fail", "; ".join(failures))
        return Step("misuse.missing_buffer", "pass", f"probed {probed}")

    def _compile_probe(self, plan: Any) -> Step:
        probe = getattr(self.op, "compile_unwarmed", None)
        if not callable(probe):
            return Step(
                "misuse.compile_in_capture", "skip", "op declares no compile_unwarmed probe"
            )
        exc = self.backend.capture_probe(lambda: probe(plan))
        if exc is None:
            return Step(
                "misuse.compile_in_capture", "fail", "a compile under capture did not raise"
            )
        return Step("misuse.compile_in_capture", "pass", f"{type(exc).__name__}: {exc}")

    @contextlib.contextmanager
    def _frozen(self) -> Iterator[None]:
        handle = self.op.freeze()
        if hasattr(handle, "__enter__"):
            with handle:
                yield
            return
        try:
            yield
        finally:
            unfreeze = getattr(self.op, "unfreeze", None)
            if callable(unfreeze):
                unfreeze()

    def run(self) -> GraphVerdict:
        """Run every step (module docstring) and return the aggregated verdict."""
        steps: list[Step] = []
        metrics: dict[str, Any] = {
            "replays": self.replays,
            "input_sets": len(self.fixture.input_sets),
        }
        addresses = {n: self.backend.address(t) for n, t in self.fixture.buffers.items()}

        def skip_rest(after: str) -> GraphVerdict:
            for name in ("capture", "replays", "addresses", "misuse"):
                if not any(s.name.startswith(name) for s in steps):
                    steps.append(Step(name, "skip", f"not run: {after} failed"))
            return GraphVerdict(self.name, tuple(steps), metrics)

        try:
            plan = self.op.plan(self.problem)
            steps.append(Step("plan", "pass"))
        except Exception as exc:  # noqa: BLE001
            steps.append(Step("plan", "fail", f"{type(exc).__name__}: {exc}"))
            return skip_rest("plan")
        tracked = _TrackedBuffers(self.fixture.buffers)
        try:
            bound = self.op.bind(plan, tracked)
            steps.append(Step("bind", "pass"))
        except Exception as exc:  # noqa: BLE001
            steps.append(Step("bind", "fail", f"{type(exc).__name__}: {exc}"))
            return skip_rest("bind")
        eager = self._warmup(bound, steps)
        metrics["buffers_read"] = list(tracked.read)
        metrics["buffers_unused"] = [n for n in self.fixture.buffers if n not in tracked.read]
        if eager is None:
            return skip_rest("warmup")
        if self.reference is not None:
            steps.append(self._reference_step(eager))
        with self._frozen():
            steps.append(Step("freeze", "pass"))
            self._load_set(0)
            before = self.backend.allocator_counters()
            try:
                graph = self.backend.capture(lambda: self.op.run(bound, self.fixture.inputs))
            except Exception as exc:  # noqa: BLE001
                steps.append(Step("capture", "fail", f"{type(exc).__name__}: {exc}"))
                return skip_rest("capture")
            delta = _counter_delta(before, self.backend.allocator_counters())
            if delta:
                steps.append(Step("capture", "fail", f"allocator activity during capture: {delta}"))
            else:
                steps.append(Step("capture", "pass"))
            for i in range(self.replays):
                steps.append(self._replay_round(i, graph, eager))
            moved = [
                n
                for n, t in self.fixture.buffers.items()
                if self.backend.address(t) != addresses[n]
            ]
            steps.append(
                Step("addresses", "fail", f"buffers moved: {moved}")
                if moved
                else Step("addresses", "pass")
            )
            steps.append(self._missing_buffer_probes(plan, tracked.read))
            steps.append(self._compile_probe(plan))
        metrics["failed_steps"] = [s.name for s in steps if s.status == "fail"]
        return GraphVerdict(self.name, tuple(steps), metrics)
