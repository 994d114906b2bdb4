"""What every benchmark script shares: the machine it ran on, strict JSON output, timestamped log lines, a plot backend.

* ``machine_info(versions=..., threadpools=...)``: platform, Python, CPUs (all and usable), memory, load
  average and the versions of NumPy, Dask, distributed and dscar, plus any other modules named
  (``"unavailable: ..."`` when one cannot be imported) and, with ``threadpools=True``, the BLAS / OpenMP
  environment variables and ``threadpoolctl``'s view of the thread pools.
* ``other_busy()`` / ``busy_note()``: the processes outside this one's tree that used a core's tenth or
  more in a short window (another benchmark, a helper's tests): the timing scripts print them before they
  measure, and ``machine_info`` records them, so a figure taken beside them says so.
* ``speed_probe()`` / ``walk_probe()``: milliseconds of a fixed pure-Python loop on a few cached objects,
  and of a walk over many objects in a shuffled order, whose reads miss the caches as the simulator's
  at W = 4,096 do (lower is faster). This VM's speed swings
  from hour to hour (the simulator's ssp+backup at W = 4,096 read 18.4-19.7 us one night and 22.6-23.4 us
  on the same code another), so ``machine_info`` records the probe beside every figure, and a figure
  can be set against the phase it was taken in.
* ``write_json(path, obj)``: NaN / inf become ``null`` (strict JSON), NumPy scalars and arrays plain numbers
  and lists, anything else its ``str``; prints ``json: PATH``.
* ``log(t0, msg)``: ``[  12.3s] msg`` on stderr, seconds since ``t0`` (a ``time.perf_counter()``).
* ``pyplot()``: ``matplotlib.pyplot`` on the non-interactive Agg backend (the scripts only write PNGs).
"""
from __future__ import annotations

import json
import math
import os
import platform
import sys
import time
from typing import Any, Iterable

import dask.config
import numpy as np

#: the benchmarks measure what a given number of workers does (a kill of worker N, the costs of a clock on
#: W workers, dscar on 2 workers against a peer on 2 threads): every worker stays active, unless the
#: environment or the script says otherwise (``bench.scaling`` compares under "auto", the engine's default)
dask.config.update_defaults({"dscar": {"active-workers": "all"}})

BLAS_ENV_PREFIXES = ("OPENBLAS", "OMP_", "MKL_")


def spawn_serving(module: str, *args: str, env: dict[str, str] | None = None,
                  stdin: int | None = None) -> "subprocess.Popen":
    """``python -m <module> --serve ARGS`` from the repository root, this checkout first on its path, output
    dropped: a harness process of ``bench.hollow`` or ``bench.barrier``; ``env``: variables of its own;
    ``stdin``: as ``subprocess.Popen`` takes it (``PIPE``: the harness writes to it)."""
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    full = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]), **(env or {})}
    return subprocess.Popen([sys.executable, "-m", module, "--serve", *args], cwd=root, env=full, stdin=stdin,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def load_average() -> tuple[float, float, float] | None:
    """``os.getloadavg()``, or None where the platform has none."""
    try:
        return os.getloadavg()
    except (AttributeError, OSError):
        return None


#: a process counts as busy (``other_busy``) from this share of one core over the window
BUSY_SHARE = 0.1


def _proc_times() -> dict[int, tuple[int, float, str]]:
    """pid -> (parent pid, CPU seconds so far, nice) of every process ``/proc`` shows (Linux; {} elsewhere)."""
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    out: dict[int, tuple[int, float, str]] = {}
    try:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return out
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        out[pid] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / tick, fields[16])
    return out


def other_busy(window_s: float = 0.3) -> list[dict[str, Any]]:
    """The processes outside this one and its descendants that used ``BUSY_SHARE`` of a core or more over
    ``window_s`` seconds, busiest first: pid, nice, CPU share of one core, command line (cut)."""
    before = _proc_times()
    time.sleep(window_s)
    after = _proc_times()
    ours = {os.getpid()}
    for _ in range(8):  # (descendants by parent links: a forkserver's children are grandchildren)
        ours |= {pid for pid, (ppid, _, _) in after.items() if ppid in ours}
    busy = []
    for pid, (_, cpu, nice) in after.items():
        if pid in ours or pid not in before:
            continue
        share = (cpu - before[pid][1]) / window_s
        if share >= BUSY_SHARE:
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
            except OSError:
                cmd = "?"
            busy.append({"pid": pid, "nice": int(nice), "cpu_share": round(share, 2), "cmd": cmd[:120]})
    return sorted(busy, key=lambda b: -b["cpu_share"])


def busy_note(busy: list[dict[str, Any]] | None = None) -> str:
    """One line naming the other busy processes (``other_busy``), or "" where there are none."""
    busy = other_busy() if busy is None else busy
    if not busy:
        return ""
    return ("other processes busy while measuring (figures may read high): "
            + "; ".join(f"pid {b['pid']} (nice {b['nice']}, {100 * b['cpu_share']:.0f}% of a core) {b['cmd']}"
                        for b in busy))


#: the last ``warn_busy``'s finding: ``machine_info`` records it, not a second sample of its own
_warned: list[dict[str, Any]] | None = None


def warn_busy() -> list[dict[str, Any]]:
    """``other_busy``, said on stdout where there are any: a timing script calls it before it measures."""
    global _warned
    busy = _warned = other_busy()
    if busy:
        print(busy_note(busy), flush=True)
    return busy


def _probe_work(n: int) -> int:
    table: dict[int, int] = {}
    total = 0
    for i in range(n):
        table[i & 1023] = i
        total += table.get(i & 511, 0) & 7
    return total


def _median_ms(work, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        work()
        times.append((time.perf_counter() - t) * 1e3)
    return sorted(times)[len(times) // 2]


def speed_probe(repeats: int = 7, n: int = 20_000) -> float:
    """Milliseconds of a fixed pure-Python loop (dict writes and reads, integer arithmetic: what the
    engine's pure core does) on objects that stay in the caches, the median of ``repeats`` runs."""
    return _median_ms(lambda: _probe_work(n), repeats)


class _Node:
    __slots__ = ("value", "next")


def walk_probe(repeats: int = 5, n: int = 200_000) -> float:
    """Milliseconds of a walk over ``n`` small objects linked in a shuffled order (each read likely a
    cache miss, as a decision's at W = 4,096), the median of ``repeats`` walks."""
    import random

    nodes = [_Node() for _ in range(n)]
    order = list(range(n))
    random.Random(0).shuffle(order)
    for a, b in zip(order, order[1:] + order[:1]):
        nodes[a].value, nodes[a].next = a, nodes[b]

    def walk() -> int:
        node, total = nodes[0], 0
        for _ in range(n):
            total += node.value
            node = node.next
        return total

    return _median_ms(walk, repeats)


def module_version(name: str) -> str:
    try:
        return __import__(name).__version__
    except Exception as e:  # noqa: BLE001 - informational only
        return f"unavailable: {e}"


def machine_info(versions: Iterable[str] = (), threadpools: bool = False) -> dict[str, Any]:
    """The machine and software a benchmark ran on (JSON-able): see the module docstring."""
    import dask
    import distributed

    import dscar

    info: dict[str, Any] = {
        "platform": platform.platform(), "python": sys.version.split()[0], "machine": platform.machine(),
        "cpu_count": os.cpu_count(), "numpy": np.__version__, "dask": dask.__version__,
        "distributed": distributed.__version__, "dscar": dscar.__version__,
    }
    for name in versions:
        info[name] = module_version(name)
    if threadpools:
        import threadpoolctl

        info["env"] = {k: v for k, v in os.environ.items() if k.startswith(BLAS_ENV_PREFIXES)}
        info["threadpools"] = threadpoolctl.threadpool_info()
    try:
        info["cpus_usable"] = len(os.sched_getaffinity(0))
    except AttributeError:
        pass
    try:
        with open("/proc/meminfo") as f:
            info["mem_total_kb"] = int(f.readline().split()[1])
    except (OSError, ValueError, IndexError):
        pass
    load = load_average()
    if load is not None:
        info["loadavg"] = load
    info["other_busy"] = other_busy() if _warned is None else _warned  # (what was busy as the measuring began)
    info["speed_probe_ms"] = round(speed_probe(), 3)
    info["walk_probe_ms"] = round(walk_probe(), 3)
    return info


def usable_cpus(info: dict[str, Any]) -> int | None:
    """The CPUs this process may run on, from ``machine_info``'s figures."""
    return info.get("cpus_usable", info["cpu_count"])


def clean(o):
    """NaN / inf -> None (recursively; dict keys as strings) so the file is strict JSON."""
    if isinstance(o, (float, np.floating)):
        return float(o) if math.isfinite(o) else None
    if isinstance(o, dict):
        return {str(k): clean(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [clean(v) for v in o]
    if isinstance(o, np.ndarray):
        return clean(o.tolist())
    return o


def json_default(o):
    """``json.dump``'s fallback: NumPy scalars as plain numbers, arrays as lists, anything else its ``str``."""
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    return str(o)


def write_json(path: str, obj: Any) -> None:
    """``obj`` as strict JSON (see ``clean`` and ``json_default``) to ``path``; says where."""
    with open(path, "w") as f:
        json.dump(clean(obj), f, indent=1, default=json_default, allow_nan=False)
    print(f"json: {path}")


def log(t0: float, msg: str) -> None:
    """A progress line on stderr: seconds since ``t0`` (``time.perf_counter()``), then ``msg``."""
    print(f"[{time.perf_counter() - t0:6.1f}s] {msg}", file=sys.stderr, flush=True)


def pyplot():
    """``matplotlib.pyplot`` on the Agg backend (files only, no display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
