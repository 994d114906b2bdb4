"""The scheduler side: the Coordinator plugin (handlers, fan-out, long polls) and the dashboard page.
It carries out what the pure core decides."""


def __getattr__(name: str):  # ``dscar.scheduler.x`` loads on first use (dscar/__init__.py says why)
    from .. import submodule

    return submodule(__name__, name)
