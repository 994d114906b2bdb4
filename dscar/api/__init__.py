"""The user API: estimators, ``fit`` (the driver), clusters, results, the CLI and its reports."""


def __getattr__(name: str):  # ``dscar.api.x`` loads on first use (dscar/__init__.py says why)
    from .. import submodule

    return submodule(__name__, name)
