"""Programmatic dependent launch (PDL): each b12x kernel's launch attribute and first statement.

Why: a b12x step is a chain of short launches on one stream; without PDL every boundary pays the
launch latency with the SMs idle. With PDL (sm_90 and newer) the next grid is launched while the
previous one drains; its CTAs become resident and wait in their first statement.

The rule every kernel keeps:
* :func:`launch_options` is spliced into every ``.launch(...)``: the PDL attribute (``use_pdl``)
  when :func:`active` holds at trace time, nothing otherwise.
* :func:`await_upstream` is the **first statement of every kernel body**, in every thread and before
  any branch, global read or global write. It emits ``griddepcontrol.wait`` (returns once the
  upstream grid has completed and its writes are visible; a no-op for a launch without the
  attribute) and then ``griddepcontrol.launch_dependents`` (the downstream grid may be launched once
  every CTA of this one has executed it or exited, i.e. once this grid is wholly resident, so an
  early downstream CTA never takes a slot this grid still needs).
* Ordering stays that of a plain stream, transitively: a grid completes only when each of its CTAs
  has passed its wait, i.e. after its upstream grid completed. A kernel that is not ours (a torch
  op, cuBLAS) launched between two of ours is ordered as usual, and one of ours after it waits for
  it. Early residency cannot deadlock: the only kernel whose CTAs wait on other CTAs of the same
  grid (the stream-K GEMM, :mod:`b12x.kernels.stream_k`) launches at most one CTA per SM and waits
  only on CTAs that become resident once the upstream grid drains.
* Both halves follow the same switch, so no kernel carries the attribute without the wait:
  :func:`active` is true for a compile target of sm_90 or newer (the instructions do not exist
  before) unless ``B12X_DEPENDENT_LAUNCH=0`` (read once per process; it is part of the compile
  cache's toolchain record, :func:`b12x.runtime.disk_store.toolchain`, so a kernel compiled under
  one setting is never loaded under the other).

Checked on the CPU by ``tests/b12x/test_dependent_launch.py`` (the first statement, the spliced
options, and in compiled PTX no global access before the wait).
"""

from __future__ import annotations

import os

import cutlass.cute as cute

__all__ = ["ENV", "MIN_MAJOR", "active", "await_upstream", "enabled", "launch_options"]

#: The switch (``0`` turns PDL off for every kernel compiled in this process).
ENV = "B12X_DEPENDENT_LAUNCH"
#: The first compute capability with ``griddepcontrol`` and the launch attribute.
MIN_MAJOR = 9

_ENABLED = os.environ.get(ENV, "1").strip() not in ("0", "false", "off", "no")


def enabled() -> bool:
    """The process-wide switch (:data:`ENV`; on unless it says ``0``/``false``/``off``/``no``)."""
    return _ENABLED


def _target_major() -> int:
    """Major compute capability of the compile target being traced (``--gpu-arch`` first, then
    ``CUTE_DSL_ARCH``)."""
    from cutlass.base_dsl import BaseDSL

    return int(BaseDSL._get_dsl().get_arch_enum().major)


def active() -> bool:
    """True while tracing for a target with PDL (sm_90+) and the switch is on."""
    return _ENABLED and _target_major() >= MIN_MAJOR


def launch_options() -> dict:
    """Keyword arguments for ``.launch(...)``: ``{"use_pdl": True}`` when :func:`active`."""
    return {"use_pdl": True} if active() else {}


def await_upstream() -> None:
    """The first statement of every kernel body (module docstring); emits nothing when PDL is not
    active for the target."""
    if active():
        cute.arch.griddepcontrol_wait()
        cute.arch.griddepcontrol_launch_dependents()
