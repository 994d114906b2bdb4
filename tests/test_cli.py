"""The ``dscar`` command, on the embedded cluster and on a separately started one."""
import json
import os
import subprocess
import sys
import time

import pytest

DSCAR = [sys.executable, "-m", "dscar"]


def run(args, timeout=120, env=None):
    return subprocess.run(DSCAR + args, capture_output=True, text=True, timeout=timeout, env=env)


def test_help():
    r = run(["--help"])
    assert r.returncode == 0 and "run" in r.stdout
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
    r = run(["run", "lasso", "--workers", "3", "--rows", "6000", "--features", "60", "--kill", "1:3", "--no-progress"])
    assert r.returncode == 0, r.stderr
    for kind in ("fault-kill", "worker-lost", "partition-restored", "recovery-done"):
        assert kind in r.stdout, kind
    assert "keeping checkpoints in" in r.stdout and "dscar lasso: converged" in r.stdout


def test_checkpoint_and_resume_flags(tmp_path):
    store = str(tmp_path / "ckpt")
    common = ["run", "lasso", "--rows", "3000", "--features", "60", "--no-progress", "--checkpoint", store,
              "--checkpoint-policy", "full", "--checkpoint-every", "1"]
    r = run(common + ["--max-clocks", "2"])
    assert r.returncode == 0 and "checkpoints: 2 published" in r.stdout  # stopped at --max-clocks: a normal end
    r = run(common + ["--resume"])
    assert r.returncode == 0, r.stderr
    assert "resumed" in r.stdout and "clock   3" in r.stdout and "clock   1 " not in r.stdout
    r = run(["run", "lasso", "--resume", "--no-progress"])
    assert r.returncode == 2 and "--resume needs --checkpoint" in r.stderr
    r = run(["run", "lasso", "--checkpoint", store, "--checkpoint-fraction", "2", "--no-progress"])
    assert r.returncode == 2 and "fraction r must be in" in r.stderr


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
        for p in reversed(procs):
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
