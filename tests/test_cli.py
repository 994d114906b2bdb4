"""The ``dscar`` command, on the embedded cluster and on a separately started one."""
import json
import os
import subprocess
import sys
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conftest import stop_processes

DSCAR = [sys.executable, "-m", "dscar"]


def run(args, timeout=120, env=None):
    return subprocess.run(DSCAR + args, capture_output=True, text=True, timeout=timeout, env=env)


def test_help():
    r = run(["--help"])
    assert r.returncode == 0 and "run" in r.stdout
    for model in ("lasso", "lda", "mlr", "mf"):  # the models are listed with what they do
        assert f"\n  {model} " in r.stdout, model
    r = run(["run", "--help"])
    assert r.returncode == 0 and "lasso" in r.stdout
    r = run(["run", "lasso", "--help"])
    assert r.returncode == 0 and "--scheduler" in r.stdout and "--workers" in r.stdout and "--alpha" in r.stdout
    assert "--slow" in r.stdout and "--kill" in r.stdout and "--hang" in r.stdout


@pytest.mark.timeout(120)
def test_run_lasso_on_the_embedded_cluster():
    r = run(["run", "lasso", "--workers", "2", "--rows", "3000", "--features", "60", "--no-progress"])
    assert r.returncode == 0, r.stderr
    last = r.stdout.strip().splitlines()[-1]
    assert last.startswith("dscar lasso: converged after") and "on 2 worker(s)" in last


@pytest.mark.timeout(120)
def test_run_with_injected_faults_prints_the_events():
    r = run(["run", "lasso", "--workers", "3", "--rows", "6000", "--features", "60", "--shards", "12",
             "--slow", "2:3", "--no-progress"])
    assert r.returncode == 0, r.stderr
    assert "fault-slow" in r.stdout
    # every Lasso worker owns a partition of w: the run recovers it from checkpoints (a temporary store)
    # the kill fires when worker 1 snapshots its partitions for clock 3's checkpoint, which it always
    # does; at the default point (before a shard step) a busy machine can let the other two take every
    # shard of worker 1 (dynamic sharding, backups, asked-back batches) and the kill fires late or never.
    # The fit runs 10 clocks (a tolerance it never reaches): converged after 5, a run of the whole suite on
    # two saturated cores once reached no checkpoint point of worker 1 in clocks 3..5
    r = run(["run", "lasso", "--workers", "3", "--rows", "6000", "--features", "100", "--kill", "1:3:checkpoint",
             "--tol", "1e-300", "--max-clocks", "10", "--no-progress"])
    assert r.returncode == 0, r.stderr
    for kind in ("fault-kill", "worker-lost", "partition-restored", "recovery-done"):
        assert kind in r.stdout, (kind, r.stdout.splitlines())
    assert "keeping checkpoints in" in r.stdout and "dscar lasso: stopped after 10 clocks" in r.stdout
    store = r.stdout.split("keeping checkpoints in ")[1].split()[0]
    assert not os.path.exists(store)  # the temporary store is removed at the end


def test_checkpoint_and_resume_flags(tmp_path):
    store = str(tmp_path / "ckpt")
    # > 64 features: clock 1 screens, later clocks solve blocks, so the run goes past clock 3
    common = ["run", "lasso", "--rows", "3000", "--features", "100", "--no-progress", "--checkpoint", store,
              "--checkpoint-policy", "full", "--checkpoint-every", "1"]
    r = run(common + ["--max-clocks", "2"])
    assert r.returncode == 0 and "checkpoints: 2 published" in r.stdout  # stopped at --max-clocks: a normal end
    r = run(common + ["--resume"])
    assert r.returncode == 0, r.stderr
    assert "resumed" in r.stdout and "clock   3" in r.stdout and "clock   1 " not in r.stdout
    r = run(["run", "lasso", "--resume", "--no-progress"])
    assert r.returncode == 2 and "--resume needs --checkpoint" in r.stderr
    r = run(["run", "lasso", "--checkpoint", store, "--checkpoint-fraction", "2", "--no-progress"])
    assert r.returncode == 2 and "--checkpoint-fraction: must be a finite number > 0 and <= 1, got 2" in r.stderr


def test_bad_fault_flags():
    r = run(["run", "lasso", "--slow", "0:0.5", "--no-progress"])
    assert r.returncode == 2 and "factor must be >= 1" in r.stderr
    r = run(["run", "lasso", "--workers", "2", "--kill", "5:1", "--no-progress"])
    assert r.returncode == 2 and "aimed at worker 5" in r.stderr
    r = run(["run", "lasso", "--policies", "fastest", "--no-progress"])
    assert r.returncode == 2 and "unknown policy" in r.stderr


def test_bad_flags_give_a_clear_error():
    r = run(["run", "lasso", "--workers", "2", "--rows", "3", "--shards", "8", "--no-progress"])
    assert r.returncode == 2 and "dscar: error:" in r.stderr and "fewer than the 8 shards" in r.stderr
    env = dict(os.environ, DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT="2s")
    r = run(["run", "lasso", "--scheduler", "tcp://127.0.0.1:1", "--no-progress"], env=env)
    assert r.returncode == 2 and "cannot reach the Dask scheduler" in r.stderr


@pytest.mark.timeout(180)
def test_run_lasso_against_a_separately_started_scheduler_and_workers(tmp_path):
    sched_file = tmp_path / "scheduler.json"
    env = dict(os.environ, DASK_DISTRIBUTED__SCHEDULER__WORKER_TTL="10s")
    procs = [subprocess.Popen([sys.executable, "-m", "dask", "scheduler", "--scheduler-file", str(sched_file), "--port", "0",
                               "--no-dashboard"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    try:
        deadline = time.monotonic() + 60
        while not sched_file.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.2)
        address = json.loads(sched_file.read_text())["address"]
        for _ in range(2):
            procs.append(subprocess.Popen([sys.executable, "-m", "dask", "worker", "--scheduler-file", str(sched_file), "--nthreads", "1",
                                           "--no-dashboard"], env=env, stdout=subprocess.DEVNULL,
                                          stderr=subprocess.DEVNULL))
        from distributed import Client

        with Client(address, timeout=30) as c:
            c.wait_for_workers(2, timeout=60)
        r = run(["run", "lasso", "--scheduler", address, "--rows", "3000", "--features", "60", "--no-progress"])
        assert r.returncode == 0, r.stderr
        assert "converged" in r.stdout and "on 2 worker(s)" in r.stdout
        # a second run on the same cluster: plugins are registered once, jobs do not leak
        r = run(["run", "lasso", "--scheduler", address, "--rows", "2000", "--features", "40", "--no-progress"])
        assert r.returncode == 0, r.stderr
    finally:
        stop_processes(procs)


@pytest.mark.parametrize("argv", [
    ["run", "lasso", "--rows", "0"], ["run", "lasso", "--features", "0"], ["run", "lasso", "--shards", "2.5"],
    ["run", "lasso", "--workers", "1.5"], ["run", "lasso", "--max-clocks", "2.5"], ["run", "lasso", "--tol", "nan"],
    ["run", "lda", "-K", "0"], ["run", "lda", "-K", "-3"], ["run", "lda", "--doc-length", "0"],
    ["run", "lda", "--beta", "0"], ["run", "mlr", "--classes", "1"], ["run", "mlr", "--rows", "-1"],
    ["run", "mf", "--rank", "0"], ["run", "mf", "--test-size", "1"], ["run", "lasso", "--bogus"], ["run", "nomodel"],
    ["run", "lasso", "--scheduler", "nonsense"], ["run", "lasso", "--scheduler", "tls://127.0.0.1:1"],
    ["run", "lasso", "--kill", "0:50", "--max-clocks", "3"], ["run", "lasso", "--tls-cert", "c.pem"],
])
def test_bad_options_of_any_model_are_one_line_errors(argv, capsys):
    """Every bad flag, engine or model, is one line ``dscar: error: ...`` and exit status 2."""
    from dscar.api.cli import main

    try:
        code = main(argv + ["--no-progress"])
    except SystemExit as e:
        code = e.code
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("dscar: error: "), (code, err)


def test_errors_print_no_traceback():
    for argv in (["run", "lda", "-K", "0"], ["run", "lasso", "--scheduler", "not-an-address:::"]):
        r = run(argv + ["--no-progress"], timeout=60)
        assert r.returncode == 2 and r.stderr.startswith("dscar: error: ") and "Traceback" not in r.stderr, r.stderr


@pytest.mark.timeout(240)
@pytest.mark.parametrize("argv", [
    ["run", "lda", "--synthetic", "--docs", "200", "--vocab", "300", "--doc-length", "20", "-K", "5"],
    ["run", "mlr", "--rows", "600", "--features", "10", "--classes", "3"],
])
def test_a_run_stopped_by_max_clocks_exits_0(argv):
    r = run(argv + ["--max-clocks", "2", "--no-progress"], timeout=200)
    assert r.returncode == 0, r.stderr
    assert "stopped after 2 clocks" in r.stdout.strip().splitlines()[-1]


@pytest.mark.timeout(180)
def test_resume_compares_the_model_not_the_stopping_rule(tmp_path):
    store = str(tmp_path / "ckpt")
    # > 64 features: clock 1 screens, later clocks solve blocks, so the run goes past clock 3
    common = ["run", "lasso", "--rows", "3000", "--features", "100", "--no-progress", "--checkpoint", store,
              "--checkpoint-policy", "full", "--checkpoint-every", "1", "--alpha", "0.01"]
    r = run(common + ["--max-clocks", "2"])
    assert r.returncode == 0, r.stderr
    r = run(common + ["--alpha", "0.5", "--resume"])  # another model: refused, the key named
    assert r.returncode == 2 and "differing: alpha: checkpoint 0.01, this fit 0.5" in r.stderr, r.stderr
    r = run(common + ["--resume", "--tol", "1e-3"])  # another stopping rule: resumes
    assert r.returncode == 0 and "resumed" in r.stdout, r.stderr


def test_version():
    from dscar import __version__

    r = run(["--version"])
    assert r.returncode == 0 and r.stdout.strip() == f"dscar {__version__}"


#: ``dscar run`` in a process where the ``lda`` package cannot be imported
WITHOUT_LDA = [sys.executable, "-c", "import sys; sys.modules['lda'] = None; from dscar.api.cli import main; "
               "sys.exit(main(sys.argv[1:]))"]


def test_setup_problems_are_one_line_before_any_data_is_built():
    """A missing optional package, checkpoint flags that cannot work and an unreachable data URL are
    each one line and exit 2; the checkpoint flags are checked before the model's data is built (here
    the Reuters corpus, which needs the missing package)."""
    def without_lda(*argv):
        return subprocess.run(WITHOUT_LDA + list(argv) + ["--no-progress"], capture_output=True, text=True,
                              timeout=120)

    for r, says in ((without_lda("run", "lda"), "dscar run lda: the Reuters corpus ships with the 'lda' package"),
                    (without_lda("run", "lda", "--checkpoint", "ck", "--checkpoint-every", "5"),
                     "--checkpoint-fraction 0.1 x --checkpoint-every 5 = 0.5"),
                    (without_lda("run", "lda", "--checkpoint-fraction", "0.5"),
                     "--checkpoint-every and --checkpoint-fraction need --checkpoint"),
                    (run(["run", "lasso", "--data", "ftp://127.0.0.1:1/data", "--no-progress"]),
                     "cannot list data directory 'ftp://127.0.0.1:1/data': ConnectionRefusedError")):
        err = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(err) == 1 and err[0].startswith("dscar: error: ") and says in err[0], r.stderr


@given(n=st.integers(1, 100_000), most=st.integers(2, 60))
def test_clock_sample_keeps_the_first_and_last_clock(n, most):
    """As many clocks as allowed (all when they fit), in order, the first and the last always, and
    evenly spread: no gap between shown clocks more than one wider than another."""
    from dscar.api.cli import clock_sample

    shown = clock_sample(n, most)
    assert shown[0] == 0 and shown[-1] == n - 1 and len(shown) == min(n, most)
    assert shown == sorted(set(shown))
    gaps = [b - a for a, b in zip(shown, shown[1:])]
    assert not gaps or max(gaps) - min(gaps) <= 1


@pytest.mark.timeout(240)
def test_a_default_run_is_short_and_verbose_shows_everything():
    argv = ["run", "lda", "--synthetic", "--docs", "200", "--vocab", "300", "--doc-length", "20", "-K", "5",
            "--max-clocks", "40", "--no-progress"]
    r = run(argv, timeout=200)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert len(lines) <= 15 and not any(line.startswith("event ") for line in lines), lines
    assert sum(line.startswith("clock ") for line in lines) == 8 and "clock  40" in r.stdout
    assert any(line.startswith("events: ") and line.endswith("(-v: every clock and event)") for line in lines)
    r = run(argv + ["-v"], timeout=200)
    assert r.returncode == 0 and sum(line.startswith("clock ") for line in r.stdout.splitlines()) == 40


def test_the_first_run_line_looks_for_numba_s_cache(tmp_path, monkeypatch):
    """``kernels_cached``: true where numba wrote a model's kernels, false where it did not, None for a
    model without kernels."""
    import importlib.util
    from pathlib import Path

    from dscar.api import cli

    src = Path(importlib.util.find_spec("dscar.algorithms.lasso_kernels").origin)
    fake = tmp_path / "algorithms"
    (fake / "__pycache__").mkdir(parents=True)
    (fake / src.name).write_text("")
    spec = importlib.util.spec_from_file_location("dscar.algorithms.lasso_kernels", fake / src.name)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: spec)
    monkeypatch.setenv("NUMBA_CACHE_DIR", "")
    import numba.core.config

    monkeypatch.setattr(numba.core.config, "CACHE_DIR", "")
    assert cli.kernels_cached("lasso") is False
    (fake / "__pycache__" / "lasso_kernels.residual-163.py311.nbi").write_bytes(b"")
    assert cli.kernels_cached("lasso") is True
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    assert cli.kernels_cached("nomodel") is None
