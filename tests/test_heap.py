"""The long-lived heap is frozen while a job runs here and unfrozen after the last (``dscar.heap``)."""
import gc

import pytest

from dscar import heap


@pytest.fixture
def clean_heap():
    assert heap.holders() == 0 and gc.get_freeze_count() == 0  # (nothing of another test held it)
    yield
    for key in list(heap._holders):
        heap.release(key)
    gc.unfreeze()


def test_the_first_holder_freezes_and_the_last_one_unfreezes(clean_heap):
    long_lived = [object() for _ in range(10)]  # (a container that exists before the job starts)
    heap.hold("job-a")
    frozen = gc.get_freeze_count()
    assert frozen > 0 and gc.is_tracked(long_lived)
    heap.hold(("worker-1", "job-b"))
    assert gc.get_freeze_count() == frozen  # a later holder freezes nothing more: the job's own objects stay collectable
    heap.hold("job-a")  # idempotent per key
    heap.release("job-a")
    assert gc.get_freeze_count() == frozen and heap.holders() == 1
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
    class Node:
        pass

    a, b = Node(), Node()
    a.other, b.other = b, a  # a cycle: only the cyclic collector frees it
    import weakref
    gone = weakref.ref(a)
    heap.hold("job-a")
    del a, b
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
