"""One validation layer for engine, estimator and CLI options (pure: no Dask here).

Every public option of dscar goes through these checks, so a bad value is refused
the same way wherever it enters: an ``InvalidInputError`` naming the option, what
it must be and what it got, before any cluster starts. Integers are
``numbers.Integral`` (NumPy integers included; ``bool``, floats such as ``2.5``
and strings such as ``"4"`` are refused), numbers are ``numbers.Real`` (no
strings, no ``bool``).
"""
from __future__ import annotations

import math
import numbers
import posixpath
from typing import Any, Iterable, Mapping, Sequence

from .errors import InvalidInputError


def _bound(v: float, minimum: float | None, maximum: float | None, strict_min: bool) -> bool:
    if minimum is not None and (v < minimum or (strict_min and v == minimum)):
        return False
    return maximum is None or v <= maximum


def _range_text(minimum: float | None, maximum: float | None, strict_min: bool) -> str:
    parts = []
    if minimum is not None:
        parts.append(f"{'>' if strict_min else '>='} {minimum:g}")
    if maximum is not None:
        parts.append(f"<= {maximum:g}")
    return " and ".join(parts)


def _want(what: str, minimum: float | None, maximum: float | None, strict_min: bool, optional: bool) -> str:
    rng = _range_text(minimum, maximum, strict_min)
    return f"{what}{' ' + rng if rng else ''}{' or None' if optional else ''}"


def integer(name: str, v: Any, minimum: int | None = None, maximum: int | None = None, *,
            optional: bool = False) -> int | None:
    """``v`` as an ``int``, or ``InvalidInputError``: it must be an integer (not a bool, a
    float or a string) in ``[minimum, maximum]``. ``optional``: ``None`` passes through."""
    if v is None and optional:
        return None
    want = _want("an integer", minimum, maximum, False, optional)
    if isinstance(v, bool) or not isinstance(v, numbers.Integral):
        raise InvalidInputError(f"{name} must be {want}, got {v!r} ({type(v).__name__})")
    if not _bound(int(v), minimum, maximum, False):
        raise InvalidInputError(f"{name} must be {want}, got {v!r}")
    return int(v)


def number(name: str, v: Any, minimum: float | None = None, maximum: float | None = None, *,
           strict_min: bool = False, optional: bool = False) -> float | None:
    """``v`` as a finite ``float``, or ``InvalidInputError``: a real number (not a bool or a
    string) in range (``strict_min``: strictly above ``minimum``)."""
    if v is None and optional:
        return None
    want = _want("a finite number", minimum, maximum, strict_min, optional)
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        raise InvalidInputError(f"{name} must be {want}, got {v!r} ({type(v).__name__})")
    f = float(v)
    if not math.isfinite(f) or not _bound(f, minimum, maximum, strict_min):
        raise InvalidInputError(f"{name} must be {want}, got {v!r}")
    return f


def positive(name: str, v: Any, *, allow_zero: bool = False) -> float:
    """A finite number > 0 (``allow_zero``: >= 0)."""
    return number(name, v, 0.0, strict_min=not allow_zero)


def boolean(name: str, v: Any, *, optional: bool = False) -> bool | None:
    """``True`` / ``False`` (NumPy bools too); ``optional``: ``None`` passes through."""
    if v is None and optional:
        return None
    if isinstance(v, bool) or type(v).__name__ == "bool_":
        return bool(v)
    raise InvalidInputError(f"{name} must be True or False{' or None' if optional else ''}, got {v!r}")


def choice(name: str, v: Any, choices: Sequence[Any]) -> Any:
    """One of ``choices`` (compared by equality, strings by value)."""
    try:
        ok = v in choices
    except TypeError:
        ok = False
    if not ok:
        raise InvalidInputError(f"{name} must be one of {', '.join(repr(c) for c in choices)}; got {v!r}")
    return v


def instance(name: str, v: Any, types: type | tuple[type, ...], what: str) -> Any:
    """``v`` if it is one of ``types``; ``what`` says in words what is expected."""
    if not isinstance(v, types):
        raise InvalidInputError(f"{name} must be {what}, not {type(v).__name__} ({v!r:.80})")
    return v


# ------------------------------------------------------------------ engine options
def fit_options(*, n_workers: Any, n_shards: Any, tol: Any, max_clocks: Any, max_failures: Any,
                progress: Any, sharding: Any, resume: Any) -> dict[str, Any]:
    """The checked engine options of ``dscar.fit`` (``tol`` may be None: the model's)."""
    return {
        "n_workers": integer("n_workers", n_workers, 1),
        "n_shards": integer("n_shards", n_shards, 1, optional=True),
        "tol": number("tol", tol, 0.0, strict_min=True, optional=True),
        "max_clocks": integer("max_clocks", max_clocks, 1),
        "max_failures": integer("max_failures", max_failures, 1),
        "progress": boolean("progress", progress, optional=True),
        "sharding": choice("sharding", sharding, ("dynamic", "static")),
        "resume": boolean("resume", resume),
    }


def consistency(consistency: Any, staleness: Any, max_staleness: int, algorithm: str,
                policies: Iterable[Any]) -> tuple[str, int]:
    """``consistency`` ("bsp" or "ssp") and its staleness: under SSP at most what the algorithm
    declares it converges with (``Algorithm.max_staleness``; the default), 0 under BSP."""
    consistency = choice("consistency", consistency, ("bsp", "ssp"))
    if consistency == "bsp":
        if staleness not in (None, 0):
            raise InvalidInputError(f"staleness={staleness!r} needs consistency='ssp' (BSP clocks are barriers)")
        return consistency, 0
    staleness = integer("staleness", max_staleness if staleness is None else staleness, 0)
    if staleness > max_staleness:
        raise InvalidInputError(
            f"staleness {staleness} is more than {algorithm} declares it converges with (max_staleness = "
            f"{max_staleness}; bench.staleness measures it)")
    if any(getattr(p, "name", None) == "restart" for p in policies):
        raise InvalidInputError("the restart policy restarts a worker between clocks, and under consistency='ssp' "
                                "clocks overlap: use 'backup' or 'adaptive'")
    return consistency, staleness


def fault_clocks(faults: Iterable[Any], max_clocks: int) -> None:
    """Every fault's clocks are integers that can fire within ``max_clocks`` clocks.

    A fault aimed at clock 50 of a 3-clock run would be accepted and never fire:
    the experiment it belongs to would silently measure nothing.
    """
    for f in faults:
        if not all(hasattr(f, a) for a in ("kind", "worker", "clock")):
            raise InvalidInputError(f"faults must be dscar.faults.Fault objects (faults.slow / kill / hang / lose), "
                                    f"not {type(f).__name__}")
        kind = f.kind
        clock = integer(f"{kind} fault clock", getattr(f, "clock", None), 1)
        integer(f"{kind} fault until", getattr(f, "until", None), clock, optional=True)
        if kind == "slow":
            number("slowdown factor", f.factor)  # its range: faults.resolve
        if clock > max_clocks:
            raise InvalidInputError(
                f"{kind} fault aimed at clock {clock}, but the run stops at max_clocks={max_clocks}: "
                "it would never fire")


# ------------------------------------------------------------------ memory
def table_bytes(n_rows: int, trailing: Sequence[int], dtype: str) -> int:
    """Bytes of a whole table (``n_rows`` rows of shape ``trailing``)."""
    import numpy as np

    return int(n_rows) * math.prod(int(t) for t in trailing) * np.dtype(dtype).itemsize


def _gib(n: float) -> str:
    return f"{n / 2**30:.3g} GiB" if n >= 2**30 else f"{n / 2**20:.3g} MiB"


def check_table_memory(tables: Iterable[Any], n_workers: int, memory_limit: float | None,
                       fraction: float = 0.8) -> None:
    """Refuse tables that cannot fit in the workers' memory, before anything is allocated.

    ``tables``: ``TableSpec``-like objects (``name``, ``n_rows``, ``trailing``, ``dtype``,
    ``n_parts``). Each worker holds its share of every table's partitions (at least one
    whole partition of each) and a shard step may pull a whole table, so both the
    largest table and a worker's share of all tables must stay below ``fraction`` of
    ``memory_limit`` (bytes per worker; ``None`` or 0: no limit known, nothing checked).
    """
    if not memory_limit:
        return
    budget = fraction * float(memory_limit)
    share = 0.0
    for t in tables:
        total = table_bytes(t.n_rows, t.trailing, t.dtype)
        parts = max(1, int(t.n_parts or n_workers))
        share += total * math.ceil(parts / max(1, n_workers)) / parts
        if total > budget:
            raise InvalidInputError(
                f"table {t.name!r} ({t.n_rows} x {tuple(t.trailing) or 1} {t.dtype}) needs {_gib(total)}, "
                f"more than {fraction:.0%} of a worker's memory limit ({_gib(memory_limit)}): "
                "shrink the model (e.g. fewer topics, a smaller rank) or use workers with more memory")
    if share > budget:
        raise InvalidInputError(
            f"the model's tables need {_gib(share)} per worker on {n_workers} worker(s), more than "
            f"{fraction:.0%} of a worker's memory limit ({_gib(memory_limit)}): use more or larger workers")


# ------------------------------------------------------------------ checkpoints and resume
def confined(path: str, root: str) -> bool:
    """Whether ``path`` (as a manifest names it) lies inside the store ``root``.

    Manifests are plain JSON a user can edit or a store can hold from elsewhere;
    workers must never be sent to read a file outside the store.
    """
    if not isinstance(path, str) or not path:
        return False
    norm = posixpath.normpath(path.replace("\\", "/"))
    base = posixpath.normpath(root.replace("\\", "/")).rstrip("/")
    if ".." in norm.split("/"):
        return False
    for p in (norm, norm.lstrip("/")):
        for b in (base, base.lstrip("/")):
            if p.startswith(b + "/"):
                return True
    return False


def param_differences(got: Mapping[str, Any], want: Mapping[str, Any], ignore: Iterable[str] = ()) -> list[str]:
    """Names of the hyperparameters that differ (``ignore``: keys not compared), with both values."""
    skip = set(ignore)
    out = []
    for k in sorted(set(got) | set(want)):
        if k in skip:
            continue
        a, b = got.get(k, "<absent>"), want.get(k, "<absent>")
        if a != b:
            out.append(f"{k}: checkpoint {a!r}, this fit {b!r}")
    return out


# ------------------------------------------------------------------ command-line flags
def arg_int(minimum: int | None = None, maximum: int | None = None):
    """An argparse ``type`` for an integer flag in range: a bad value is a one-line usage error."""
    import argparse

    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if not _bound(v, minimum, maximum, False):
            raise argparse.ArgumentTypeError(f"must be {_range_text(minimum, maximum, False)}, got {v}")
        return v

    parse.__name__ = "integer"
    return parse


def arg_float(minimum: float | None = None, maximum: float | None = None, *, strict_min: bool = False):
    """An argparse ``type`` for a finite number flag in range."""
    import argparse

    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not math.isfinite(v) or not _bound(v, minimum, maximum, strict_min):
            raise argparse.ArgumentTypeError(
                f"must be a finite number {_range_text(minimum, maximum, strict_min)}".rstrip() + f", got {text}")
        return v

    parse.__name__ = "number"
    return parse
