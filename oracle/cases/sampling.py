"""Deterministic stratified sampling of grid cases (``cases(max_cases=N)``, ``--max-cases``,
the default GPU job's sample); split out of :mod:`oracle.cases.grids`, which calls it.

Layout
------
A deterministic sample of ``N`` cases (a pure function of the cases and ``seed``; the result
keeps the input order). Before filling, it takes a *cover*, in this priority order: both compute
dtypes of every op present, every (op, M) present, every variant present. Each cover pick
prefers a variant with the fewest picks so far, so a cover has at most one case per variant when
there are at least as many variants as (op, dtype) and (op, M) strata. Then it fills
round-robin over the variants, each variant's queue alternating over its Ms (and, within one M,
over its shapes). Guarantee: when ``N >= stratified_cover_size(cases)``, every variant, every
(op, M) and every (op, compute dtype) of ``cases`` is in the sample, and the per-variant counts
of variants that still had cases left differ by at most one beyond their cover picks; below
that size the sample is a prefix of the cover (dtypes, then Ms, then variants).
"""

from __future__ import annotations

import zlib
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from oracle.cases.case import Case, check_count
from oracle.cases.variants import Variant

__all__ = ["stratified_cover_size", "stratified_sample"]


def _rank(seed: int, identity: str) -> int:
    return zlib.crc32(f"{seed}:{identity}".encode())


def _stratified_order(pool: Sequence[Case], seed: int) -> tuple[list[int], int]:
    """Indices of ``pool`` in sampling order (cover, then round-robin fill) and the cover size."""
    variants = list(dict.fromkeys(c.variant for c in pool))
    variant_rank = {v: _rank(seed, v.name) for v in variants}
    case_rank = [_rank(seed, c.case_id) for c in pool]
    by_variant: dict[Variant, list[int]] = defaultdict(list)
    for i, c in enumerate(pool):
        by_variant[c.variant].append(i)
    picked: list[int] = []
    taken: set[int] = set()
    per_variant: Counter = Counter()
    per_op_m: Counter = Counter()

    def take(i: int) -> None:
        picked.append(i)
        taken.add(i)
        per_variant[pool[i].variant] += 1
        per_op_m[(pool[i].variant.op, pool[i].m)] += 1

    def best(candidates: Iterable[int]) -> int:
        return min(
            candidates,
            key=lambda i: (
                per_variant[pool[i].variant],
                per_op_m[(pool[i].variant.op, pool[i].m)],
                variant_rank[pool[i].variant],
                case_rank[i],
            ),
        )

    strata: list[dict[Any, list[int]]] = [defaultdict(list), defaultdict(list)]
    for i, c in enumerate(pool):
        strata[0][(c.variant.op, c.variant.compute_dtype)].append(i)
        strata[1][(c.variant.op, c.m)].append(i)
    for groups in strata:  # both dtypes of every op, then every (op, M)
        for members in groups.values():
            if not any(i in taken for i in members):
                take(best(members))
    for v in sorted(variants, key=variant_rank.__getitem__):  # then every variant
        if not per_variant[v]:
            take(best(by_variant[v]))
    cover = len(picked)
    queues: dict[Variant, list[int]] = {}
    for v in variants:  # each variant's queue alternates over its Ms, shapes within one M
        by_m: dict[int, list[int]] = defaultdict(list)
        for i in sorted(by_variant[v], key=case_rank.__getitem__):
            if i not in taken:
                by_m[pool[i].m].append(i)
        have = Counter(pool[i].m for i in by_variant[v] if i in taken)  # cover's Ms go last
        lanes = [
            by_m[m]
            for m in sorted(by_m, key=lambda m, v=v: (have[m], _rank(seed, f"{v.name}|{m}")))
        ]
        queue = []
        for depth in range(max((len(lane) for lane in lanes), default=0)):
            queue += [lane[depth] for lane in lanes if depth < len(lane)]
        queues[v] = queue[::-1]  # pop() from the end
    order = sorted(variants, key=variant_rank.__getitem__)
    while len(picked) < len(pool):  # round-robin fill
        for v in order:
            if queues[v]:
                take(queues[v].pop())
    return picked, cover


def stratified_cover_size(cases: Sequence[Case], *, seed: int = 0) -> int:
    """How many cases the cover of :func:`stratified_sample` needs: the smallest ``max_cases``
    at which its guarantee (every variant, (op, M) and (op, dtype) present) holds."""
    return _stratified_order(list(cases), seed)[1]


def stratified_sample(cases: Sequence[Case], max_cases: int, *, seed: int = 0) -> list[Case]:
    """A deterministic stratified sample of at most ``max_cases`` of ``cases``, in input order.

    Guarantee (module docstring): when ``max_cases >= stratified_cover_size(cases)``, every
    variant, every (op, M) and both compute dtypes of every op present in ``cases`` appear; the
    rest is filled round-robin across variants, spreading each variant over its Ms and shapes.
    Same input and ``seed`` → same sample."""
    pool = list(cases)
    for i, c in enumerate(pool):
        if not isinstance(c, Case):
            raise TypeError(f"stratified_sample: cases[{i}] must be a Case, got {type(c).__name__}")
    check_count(max_cases, "stratified_sample: max_cases", allow_zero=True)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"stratified_sample: seed must be an int, got {seed!r}")
    if max_cases >= len(pool):
        return pool
    order, _ = _stratified_order(pool, seed)
    return [pool[i] for i in sorted(order[:max_cases])]
