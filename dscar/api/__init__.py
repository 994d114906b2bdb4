"""The user API: estimators, ``fit`` (the driver), clusters, results, the CLI and its reports."""
