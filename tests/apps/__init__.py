"""Small importable apps for tests that load an app by ``module:attr`` (the CLI)."""
