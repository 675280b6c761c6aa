"""The public peer of the dense benchmark: quack-kernels' W4A16 trellis GEMM, imported and judged.

:func:`load_peer` imports ``quack.gemm_w4`` (any failure is the reason the peer is unavailable);
:func:`judge_peer_rows` holds up to 8 rows of a peer output (first, last and evenly between) to
the oracle's envelope (``judge_gemm``) against ``x @ W``, ``W [K, N]`` decoded by
:func:`reference.qtip.decode` from the same blob (docs/format.md §8). The whole peer is judged
by ``python -m oracle run --kernel quack`` (docs/adapters.md).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from bench_cli import short_error


@dataclasses.dataclass(frozen=True)
class Peer:
    available: bool
    reason: str | None = None
    version: str | None = None
    gemm: Callable[..., Any] | None = None
    prepare: Callable[..., Any] | None = None


def load_peer() -> Peer:
    """Import quack's W4A16 GEMM and its weight prep; any failure (not installed, a CuTe DSL it
    cannot use, no GPU at import) is the reason the peer is unavailable."""
    try:
        import quack
        from quack.gemm_w4 import gemm_w4a16, prepare_w4_weight
    except Exception as exc:  # noqa: BLE001 -- whatever stops the import is the reason
        return Peer(False, short_error(exc))
    return Peer(True, None, getattr(quack, "__version__", None), gemm_w4a16, prepare_w4_weight)


def peer_weight(blob: Any) -> Any:
    """``W [K, N]`` of a QTIP blob, decoded by the reference on the blob's device."""
    from reference import qtip  # lazy: only a run with the peer judges

    return qtip.decode(blob).t()


def judge_peer_rows(out: Any, x: Any, weight: Any) -> str:
    """The oracle's verdict on up to 8 rows of ``out = x @ weight`` (bf16), as one phrase."""
    import torch

    from oracle.judge.tolerance import judge_gemm  # lazy: only a run with the peer judges

    m = x.shape[0]
    rows = sorted({round(i * (m - 1) / 7) for i in range(8)})
    verdict = judge_gemm(out[rows], x[rows], weight, compute_dtype=torch.bfloat16)
    state = "pass" if verdict.passed else f"FAIL: {verdict.reason[:160]}"
    return f"judged {len(rows)} row(s) against reference.qtip: {state}"
