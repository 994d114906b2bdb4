"""``Dispatch.item`` builds a work item's message as the wire dicts of ``dscar.core.protocol`` without
building its dataclasses (pure: no Dask): the message must stay the one ``WorkItem.to_msg`` makes, key
order included (the simulator's decision digests and the workers read it)."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from dscar.core.dispatch import SspFields
from dscar.core.job import JobConfig, JobState
from dscar.core.partitions import PartitionMap, TableLayout
from dscar.core.protocol import Member, WorkItem
from dscar.core.shards import Attempt, ShardQueue

WORKERS = ["a", "b", "c"]


def expected(job: JobState, batch: list[Attempt], rebuild: bool, window: SspFields | None, item_id: int) -> dict:
    """The message as the dataclasses make it (what ``Dispatch.item`` built before it built the dicts)."""
    phases, restore = job.cfg.phase_names, job.losses.restore_state
    if window is None:
        members = [Member(a.shard, a.attempt, a.fetch_from, a.backup, phases[job.queue.phase_of(a.shard)] or None,
                          restore.get(a.shard)) for a in batch]
        clock, extra = job.clock, {}
    else:
        members = [Member(a.shard, a.attempt, a.fetch_from, a.backup, phases[job.queue.phase_of(a.shard)] or None,
                          restore.get(a.shard), c, seen, mine) for a, (c, seen, mine) in zip(batch, window.members)]
        clock, extra = window.clock, {"version": window.version, "floor": window.floor,
                                      "read_floor": window.read_floor}
    restored = ({t: [list(r) for r in rs] for t, rs in job.losses.restored_rows.items()}
                if rebuild and job.losses.restored_rows else None)
    return WorkItem("rebuild" if rebuild else "shard", job.cfg.job_id, item_id, clock, job.run_id, job.pmap.to_msg(),
                    members, job.dispatch.batch_scale.get(batch[0].worker, 1.0), restored, **extra).to_msg()


maybe_int = st.none() | st.integers(0, 9)


@st.composite
def cases(draw):
    phases = draw(st.lists(st.integers(1, 4), min_size=1, max_size=3))
    names = [""] if len(phases) == 1 and draw(st.booleans()) else [f"p{i}" for i in range(len(phases))]
    n_shards = sum(phases)
    shards = draw(st.lists(st.integers(0, n_shards - 1), min_size=1, max_size=5))
    worker = draw(st.sampled_from(WORKERS))
    batch = [Attempt(s, draw(st.integers(0, 3)), worker, 0.0, draw(st.none() | st.sampled_from(WORKERS)),
                     draw(st.booleans())) for s in shards]
    restore = draw(st.dictionaries(st.integers(0, n_shards - 1), st.none() | st.text("xyz", max_size=3), max_size=3))
    rows = draw(st.dictionaries(st.sampled_from(["x", "y"]), st.lists(st.tuples(st.integers(0, 9), st.integers(0, 9)),
                                                                      max_size=2), max_size=2))
    window = None
    if draw(st.booleans()):
        members = [(draw(maybe_int), draw(maybe_int), draw(st.none() | st.booleans())) for _ in batch]
        window = SspFields(members, draw(st.integers(1, 9)), draw(maybe_int), draw(maybe_int), draw(maybe_int))
    scale = draw(st.none() | st.floats(0.1, 2.0))
    return phases, names, batch, restore, rows, window, draw(st.booleans()), scale


@settings(max_examples=300, deadline=None)
@given(cases())
def test_a_work_item_s_message_is_the_protocol_s_dataclasses_message(case):
    phases, names, batch, restore, rows, window, rebuild, scale = case
    queue = ShardQueue(sum(phases), reloadable=True, phases=phases)
    pmap = PartitionMap([TableLayout("x", 12, 3)])
    pmap.assign(WORKERS)
    job = JobState(JobConfig("j", sum(phases), {"x": "param"}, [], names), queue, pmap)
    job.losses.restore_state = restore
    job.losses.restored_rows = rows
    if scale is not None:
        job.dispatch.batch_scale = {batch[0].worker: scale}
    before = job.dispatch.items_handed
    want = expected(job, batch, rebuild, window, before + 1)
    got = job.dispatch.item(batch, rebuild, window)
    assert repr(got) == repr(want)  # (the keys in the same order: a dict's == does not look at it)
    assert job.dispatch.items_handed == before + 1 and job.dispatch.item_of[batch[0].worker] == before + 1
