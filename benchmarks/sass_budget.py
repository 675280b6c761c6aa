"""CPU-side instruction budget of the dense trellis GEMM mainloop (SASS per decoded weight).

What it measures
----------------
For each (codebook, bits) the dense GEMM specialisation is compiled on the CPU (fake tensors,
``--gpu-arch``, the same spill-free optimisation level that :func:`b12x.launch.specs.
compile_spec` picks), its cubin is disassembled with ``nvdisasm`` and the **steady-state loop**
is located: the backward branch whose body holds the most ``HMMA`` instructions (the unrolled
K16-row loop, not a remainder loop). Each N16 tile contributes two ``HMMA`` per M16 block and
eight decoded weights per thread, so

    weights per iteration per thread = 8 · HMMA / (2 · m_tiles)

and every count below is divided by that. The table prints, per decoded weight, all
instructions and the issue-pipe classes that bound the decode on sm_90:

* ``alu``  — integer ALU pipe: LOP3, SHF, PRMT, SGXT, IADD3, ISETP, SEL, LEA, … (the pipe that
  window extraction and the codebook hash mostly load);
* ``imad`` — the IMAD family (IMAD, IMAD.MOV, IMAD.SHL, IMAD.WIDE, …) and IDP (dp4a): the
  FMA-heavy pipe;
* ``fp16`` — HADD2 / HFMA2 / HMUL2; ``mem`` — loads and stores; ``uni`` — the uniform datapath
  (U* opcodes, issue slots only); ``mma`` — HMMA.

With ``--cluster`` (the swap-AB CTAs that share each token tile, the planned M > 128 geometry)
the loop also holds the token tile's TMA copies, which only the CTA's warp 0 issues: the
**issuer regions** (the loop's forward conditional branches whose skipped range holds a
``UTMALDG``, outermost only) count 1/``warps`` of their instructions per thread, every other
instruction counts once (``issuer`` in the printed row: the static count of those regions).

It is a reproducible static metric (same compiler, same number); it does not replace timing on
the GPU. ``nvdisasm`` comes from the ``nvidia-cuda-nvdisasm`` wheel (``pip install
nvidia-cuda-nvdisasm``) or a CUDA toolkit on ``PATH``.

Usage: ``python benchmarks/sass_budget.py [--codebooks mcg,3inst,mul1] [--bits 2,3,4,6]
[--arch sm_90] [--tiles 1x4] [--bf16] [--depth 1] [--unroll 1] [--smem-stages 0]
[--swap-ab [--shared-rows 2] [--cluster 2]] [--wgmma] [--stream-k] [--json out.json]
[--dump DIR]``; with
``--swap-ab`` the tiles are ``tokens/16 x N16 tiles per warp`` of the swap-AB mainloop
(``--tiles 16x1``: 256 tokens x 128 weight rows) and its loop's HGMMAs count the weights.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import io
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90")

__all__ = [
    "LoopBudget",
    "find_nvdisasm",
    "compile_cubin",
    "disassemble",
    "parse_sass",
    "steady_loop",
    "issuer_regions",
    "pipe_class",
    "budget",
]

_INSTR = re.compile(
    r"/\*(?P<addr>[0-9a-f]{4,})\*/\s+(?P<pred>@!?U?P[T0-9]+\s+)?(?P<op>[A-Z][A-Z0-9_.]*)"
    r"(?P<rest>[^;]*);"
)
_LABEL = re.compile(r"^\s*(?P<name>\.L_x_\d+):")
_TARGET = re.compile(r"`\((?P<name>\.L_x_\d+)\)")
_SPILL = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")
_REGS = re.compile(r"Used (\d+) registers")

_ALU = {
    "LOP3", "LOP", "SHF", "SHL", "SHR", "PRMT", "SGXT", "IADD3", "IADD", "ISETP", "SEL", "LEA",
    "BMSK", "FLO", "BREV", "POPC", "IMNMX", "VIMNMX", "IABS", "PLOP3", "MOV", "VIADD", "P2R",
    "R2P", "CS2R", "BFE", "BFI",
}  # fmt: skip
_FP16 = {"HADD2", "HFMA2", "HMUL2", "HMNMX2", "HSETP2"}
_MEM = {"LDG", "LDS", "LD", "STG", "STS", "ST", "LDC", "LDSM", "ATOM", "ATOMS", "RED"}
_CTRL = {"BRA", "BSSY", "BSYNC", "EXIT", "NOP", "BAR", "WARPSYNC", "CALL", "RET", "YIELD"}
CLASSES = ("alu", "imad", "fp16", "mem", "uni", "mma", "ctrl", "other")


def pipe_class(opcode: str) -> str:
    """Issue-pipe class of a SASS opcode (``"IMAD.MOV.U32"`` -> ``"imad"``), see the docstring."""
    base = opcode.split(".")[0]
    if base.startswith("IMAD") or base in ("IMUL", "IDP"):
        return "imad"
    if base in ("HMMA", "HGMMA"):
        return "mma"
    if base in _FP16:
        return "fp16"
    if base in _MEM:
        return "mem"
    if base in _CTRL:
        return "ctrl"
    if base.startswith("U") or base == "S2UR":
        return "uni"
    if base in _ALU:
        return "alu"
    return "other"


def find_nvdisasm() -> str | None:
    """Path of ``nvdisasm``: the nvidia-cuda-nvdisasm wheel first, then ``PATH``."""
    try:
        import nvidia  # namespace package of the NVIDIA wheels
    except ImportError:
        nvidia = None
    if nvidia is not None:
        for root in getattr(nvidia, "__path__", []):
            for flavour in ("cu13", "cu12", "cuda_nvdisasm"):
                path = pathlib.Path(root, flavour, "bin", "nvdisasm")
                if path.is_file() and os.access(path, os.X_OK):
                    return str(path)
    return shutil.which("nvdisasm")


@dataclasses.dataclass(frozen=True)
class Compiled:
    cubin: bytes
    registers: int | None
    spill_bytes: int | None
    opt_level: int


def compile_cubin(spec, arch: str) -> Compiled:
    """Compile ``spec`` for ``arch`` and return its cubin, at the level ``compile_spec`` picks."""
    import cutlass.cute as cute

    from b12x.launch.kinds import kind_of
    from b12x.launch.specs import target_arch
    from b12x.launch.toolchain import OPT_LEVELS, compile_options

    arch = target_arch(spec, arch)  # sm_90a for a wgmma spec
    first = None
    for level in OPT_LEVELS:
        with tempfile.TemporaryDirectory(prefix="sass_budget_") as dump:
            log = io.StringIO()
            with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
                kernel, args = kind_of(spec).build(spec)
                opts = compile_options(arch, remarks=True, opt_level=level)
                opts += f" --keep-cubin --dump-dir {dump}"
                fn = cute.compile(kernel, *args, options=opts)
        text = log.getvalue()
        spills = [int(a) + int(b) for a, b in _SPILL.findall(text)]
        regs = [int(r) for r in _REGS.findall(text)]
        result = Compiled(
            cubin=bytes(fn.artifacts.CUBIN),
            registers=max(regs) if regs else None,
            spill_bytes=sum(spills) if spills else None,
            opt_level=level,
        )
        if result.spill_bytes == 0:
            return result
        first = first or result
    return first


def disassemble(cubin: bytes, nvdisasm: str) -> str:
    with tempfile.TemporaryDirectory(prefix="sass_budget_") as tmp:
        path = pathlib.Path(tmp, "kernel.cubin")
        path.write_bytes(cubin)
        done = subprocess.run(
            [nvdisasm, "-c", str(path)], capture_output=True, text=True, check=True
        )
    return done.stdout


@dataclasses.dataclass(frozen=True)
class Instr:
    addr: int
    opcode: str
    text: str
    target: str | None
    #: The guard predicate (``"@!P0"``), None when the instruction always executes.
    pred: str | None = None


def parse_sass(sass: str) -> tuple[list[Instr], dict[str, int]]:
    """(instructions in address order, label -> address of the instruction after it)."""
    instrs: list[Instr] = []
    pending: list[str] = []
    labels: dict[str, int] = {}
    for line in sass.splitlines():
        m = _LABEL.match(line)
        if m:
            pending.append(m.group("name"))
            continue
        m = _INSTR.search(line)
        if not m:
            continue
        addr = int(m.group("addr"), 16)
        for name in pending:
            labels[name] = addr
        pending = []
        t = _TARGET.search(m.group("rest"))
        pred = (m.group("pred") or "").strip() or None
        target = t.group("name") if t else None
        instrs.append(Instr(addr, m.group("op"), m.group(0), target, pred))
    return instrs, labels


def steady_loop(instrs: list[Instr], labels: dict[str, int]) -> list[Instr]:
    """Body of the backward-branch loop holding the most MMAs (HMMA or HGMMA; ties: the shorter
    body)."""
    best = None
    for ins in instrs:
        if not ins.opcode.startswith("BRA") or ins.target not in labels:
            continue
        start = labels[ins.target]
        if start > ins.addr:
            continue
        body = [i for i in instrs if start <= i.addr <= ins.addr]
        hmma = sum(pipe_class(i.opcode) == "mma" for i in body)
        key = (hmma, -len(body))
        if hmma and (best is None or key > best[0]):
            best = (key, body)
    if best is None:
        raise ValueError("sass: no loop with MMA instructions found")
    return best[1]


def issuer_regions(body: list[Instr], labels: dict[str, int]) -> list[tuple[int, int]]:
    """``(branch address, target address)`` of each outermost forward conditional branch of the
    loop ``body`` whose skipped instructions hold a TMA copy (``UTMALDG``): the code only the
    issuing warp runs (its other warps branch over it)."""
    end = body[-1].addr + 16  # the address after the loop (sm_90 instructions are 16 bytes)
    found = set()
    for ins in body:
        if not (ins.opcode.startswith("BRA") and ins.pred and ins.target in labels):
            continue
        target = labels[ins.target]
        if not ins.addr < target <= end:
            continue
        if any(i.opcode.startswith("UTMALDG") for i in body if ins.addr < i.addr < target):
            found.add((ins.addr, target))
    return sorted(
        r for r in found if not any(o != r and o[0] <= r[0] and r[1] <= o[1] for o in found)
    )


@dataclasses.dataclass(frozen=True)
class LoopBudget:
    codebook: str
    bits: int
    arch: str
    m_tiles: int
    n_tiles: int
    bf16: bool
    registers: int | None
    spill_bytes: int | None
    loop_instructions: int
    weights_per_iteration: int
    opcodes: dict
    #: Instructions per pipe class, issuer regions weighted ``1 / warps`` (module docstring).
    classes: dict
    #: Static instructions in the issuer regions (0 without TMA copies in the loop).
    issuer_instructions: int = 0
    warps: int = 1

    @property
    def per_weight(self) -> float:
        """Instructions per decoded weight per thread, issuer regions amortised over the CTA's
        warps (the weighted :attr:`classes`)."""
        return sum(self.classes.values()) / self.weights_per_iteration

    def class_per_weight(self, name: str) -> float:
        return self.classes.get(name, 0) / self.weights_per_iteration

    def as_dict(self) -> dict:
        out = dataclasses.asdict(self)
        out["per_weight"] = self.per_weight
        out["class_per_weight"] = {c: self.class_per_weight(c) for c in CLASSES}
        return out


def budget(
    codebook: str,
    bits: int,
    *,
    arch: str = "sm_90",
    m_tiles: int = 1,
    n_tiles: int = 4,
    bf16: bool = False,
    depth: int = 1,
    unroll: int = 1,
    smem_stages: int = 0,
    swap_ab: bool = False,
    shared_rows: int = 2,
    cluster: int = 1,
    wgmma: bool = False,
    stream_k: bool = False,
    nvdisasm: str | None = None,
    dump: str | None = None,
) -> LoopBudget:
    """Compile one dense GEMM specialisation and count its steady-state loop (module doc).
    ``swap_ab``: the swap-AB mainloop (8 warps, ``16·m_tiles`` tokens, ``shared_rows`` x
    ``smem_stages`` slots, 6 when 0), whose every HGMMA consumes one decoded N16 x K16 tile per
    warp: 8 weights per thread; ``cluster`` > 1: CTAs sharing each token tile by TMA multicast
    (:data:`b12x.ops.dense.mainloop.SWAP_TALL`), whose issuer regions are amortised.
    ``wgmma``: the ``wgmma`` shared decode (8 warps, every warp multiplies, ``shared_rows`` x
    ``smem_stages`` slots, 4 when 0; the deep row is ``--tiles 1x2 --shared-rows 4``), whose
    warpgroup HGMMAs cover the CTA width: one per M16 block and K16 row, while each thread
    decodes ``n_tiles`` tiles (8 weights each) per K16 row. ``stream_k``: either ``wgmma``
    mainloop as the stream-K kernel compiles it (:mod:`b12x.kernels.stream_k`)."""
    from b12x.kernels.geometry import GemmGeometry
    from b12x.launch.specs import gemm_spec

    tool = nvdisasm or find_nvdisasm()
    if tool is None:
        raise RuntimeError("nvdisasm not found: pip install nvidia-cuda-nvdisasm")
    mainloop = dict(depth=depth, unroll=unroll, smem_stages=smem_stages)
    write_partials = not (swap_ab or wgmma)  # the per-warp loop as the split-K kernel has it
    if swap_ab:
        mainloop = dict(
            warps=8, m_warps=8, shared_rows=shared_rows, smem_stages=smem_stages or 6,
            wgmma=True, swap_ab=True, cluster=cluster,
        )  # fmt: skip
    elif cluster != 1:
        raise ValueError(f"cluster: only swap-AB CTAs share a token tile, got cluster={cluster}")
    elif wgmma:
        mainloop = dict(
            warps=8, m_warps=8, shared_rows=shared_rows, smem_stages=smem_stages or 4,
            wgmma=True,
        )  # fmt: skip
    if stream_k and not (swap_ab or wgmma):
        raise ValueError("stream_k: the stream-K kernel runs the wgmma mainloops only")
    geometry = GemmGeometry(m_tiles=m_tiles, n_tiles=n_tiles, stream_k=stream_k, **mainloop)
    spec = gemm_spec(codebook, bits, geometry, bf16=bf16, write_partials=write_partials)
    comp = compile_cubin(spec, arch)
    sass = disassemble(comp.cubin, tool)
    if dump:
        name = f"{codebook}_k{bits}_{arch}_{m_tiles}x{n_tiles}{'_bf16' if bf16 else ''}.sass"
        pathlib.Path(dump).mkdir(parents=True, exist_ok=True)
        pathlib.Path(dump, name).write_text(sass)
    instrs, labels = parse_sass(sass)
    body = steady_loop(instrs, labels)
    opcodes = collections.Counter(i.opcode for i in body)
    regions = issuer_regions(body, labels)
    warps = spec.geometry.warps
    classes: dict[str, float] = collections.defaultdict(float)
    issuer = 0
    for ins in body:
        by_issuer = any(lo < ins.addr < hi for lo, hi in regions)
        issuer += by_issuer
        classes[pipe_class(ins.opcode)] += 1 / warps if by_issuer else 1
    hmma = sum(n for op, n in opcodes.items() if pipe_class(op) == "mma")
    if swap_ab:
        weights = 8 * hmma
    elif wgmma:
        if hmma % m_tiles:
            raise ValueError(f"sass: {hmma} HGMMA is not a multiple of m_tiles={m_tiles}")
        weights = 8 * n_tiles * hmma // m_tiles
    elif hmma % (2 * m_tiles):
        raise ValueError(f"sass: {hmma} HMMA is not a multiple of 2·m_tiles={2 * m_tiles}")
    else:
        weights = 8 * hmma // (2 * m_tiles)
    return LoopBudget(
        codebook=codebook,
        bits=bits,
        arch=arch,
        m_tiles=m_tiles,
        n_tiles=n_tiles,
        bf16=bf16,
        registers=comp.registers,
        spill_bytes=comp.spill_bytes,
        loop_instructions=len(body),
        weights_per_iteration=weights,
        opcodes=dict(sorted(opcodes.items(), key=lambda kv: -kv[1])),
        classes=dict(classes),
        issuer_instructions=issuer,
        warps=warps,
    )


def _row(b: LoopBudget) -> str:
    cls = "  ".join(f"{b.class_per_weight(c):5.2f}" for c in CLASSES[:6])
    return (
        f"{b.codebook:6s} K{b.bits}  {b.loop_instructions:5d} / {b.weights_per_iteration:3d} w"
        f"  {b.per_weight:6.3f}   {cls}   regs {b.registers} spill {b.spill_bytes}"
        + (f"   issuer {b.issuer_instructions} / {b.warps} warps" if b.issuer_instructions else "")
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--codebooks", default="mcg,3inst,mul1")
    parser.add_argument("--bits", default="2,3,4,6")
    parser.add_argument("--arch", default="sm_90")
    parser.add_argument("--tiles", default="1x4", help="m_tiles x n_tiles per warp")
    parser.add_argument("--bf16", action="store_true")
    parser.add_argument("--depth", type=int, default=1, help="register stages in flight")
    parser.add_argument("--unroll", type=int, default=1)
    parser.add_argument("--smem-stages", type=int, default=0, help="cp.async ring slots (0: off)")
    parser.add_argument("--swap-ab", action="store_true", help="the sm_90 swap-AB mainloop")
    parser.add_argument("--shared-rows", type=int, default=2, help="swap-AB K16 rows per step")
    parser.add_argument("--cluster", type=int, default=1, help="swap-AB CTAs sharing tokens")
    parser.add_argument("--wgmma", action="store_true", help="the sm_90 wgmma shared decode")
    parser.add_argument("--stream-k", action="store_true", help="the stream-K kernel's loop")
    parser.add_argument("--json", default=None)
    parser.add_argument("--dump", default=None, help="write each disassembly into this folder")
    args = parser.parse_args(argv)
    tool = find_nvdisasm()
    if tool is None:
        print("nvdisasm not found: pip install nvidia-cuda-nvdisasm", file=sys.stderr)
        return 2
    m_tiles, n_tiles = (int(v) for v in args.tiles.lower().split("x"))
    head = "  ".join(f"{c:>5s}" for c in CLASSES[:6])
    dtype = "bf16" if args.bf16 else "fp16"
    print(
        f"{args.arch} tiles {m_tiles}x{n_tiles} {dtype} depth {args.depth} unroll {args.unroll}"
        f" smem_stages {args.smem_stages}{' swap-AB' if args.swap_ab else ''}"
        f"{' wgmma' if args.wgmma else ''}{' stream-K' if args.stream_k else ''}"
        f"{f' cluster {args.cluster}' if args.cluster > 1 else ''}"
    )
    print(f"codebook     loop / weights  instr/w   {head}   (per decoded weight)")
    rows = []
    for codebook in args.codebooks.split(","):
        for bits in (int(v) for v in args.bits.split(",")):
            b = budget(
                codebook,
                bits,
                arch=args.arch,
                m_tiles=m_tiles,
                n_tiles=n_tiles,
                bf16=args.bf16,
                depth=args.depth,
                unroll=args.unroll,
                smem_stages=args.smem_stages,
                swap_ab=args.swap_ab,
                shared_rows=args.shared_rows,
                cluster=args.cluster,
                wgmma=args.wgmma,
                stream_k=args.stream_k,
                nvdisasm=tool,
                dump=args.dump,
            )
            rows.append(b.as_dict())
            print(_row(b), flush=True)
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
