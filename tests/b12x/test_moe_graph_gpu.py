"""GPU: the fused MoE inside a serving engine's CUDA graphs, FULL and PIECEWISE (issue 5;
regression classes R4, R5, R8, R13).

The block step (:class:`BlockStep`)
-----------------------------------
``router_logits`` (static input, fp32 ``[M, E]``: what the gate linear produced) → softmax →
top-k → renormalise → ``expert_map`` (static, global → local id; −1 and ids ≥ E mark experts this
rank does not hold, as expert parallelism does) → the fused MoE (:func:`b12x.ops.moe.run.run_moe` on
the plan's buffers) → ``block_output = hidden + moe``. Every intermediate lives in a caller-owned
buffer, and the MoE gets exactly :attr:`MoePlan.buffers` (``allocate_moe_buffers``, nothing more).
The plan holds ``M_PLAN`` = 32 tokens and the live batch is ``M_LIVE`` = 27, so every route-order
and token-order buffer has a tail the step must not write.

* **FULL**: the whole step in one graph. **PIECEWISE**: router, MoE and residual each in a graph
  of its own, with eager glue between them (the route tensors copied into the MoE graph's static
  route inputs). The MoE's public per-op API is the whole op (``run_moe``: route packing, FC1, the
  boundary and FC2 are not separately launchable stages), so the MoE is one piece.
* Replays (both modes): new inputs copied into the static tensors; every scratch and output
  buffer poisoned before capture and before each replay (NaN, 0xFF for integers; 0x7fff
  half-words; random bytes); each replay bit-for-bit equal to the eager run of a *clean* step
  (zeroed buffers, never poisoned) on the same inputs; one input set maps six experts to inactive
  ids (−1, E, E + 3, a huge id); the route tensors the MoE reads are bit-unchanged after it ran.
* Tails (R8), as the contract states them: :mod:`b12x.ops.moe.routing` "Live M may be below the
  planned M: every buffer is used through a row-prefix view", so past the live prefix (the size
  the same plan gives that buffer at the live M) no byte may change; :mod:`b12x.ops.moe.plan` "Rows
  of inactive routes are never written" (FC1) and :mod:`b12x.kernels.moe_gemm` (a route in no
  live block is never stored), so the ``fc1`` and ``fc2`` rows of inactive routes keep the poison.
* :class:`oracle.run.graph_protocol.GraphProtocol` (CUDA backend) over the FULL step
  (:class:`~oracle.run.graph_protocol.ComposedOp`) and over each piece: no allocator activity in
  capture or replay, stable buffer addresses, every buffer removed in turn raises naming it, a
  compile under capture raises; closeness of the FULL step to ``reference.moe``; and the FULL
  consumer fixture has no buffer the step does not read (consumer-exact).
* Misuse, explicitly: a missing or one-element placeholder MoE buffer raises
  ``BufferNotProvided`` naming it, eagerly (before any launch: no buffer changes) and under
  capture (the capture wording); with resolution frozen, a plan whose kernels were never compiled
  raises ``KernelResolutionFrozen`` eagerly and under capture, and compiles nothing.
* N-run determinism: 5 eager runs with different poisons in between are bitwise equal.
* Batch invariance, as the design promises it: ``b12x/kernels/moe_gemm.py`` "No split-K, so the
  result is deterministic and independent of the other blocks: each row's output depends only on
  its own A row, which makes the MoE batch-invariant per route", and ``b12x/ops/moe/plan.py`` "a
  token's output at batch M equals its batch-1 output bit for bit, given the same routes". Tested
  for M = 5, 33 and 129 (129 plans two M16 tiles per route block) against batch 1, fp16 and bf16,
  several tokens each (inactive routes included: they are part of "the same routes").

Geometry: H = 256, I = 256, E = 16, top-k 4, MCG K3 (one grouped-GEMM specialisation per compute
dtype and block size). Capture and replay go through :func:`_capture` / :func:`_replay`.
"""

from __future__ import annotations

import contextlib
import dataclasses

import pytest
import torch

from b12x.ops.moe.custom_op import MoeOp
from b12x.ops.moe.plan import allocate_moe_buffers, bind_moe, plan_moe
from b12x.ops.moe.run import MoeInputs, run_moe
from b12x.runtime import compile_cache
from b12x.runtime.scratch import BufferNotProvided
from oracle.run.graph_protocol import (
    ComposedOp,
    ConsumerFixture,
    CudaBackend,
    GraphProtocol,
    capture_graph,
)
from reference.moe import TrellisExperts, moe_forward

pytestmark = pytest.mark.gpu

F16, BF16, F32, I32, I64 = torch.float16, torch.bfloat16, torch.float32, torch.int32, torch.int64
DEV = "cuda"
H, I, E, TOP_K, BITS, CODEBOOK = 256, 256, 16, 4, 3, "mcg"
M_PLAN, M_LIVE = 32, 27
POISONS = ("nan", "0x7fff", "garbage")
#: (input set, poison) per replay; set 2 carries the inactive expert map, set 0 comes back.
ROUNDS = ((0, "nan"), (1, "0x7fff"), (2, "garbage"), (3, "nan"), (0, "garbage"), (2, "0x7fff"))
INACTIVE_SET = 2


@dataclasses.dataclass(frozen=True)
class Config:
    layout: str
    x_dtype: torch.dtype
    compute_dtype: torch.dtype
    ids_dtype: torch.dtype


CONFIGS = {
    "f16-packed-ids64": Config("packed", F16, F16, I64),
    "bf16-proj-ids32": Config("proj", BF16, BF16, I32),
}


# ------------------------------------------------------------------ capture, replay, bits


def _capture(fn):
    """One CUDA graph of ``fn`` (already warmed up: nothing may compile now). A failed capture
    is undone by :func:`oracle.run.graph_protocol.capture_graph` before it raises, so it cannot leak
    into the next test."""
    return capture_graph(fn)


def _replay(graph) -> None:
    graph.replay()


@contextlib.contextmanager
def _side_stream():
    """Warm-up on a side stream, as torch wants before a capture."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        yield
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()


_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(_INT_OF_SIZE[t.element_size()])


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(_bits(a), _bits(b))


def _snap(t: torch.Tensor) -> torch.Tensor:
    """A byte-exact copy (a bool holding a poison byte would be canonicalised by ``clone``)."""
    return _bits(t).clone()


def _unchanged(t: torch.Tensor, snap: torch.Tensor) -> bool:
    return torch.equal(_bits(t), snap)


def poison_(t: torch.Tensor, pattern: str) -> None:
    """Overwrite every byte of ``t``: ``nan`` (0xFF bytes for non-float), ``0x7fff`` half-words
    (0x7f bytes for an odd byte count), or ``garbage`` (random bytes)."""
    raw = t.view(-1).view(torch.uint8)
    if pattern == "nan":
        if t.is_floating_point():
            t.fill_(float("nan"))
        else:
            raw.fill_(0xFF)
    elif pattern == "0x7fff":
        if raw.numel() % 2 == 0:
            raw.view(torch.int16).fill_(0x7FFF)
        else:
            raw.fill_(0x7F)
    elif pattern == "garbage":
        # Seeded CPU bytes: the pattern never depends on (or disturbs) the global CUDA RNG
        # state, so a test's poison does not depend on what ran before it.
        gen = torch.Generator().manual_seed(raw.numel())
        raw.copy_(torch.randint(0, 256, raw.shape, dtype=torch.uint8, generator=gen))
    else:
        raise ValueError(f"pattern: expected one of {POISONS}, got {pattern!r}")


# ------------------------------------------------------------------ weights and inputs


def make_experts(layout: str, seed: int) -> TrellisExperts:
    g = torch.Generator().manual_seed(seed)

    def payload(*shape):
        data = torch.randint(-(2**15), 2**15, shape, generator=g, dtype=torch.int32)
        return data.to(torch.int16).to(DEV)

    def scales(rows, width):
        sign = torch.where(torch.rand(rows, width, generator=g) < 0.5, -1.0, 1.0)
        return (sign * (0.8 + 0.4 * torch.rand(rows, width, generator=g))).half().to(DEV)

    words = 16 * BITS
    if layout == "packed":
        w13 = payload(E, H // 16, 2 * I // 16, words)
    else:
        w13 = payload(2, E, H // 16, I // 16, words)
    gate = scales(E, H)
    up = gate if layout == "packed" else scales(E, H)
    return TrellisExperts(
        w13, payload(E, I // 16, H // 16, words), gate, up, scales(E, 3 * I), scales(1, H),
        CODEBOOK, layout,
    )  # fmt: skip


@pytest.fixture(scope="module")
def experts():
    made: dict[str, TrellisExperts] = {}

    def get(layout: str) -> TrellisExperts:
        if layout not in made:
            made[layout] = make_experts(layout, seed=7 if layout == "packed" else 8)
        return made[layout]

    return get


def weight_inputs(ex: TrellisExperts) -> dict[str, torch.Tensor]:
    """The MoE weights as ``MoeOp.run`` reads them by name."""
    return {
        "w13": ex.w13, "w2": ex.w2, "gate_suh": ex.gate_suh, "up_suh": ex.up_suh,
        "intermediate_rotations": ex.intermediate_rotations, "down_svh": ex.down_svh,
    }  # fmt: skip


def moe_inputs(ex: TrellisExperts, x, weights, ids) -> MoeInputs:
    return MoeInputs(
        x, weights, ids, (ex.w13,), (ex.w2,), ex.gate_suh,
        ex.up_suh if ex.w13_layout == "proj" else None, ex.intermediate_rotations, ex.down_svh,
    )  # fmt: skip


def moe_problem(cfg: Config, m: int) -> dict:
    return dict(
        m=m, top_k=TOP_K, hidden=H, intermediate=I, codebook=CODEBOOK, bits=BITS, num_experts=E,
        w13_layout=cfg.layout, x_dtype=cfg.x_dtype, compute_dtype=cfg.compute_dtype,
    )  # fmt: skip


def inactive_map(ids_dtype: torch.dtype) -> torch.Tensor:
    """Identity except six experts this rank does not hold: −1, E, E + 3 and a huge id."""
    huge = 2**31 - 1 if ids_dtype == I32 else 2**40
    table = torch.arange(E, dtype=I64)
    for expert, local in zip((1, 4, 6, 9, 12, 15), (-1, E, huge, -1, E + 3, huge), strict=True):
        table[expert] = local
    return table.to(ids_dtype)


def input_set(seed: int, cfg: Config, *, inactive: bool) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    hidden = (0.25 * torch.randn(M_LIVE, H, generator=g)).to(cfg.x_dtype)
    logits = 2.0 * torch.randn(M_LIVE, E, generator=g)
    table = inactive_map(cfg.ids_dtype) if inactive else torch.arange(E, dtype=cfg.ids_dtype)
    return {"hidden": hidden.to(DEV), "router_logits": logits.to(DEV), "expert_map": table.to(DEV)}


def input_sets(cfg: Config) -> list[dict[str, torch.Tensor]]:
    return [input_set(100 + s, cfg, inactive=s == INACTIVE_SET) for s in range(4)]


# ------------------------------------------------------------------ the router (torch ops)


def router_specs(m: int, ids_dtype: torch.dtype) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    return {
        "router_probs": ((m, E), F32),
        "router_topk_weights": ((m, TOP_K), F32),
        "router_topk_index": ((m, TOP_K), I64),
        "router_topk_sum": ((m, 1), F32),
        "router_topk_ids": ((m, TOP_K), ids_dtype),
    }


def route_(logits: torch.Tensor, expert_map: torch.Tensor, buf) -> None:
    """softmax → top-k → renormalise → expert map, into ``buf`` (out= variants: no allocation)."""
    torch.softmax(logits, -1, out=buf["router_probs"])
    torch.topk(
        buf["router_probs"],
        TOP_K,
        dim=-1,
        out=(buf["router_topk_weights"], buf["router_topk_index"]),
    )
    torch.sum(buf["router_topk_weights"], dim=-1, keepdim=True, out=buf["router_topk_sum"])
    buf["router_topk_weights"].div_(buf["router_topk_sum"])
    flat_ids = buf["router_topk_ids"].view(-1)
    torch.index_select(expert_map, 0, buf["router_topk_index"].view(-1), out=flat_ids)


def reference_routes(logits, expert_map):
    """The same routing, functional (the reference side of the closeness check)."""
    weights, index = torch.softmax(logits, -1).topk(TOP_K, dim=-1)
    return weights / weights.sum(-1, keepdim=True), expert_map[index]


# ------------------------------------------------------------------ the block step


class BlockStep:
    """One MoE block step on caller-owned storage (module docstring).

    ``inputs``: the static inputs (``hidden``, ``router_logits``, ``expert_map``); ``router``:
    the router's buffers; ``moe_buffers``: exactly the plan's buffers; ``moe_routes``: the route
    tensors the MoE reads (FULL: the router's own; PIECEWISE: static copies the glue fills);
    ``route_probe`` (FULL): copies of the routes taken inside the graph before the MoE runs."""

    def __init__(self, cfg: Config, ex: TrellisExperts, *, piecewise: bool, clean: bool):
        self.cfg, self.piecewise = cfg, piecewise
        self.plan = plan_moe(**moe_problem(cfg, M_PLAN))
        self.moe_buffers = allocate_moe_buffers(self.plan, DEV)
        assert tuple(self.moe_buffers) == self.plan.buffer_names  # exactly the planned buffers
        self.inputs = {
            "hidden": torch.zeros(M_LIVE, H, dtype=cfg.x_dtype, device=DEV),
            "router_logits": torch.zeros(M_LIVE, E, dtype=F32, device=DEV),
            "expert_map": torch.arange(E, dtype=cfg.ids_dtype, device=DEV),
        }
        self.router = {
            name: torch.empty(shape, dtype=dtype, device=DEV)
            for name, (shape, dtype) in router_specs(M_LIVE, cfg.ids_dtype).items()
        }
        self.block_output = torch.empty(M_LIVE, H, dtype=cfg.x_dtype, device=DEV)
        weights, ids = self.router["router_topk_weights"], self.router["router_topk_ids"]
        copies = {"weights": torch.empty_like(weights), "ids": torch.empty_like(ids)}
        self.moe_routes = copies if piecewise else {"weights": weights, "ids": ids}
        self.route_probe = {} if piecewise else copies
        if clean:
            for t in self.storage().values():
                t.zero_()
        self.bound = bind_moe(self.plan, **self.moe_buffers)
        self.moe_in = moe_inputs(
            ex, self.inputs["hidden"], self.moe_routes["weights"], self.moe_routes["ids"]
        )

    def storage(self) -> dict[str, torch.Tensor]:
        """Everything the step writes (what gets poisoned)."""
        out = {f"moe.{n}": t for n, t in self.moe_buffers.items()}
        out.update({f"router.{n}": t for n, t in self.router.items()})
        out["block_output"] = self.block_output
        if self.piecewise:
            out.update({f"moe_routes.{n}": t for n, t in self.moe_routes.items()})
        out.update({f"probe.{n}": t for n, t in self.route_probe.items()})
        return out

    def load(self, values: dict[str, torch.Tensor]) -> None:
        for name, src in values.items():
            self.inputs[name].copy_(src)

    def poison(self, pattern: str) -> None:
        for t in self.storage().values():
            poison_(t, pattern)

    # the pieces
    def route(self) -> None:
        route_(self.inputs["router_logits"], self.inputs["expert_map"], self.router)

    def probe(self) -> None:
        self.route_probe["weights"].copy_(self.router["router_topk_weights"])
        self.route_probe["ids"].copy_(self.router["router_topk_ids"])

    def glue(self) -> None:
        self.moe_routes["weights"].copy_(self.router["router_topk_weights"])
        self.moe_routes["ids"].copy_(self.router["router_topk_ids"])

    def moe(self) -> None:
        run_moe(self.bound, self.moe_in)

    def residual(self) -> None:
        moe_out = self.moe_buffers["output"].narrow(0, 0, M_LIVE)
        torch.add(self.inputs["hidden"], moe_out, out=self.block_output)

    def full(self) -> None:
        self.route()
        self.probe()
        self.moe()
        self.residual()

    def eager(self) -> None:
        if self.piecewise:
            self.route()
            self.glue()
            self.moe()
            self.residual()
        else:
            self.full()

    def capture(self) -> list:
        if not self.piecewise:
            return [_capture(self.full)]
        return [_capture(piece) for piece in (self.route, self.moe, self.residual)]

    def replay(self, graphs: list) -> None:
        if not self.piecewise:
            _replay(graphs[0])
            return
        router_graph, moe_graph, residual_graph = graphs
        _replay(router_graph)
        self.glue()  # eager glue between the pieces
        _replay(moe_graph)
        _replay(residual_graph)


def live_extents(plan, m_live: int) -> dict[str, int]:
    """Elements of each buffer a live batch of ``m_live`` may write: its size in the same plan
    made for ``m_live`` (same block size), per the row-prefix contract of
    ``b12x.ops.moe.routing``."""
    p = plan.problem
    live = plan_moe(
        m=m_live, top_k=p.top_k, hidden=p.hidden, intermediate=p.intermediate,
        codebook=p.codebook, bits=p.tiers[0].bits, num_experts=p.tiers[0].num_experts,
        w13_layout=p.w13_layout, x_dtype=p.x_dtype, compute_dtype=p.compute_dtype,
        m_tiles=plan.routes.block_size // 16,
    )  # fmt: skip
    assert live.buffer_names == plan.buffer_names
    return {s.name: s.numel for s in live.buffers}


def tails(step: BlockStep) -> dict[str, torch.Tensor]:
    """Views of every MoE buffer past its live prefix (non-empty ones only)."""
    extents = live_extents(step.plan, M_LIVE)
    views = {}
    for name, t in step.moe_buffers.items():
        if t.numel() > extents[name]:
            views[name] = t.view(-1)[extents[name] :]
    return views


def inactive_routes(ids: torch.Tensor) -> torch.Tensor:
    flat = ids.reshape(-1).to(I64)
    return ((flat < 0) | (flat >= E)).nonzero().view(-1)


# ------------------------------------------------------------------ FULL / PIECEWISE replays


def _clean_eager(cfg, ex, sets):
    """Per input set: the block output and route ids of an eager step on zeroed buffers."""
    clean = BlockStep(cfg, ex, piecewise=False, clean=True)
    expected = []
    for values in sets:
        clean.load(values)
        clean.eager()
        torch.cuda.synchronize()
        expected.append(
            {
                "block_output": clean.block_output.clone(),
                "ids": clean.route_probe["ids"].clone(),  # as routed, before the MoE ran
                "weights": clean.route_probe["weights"].clone(),
            }
        )
    return expected


@pytest.mark.graph
@pytest.mark.parametrize("mode", ["full", "piecewise"])
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_replays_match_a_clean_eager_step(mode, name, experts):
    cfg = CONFIGS[name]
    ex = experts(cfg.layout)
    sets = input_sets(cfg)
    expected = _clean_eager(cfg, ex, sets)
    assert inactive_routes(expected[INACTIVE_SET]["ids"]).numel() > 0, "no inactive route drawn"
    for index, want in enumerate(expected):
        if index != INACTIVE_SET:
            assert inactive_routes(want["ids"]).numel() == 0
        assert bool(torch.isfinite(want["block_output"]).all()), f"input set {index}"

    step = BlockStep(cfg, ex, piecewise=mode == "piecewise", clean=False)
    step.poison("garbage")
    step.load(sets[0])
    with _side_stream():
        step.eager()
        step.eager()
    step.poison("nan")  # stale values from warm-up must not matter either
    with compile_cache.frozen():
        graphs = step.capture()
        for rnd, (index, pattern) in enumerate(ROUNDS):
            where = f"{mode} replay {rnd} (input set {index}, poison {pattern})"
            step.load(sets[index])
            step.poison(pattern)
            tail_views = tails(step)
            tail_before = {n: _snap(v) for n, v in tail_views.items()}
            gemm_before = {n: _snap(step.moe_buffers[n]) for n in ("fc1", "fc2")}
            step.replay(graphs)
            torch.cuda.synchronize()

            want = expected[index]
            got = step.block_output
            assert _same_bits(got, want["block_output"]), (
                f"{where}: block output differs from the clean eager step in "
                f"{int((_bits(got) != _bits(want['block_output'])).sum())} elements"
            )
            ids, weights = step.router["router_topk_ids"], step.router["router_topk_weights"]
            # the route tensors the MoE read are bit-unchanged after it ran: FULL compares them
            # with the in-graph copy taken before the MoE, PIECEWISE with the glue's source
            routes = {"ids": ids, "weights": weights}
            read, before = (
                (step.moe_routes, routes) if step.piecewise else (routes, step.route_probe)
            )
            for key in ("ids", "weights"):
                assert _same_bits(read[key], before[key]), f"{where}: the MoE changed route {key}"
                assert _same_bits(before[key], want[key]), f"{where}: routed {key} differ"
            for key, value in sets[index].items():  # static inputs untouched
                assert _same_bits(step.inputs[key], value), f"{where}: input {key} changed"
            # tails past the live prefix: never written
            assert "output" in tail_views and "fc1" in tail_views
            for n, view in tail_views.items():
                assert _unchanged(view, tail_before[n]), f"{where}: tail of `{n}` was written"
            rows = inactive_routes(want["ids"])
            for n in ("fc1", "fc2"):
                now, before = _bits(step.moe_buffers[n])[rows], gemm_before[n][rows]
                assert torch.equal(now, before), f"{where}: `{n}` rows of inactive routes written"


# ------------------------------------------------------------------ the oracle's protocol


class RouterOp:
    """The router as a plan/bind/run op (torch ops into caller buffers)."""

    name = "router"

    def __init__(self, ids_dtype: torch.dtype):
        self.ids_dtype = ids_dtype

    def plan(self, problem):
        return dict(problem)

    def bind(self, plan, buffers):
        bound = {}
        for name, (shape, dtype) in router_specs(plan["m"], self.ids_dtype).items():
            t = buffers[name]  # a missing name raises naming it
            if tuple(t.shape) != shape or t.dtype != dtype:
                raise ValueError(f"buffer `{name}`: expected {list(shape)} {dtype}")
            bound[name] = t
        return bound

    def run(self, bound, inputs) -> None:
        route_(inputs["router_logits"], inputs["expert_map"], bound)

    def freeze(self):
        return contextlib.nullcontext()


class MoeStage:
    """:class:`MoeOp` inside the block: ``x`` is the block's ``hidden``, the routes come from the
    buffers named in ``routes`` (the router's, in FULL)."""

    name = "trellis_moe"

    def __init__(self, routes=("router_topk_weights", "router_topk_ids")):
        self.op, self.routes = MoeOp(), routes

    def plan(self, problem):
        return self.op.plan(problem)

    def bind(self, plan, buffers):
        return self.op.bind(plan, buffers), buffers[self.routes[0]], buffers[self.routes[1]]

    def run(self, bound, inputs) -> None:
        moe, weights, ids = bound
        named = {**inputs, "x": inputs["hidden"], "topk_weights": weights, "topk_ids": ids}
        self.op.run(moe, named)

    def freeze(self):
        return self.op.freeze()

    def compile_unwarmed(self, plan) -> None:
        self.op.compile_unwarmed(plan)


class ResidualOp:
    """``block_output = hidden + output[:M]`` (the MoE's output buffer is read, not written)."""

    name = "residual"

    def plan(self, problem):
        return dict(problem)

    def bind(self, plan, buffers):
        return buffers["output"], buffers["block_output"]

    def run(self, bound, inputs) -> None:
        moe_out, out = bound
        torch.add(inputs["hidden"], moe_out.narrow(0, 0, out.shape[0]), out=out)

    def freeze(self):
        return contextlib.nullcontext()


def _router_buffers(cfg: Config, m: int) -> dict[str, torch.Tensor]:
    specs = router_specs(m, cfg.ids_dtype)
    return {n: torch.empty(s, dtype=d, device=DEV) for n, (s, d) in specs.items()}


def _fixture(buffers, sets, outputs, extra=None):
    sets = [{**s, **(extra or {})} for s in sets]
    inputs = {k: v.clone() for k, v in sets[0].items()}
    scratch = tuple(n for n in buffers if n not in outputs)
    return ConsumerFixture(buffers, inputs, sets, outputs=outputs, scratch=scratch)


def _judge(got: torch.Tensor, want: torch.Tensor) -> tuple[bool, str]:
    if not want.is_floating_point():
        ok = torch.equal(got, want.to(got.device))
        return ok, "" if ok else f"{int((got != want.to(got.device)).sum())} ids differ"
    err = float((got.double() - want).norm() / want.norm())
    return err <= 1e-2, f"relL2 {err:.3e} against hidden + the faithful reference MoE"


@pytest.mark.graph
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_full_block_graph_protocol(name, experts):
    cfg = CONFIGS[name]
    ex = experts(cfg.layout)
    op = ComposedOp("moe_block", [RouterOp(cfg.ids_dtype), MoeStage(), ResidualOp()])
    problems = [{"m": M_LIVE}, moe_problem(cfg, M_PLAN), {}]
    buffers = {**_router_buffers(cfg, M_LIVE), **allocate_moe_buffers(op.plan(problems)[1], DEV)}
    buffers["block_output"] = torch.empty(M_LIVE, H, dtype=cfg.x_dtype, device=DEV)
    sets = input_sets(cfg)[:3]  # set 2 holds the inactive expert map
    fixture = _fixture(buffers, sets, ("block_output", "router_topk_ids"), weight_inputs(ex))

    def reference(values):
        weights, ids = reference_routes(values["router_logits"], values["expert_map"])
        moe = moe_forward(
            values["hidden"], ex, weights, ids, precision="faithful",
            compute_dtype=cfg.compute_dtype,
        )  # fmt: skip
        return {"block_output": values["hidden"].double() + moe.double(), "router_topk_ids": ids}

    verdict = GraphProtocol(
        op, problems, fixture, CudaBackend(), reference=reference, judge=_judge
    ).run()
    assert verdict.passed, verdict.reasons
    assert verdict.metrics["buffers_unused"] == [], "the consumer provisions buffers nobody reads"
    for step in ("reference", "capture", "misuse.missing_buffer", "misuse.compile_in_capture"):
        assert verdict.step(step).status == "pass", verdict.step(step)


def _piece(piece: str, cfg: Config, ex: TrellisExperts):
    """(op, problem, fixture) of one PIECEWISE piece with its own static inputs."""
    sets = input_sets(cfg)[:3]
    if piece == "router":
        buffers = _router_buffers(cfg, M_LIVE)
        router_sets = [{k: s[k] for k in ("router_logits", "expert_map")} for s in sets]
        fixture = _fixture(buffers, router_sets, ("router_topk_ids", "router_topk_weights"))
        return RouterOp(cfg.ids_dtype), {"m": M_LIVE}, fixture
    if piece == "moe":
        problem = moe_problem(cfg, M_LIVE)  # live M = planned M: the whole output is compared
        buffers = allocate_moe_buffers(plan_moe(**problem), DEV)
        moe_sets = []
        for s in sets:
            weights, ids = reference_routes(s["router_logits"], s["expert_map"])
            moe_sets.append({"x": s["hidden"], "topk_weights": weights, "topk_ids": ids})
        return MoeOp(), problem, _fixture(buffers, moe_sets, ("output",), weight_inputs(ex))
    g = torch.Generator().manual_seed(5)
    moe_out = (64 * torch.randn(M_PLAN, H, generator=g)).to(cfg.x_dtype).to(DEV)
    buffers = {"output": moe_out, "block_output": torch.empty_like(moe_out[:M_LIVE])}
    residual_sets = [{"hidden": s["hidden"]} for s in sets]
    fixture = ConsumerFixture(
        buffers,
        {"hidden": sets[0]["hidden"].clone()},
        residual_sets,
        outputs=("block_output",),
    )  # `output` is persistent here: the MoE piece's result, read, never poisoned
    return ResidualOp(), {}, fixture


@pytest.mark.graph
@pytest.mark.parametrize("piece", ["router", "moe", "residual"])
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_piecewise_graph_protocol(piece, name, experts):
    cfg = CONFIGS[name]
    op, problem, fixture = _piece(piece, cfg, experts(cfg.layout))
    verdict = GraphProtocol(op, problem, fixture, CudaBackend()).run()
    assert verdict.passed, verdict.reasons
    assert verdict.metrics["buffers_unused"] == []
    if piece == "moe":
        assert verdict.step("misuse.compile_in_capture").status == "pass"


# ------------------------------------------------------------------ misuse


@pytest.mark.graph
@pytest.mark.parametrize("kind", ["absent", "placeholder"])
@pytest.mark.parametrize("missing", ["expert_counts", "route_onehot", "fc1", "accum", "output"])
def test_missing_buffer_raises_naming_it(missing, kind, experts):
    cfg = CONFIGS["f16-packed-ids64"]
    ex = experts(cfg.layout)
    plan = plan_moe(**moe_problem(cfg, M_PLAN))
    buffers = allocate_moe_buffers(plan, DEV)
    spec = next(s for s in plan.buffers if s.name == missing)
    buffers[missing] = None if kind == "absent" else torch.empty(1, dtype=spec.dtype, device=DEV)
    for t in buffers.values():
        if t is not None:
            poison_(t, "nan")
    before = {n: _snap(t) for n, t in buffers.items() if t is not None}
    values = input_sets(cfg)[0]
    weights, ids = reference_routes(values["router_logits"], values["expert_map"])
    inputs = moe_inputs(ex, values["hidden"], weights, ids)

    with pytest.raises(BufferNotProvided, match=f"`{missing}`"):
        run_moe(bind_moe(plan, **buffers), inputs)
    torch.cuda.synchronize()
    for n, t in before.items():  # raised before anything launched into the other buffers
        assert _unchanged(buffers[n], t), f"`{n}` changed although binding failed"

    phrase = f"`{missing}` is not initialized for CUDA graph capture"
    with pytest.raises(BufferNotProvided, match=phrase):
        _capture(lambda: run_moe(bind_moe(plan, **buffers), inputs))


@pytest.mark.graph
def test_unwarmed_plan_raises_when_frozen_and_under_capture(experts, monkeypatch):
    cfg = CONFIGS["f16-packed-ids64"]
    ex = experts(cfg.layout)
    plan = plan_moe(**moe_problem(cfg, M_PLAN))
    bound = bind_moe(plan, **allocate_moe_buffers(plan, DEV))
    values = input_sets(cfg)[0]
    weights, ids = reference_routes(values["router_logits"], values["expert_map"])
    inputs = moe_inputs(ex, values["hidden"], weights, ids)
    empty = compile_cache.CompileCache()  # as far as run_moe can see, nothing was ever warmed
    monkeypatch.setattr(compile_cache, "CACHE", empty)
    backend = CudaBackend()
    with compile_cache.frozen():
        with pytest.raises(compile_cache.KernelResolutionFrozen, match="never warmed up"):
            run_moe(bound, inputs)
        frozen_exc = backend.capture_probe(lambda: run_moe(bound, inputs))
    capture_exc = backend.capture_probe(lambda: run_moe(bound, inputs))  # unfrozen, capturing
    assert isinstance(frozen_exc, compile_cache.KernelResolutionFrozen), frozen_exc
    assert isinstance(capture_exc, compile_cache.KernelResolutionFrozen), capture_exc
    assert "during CUDA graph capture" in str(capture_exc)
    assert len(empty) == 0 and empty.misses == 0, "a kernel compiled while it must not"


# ------------------------------------------------------------------ determinism, batch invariance


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_five_runs_are_bitwise_equal_whatever_the_stale_scratch(name, experts):
    cfg = CONFIGS[name]
    ex = experts(cfg.layout)
    plan = plan_moe(**moe_problem(cfg, M_PLAN))
    buffers = allocate_moe_buffers(plan, DEV)
    bound = bind_moe(plan, **buffers)
    values = input_sets(cfg)[INACTIVE_SET]
    weights, ids = reference_routes(values["router_logits"], values["expert_map"])
    inputs = moe_inputs(ex, values["hidden"], weights, ids)
    runs = []
    for pattern in ("nan", "0x7fff", "garbage", "nan", "garbage"):
        for t in buffers.values():
            poison_(t, pattern)
        runs.append(run_moe(bound, inputs).clone())
    torch.cuda.synchronize()
    assert bool(torch.isfinite(runs[0]).all())
    for r, run in enumerate(runs[1:], start=1):
        assert _same_bits(run, runs[0]), f"run {r} differs from run 0"


@pytest.mark.parametrize("layout, dtype", [("packed", F16), ("proj", BF16)])
def test_batch_invariance_against_batch_one(layout, dtype, experts):
    cfg = Config(layout, dtype, dtype, I64)
    ex = experts(layout)
    g = torch.Generator().manual_seed(17)
    m_max = 129
    x = (0.25 * torch.randn(m_max, H, generator=g)).to(dtype).to(DEV)
    ids = torch.stack([torch.randperm(E, generator=g)[:TOP_K] for _ in range(m_max)])
    ids[3, 1], ids[10, 0], ids[64, 3] = -1, E, 2**40  # inactive routes are part of the routes
    ids = ids.to(DEV)
    w = torch.rand(m_max, TOP_K, generator=g).to(DEV)

    def bound_for(m):
        plan = plan_moe(**moe_problem(cfg, m))
        return plan, bind_moe(plan, **allocate_moe_buffers(plan, DEV))

    _, single = bound_for(1)
    batch_one = {}

    def one(t):
        if t not in batch_one:
            inputs = moe_inputs(ex, x[t : t + 1], w[t : t + 1], ids[t : t + 1])
            batch_one[t] = run_moe(single, inputs)[0].clone()
        return batch_one[t]

    for m in (5, 33, 129):
        plan, bound = bound_for(m)
        out = run_moe(bound, moe_inputs(ex, x[:m], w[:m], ids[:m])).clone()
        tokens = sorted({0, 1, 2, 3, m // 2, m - 1} | ({10, 32, 64, 100} & set(range(m))))
        for t in tokens:
            assert _same_bits(out[t], one(t)), (
                f"M={m} (block size {plan.routes.block_size}): token {t} differs from its "
                f"batch-1 output"
            )
