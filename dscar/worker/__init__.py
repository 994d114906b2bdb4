"""The worker side: the ParamServer plugin, the shard runner, and the stores of partitions, shards and
pulled rows."""


def __getattr__(name: str):  # ``dscar.worker.x`` loads on first use (dscar/__init__.py says why)
    from .. import submodule

    return submodule(__name__, name)
