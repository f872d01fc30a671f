"""The Python client against a real ``palisade proxy`` process (embedded store).

The binary is ``$PALISADE_BIN``, else ``target/debug/palisade`` at the repository root:
build it first with ``cargo build -p palisade-cli``.
"""

import json
import queue
import subprocess
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from palisade import (
    Fenced,
    FencedClient,
    HTTPError,
    NodeTokenSource,
    NotLeader,
    StaticToken,
    Unreachable,
)
from palisade_binary import palisade_bin

#: Seconds the proxy may take to print its listening line.
START_TIMEOUT_S = 30


class Proxy:
    """A ``palisade proxy`` child on free loopback ports; ``extra`` flags are added, and
    ``admin_token`` is sent as the bearer of admin calls."""

    def __init__(self, data_dir: Path, extra=(), admin_token=None):
        self.log = data_dir / "proxy.log"
        self.admin_token = admin_token
        self.process = subprocess.Popen(
            [
                str(palisade_bin()),
                "proxy",
                "--listen",
                "127.0.0.1:0",
                "--admin-listen",
                "127.0.0.1:0",
                "--data-dir",
                str(data_dir / "data"),
                *extra,
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self.log.open("w"),
            text=True,
        )
        lines: "queue.Queue[str]" = queue.Queue()

        def read():
            for line in self.process.stdout:
                lines.put(line)

        threading.Thread(target=read, daemon=True).start()
        try:
            while True:
                line = lines.get(timeout=START_TIMEOUT_S)
                if line.startswith("palisade proxy listening on"):
                    break
        except queue.Empty:
            self.stop()
            pytest.fail(f"the proxy did not start; its log:\n{self.log.read_text()}")
        # "palisade proxy listening on ADDR (admin ADDR)"
        words = line.split()
        self.url = f"http://{words[4]}"
        self.admin = f"http://{words[6].rstrip(')')}"

    def _admin_request(self, path: str):
        request = urllib.request.Request(self.admin + path)
        if self.admin_token is not None:
            request.add_header("Authorization", f"Bearer {self.admin_token}")
        return request

    def admin_json(self, path: str):
        with urllib.request.urlopen(self._admin_request(path), timeout=10) as answer:
            return json.load(answer)

    def requests_total(self) -> float:
        with urllib.request.urlopen(self._admin_request("/metrics"), timeout=10) as answer:
            text = answer.read().decode()
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("palisade_proxy_requests_total")
        )

    def stop(self):
        self.process.kill()
        self.process.wait(timeout=10)


@pytest.fixture
def proxy(tmp_path):
    running = Proxy(tmp_path)
    yield running
    running.stop()


class FakeNode:
    """A node API answering ``GET /v1/leader`` from ``self.view``."""

    def __init__(self, view: dict):
        self.view = view
        node = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                body = json.dumps(node.view).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


def leader_view(term, token):
    return {"node_id": 1, "scope": "default", "term": term, "leader_id": 1,
            "role": "leader", "token": token, "announced": token is not None}


def test_put_get_round_trip_carries_the_token(proxy):
    """A put carries the token; the store records it and a get reports it."""
    client = FencedClient(proxy.url, 3)
    stored = client.put("charges/sub-1", b"4200 cents")
    assert stored.status == 200
    assert stored.sent_token == 3
    got = client.get("/charges/sub-1")
    assert got.body == b"4200 cents"
    assert got.stored_token == 3
    assert got.sent_token is None


def test_stale_put_raises_fenced_then_not_leader_without_sending(proxy):
    """A token below the fence raises Fenced with the numbers; the source is marked, so
    the next write raises NotLeader and never reaches the proxy."""
    FencedClient(proxy.url, 5).put("k", "new")
    source = StaticToken(3)
    client = FencedClient(proxy.url, source)
    with pytest.raises(Fenced) as fenced:
        client.put("k", "old")
    assert (fenced.value.current, fenced.value.presented, fenced.value.scope) == (5, 3, "default")
    assert str(fenced.value) == "stale fencing token 3 for scope default: current is 5"
    assert source.current().write_token is None

    before = proxy.requests_total()
    with pytest.raises(NotLeader):
        client.put("k", "older")
    with pytest.raises(NotLeader):
        client.delete("k")
    assert proxy.requests_total() == before, "refused writes never reached the proxy"
    assert client.get("k").body == b"new"


def test_scope_header_delete_and_missing_object(tmp_path):
    """The scope is sent (to a proxy started with --client-scopes); delete removes; a
    missing object is HTTPError 404."""
    proxy = Proxy(tmp_path, extra=("--client-scopes",))
    try:
        client = FencedClient(proxy.url, 2, scope="billing")
        client.put("charges/a", "x")
        assert proxy.admin_json("/v1/fences/billing") == {"scope": "billing", "token": 2}
        assert client.delete("charges/a").status == 204
        with pytest.raises(HTTPError) as missing:
            client.get("charges/a")
        assert missing.value.status == 404
        with pytest.raises(ValueError):
            FencedClient(proxy.url, 2, scope="bad scope!")
    finally:
        proxy.stop()


def test_scope_header_is_refused_without_client_scopes(proxy):
    """A proxy with client scopes off (the default) refuses a chosen scope with 400 that
    says how to enable it, and its fence does not move."""
    client = FencedClient(proxy.url, 2, scope="billing")
    with pytest.raises(HTTPError) as refused:
        client.put("charges/a", "x")
    assert refused.value.status == 400
    assert "--client-scopes" in str(refused.value)
    assert proxy.admin_json("/v1/fences/billing") == {"scope": "billing", "token": 0}


def test_node_token_source_follows_the_node(proxy):
    """The node's token is used while it is the established leader; a follower, a leader
    not yet established, and an unreachable node all mean NotLeader."""
    node = FakeNode(leader_view(4, 4))
    try:
        client = FencedClient(proxy.url, NodeTokenSource(node.url))
        assert client.put("jobs/1", "a").sent_token == 4
        node.view = leader_view(5, None)
        with pytest.raises(NotLeader):
            client.put("jobs/2", "b")
        node.view = {**leader_view(5, None), "role": "follower", "leader_id": 2}
        with pytest.raises(NotLeader) as not_leader:
            client.put("jobs/2", "b")
        assert (not_leader.value.term, not_leader.value.leader_id) == (5, 2)
    finally:
        node.stop()
    with pytest.raises(NotLeader):
        client.put("jobs/3", "c")


def test_unreachable_proxy_raises_unreachable():
    """A refused connection is Unreachable: nothing was sent."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(Unreachable):
        FencedClient(f"http://127.0.0.1:{port}", 1).put("k", "v")
