"""etcd, one member on loopback, with its v3 JSON gateway (Debian's etcd-server 3.4)."""

import base64

from conftest import Backend, Process, example, free_port, http, http_json, tool


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


class Etcd(Backend):
    """etcd, one member on loopback, configured from ``docs/examples/etcd.yaml``."""

    def __init__(self, workdir):
        binary = tool("etcd", "apt-get install etcd-server")
        workdir.mkdir(parents=True, exist_ok=True)
        client, peer = free_port(), free_port()
        config = workdir / "etcd.yaml"
        config.write_text(example("etcd.yaml", {
            "/var/lib/etcd/palisade-test": workdir / "data",
            "127.0.0.1:2379": f"127.0.0.1:{client}",
            "127.0.0.1:2380": f"127.0.0.1:{peer}",
        }))
        self.url = f"http://127.0.0.1:{client}"
        self.process = Process("etcd", [binary, "--config-file", config], workdir / "etcd.log")
        self.process.wait_or_stop("etcd's /health", self._healthy)

    def _healthy(self):
        self.process.check_alive()
        status, _, body = http("GET", self.url + "/health", timeout=2)
        return status == 200 and b'"true"' in body

    def value(self, key: str):
        """The key's value read from etcd itself, or None."""
        status, body = http_json("POST", self.url + "/v3/kv/range", {"key": b64(key)})
        assert status == 200, body
        kvs = body.get("kvs", [])
        return base64.b64decode(kvs[0]["value"]).decode() if kvs else None
