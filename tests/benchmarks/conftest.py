"""The benchmarks' tests run against the same live server as the server's tests."""

from tests.server.conftest import live, server_config

__all__ = ["live", "server_config"]
