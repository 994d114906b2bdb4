"""The long-lived heap is frozen while a job runs here and unfrozen after the last (``dscar.heap``)."""
import gc
import weakref

import pytest

from dscar import heap


@pytest.fixture
def clean_heap(monkeypatch):
    """No holder and nothing frozen (the scheduler of the ``procs`` cluster runs in this process)."""
    monkeypatch.setattr(heap, "_holders", set())
    gc.unfreeze()
    yield
    gc.unfreeze()


class Node:
    """A reference cycle's member: only the cyclic collector frees it."""


def cycle() -> "weakref.ref":
    a, b = Node(), Node()
    a.other, b.other = b, a
    return weakref.ref(a)


def test_the_first_holder_freezes_and_the_last_one_unfreezes(clean_heap):
    heap.hold("job-a")
    assert gc.get_freeze_count() > 0 and heap.holders() == 1
    made_by_the_job = cycle()  # (allocated after the freeze)
    heap.hold(("worker-1", "job-b"))  # a later holder freezes nothing more: the job's own garbage is collected
    heap.hold("job-a")  # idempotent per key
    gc.collect()
    assert made_by_the_job() is None and heap.holders() == 2
    heap.release("job-a")
    assert gc.get_freeze_count() > 0 and heap.holders() == 1
    heap.release(("worker-1", "job-b"))
    assert gc.get_freeze_count() == 0 and heap.holders() == 0


def test_a_release_of_a_key_that_holds_nothing_is_ignored(clean_heap):
    heap.release("never-held")
    assert gc.get_freeze_count() == 0
    heap.hold("job-a")
    heap.release("job-b")
    assert gc.get_freeze_count() > 0 and heap.holders() == 1
    heap.release("job-a")
    assert gc.get_freeze_count() == 0


def test_garbage_cycles_among_frozen_objects_are_collected_once_unfrozen(clean_heap):
    a = Node()
    a.other = Node()
    a.other.other = a
    gone = weakref.ref(a)
    heap.hold("job-a")  # (frozen while still referenced)
    del a
    gc.collect()
    assert gone() is not None  # frozen: kept while the job runs
    heap.release("job-a")
    gc.collect()
    assert gone() is None  # nothing is kept for good


def test_a_fit_holds_the_heap_frozen_on_the_scheduler_and_the_workers_while_it_runs_only(procs):
    import dscar
    from conftest import RowCounter, assert_exactly_once, row_data

    def heap_state(dask_scheduler=None, dask_worker=None) -> tuple[int, int]:
        import gc
        from dscar import heap
        return heap.holders(), gc.get_freeze_count()

    seen = {}

    class Watched(RowCounter):
        converged_on_workers = False  # (so that ``converged`` runs in this process)

        def converged(self, history, tol):  # (the driver's process, between clocks)
            if len(history) == 2:
                seen["scheduler"] = procs.client.run_on_scheduler(heap_state)
                seen["workers"] = list(procs.client.run(heap_state).values())
            return False

    res = dscar.fit(Watched(), row_data(40), procs, n_shards=8, max_clocks=3, progress=False)
    assert_exactly_once(res, 40)
    assert seen["scheduler"][0] == 1 and seen["scheduler"][1] > 0
    assert all(n == 1 and frozen > 0 for n, frozen in seen["workers"])
    assert procs.client.run_on_scheduler(heap_state) == (0, 0)
    assert set(procs.client.run(heap_state).values()) == {(0, 0)}
