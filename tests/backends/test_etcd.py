"""etcd's v3 JSON gateway through the proxy: Debian's etcd-server 3.4.

The proxy runs ``docs/examples/proxy-etcd.toml``: every gateway call is a POST, and
``/v3/kv/range`` is a read route; every other call (put, deleterange...) is a fenced
write of the scope ``etcd``. etcd runs ``docs/examples/etcd.yaml``. What is checked is
read from etcd directly, not through the proxy.
"""

import base64
import json

import pytest

from conftest import (
    LEADERSHIP_MOVES,
    backend_fixtures,
    gc_paused_writer_is_refused,
    http,
    http_json,
    is_problem,
    start_proxy,
)
from etcd_backend import Etcd, b64

SCOPE = "etcd"

etcd, proxy = backend_fixtures("etcd", Etcd, "proxy-etcd.toml")


def call(proxy, path: str, payload, token=None):
    headers = {} if token is None else {"Fencing-Token": str(token)}
    return http_json("POST", proxy.url + path, payload, headers)


def test_puts_and_deletes_are_fenced_writes(proxy, etcd):
    """Goal: put and deleterange need a current token, and a refused one never reaches
    etcd. Method: put with the next token N; put without a token (428) and, after the
    fence is raised to N+1, with N (409); deleterange without a token and with N; etcd
    directly still holds the first value; then N+1 deletes it."""
    n = proxy.fence(SCOPE) + 1
    status, _ = call(proxy, "/v3/kv/put", {"key": b64("fenced"), "value": b64("one")}, token=n)
    assert status == 200
    assert proxy.fence(SCOPE) == n
    assert call(proxy, "/v3/kv/put", {"key": b64("fenced"), "value": b64("none")})[0] == 428
    proxy.advance(SCOPE, n + 1)
    assert call(proxy, "/v3/kv/put", {"key": b64("fenced"), "value": b64("stale")}, token=n)[0] == 409
    assert call(proxy, "/v3/kv/deleterange", {"key": b64("fenced")})[0] == 428
    assert call(proxy, "/v3/kv/deleterange", {"key": b64("fenced")}, token=n)[0] == 409
    assert etcd.value("fenced") == "one"
    status, body = call(proxy, "/v3/kv/deleterange", {"key": b64("fenced")}, token=n + 1)
    assert status == 200 and body.get("deleted") == "1", body
    assert etcd.value("fenced") is None


def test_range_is_a_read_without_a_token(proxy, etcd):
    """Goal: the range call, a POST, is a read by its route. Method: a key written to
    etcd directly is read through the proxy with no token."""
    http_json("POST", etcd.url + "/v3/kv/put", {"key": b64("readable"), "value": b64("yes")})
    status, body = call(proxy, "/v3/kv/range", {"key": b64("readable")})
    assert status == 200, body
    assert base64.b64decode(body["kvs"][0]["value"]) == b"yes"


def test_other_gateway_calls_are_fenced_by_default(proxy):
    """Goal: a call the configuration does not name is a write (fail closed). Method: a
    txn and a lease grant without a token get 428."""
    assert call(proxy, "/v3/kv/txn", {"compare": [], "success": []})[0] == 428
    assert call(proxy, "/v3/lease/grant", {"TTL": 60})[0] == 428


@pytest.mark.parametrize("path", [
    "/v3/kv/range/../put",
    "/v3/kv/range/%2E%2E/put",
    "/v3/kv/range%2F..%2Fput",
    "//v3/kv/put",
    "/v3/kv/%70ut",
    "/v3/kv/./put",
])
def test_spellings_of_put_do_not_escape_the_fence(proxy, etcd, path):
    """Goal: no spelling of the put path passes as the range read route or escapes the
    scope. Method: with the fence above the token, a put on each spelling is answered
    by the proxy itself (problem+json, 400 or 409), and etcd directly never holds it."""
    http_json("POST", etcd.url + "/v3/kv/put", {"key": b64("spelled"), "value": b64("original")})
    current = proxy.fence(SCOPE) + 1
    proxy.advance(SCOPE, current)
    status, headers, _ = http("POST", proxy.url + path,
                              json.dumps({"key": b64("spelled"), "value": b64("bypassed")}).encode(),
                              {"Content-Type": "application/json", "Fencing-Token": str(current - 1)})
    assert status in (400, 409) and is_problem(headers), (path, status)
    assert etcd.value("spelled") == "original"


@pytest.mark.parametrize("move", LEADERSHIP_MOVES)
def test_a_gc_paused_etcd_writer_is_refused(etcd, tmp_path, move):
    """Goal: a writer frozen between taking its token and writing cannot overwrite the new
    leader's key. Method: a 3-node cluster for scope etcd announcing to the proxy; the
    writer process stops itself (SIGSTOP) after taking the token; leadership moves
    (transferred, or the leader killed); the new token puts; SIGCONT: the stale put gets
    409, and etcd directly holds the new leader's value. The proxy is this test's own,
    so that its fence starts at 0, where a new cluster's first term is accepted."""
    proxy = start_proxy(tmp_path / "proxy", "proxy-etcd.toml", etcd.url)

    def fresh_write(token):
        status, body = call(proxy, "/v3/kv/put", {"key": b64("leader"), "value": b64("new leader")}, token)
        assert status == 200, body

    spec = {"kind": "http", "method": "POST", "url": proxy.url + "/v3/kv/put",
            "headers": {"Content-Type": "application/json"},
            "body": '{"key": "%s", "value": "%s"}' % (b64("leader"), b64("stale leader"))}
    try:
        old, new, stored = gc_paused_writer_is_refused(tmp_path, proxy, SCOPE, spec, fresh_write,
                                                       lambda: etcd.value("leader"), move)
    finally:
        proxy.stop()
    assert new > old
    assert stored == "new leader"
