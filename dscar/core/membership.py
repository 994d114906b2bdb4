"""Who may call a job's handlers, and how long a job lives without its driver (pure: no Dask).

Dask lets whoever reaches the scheduler run code, so none of this stops an attacker; it stops a
stray or stale caller (an old driver, a notebook, a second job's driver, a buggy worker) from
driving or corrupting a fit without a word:

- **Job token**: made by the driver at job start (``new_token``), sent to the coordinator with the
  job and to the job's workers with its spec. Every call about a job carries it; a call without
  it, or with another one, is refused (``refusal``) and recorded (a ``forged-call`` event).
- **Worker key**: each worker process makes its own at start and registers it with the
  coordinator (``dscar_hello``), which believes it only once the worker at the claimed address,
  asked there, confirms it holds that key (``key_digest``): a caller claiming to be worker W
  must hold W's key. The coordinator checks it on the calls that act as a worker (ask for work,
  commit, report), so a worker asks only for its own work and commits only its own attempts.
- **Lease**: a job lives while its driver renews it (``Lease``); a driver that dies stops
  renewing, and the coordinator ends the job once the lease has lapsed.
- **Run of a write**: a call that writes a job's parameters (``WORKER_RUN_WRITES``) is tagged
  with the run it belongs to; a run newer than the job's current one was issued by no member
  of the job and is refused (``run_refusal``), so a caller holding the token still cannot make
  its write outlive the run (a ``run=10**6`` assign would otherwise be taken for the newest work,
  and make every later, real one look stale).
"""
from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from enum import Enum

#: seconds a job lives after its driver's last renewal, unless ``dscar.lease-timeout`` says otherwise
DEFAULT_LEASE_S = 15.0


def new_token() -> str:
    """An unguessable token (a job's, or a worker's key)."""
    return secrets.token_hex(16)


def key_digest(key: str) -> str:
    """What a worker is asked to confirm about its key: its hash (the key itself never travels twice)."""
    return hashlib.sha256(key.encode()).hexdigest()


def same(expected: str | None, given: str | None) -> bool:
    """``given`` is ``expected`` (both set), compared in constant time (as bytes: a forged value
    may hold any character)."""
    return (expected is not None and given is not None
            and hmac.compare_digest(str(expected).encode(), str(given).encode()))


class Rule(Enum):
    """What a handler asks of its caller."""

    #: anyone: reads no job's data and changes none (listings, liveness probes, an operator's cancel)
    OPEN = "open"
    #: the job's driver: the job's token; a granted call renews the job's lease
    DRIVER = "driver"
    #: a member of the job (its driver, its workers, the coordinator for it): the job's token
    JOB = "job"
    #: a worker acting as itself (``worker=``): that worker's key, and the job's token when it names a job
    WORKER = "worker"
    #: any registered worker of the cluster (``worker=``): its key only (it asks to join a job)
    CLUSTER_WORKER = "cluster-worker"


#: what each of the coordinator's handlers (``dscar_<name>`` on the scheduler) asks of its caller
SCHEDULER_RULES: dict[str, Rule] = {
    # the driver's (``start_job`` brings the token of the job it starts)
    "start_job": Rule.JOB, "placed": Rule.DRIVER, "begin_clock": Rule.DRIVER, "wait": Rule.DRIVER,
    "end_job": Rule.DRIVER, "owners": Rule.DRIVER, "flush": Rule.DRIVER, "rebase": Rule.DRIVER,
    "published": Rule.DRIVER, "stop": Rule.DRIVER, "until_lost": Rule.DRIVER, "renew": Rule.DRIVER,
    # a simulated loss (``faults.lose``): the lost worker's or a test driver's
    "simulate_loss": Rule.JOB,
    # a worker's, as itself
    "next": Rule.WORKER, "commit": Rule.WORKER, "fail": Rule.WORKER, "clock_done": Rule.WORKER,
    "clock_failed": Rule.WORKER, "runner_failed": Rule.WORKER, "ckpt_written": Rule.WORKER,
    "mirrored": Rule.WORKER, "event": Rule.WORKER, "run": Rule.WORKER, "job_spec": Rule.CLUSTER_WORKER,
    # anyone's: a worker's registration (checked by asking the worker), an operator's listing and cancel
    "hello": Rule.OPEN, "jobs": Rule.OPEN, "cancel": Rule.OPEN,
}

#: the worker handlers (``dscar_<name>`` on a worker) anyone may call: liveness, where the runner
#: stands, peers coming and going, a key's confirmation; every other one is about a job (``Rule.JOB``)
WORKER_OPEN = frozenset({"info", "stack", "peer_lost", "peer_joined", "confirm_key"})
#: worker handlers that install the job they name when it is new there (its token comes with it)
WORKER_INSTALLING = frozenset({"init", "warm_up", "adopt", "adopt_all", "put_shard", "restore"})


#: worker handlers that write a job's parameters for a run (``run=``): the coordinator's apply of a
#: pass or batch, a clock end's assign, a recovery's restore
WORKER_RUN_WRITES = frozenset({"apply", "assign", "restore"})

#: worker handlers a ``bundle`` may carry (several of one job's messages to one worker in one: a hand-off's
#: copies from a leaver, a join's switch): the bundle's caller is checked once, as any ``Rule.JOB`` call,
#: so it carries only ``Rule.JOB`` ones that neither install the job, nor write a run, nor wait for an apply
BUNDLED_OPS = frozenset({"pull", "lend", "copy_shard", "forget_copy", "drop_shard"})


def run_known(run: object, known: int) -> bool:
    """Whether a write tagged ``run`` needs no question: an integer no newer than ``known``, the
    newest run this worker knows the job has reached (a work item, a restore, a confirmation).
    An older run is its handler's business (stale), not a forgery."""
    return type(run) is int and run <= known


def run_refusal(run: object, current: int | None) -> str | None:
    """Why a write tagged ``run`` must be refused, given the job's ``current`` run as its
    coordinator states it (None: the coordinator does not run the job, or did not answer), or
    None to grant it. A run newer than the current one was issued by no member of the job."""
    if type(run) is not int:
        return f"its run {run!r} is not an integer"
    if current is None:
        return "the coordinator did not confirm the job's current run"
    if run > current:
        return f"its run {run} is newer than the job's current run {current}"
    return None


def worker_rule(op: str) -> Rule:
    """What the worker handler ``dscar_<op>`` asks of its caller."""
    return Rule.OPEN if op in WORKER_OPEN else Rule.JOB


def refusal(rule: Rule, *, job_token: str | None, token: str | None,
            worker_key: str | None = None, key: str | None = None) -> str | None:
    """Why a call must be refused, or None to grant it.

    ``job_token``: the token of the job the call names (None: it names none, or one no longer
    known here, whose handler then has nothing to act on); ``token``: the one the call carries.
    ``worker_key``: the registered key of the worker the call claims to come from (None: none
    registered); ``key``: the one it carries."""
    if rule is Rule.OPEN:
        return None
    if rule in (Rule.WORKER, Rule.CLUSTER_WORKER):
        if worker_key is None:
            return "the worker it claims to be has registered no key"
        if key is None:
            return "no worker key"
        if not same(worker_key, key):
            return "not the key of the worker it claims to be"
        if rule is Rule.CLUSTER_WORKER:
            return None
    if job_token is None:
        return None
    if token is None:
        return "no job token"
    if not same(job_token, token):
        return "not the job's token"
    return None


@dataclass
class Lease:
    """A job's lease: it lives while its driver renews it at least every ``timeout`` seconds.

    Times are the caller's clock (monotonic seconds): only differences matter."""

    #: seconds the job lives after the newest renewal
    timeout: float
    #: when the driver last renewed it
    renewed_at: float

    def renew(self, now: float) -> None:
        self.renewed_at = max(self.renewed_at, now)

    def age(self, now: float) -> float:
        """Seconds since the newest renewal."""
        return max(0.0, now - self.renewed_at)

    def expired(self, now: float) -> bool:
        return now - self.renewed_at > self.timeout

    def grant(self, lagged_s: float) -> None:
        """The coordinator's own loop was starved for ``lagged_s`` seconds: the driver's renewals
        may be waiting unread, so that time is not held against it."""
        self.renewed_at += max(0.0, lagged_s)
