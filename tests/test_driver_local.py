"""The driver of a fit on an embedded cluster calls the coordinator's handlers directly: its scheduler
runs on the client's own event loop, where each message would cross a socket twice (``dscar.comm.call_local``)."""
import dask
import numpy as np

import dscar
from conftest import RowCounter, assert_exactly_once, row_data
from dscar.api import driver
from dscar.comm import local_scheduler_handler


def test_an_embedded_scheduler_s_handlers_are_called_directly_and_answer_as_messages_do(procs, monkeypatch):
    """Every driver call of a fit on ``dscar.Cluster()`` (worker processes, TCP) goes to the handler itself,
    and the fit equals one whose calls are messages; a client of a scheduler it does not run has none."""
    handler = local_scheduler_handler(procs.client, "dscar_wait")
    assert handler is not None and handler is procs.client.cluster.scheduler.handlers["dscar_wait"]
    direct: list[str] = []
    call_local = driver.call_local

    async def noted(h, address, **kw):
        direct.append(h.__name__)
        return await call_local(h, address, **kw)

    monkeypatch.setattr(driver, "call_local", noted)
    with dask.config.set({"dscar.report-linger": 0}):  # (an ask a clock: none of its reports comes with another's)
        res = dscar.fit(RowCounter(), row_data(40), procs, n_shards=4, max_clocks=4, progress=False)
    assert_exactly_once(res, 40)
    assert direct.count("dscar_wait") + direct.count("dscar_begin_clock") >= 4, direct
    monkeypatch.setattr(driver, "local_scheduler_handler", lambda client, name: None)
    direct.clear()
    by_message = dscar.fit(RowCounter(), row_data(40), procs, n_shards=4, max_clocks=4, progress=False)
    assert not direct
    assert [r.metrics for r in by_message.history] == [r.metrics for r in res.history]
    np.testing.assert_array_equal(by_message.params["count"], res.params["count"])
    with dscar.Cluster(procs.client.scheduler.address) as remote:  # (a client of its own: not the scheduler's loop)
        assert local_scheduler_handler(remote.client, "dscar_wait") is None
