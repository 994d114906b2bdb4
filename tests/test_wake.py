"""Which waiting long polls a change wakes (``dscar.core.wake``), without Dask."""
from hypothesis import given, settings
from hypothesis import strategies as st

from dscar.core.wake import MISSES, WaitLine, Woken, commit_wakes


def line_of(*workers: str) -> WaitLine:
    line = WaitLine()
    for w in workers:
        line.wait(w)
    return line


def test_a_change_wakes_the_waiting_owners_and_the_head_of_the_line_only():
    line = line_of("a", "b", "c", "d")
    woken = line.wake(owners={"c", "x"})
    assert woken == [Woken("c", None), Woken("a", MISSES)]
    assert list(line) == ["b", "d"]


def test_everyone_wakes_every_waiting_poll():
    line = line_of("a", "b", "c")
    assert [w.worker for w in line.wake(everyone=True)] == ["a", "b", "c"]
    assert len(line) == 0


def test_a_poll_that_got_an_item_passes_its_wake_on_one_that_found_nothing_with_a_miss_fewer_an_owner_none():
    line = line_of("a", "b", "c")
    assert line.pass_on(Woken("x", 1), got_item=True) == [Woken("a", 1)]
    assert line.pass_on(Woken("x", 1), got_item=False) == [Woken("b", 0)]
    assert line.pass_on(Woken("x", 0), got_item=False) == []
    assert line.pass_on(Woken("x", None), got_item=True) == []  # an owner's wake
    assert list(line) == ["c"]


def test_a_worker_waits_in_the_line_once_in_the_order_it_began_waiting():
    line = line_of("a", "b", "a")
    assert list(line) == ["a", "b"]
    line.leave("a")
    line.wait("a")
    assert list(line) == ["b", "a"]


@st.composite
def waits(draw):
    """Waiting workers, the TODO shards each holds, work any worker may take (a clock-end step, shards
    worth moving, backups, batch members to ask back), and up to ``MISSES`` waiters that may not take
    the latter (a straggler held back, a joiner warming up, ...), waiting in some order."""
    n = draw(st.integers(1, 12))
    workers = [f"w{i}" for i in range(n)]
    order = draw(st.permutations(workers))
    own = {w: draw(st.integers(0, 2)) for w in workers}
    spare = draw(st.integers(0, 4))
    barred = set(draw(st.lists(st.sampled_from(workers), max_size=MISSES, unique=True)))
    held_back = set(draw(st.lists(st.sampled_from(workers), max_size=MISSES - len(barred), unique=True)))
    return order, own, spare, barred - held_back, held_back


@settings(max_examples=400, deadline=None)
@given(waits())
def test_no_lost_wake_up_whenever_a_waiting_worker_may_take_work_and_the_cost_is_the_work_plus_a_few(case):
    """After one change, woken polls look and pass wakes on until none is passed: then no worker still
    waiting may take any work left (nothing waits for its timeout), and the polls that looked are the
    owners, the items handed out and at most ``MISSES + 1`` more (not every waiting poll)."""
    order, own, spare, barred, held_back = case
    own = dict(own)
    line = line_of(*order)
    owners = {w for w, n in own.items() if n}

    def takes(w: str) -> bool:
        nonlocal spare
        if own[w] and w not in held_back:
            own[w] -= 1
            return True
        if spare and w not in barred:
            spare -= 1
            return True
        if any(own[h] for h in held_back if h != w) and w not in barred:  # a held-back straggler's shard moves
            own[next(h for h in held_back if own[h] and h != w)] -= 1
            return True
        return False

    def may_take(w: str) -> bool:
        return bool((own[w] and w not in held_back) or (w not in barred and (
            spare or any(own[h] for h in held_back if h != w))))

    pending, looked, handed = list(line.wake(owners=owners)), 0, 0
    while pending:
        woken = pending.pop(0)
        looked += 1
        got = takes(woken.worker)
        handed += got
        pending += line.pass_on(woken, got)
        if not got:
            line.wait(woken.worker)  # it waits again
    assert not [w for w in line if may_take(w)], "a waiting worker may take work and nobody woke it"
    assert looked <= len(owners) + handed + MISSES + 1


class _Queue:
    def __init__(self, n_todo: int):
        self.n_todo = n_todo


class _Job:
    def __init__(self, consistency: str, n_todo: int):
        self.consistency, self.queue = consistency, _Queue(n_todo)


def test_a_bsp_commit_wakes_polls_only_when_it_completes_its_pass_or_shards_wait():
    """At a pass's tail every shard is running: a commit that completes nothing gives a waiting poll
    nothing it could not get before (a backup turns due with time: the ticker wakes the head then), so
    it wakes none; one whose pass is complete, or after which shards are TODO, wakes as any change."""
    assert not commit_wakes(_Job("bsp", 0), [])
    assert commit_wakes(_Job("bsp", 0), ["an effect"])
    assert commit_wakes(_Job("bsp", 3), [])
    assert commit_wakes(_Job("ssp", 0), [])  # (a commit moves the clock window)
