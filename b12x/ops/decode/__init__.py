"""The decode op: a whole trellis layer payload to its fp16 weight, as plan / bind / run.

* :mod:`b12x.ops.decode.plan` — :func:`plan_decode`, :func:`allocate_decode_buffers`,
  :func:`bind_decode`, :func:`run_decode` and the graph op :class:`DecodeOp`.
"""

from b12x.ops.decode.plan import (
    BoundDecode,
    DecodeOp,
    DecodePlan,
    allocate_decode_buffers,
    bind_decode,
    plan_decode,
    run_decode,
)

__all__ = [
    "BoundDecode",
    "DecodeOp",
    "DecodePlan",
    "allocate_decode_buffers",
    "bind_decode",
    "plan_decode",
    "run_decode",
]
