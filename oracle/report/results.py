"""Saved failing cases: safetensors + a JSON sidecar, loadable without pickle.

Layout of a saved case ``<results_dir>/<case_id>.{safetensors,json}``
--------------------------------------------------------------------
* ``<case_id>.safetensors`` holds, per tensor name, the **storage span** of the tensor: the
  contiguous 1-D slice of its storage from its storage offset to its last addressable element.
  safetensors stores only contiguous data, so strides are recorded in the sidecar and the view is
  rebuilt with ``as_strided`` on load. Values, dtype, shape and strides (including overlapping
  ones such as stride 0 from ``expand``) therefore survive bit-exactly; the storage offset is
  rebased to 0.
* ``<case_id>.json`` is the sidecar: the caller's ``case_meta`` (seed, variant, metrics,
  verdict, anything JSON-able; dataclasses with ``to_dict`` and plain dataclasses are converted),
  plus ``tensors`` (name -> shape, stride, dtype, device), ``versions`` (python, torch, numpy,
  cutlass), ``git_sha``, ``device``, ``saved_at`` and ``replay`` (the exact command).
  Non-finite floats are written as the strings ``"nan"``, ``"inf"``, ``"-inf"`` (strict JSON).
* The sidecar carries ``schema`` = :data:`CASE_SCHEMA` (``docs/json_schemas.md``); a sidecar
  without one is the pre-versioning layout, read the same way.
* :func:`load_case` refuses (:class:`CaseFileError`, a ``ValueError`` with a one-line message)
  an unreadable or non-JSON sidecar, another schema, missing keys or wrong types, a tensor file
  that is missing, corrupt, or disagrees with the sidecar (dtype, a span too short for the
  recorded shape and strides, tensors the sidecar does not list).
  :func:`oracle.run.replay.check_grid_case` then ties a saved grid case to its id: the id must be a
  grid point, the ``case``/``variant`` meta must name the same case, and the tensors must have
  exactly the names, shapes and dtypes the grid runner saves for it, so an edited id cannot replay
  other data.
* torch is imported lazily (inside the functions that handle tensors), so reports and the
  contracts job can use :func:`jsonable`, :func:`versions` and :func:`git_sha` without it.
* Nothing here pickles: safetensors and json only (``load_case`` never calls ``torch.load``).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import platform
import re
import shlex
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from oracle.arguments import read_json

if TYPE_CHECKING:
    import torch

from importlib.metadata import PackageNotFoundError, version

__all__ = [
    "CASE_SCHEMA",
    "CaseFileError",
    "LoadedCase",
    "case_meta",
    "device_name",
    "git_sha",
    "jsonable",
    "load_case",
    "replay_command",
    "same_bits",
    "save_case",
    "save_failing_case",
    "versions",
]

#: The sidecar's schema tag (docs/json_schemas.md).
CASE_SCHEMA = "oracle.case/1"
_SAFE_ID = re.compile(r"^[A-Za-z0-9_.-]+$")


class CaseFileError(ValueError):
    """A saved case that cannot be loaded or replayed as what it claims; one-line message."""


_REPO_ROOT = Path(__file__).resolve().parents[2]


def git_sha(cwd: Path | None = None) -> str:
    """``git rev-parse HEAD`` of the checkout, or ``"unknown"`` (not a repo, no commit, no git)."""
    try:
        done = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=cwd or _REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    sha = done.stdout.strip()
    return sha if done.returncode == 0 and re.fullmatch(r"[0-9a-f]{40}", sha) else "unknown"


def versions() -> dict[str, str]:
    """Python, torch, numpy and CUTLASS DSL versions ("absent" when not installed), read from
    package metadata so that nothing heavy is imported."""
    out = {"python": platform.python_version()}
    for key, dist in (("torch", "torch"), ("numpy", "numpy"), ("cutlass", "nvidia-cutlass-dsl")):
        try:
            out[key] = version(dist)
        except PackageNotFoundError:
            out[key] = "absent"
    return out


def device_name() -> str:
    """The CUDA device name, or ``"cpu"`` when CUDA (or torch) is unavailable. Without an
    NVIDIA driver (no ``/proc/driver/nvidia``) torch is not even imported."""
    if "torch" not in sys.modules and not Path("/proc/driver/nvidia").exists():
        return "cpu"
    try:
        import torch  # lazy: reports and contracts load without torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_name(torch.cuda.current_device())
    except Exception:  # noqa: BLE001 - a broken driver reads as "cpu"
        pass
    return "cpu"


def jsonable(value: Any) -> Any:
    """Convert to strict-JSON values: dataclasses (``to_dict`` first), tuples, Paths, torch dtypes
    and devices, numpy/torch scalars; non-finite floats become "nan" / "inf" / "-inf"."""
    if hasattr(value, "to_dict") and callable(value.to_dict) and not isinstance(value, type):
        return jsonable(value.to_dict())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return jsonable(dataclasses.asdict(value))
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [jsonable(v) for v in value]
    if isinstance(value, bool) or value is None or isinstance(value, str | int):
        return value
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return value
    if isinstance(value, Path):
        return str(value)
    torch = sys.modules.get("torch")  # a torch object implies torch is already imported
    if torch is not None and isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise TypeError("jsonable: tensors go in the tensors dict, not in case_meta")
        return jsonable(value.item())
    if torch is not None and isinstance(value, torch.dtype | torch.device):
        return str(value)
    if hasattr(value, "item"):  # numpy scalar
        return jsonable(value.item())
    raise TypeError(f"jsonable: cannot write a {type(value).__name__} to JSON")


def _storage_span(t: torch.Tensor) -> int:
    if t.numel() == 0:
        return 0
    return 1 + sum((size - 1) * stride for size, stride in zip(t.shape, t.stride(), strict=True))


def _span_tensor(t: torch.Tensor) -> torch.Tensor:
    """The contiguous 1-D storage slice the view addresses (a copy, on CPU)."""
    span = _storage_span(t)
    flat = t.detach().as_strided((span,), (1,), t.storage_offset())
    return flat.to("cpu").clone()


def case_meta(case: Any, verdict: Any = None, **extra: Any) -> dict[str, Any]:
    """Sidecar metadata for a grid case: ``case_id``, ``seed``, ``variant`` (name), the case
    itself, and the verdict's ``passed``/``reasons``/``metrics`` when given, plus ``extra``."""
    meta: dict[str, Any] = {
        "case_id": case.case_id,
        "seed": case.seed,
        "variant": case.variant.name,
        "case": case,
    }
    if verdict is not None:
        meta["verdict"] = verdict
        meta["metrics"] = verdict.metrics
    meta.update(extra)
    return meta


def save_failing_case(
    case: Any,
    tensors: Mapping[str, torch.Tensor],
    results_dir: str | Path,
    verdict: Any = None,
    *,
    echo: Any = print,
    **extra: Any,
) -> Path:
    """Save a grid case with :func:`save_case` and ``echo`` the exact replay command."""
    path = save_case(case_meta(case, verdict, **extra), tensors, results_dir)
    if echo is not None:
        echo(f"saved failing case {case.case_id}; replay with: {replay_command(path)}")
    return path


def same_bits(got: Any, want: Any) -> bool:
    """A saved tensor is the one its case regenerates: same dtype, shape and bytes (NaN payloads
    and signed zeros included, which ``torch.equal`` on values would not tell apart)."""
    import torch  # lazy: reports and contracts load without torch

    if got.dtype != want.dtype or tuple(got.shape) != tuple(want.shape):
        return False
    return torch.equal(got.contiguous().view(torch.uint8), want.contiguous().view(torch.uint8))


def replay_command(path: str | Path) -> str:
    """The exact command that replays a saved case."""
    return f"python -m oracle replay {shlex.quote(str(path))}"


def save_case(
    case_meta: Mapping[str, Any], tensors: Mapping[str, torch.Tensor], results_dir: str | Path
) -> Path:
    """Write ``<case_id>.safetensors`` and ``<case_id>.json`` under ``results_dir``; return the
    sidecar path. ``case_meta["case_id"]`` must be filename-safe (``[A-Za-z0-9_.-]+``)."""
    # lazy: reports and contracts load without torch; safetensors.torch loads torch
    import torch
    from safetensors.torch import save_file

    if not isinstance(case_meta, Mapping):
        raise TypeError(f"save_case: case_meta must be a mapping, got {type(case_meta).__name__}")
    case_id = case_meta.get("case_id")
    if not isinstance(case_id, str) or not _SAFE_ID.match(case_id):
        raise ValueError(f"save_case: case_meta['case_id'] must be filename-safe, got {case_id!r}")
    if not isinstance(tensors, Mapping) or not tensors:
        raise ValueError("save_case: tensors must be a non-empty mapping of name -> Tensor")
    for name, t in tensors.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"save_case: tensor names must be non-empty strings, got {name!r}")
        if not isinstance(t, torch.Tensor):
            raise TypeError(
                f"save_case: tensors[{name!r}] must be a Tensor, got {type(t).__name__}"
            )
    meta = jsonable(dict(case_meta))  # fail on non-JSON meta before writing anything
    layout = {
        name: {
            "shape": list(t.shape),
            "stride": list(t.stride()),
            "dtype": str(t.dtype).removeprefix("torch."),
            "device": str(t.device),
            "contiguous": t.is_contiguous(),
        }
        for name, t in tensors.items()
    }
    out_dir = Path(results_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tensor_path = out_dir / f"{case_id}.safetensors"
    json_path = out_dir / f"{case_id}.json"
    save_file({name: _span_tensor(t) for name, t in tensors.items()}, str(tensor_path))
    meta.update(
        schema=CASE_SCHEMA,
        tensors=layout,
        tensor_file=tensor_path.name,
        versions=versions(),
        git_sha=git_sha(),
        device=device_name(),
        saved_at=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        replay=replay_command(json_path),
    )
    json_path.write_text(json.dumps(meta, indent=2, sort_keys=True, allow_nan=False) + "\n")
    return json_path


@dataclasses.dataclass(frozen=True)
class LoadedCase:
    """A saved case: its sidecar ``meta``, its ``tensors`` (original strides), the sidecar path."""

    meta: dict[str, Any]
    tensors: dict[str, torch.Tensor]
    path: Path

    @property
    def case(self) -> Any:
        """The grid :class:`~oracle.cases.grids.Case` this file was saved for (from its case id), or
        None when the sidecar names no grid case."""
        # lazy: reports and contracts load without torch
        from oracle.cases.grids import parse_case_id

        case_id = (self.meta.get("case") or {}).get("case_id")
        return parse_case_id(case_id) if isinstance(case_id, str) else None


def _dtype_from_name(name: Any, where: str) -> torch.dtype:
    import torch  # lazy: reports and contracts load without torch

    dtype = getattr(torch, name, None) if isinstance(name, str) else None
    if not isinstance(dtype, torch.dtype):
        raise CaseFileError(f"{where}: unknown dtype {name!r} in the sidecar")
    return dtype


def _int_list(value: Any, where: str) -> list[int]:
    if not isinstance(value, list) or not all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value
    ):
        raise CaseFileError(f"{where} must be a list of non-negative ints, got {value!r}")
    return value


def _read_sidecar(json_path: Path) -> dict[str, Any]:
    try:
        meta = read_json(str(json_path))
    except ValueError as exc:
        raise CaseFileError(str(exc)) from None
    if not isinstance(meta, dict):
        raise CaseFileError(f"{json_path}: expected a JSON object, got {type(meta).__name__}")
    schema = meta.get("schema", CASE_SCHEMA)
    if schema != CASE_SCHEMA:
        hint = {
            "oracle.report": "a check report: render it with `python -m oracle report`",
            "oracle.mutate": "a mutation report: `python -m oracle mutate --from-json`",
        }.get(str(schema).split("/")[0], "not a saved case")
        raise CaseFileError(f"{json_path}: schema {schema!r} is {hint} (want {CASE_SCHEMA!r})")
    return meta


def load_case(path: str | Path) -> LoadedCase:
    """Load a case saved by :func:`save_case`; ``path`` may be the .json, the .safetensors, or
    the path without suffix. Tensors are rebuilt with their recorded shapes and strides.
    Raises :class:`CaseFileError` for anything that is not such a case (module docstring)."""
    # lazy: reports and contracts load without torch; safetensors.torch loads torch
    import torch  # noqa: F401 - safetensors.torch needs it; kept explicit
    from safetensors.torch import load_file

    if not isinstance(path, str | Path) or not str(path):
        raise CaseFileError(f"case path: expected a file path, got {path!r}")
    base = Path(path)
    if base.suffix in (".json", ".safetensors"):
        base = base.with_suffix("")
    json_path = base.with_name(base.name + ".json")
    if not json_path.is_file():
        raise CaseFileError(f"no saved case at {str(path)!r}: no sidecar {json_path}")
    meta = _read_sidecar(json_path)
    case_id = meta.get("case_id")
    if not isinstance(case_id, str) or not _SAFE_ID.match(case_id):
        raise CaseFileError(
            f"{json_path}: 'case_id' must be a filename-safe string, got {case_id!r}"
        )
    layout = meta.get("tensors")
    if not isinstance(layout, dict) or not layout:
        raise CaseFileError(f"{json_path}: 'tensors' must be a non-empty object of name -> layout")
    tensor_file = meta.get("tensor_file", base.name + ".safetensors")
    if not isinstance(tensor_file, str) or Path(tensor_file).name != tensor_file:
        raise CaseFileError(f"{json_path}: 'tensor_file' must be a file name, got {tensor_file!r}")
    tensor_path = json_path.with_name(tensor_file)
    if not tensor_path.is_file():
        raise CaseFileError(f"{json_path}: tensor file {tensor_path} is missing")
    try:
        spans = load_file(str(tensor_path))
    except Exception as exc:  # noqa: BLE001 - safetensors raises its own error types
        message = str(exc).splitlines()[0] if str(exc) else ""
        raise CaseFileError(
            f"{tensor_path}: corrupt tensor file ({type(exc).__name__}: {message})"
        ) from None
    extra = sorted(set(spans) - set(layout))
    if extra:
        raise CaseFileError(f"{tensor_path} holds tensors the sidecar does not list: {extra}")
    tensors: dict[str, torch.Tensor] = {}
    for name, info in layout.items():
        where = f"{json_path}: tensor {name!r}"
        if not isinstance(info, dict):
            raise CaseFileError(f"{where}: layout must be an object, got {info!r}")
        if name not in spans:
            raise CaseFileError(f"{where} is missing from {tensor_path}")
        shape = _int_list(info.get("shape"), f"{where}: shape")
        stride = _int_list(info.get("stride"), f"{where}: stride")
        if len(shape) != len(stride):
            raise CaseFileError(f"{where}: shape {shape} and stride {stride} differ in length")
        dtype = _dtype_from_name(info.get("dtype"), where)
        span = spans[name]
        if span.dtype != dtype:
            raise CaseFileError(f"{where} is {span.dtype} in the file, the sidecar says {dtype}")
        need = 0 if 0 in shape else 1 + sum((n - 1) * s for n, s in zip(shape, stride, strict=True))
        if span.dim() != 1 or span.numel() < need:
            raise CaseFileError(
                f"{where}: the file holds {span.numel()} elements, shape {shape} with stride "
                f"{stride} needs {need}"
            )
        tensors[name] = span.as_strided(tuple(shape), tuple(stride), 0)
    return LoadedCase(meta=meta, tensors=tensors, path=json_path)
