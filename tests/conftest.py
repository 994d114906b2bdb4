import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import dscar
from dscar import Algorithm, TableSpec


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
