"""Garage, one node on loopback, configured from ``docs/examples/garage.toml``."""

import os
import re
import subprocess
from pathlib import Path

import pytest

from conftest import Backend, Process, example, free_port, port_open, random_secret_hex, tool, wait_until

KEY_NAME = "palisade-test"


class Garage(Backend):
    def __init__(self, workdir: Path):
        self.bin = tool("garage", "cargo install garage --version 2.5.0 --locked")
        workdir.mkdir(parents=True, exist_ok=True)
        self.s3_port, self.rpc_port, admin_port = free_port(), free_port(), free_port()
        rpc_port = self.rpc_port
        self.config = workdir / "garage.toml"
        self.config.write_text(example("garage.toml", {
            "/var/lib/garage/meta": workdir / "meta",
            "/var/lib/garage/data": workdir / "data",
            "127.0.0.1:3901": f"127.0.0.1:{rpc_port}",
            "127.0.0.1:3900": f"127.0.0.1:{self.s3_port}",
            "127.0.0.1:3903": f"127.0.0.1:{admin_port}",
            "0" * 64: random_secret_hex(32),
        }))
        self.env = {"GARAGE_CONFIG_FILE": str(self.config), "RUST_LOG": "garage=warn,garage_api_common=info"}
        self.url = f"http://127.0.0.1:{self.s3_port}"
        self.process = Process("garage server", [self.bin, "server"], workdir / "garage.log", self.env)
        try:
            node = wait_until("garage to answer `garage node id`", self._node_id)
            self.cli("layout", "assign", "-z", "dc1", "-c", "1G", node.split("@")[0])
            self.cli("layout", "apply", "--version", "1")
            out = self.cli("key", "create", KEY_NAME)
            self.access_key = re.search(r"Key ID:\s*(\S+)", out).group(1)
            self.secret_key = re.search(r"Secret key:\s*(\S+)", out).group(1)
            wait_until("garage's S3 port", lambda: port_open(self.s3_port))
        except BaseException:
            self.stop()
            raise

    def cli(self, *args) -> str:
        self.process.check_alive()
        done = subprocess.run([self.bin, *args], env={**os.environ, **self.env},
                              capture_output=True, text=True, timeout=60)
        if done.returncode != 0:
            pytest.fail(f"garage {' '.join(args)} failed ({done.returncode}): {done.stdout}{done.stderr}")
        return done.stdout

    def _node_id(self):
        self.process.check_alive()
        if not port_open(self.rpc_port):
            return None
        done = subprocess.run([self.bin, "node", "id", "-q"], env={**os.environ, **self.env},
                              capture_output=True, text=True, timeout=30)
        return done.stdout.strip() if done.returncode == 0 and "@" in done.stdout else None

    def create_bucket(self, bucket: str):
        self.cli("bucket", "create", bucket)
        self.cli("bucket", "allow", "--read", "--write", "--owner", bucket, "--key", KEY_NAME)
