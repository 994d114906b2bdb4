"""Job tokens, worker keys and the job lease (``dscar.core.membership``): the pure decisions, then
forged calls against a running fit, a cancelled job, and a driver SIGKILLed on an external cluster."""
import json
import os
import subprocess
import sys
import time

import dask
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import dscar
from conftest import RowCounter, assert_exactly_once, row_data, stop_processes
from dscar.core.membership import (
    SCHEDULER_RULES,
    WORKER_INSTALLING,
    WORKER_RUN_WRITES,
    Lease,
    Rule,
    key_digest,
    new_token,
    refusal,
    run_known,
    run_refusal,
    worker_rule,
)

TESTS = os.path.dirname(os.path.abspath(__file__))


# ------------------------------------------------------------------ pure
def test_tokens_are_unguessable_and_distinct():
    tokens = {new_token() for _ in range(100)}
    assert len(tokens) == 100 and all(len(t) == 32 for t in tokens)
    assert key_digest("a") != key_digest("b") and key_digest("a") == key_digest("a")


def test_a_call_about_a_job_needs_its_token():
    for rule in (Rule.JOB, Rule.DRIVER):
        assert refusal(rule, job_token="t", token="t") is None
        assert refusal(rule, job_token="t", token=None) == "no job token"
        assert refusal(rule, job_token="t", token="u") == "not the job's token"
        assert refusal(rule, job_token=None, token=None) is None  # a job no longer known: nothing to act on
    assert refusal(Rule.OPEN, job_token="t", token=None) is None


def test_a_worker_acts_only_as_itself():
    ok = dict(job_token="t", token="t", worker_key="k")
    assert refusal(Rule.WORKER, key="k", **ok) is None
    assert refusal(Rule.WORKER, key=None, **ok) == "no worker key"
    assert refusal(Rule.WORKER, key="other", **ok) == "not the key of the worker it claims to be"
    assert refusal(Rule.WORKER, key="k", job_token="t", token="u", worker_key="k") == "not the job's token"
    assert refusal(Rule.WORKER, key="k", job_token="t", token="t", worker_key=None).startswith("the worker it claims")
    # joining a job: its key is enough (the job's token comes with the spec)
    assert refusal(Rule.CLUSTER_WORKER, key="k", job_token="t", token=None, worker_key="k") is None
    assert refusal(Rule.CLUSTER_WORKER, key="x", job_token="t", token=None, worker_key="k") is not None


@given(rule=st.sampled_from(list(Rule)), job_token=st.one_of(st.none(), st.text(min_size=1, max_size=4)),
       token=st.one_of(st.none(), st.text(max_size=4)), worker_key=st.one_of(st.none(), st.text(min_size=1, max_size=4)),
       key=st.one_of(st.none(), st.text(max_size=4)))
def test_a_granted_call_carries_what_its_rule_asks(rule, job_token, token, worker_key, key):
    why = refusal(rule, job_token=job_token, token=token, worker_key=worker_key, key=key)
    if rule is Rule.OPEN:
        assert why is None
        return
    job_ok = job_token is None or token == job_token
    worker_ok = worker_key is not None and key == worker_key
    if rule in (Rule.JOB, Rule.DRIVER):
        assert (why is None) == job_ok
    elif rule is Rule.WORKER:
        assert (why is None) == (job_ok and worker_ok)
    else:
        assert (why is None) == worker_ok


def test_every_handler_has_a_rule():
    from dscar.scheduler.coordinator import Coordinator
    from dscar.worker.plugin import ParamServer

    assert {n[3:] for n in dir(Coordinator) if n.startswith("_h_")} == set(SCHEDULER_RULES)
    worker_ops = {n[3:] for n in dir(ParamServer) if n.startswith("_h_")}
    assert WORKER_INSTALLING <= worker_ops
    assert {op for op in worker_ops if worker_rule(op) is Rule.OPEN} == {"info", "stack", "peer_lost", "peer_joined",
                                                                         "confirm_key"}


@given(run=st.integers(-2, 50), known=st.integers(-1, 50), current=st.none() | st.integers(-1, 50))
def test_a_write_s_run_is_taken_only_when_the_job_has_reached_it(run, known, current):
    """A write tagged with a run no newer than the worker knows of needs no question (an older one
    is its handler's: stale); a newer one only when the coordinator's current run is at least as new."""
    assert run_known(run, known) == (run <= known)
    assert (run_refusal(run, current) is None) == (current is not None and run <= current)


def test_a_write_s_run_that_is_no_integer_is_refused_and_the_writes_are_named():
    for run in ("7", 7.0, None, True, [7]):
        assert not run_known(run, 10) and "not an integer" in run_refusal(run, 10)
    assert "newer than the job's current run 3" in run_refusal(10**6, 3)
    assert WORKER_RUN_WRITES == {"apply", "assign", "restore"} and all(worker_rule(op) is Rule.JOB
                                                                       for op in WORKER_RUN_WRITES)


def test_a_lease_lapses_only_after_its_timeout_without_renewal():
    lease = Lease(15.0, renewed_at=100.0)
    assert not lease.expired(115.0) and lease.expired(115.1)
    lease.renew(110.0)
    assert not lease.expired(125.0) and lease.age(120.0) == 10.0
    lease.renew(105.0)  # an older renewal read late moves nothing back
    assert lease.renewed_at == 110.0
    lease.grant(3.0)  # the coordinator's loop was starved for 3 s: not the driver's fault
    assert not lease.expired(128.0) and lease.expired(128.1)


@given(timeout=st.floats(0.1, 100), renewals=st.lists(st.floats(0, 1000), max_size=20), now=st.floats(0, 1200))
def test_a_lease_is_expired_exactly_when_the_newest_renewal_is_older_than_its_timeout(timeout, renewals, now):
    lease = Lease(timeout, renewed_at=0.0)
    for t in renewals:
        lease.renew(t)
    assert lease.expired(now) == (now - max([0.0, *renewals]) > timeout)


# ------------------------------------------------------------ on a cluster
class Forger(RowCounter):
    """RowCounter whose driver-side stopping rule, at clock 2, makes ``forge(address)`` run while the
    fit waits between clocks (the job is known, its workers hold its partitions)."""

    converged_on_workers = False  # (its hook runs in the driver's process, between clocks the driver begins)

    def __init__(self, forge, address, **kw):
        super().__init__(**kw)
        self.forge, self.address, self.outcomes = forge, address, None

    def __getstate__(self):  # the workers get a plain RowCounter's state (the forger stays here)
        return {k: v for k, v in self.__dict__.items() if k not in ("forge", "outcomes")}

    def converged(self, history, tol):
        if len(history) == 2 and self.outcomes is None:
            self.outcomes = self.forge(self.address)
        return False


def _refused(call) -> str:
    """``"refused"`` when the call raised ``RefusedCallError``, else what it answered."""
    try:
        return f"answered {call()!r}"[:200]
    except dscar.RefusedCallError:
        return "refused"


def _job_and_token(address):
    from distributed import Client

    with Client(address, timeout=30) as c:
        (job,) = dscar.jobs(c)
        token = c.run_on_scheduler(lambda dask_scheduler, j=job["job"]:
                                   dask_scheduler.plugins["dscar-coordinator"]._tokens[j])
    return job, token


def forge_scheduler_work_calls(address) -> dict:
    """A plain client asks the coordinator for work and commits or fails attempts as a worker:
    without the job's token, with the token but without the worker's key, with wrong ones; and
    registers a key of its own for that worker."""
    from distributed import Client

    job, token = _job_and_token(address)
    j, w0 = job["job"], job["workers"][0]
    with Client(address, timeout=30) as c:
        s = c.scheduler
        return {
            "next": _refused(lambda: c.sync(s.dscar_next, worker=w0, timeout=0.1)),
            "next-as-member": _refused(lambda: c.sync(s.dscar_next, worker=w0, timeout=0.1, token=token)),
            "commit": _refused(lambda: c.sync(s.dscar_commit, job_id=j, clock=3, run=0, worker=w0,
                                              commits=[{"shard": 0, "attempt": 0}], token=token)),
            "fail": _refused(lambda: c.sync(s.dscar_fail, job_id=j, clock=3, run=0, shard=0, attempt=0, worker=w0,
                                            error="forged", token="wrong", key="wrong")),
            "hello": _refused(lambda: c.sync(s.dscar_hello, worker=w0, key="mine")),
        }


def forge_scheduler_job_calls(address) -> dict:
    """A plain client drives the job as its driver would, and asks for its spec as a worker would."""
    from distributed import Client

    job, _ = _job_and_token(address)
    j, w0 = job["job"], job["workers"][0]
    with Client(address, timeout=30) as c:
        s = c.scheduler
        return {
            "begin_clock": _refused(lambda: c.sync(s.dscar_begin_clock, job_id=j, clock=99)),
            "end_job": _refused(lambda: c.sync(s.dscar_end_job, job_id=j, token="wrong")),
            "simulate_loss": _refused(lambda: c.sync(s.dscar_simulate_loss, job_id=j, worker=w0)),
            "job_spec": _refused(lambda: c.sync(s.dscar_job_spec, job_id=j, worker=w0)),
        }


def forge_worker_data_calls(address) -> dict:
    """A plain client reads and writes a worker's partitions (pull, assign, apply)."""
    from distributed import Client

    from dscar import wire

    job, _ = _job_and_token(address)
    j = job["job"]
    out = {}
    with Client(address, timeout=30) as c:
        for w in job["workers"]:
            r = c.rpc(w)
            out[f"pull {w}"] = _refused(lambda: c.sync(r.dscar_pull, job_id=j, table="count", part=0, lo=0, hi=5))
            out[f"assign {w}"] = _refused(lambda: c.sync(
                r.dscar_assign, job_id=j, run=10**6, chunks=[["count", 0, 0]],
                arrays=wire.encode([np.full(5, 835.0)]), token="wrong"))
            out[f"apply {w}"] = _refused(lambda: c.sync(r.dscar_apply, job_id=j, clock=2, run=10**6, committed=[]))
    return out


def forge_worker_run_writes(address) -> dict:
    """A client holding the job's token (a stale driver's, a notebook's) writes a worker's partitions
    tagged with a run the job never reached: the issue's ``dscar_assign(job, run=10**6, ...)``, an apply
    of no pass (it would mark every later attempt's pass as applied already), a restore to initial values."""
    from distributed import Client

    from dscar import wire

    job, token = _job_and_token(address)
    j = job["job"]
    out = {}
    with Client(address, timeout=30) as c:
        for w in job["workers"]:
            r = c.rpc(w)
            out[f"assign {w}"] = _refused(lambda: c.sync(
                r.dscar_assign, job_id=j, run=10**6, chunks=[["count", 0, 0]],
                arrays=wire.encode([np.full(5, 835.0)]), token=token))
            out[f"apply {w}"] = _refused(lambda: c.sync(r.dscar_apply, job_id=j, clock=2, run=10**6, committed=[],
                                                        reset=["count"], token=token))
            out[f"restore {w}"] = _refused(lambda: c.sync(r.dscar_restore, job_id=j, table="count", part=0, chain=[],
                                                          url="", run=10**6, token=token))
    return out


def forge_worker_peer_calls(address) -> dict:
    """A plain client calls the handlers workers call on each other (staged updates, shard copies,
    memory copies)."""
    from distributed import Client

    job, _ = _job_and_token(address)
    j = job["job"]
    out = {}
    with Client(address, timeout=30) as c:
        for w in job["workers"]:
            r = c.rpc(w)
            out[f"fetch_staged {w}"] = _refused(lambda: c.sync(r.dscar_fetch_staged, job_id=j, run=0, keys=[], parts=[]))
            out[f"copy_shard {w}"] = _refused(lambda: c.sync(r.dscar_copy_shard, job_id=j, shard=0, token="wrong"))
            out[f"get_mirror {w}"] = _refused(lambda: c.sync(r.dscar_get_mirror, job_id=j, key=["part", "count", 0]))
            out[f"keep_mirror {w}"] = _refused(lambda: c.sync(r.dscar_keep_mirror, job_id=j, clock=2, copies=[]))
    return out


def _forged(res) -> list[dict]:
    return [e for e in res.events if e["kind"] == "forged-call"]


#: family -> (its forger, the handlers it calls, whether they are the workers' (recorded per worker))
FAMILIES = {
    "scheduler-work": (forge_scheduler_work_calls, ("next", "commit", "fail", "hello"), False),
    "scheduler-job": (forge_scheduler_job_calls, ("begin_clock", "end_job", "simulate_loss", "job_spec"), False),
    "worker-data": (forge_worker_data_calls, ("pull", "assign", "apply"), True),
    "worker-writes-of-no-run": (forge_worker_run_writes, ("assign", "apply", "restore"), True),
    "worker-peer": (forge_worker_peer_calls, ("fetch_staged", "copy_shard", "get_mirror", "keep_mirror"), True),
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("family", list(FAMILIES))
def test_forged_calls_are_refused_recorded_and_change_nothing(procs, family):
    """Each call from a plain ``distributed.Client`` raises ``RefusedCallError``, the job records a
    ``forged-call`` event naming the handler (and, on a worker, the worker that refused it), and
    the fit goes on with every row counted once per clock (the forged assign of 835 never lands)."""
    forge, handlers, on_workers = FAMILIES[family]
    algo = Forger(forge, procs.client.scheduler.address)
    res = dscar.fit(algo, row_data(40), procs, n_shards=4, max_clocks=4, policies=[])
    assert algo.outcomes is not None and set(algo.outcomes.values()) == {"refused"}, algo.outcomes
    assert all(e["caller"] and e["reason"] for e in _forged(res))
    if on_workers:
        recorded = {(e["handler"], e["worker"]) for e in _forged(res)}
        assert recorded == {(f"dscar_{op}", w) for op in handlers for w in res.workers}, recorded
    else:
        assert {e["handler"] for e in _forged(res)} == {f"dscar_{op}" for op in handlers}
        assert {e.get("claimed") for e in _forged(res)} <= {res.workers[0], None}  # the worker a call claimed to be
    assert_exactly_once(res, 40)
    assert res.n_clocks == 4 and "worker-lost" not in {e["kind"] for e in res.events}


def cancel_job(address) -> dict:
    from distributed import Client

    with Client(address, timeout=30) as c:
        (job,) = dscar.jobs(c)
        dscar.cancel(job["job"], c)
        with pytest.raises(dscar.InvalidInputError, match="no dscar job"):
            dscar.cancel(job["job"], c)
        return {"left": dscar.jobs(c), "job": job}


@pytest.mark.timeout(120)
def test_a_job_cancelled_by_hand_ends_on_the_cluster_and_its_driver_says_so(procs):
    algo = Forger(cancel_job, procs.client.scheduler.address)
    with pytest.raises(dscar.JobFailedError, match="was cancelled by hand"):
        dscar.fit(algo, row_data(40), procs, n_shards=4, max_clocks=4, policies=[])
    job = algo.outcomes["job"]
    assert algo.outcomes["left"] == [] and job["model"] == "rowcounter" and job["clock"] == 2
    assert sorted(job["workers"]) == sorted(procs.workers) and 0 <= job["lease_age"] <= job["lease_timeout"]
    held = procs.client.run(lambda dask_worker: list(dask_worker.plugins["dscar-paramserver"].jobs))
    assert all(js == [] for js in held.values()), held  # the workers dropped the job
    res = dscar.fit(RowCounter(), row_data(40), procs, n_shards=4, max_clocks=2)  # the cluster takes a new fit
    assert res.n_clocks == 2


class BusyDriver(RowCounter):
    """RowCounter whose driver, after clock 1, is busy for 2.5 s without a call to the coordinator
    (as while it places data or publishes a checkpoint)."""

    converged_on_workers = False  # (the driver is the one busy)

    def converged(self, history, tol):
        if len(history) == 1:
            time.sleep(2.5)
        return False


@pytest.mark.timeout(120)
def test_a_driver_busy_between_calls_for_longer_than_its_lease_keeps_its_job(inproc):
    """The driver renews its lease in the background (every third of it), not only with its calls."""
    with dask.config.set({"dscar.lease-timeout": 1.0}):
        res = dscar.fit(BusyDriver(), row_data(20), inproc, n_shards=2, max_clocks=2, policies=[])
    assert res.n_clocks == 2 and "job-expired" not in {e["kind"] for e in res.events}
    assert_exactly_once(res, 20)


@pytest.mark.timeout(120)
def test_a_worker_asking_for_the_spec_of_a_job_that_has_ended_is_told_so(inproc, caplog):
    """A joiner's warm-up or a runner's first item may ask for a job's spec after the job ended: the
    answer is a ``JobFailedError`` naming the job, and the scheduler logs no fault of its own."""
    import logging

    res = dscar.fit(RowCounter(), row_data(20), inproc, n_shards=2, max_clocks=1, policies=[])
    assert res.n_clocks == 1
    ended = "job-that-ended"

    async def ask(dask_worker):
        server = dask_worker.plugins["dscar-paramserver"]
        try:
            await server._acall("job_spec", job_id=ended, worker=dask_worker.address)
        except dscar.JobFailedError as e:
            return str(e)
        return "answered"

    with caplog.at_level(logging.ERROR, logger="distributed"):
        said = list(inproc.client.run(ask).values())
    assert said and all(ended in s and "not running" in s for s in said), said
    assert not [r for r in caplog.records if "job_spec" in r.getMessage() or "KeyError" in r.getMessage()]


@pytest.mark.cluster
def test_asking_for_the_jobs_registers_nothing_on_the_workers():
    """``dscar.jobs`` and ``dscar.cancel`` are questions to the scheduler: they register its
    coordinator (the handlers) and send nothing to the workers, whose plugin registration goes to
    every worker (a worker closing meanwhile made it fail with ``CommClosedError``)."""
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, processes=False, dashboard_address=":0") as lc, \
            Client(lc, set_as_default=False) as c:
        assert dscar.jobs(lc) == [] and dscar.jobs(c) == []
        with pytest.raises(dscar.InvalidInputError, match="no dscar job 'nope'"):
            dscar.cancel("nope", c)
        plugins = c.run(lambda dask_worker: sorted(dask_worker.plugins))
        assert not any("dscar" in p for ps in plugins.values() for p in ps), plugins
        assert c.run_on_scheduler(lambda dask_scheduler: "dscar-coordinator" in dask_scheduler.plugins)


def test_the_jobs_commands_say_what_is_wrong_in_one_line():
    for argv in (["jobs", "--scheduler", "nonsense"], ["cancel", "some-job", "--scheduler", "nonsense"],
                 ["cancel", "--scheduler", "tcp://127.0.0.1:1"], ["jobs"]):
        r = _cli(*argv)
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and r.stderr.startswith("dscar: error:"), (argv, r.stderr)
    with pytest.raises(dscar.InvalidInputError, match="job_id must be"):
        dscar.cancel("", "tcp://127.0.0.1:1")


# --------------------------------------------------- a driver that dies
DRIVER = """
import sys
import dscar
from conftest import RowCounter, assert_exactly_once, row_data
cfg = dscar.CheckpointConfig(sys.argv[2], policy="full", every=1)
dscar.fit(RowCounter(n_parts=2, sleep=0.1), row_data(40), sys.argv[1], n_shards=4, max_clocks=10_000,
          checkpoint=cfg, progress=False)
"""


def _start(args, env, **kw):
    return subprocess.Popen([sys.executable, *args], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **kw)


def _wait_for(what, check, timeout):
    deadline = time.monotonic() + timeout
    while not (got := check()):
        assert time.monotonic() < deadline, f"waited {timeout} s for {what}"
        time.sleep(0.2)
    return got


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "dscar", *args], capture_output=True, text=True, timeout=120)


@pytest.mark.timeout(300)
def test_a_driver_killed_on_an_external_cluster_lets_its_lease_lapse_and_the_fit_resumes(tmp_path):
    """``dask scheduler`` + 2 ``dask worker`` processes; the driver, a process of its own, is
    SIGKILLed once checkpoints exist. The coordinator ends the job when the driver's lease lapses
    (2 s here), the workers free its partitions, and a resume from the checkpoint finishes with the
    failure-free result."""
    from distributed import Client

    store = tmp_path / "ckpt"
    sched_file = tmp_path / "scheduler.json"
    env = dict(os.environ, DASK_DISTRIBUTED__SCHEDULER__WORKER_TTL="10s", DASK_DSCAR__LEASE_TIMEOUT="2",
               PYTHONPATH=os.pathsep.join([TESTS, *filter(None, [os.environ.get("PYTHONPATH")])]))
    procs = [_start(["-m", "dask", "scheduler", "--scheduler-file", str(sched_file), "--port", "0", "--no-dashboard"], env)]
    driver = None
    try:
        _wait_for("the scheduler file", lambda: sched_file.exists() and sched_file.read_text().strip(), 60)
        address = json.loads(sched_file.read_text())["address"]
        for _ in range(2):
            procs.append(_start(["-m", "dask", "worker", "--scheduler-file", str(sched_file), "--nthreads", "1",
                                 "--no-dashboard"], env))
        with Client(address, timeout=30) as c:
            c.wait_for_workers(2, timeout=60)
        driver = _start(["-c", DRIVER, address, str(store)], env, cwd=TESTS)
        running = _wait_for("3 clocks", lambda: [j for j in dscar.jobs(address) if j["clock"] >= 3], 120)
        listed = _cli("jobs", "--scheduler", address)
        assert listed.returncode == 0 and running[0]["job"] in listed.stdout and "model=rowcounter" in listed.stdout
        _wait_for("a checkpoint", lambda: list(store.glob("manifest-*.json")), 60)
        driver.kill()
        driver.wait()
        killed_at = time.monotonic()
        _wait_for("the job to end", lambda: dscar.jobs(address) == [], 60)
        print(f"the job ended {time.monotonic() - killed_at:.1f} s after its driver was killed (lease 2 s)")
        with Client(address, timeout=30) as c:
            held = c.run(lambda dask_worker: list(dask_worker.plugins["dscar-paramserver"].jobs))
            why = c.run_on_scheduler(lambda dask_scheduler: dask_scheduler.plugins["dscar-coordinator"]._ended_why)
        assert all(js == [] for js in held.values()), held
        assert "did not renew its lease" in why[running[0]["job"]]
        gone = _cli("cancel", running[0]["job"], "--scheduler", address)
        assert gone.returncode == 2 and gone.stderr.count("\n") == 1 and "no dscar job" in gone.stderr
        newest = max(json.loads(m.read_text())["clock"] for m in store.glob("manifest-*.json"))
        res = dscar.fit(RowCounter(n_parts=2, sleep=0.1), row_data(40), address, n_shards=4,
                        checkpoint=dscar.CheckpointConfig(str(store), policy="full", every=1), resume=True,
                        max_clocks=newest + 3)
        resumed = next(e for e in res.events if e["kind"] == "resumed")
        assert resumed["clock"] == newest and [rec.clock for rec in res.history] == [newest + 1, newest + 2, newest + 3]
        for rec in res.history:  # every row counted once per clock, as if no driver had died
            assert rec.metrics["seen_min"] == rec.metrics["seen_max"] == 1.0, rec
            assert rec.metrics["count_min"] == rec.metrics["count_max"] == rec.clock, rec
        np.testing.assert_array_equal(res.params["count"], np.full(40, float(newest + 3)))
    finally:
        if driver is not None and driver.poll() is None:
            driver.kill()
        stop_processes(procs)
