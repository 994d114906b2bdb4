import contextlib
import inspect
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import dask.config
import numpy as np
import pytest

import dscar

from dscar import Algorithm, TableSpec

#: the suite's many tests that kill or slow worker N of a tiny 2-4-worker fit need every worker active:
#: ``dscar.active-workers`` "all" here and in the scripts the tests start (an environment variable
#: they inherit); the active-set tests (tests/test_active_set*.py) set "auto" themselves
os.environ["DASK_DSCAR__ACTIVE_WORKERS"] = "all"
dask.config.set({"dscar.active-workers": "all"})

#: the test tiers, by what a test needs (registered in pyproject.toml; ``python -m pytest -m pure``)
TIERS = ("pure", "cluster", "processes", "bench")
#: in a test's own source, signs that it starts worker processes (a cluster, or a script that starts one)
PROCESS_SIGNS = ("procs", "subprocess", "SIGSTOP", "SIGKILL", "os.kill", "processes=True")
#: signs that it starts an in-process cluster or fits on one
CLUSTER_SIGNS = ("inproc", "Cluster(", "LocalCluster", "Client(", "connect(", "fit(", "Scheduler(")


def tier_of(item: pytest.Item) -> str:
    """The tier of a test without an explicit one: ``bench`` for the benchmark scripts' tests, else
    what its fixtures and its own source use (worker processes, then an in-process cluster), else
    ``pure``. A pure test that starts a scheduler anyway fails (``_pure_tests_start_no_scheduler``)."""
    if item.path.name.startswith("test_bench_"):
        return "bench"
    fixtures = set(getattr(item, "fixturenames", ()))
    module = getattr(item, "module", None)
    source = _source_with_helpers(getattr(item, "function", None), module)
    source += "".join(_source_with_helpers(f, module) for f in _own_fixtures(item))
    if "procs" in fixtures or any(sign in source for sign in PROCESS_SIGNS):
        return "processes"
    if "Cluster(" in source and "processes=False" not in source:
        return "processes"  # dscar.Cluster starts worker processes unless told not to
    if "inproc" in fixtures or any(sign in source for sign in CLUSTER_SIGNS):
        return "cluster"
    return "pure"


def _own_fixtures(item: pytest.Item) -> list:
    """The functions of the fixtures ``item`` uses that are defined in a test module (not
    ``conftest.py``, whose ``procs`` and ``inproc`` are tiered by name): a test whose module
    fixture fits on a cluster is a cluster test."""
    defs = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
    here = Path(__file__).parent
    return [d.func for ds in defs.values() for d in ds
            if (inspect.getsourcefile(d.func) or "").startswith(str(here / "test_"))]


def _source_with_helpers(function, module, depth: int = 2) -> str:
    """``function``'s source and that of the module's functions it calls, ``depth`` calls deep
    (a test that fits through a helper of its module is a cluster test)."""
    try:
        source = inspect.getsource(function)
    except (OSError, TypeError):
        return ""
    if depth and module is not None:
        for name in getattr(getattr(function, "__code__", None), "co_names", ()):
            helper = getattr(module, name, None)
            if inspect.isfunction(helper) and helper.__module__ == module.__name__ and helper is not function:
                source += _source_with_helpers(helper, module, depth - 1)
    return source


def pytest_collection_modifyitems(config, items):
    """Every test gets one tier marker: its own (a decorator or a module's ``pytestmark``) or
    ``tier_of``'s. Inferred rather than written on each of some 400 tests: a new test lands in the
    right tier by what it uses, and the pure tier's guard catches a wrong guess."""
    for item in items:
        if not any(item.get_closest_marker(t) for t in TIERS):
            item.add_marker(getattr(pytest.mark, tier_of(item)))


@pytest.fixture(autouse=True)
def _pure_tests_start_no_scheduler(request, monkeypatch):
    """The pure tier is the one a developer runs in seconds: a test in it that starts a Dask
    scheduler fails at once and says where it belongs."""
    if request.node.get_closest_marker("pure") is None:
        return
    from distributed import Scheduler

    def refuse(*args, **kwargs):
        raise RuntimeError(f"{request.node.nodeid} is in the pure tier but starts a Dask scheduler: "
                           "mark it pytest.mark.cluster (or processes)")

    monkeypatch.setattr(Scheduler, "__init__", refuse)


def stop_processes(procs: list) -> None:
    """Stop the ``subprocess.Popen`` processes a test started (a scheduler and its workers), the
    last started first; kill those that do not exit in 20 s."""
    for p in reversed(procs):
        p.terminate()
    for p in procs:
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()


class RowCounter(Algorithm):
    """Test model: every clock, each data row adds 1 to its own counter.

    ``count`` (a param table) must equal the number of clocks on every row, and
    ``seen`` (this clock's reduction) must be exactly 1 on every row: any lost,
    duplicated or half-applied shard update shows.
    """

    name = "rowcounter"
    data_names = ("row",)

    def __init__(self, n_parts=None, sleep=0.0, slow_shards=()):
        self.n_parts = n_parts
        self.sleep = sleep
        self.slow_shards = tuple(slow_shards)  # only these sleep, when given

    def tables(self, meta):
        return [
            TableSpec("count", meta.n_rows, n_parts=self.n_parts),
            TableSpec("seen", meta.n_rows, kind="reduction", n_parts=self.n_parts),
        ]

    def shard_step(self, ctx, data):
        rows = data["row"]
        if self.sleep and (not self.slow_shards or ctx.shard in self.slow_shards):
            time.sleep(self.sleep)
        ones = ctx.xp.ones(rows.shape[0])
        ctx.add("count", ones, start=int(rows[0]))
        ctx.add("seen", ones, start=int(rows[0]))

    def clock_end(self, ctx):
        seen = dscar.to_host(ctx.pull("seen"))
        count = dscar.to_host(ctx.pull("count"))
        return {"objective": float(count.sum()), "seen_min": float(seen.min()), "seen_max": float(seen.max()),
                "count_min": float(count.min()), "count_max": float(count.max())}

    def converged(self, history, tol):
        return False


def row_data(n):
    return {"row": np.arange(n, dtype=np.int64)}


@contextlib.contextmanager
def scheduler_calls(client):
    """The ``dscar_*`` calls the scheduler answered inside the block, by handler (``bench.overhead``'s
    counters; a handler not called is absent): the dict yielded is filled at the block's end."""
    from bench.overhead import diff, install_counters, read_counters

    client.run_on_scheduler(install_counters)
    before = Counter(client.run_on_scheduler(read_counters))
    calls: dict[str, int] = {}
    yield calls
    calls.update(diff(before, Counter(client.run_on_scheduler(read_counters))))


def assert_exactly_once(res, n_rows):
    for rec in res.history:
        assert rec.metrics["seen_min"] == rec.metrics["seen_max"] == 1.0, rec
        assert rec.metrics["count_min"] == rec.metrics["count_max"] == rec.clock, rec
    np.testing.assert_array_equal(res.params["count"], np.full(n_rows, float(res.n_clocks)))


@pytest.fixture(scope="module")
def inproc():
    """Two in-process workers: fast, but objects pass by reference (no serialization)."""
    with dscar.Cluster(n_workers=2, processes=False) as cl:
        yield cl


@pytest.fixture(scope="session")
def procs():
    """Two worker processes over TCP: serialization and aliasing bugs show here."""
    with dscar.Cluster(n_workers=2) as cl:
        yield cl


@pytest.fixture(scope="module")
def quick_bench(tmp_path_factory):
    """Runs ``python -m bench.<name> --quick [extra ...] --json ... --plot ...`` from the repository root
    in a fresh temporary folder and returns its stdout, the JSON it wrote and the path of its plot."""
    root = Path(__file__).resolve().parents[1]

    def run(name: str, *extra: str) -> tuple[str, dict, Path]:
        tmp = tmp_path_factory.mktemp(name)
        out, png = tmp / f"{name}.json", tmp / f"{name}.png"
        r = subprocess.run(
            [sys.executable, "-m", f"bench.{name}", "--quick", *extra, "--json", str(out), "--plot", str(png)],
            cwd=root, capture_output=True, text=True, timeout=1500,
        )
        assert r.returncode == 0, f"stdout:\n{r.stdout[-3000:]}\nstderr:\n{r.stderr[-5000:]}"
        return r.stdout, json.loads(out.read_text()), png

    return run


@pytest.fixture(scope="module")
def one_blas_thread():
    """One BLAS thread for a test module: on a busy 2-core machine a second OpenBLAS thread only
    spins on small matrices."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1, user_api="blas"):
        yield
