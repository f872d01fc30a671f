"""wsgidav 4.4 (with cheroot), serving one directory over WebDAV on loopback."""

import sys
from pathlib import Path

from conftest import Backend, Process, example, free_port, http, port_open, tool


class WsgiDav(Backend):
    """wsgidav serving a directory on loopback, configured from ``docs/examples/wsgidav.yaml``."""

    def __init__(self, workdir: Path):
        # The module of the python3 running the tests, so that a pip install whose scripts
        # directory is not on PATH still counts; skipped only when it is not importable.
        try:
            import cheroot  # noqa: F401, PLC0415
            import wsgidav  # noqa: F401, PLC0415
        except ImportError:
            tool("wsgidav", "pip install wsgidav cheroot")  # skips, or fails under CI
        command = [sys.executable, "-m", "wsgidav.server.server_cli"]
        workdir.mkdir(parents=True, exist_ok=True)
        self.root = workdir / "root"
        self.root.mkdir()
        self.port = free_port()
        config = workdir / "wsgidav.yaml"
        config.write_text(example("wsgidav.yaml", {"8090": self.port, "/var/lib/dav": self.root}))
        self.url = f"http://127.0.0.1:{self.port}"
        self.process = Process("wsgidav", [*command, "--config", config], workdir / "wsgidav.log")
        self.process.wait_or_stop("wsgidav to answer OPTIONS", self._up)

    def _up(self):
        self.process.check_alive()
        return port_open(self.port) and http("OPTIONS", self.url + "/", timeout=2)[0] == 200
