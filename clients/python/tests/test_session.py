"""``Session`` and ``observe`` against scripted nodes: small ``http.server`` servers that
answer the session and scope routes as the contract describes, each told how to
misbehave (never answer keepalives, forget the session, name another leader), so that
no cluster is needed. Sessions use the shortest TTL the contract allows (1 s).
"""

import json
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from palisade import (
    DRIFT_PPM_DEFAULT,
    HTTPError,
    NotLeaderNode,
    Session,
    SessionLost,
    UnknownSession,
    observe,
    session_trusted_until,
)

#: Seconds any expected outcome may take.
SEEN_TIMEOUT_S = 10.0
#: The TTL the tests ask for: the contract's shortest.
TTL_MS = 1_000
SESSION_ID = "s-0001"


class FakeNode:
    """A scripted node: ``script`` says who it is, whom it names as leader (itself when
    it leads), how it answers keepalives (``answer``, ``hang``, ``unknown``) and how many
    ``fence-pending`` answers come before a grant. ``seen`` counts requests by route."""

    def __init__(self, node_id, leader_id, keepalive="answer", fence_pending=0):
        self.script = {"node_id": node_id, "leader_id": leader_id, "keepalive": keepalive,
                       "fence_pending": fence_pending}
        self.seen = {"open": 0, "keepalive": 0, "campaign": 0, "resign": 0, "revoke": 0}
        self.queries = []
        self.lock = threading.Lock()
        self.released = threading.Event()
        node = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                node.handle(self, "GET")

            def do_POST(self):
                node.handle(self, "POST")

            def do_DELETE(self):
                node.handle(self, "DELETE")

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def count(self, route):
        with self.lock:
            return self.seen[route]

    def handle(self, request, method):
        url = urllib.parse.urlsplit(request.path)
        parts = url.path.strip("/").split("/")
        length = int(request.headers.get("Content-Length") or 0)
        body = json.loads(request.rfile.read(length)) if length else None
        with self.lock:
            script = dict(self.script)
        leads = script["leader_id"] == script["node_id"]
        if parts == ["v1", "leader"]:
            return reply(request, 200, {
                "node_id": script["node_id"], "scope": "default", "term": 3,
                "leader_id": script["leader_id"], "role": "leader" if leads else "follower",
                "token": 3 if leads else None, "announced": leads})
        if method != "GET" and not leads:
            return problem(request, 503, "not-leader", script)
        route = {
            ("POST", 2): "open", ("POST", 4): "keepalive", ("DELETE", 3): "revoke",
        }.get((method, len(parts)))
        if parts[:2] == ["v1", "scopes"] and method == "POST":
            route = parts[3]
        if route is not None:
            with self.lock:
                self.seen[route] += 1
        if route == "open":
            return reply(request, 200, {"id": SESSION_ID, "ttl_ms": body["ttl_ms"]})
        if route == "keepalive":
            if script["keepalive"] == "hang":
                self.released.wait(SEEN_TIMEOUT_S)  # Never answered while the test runs.
                return None
            if script["keepalive"] == "unknown":
                return problem(request, 404, "unknown-session", script)
            return reply(request, 200, {"id": parts[2], "ttl_ms": TTL_MS})
        if route == "revoke":
            return reply(request, 200, {"id": parts[2], "released": ["jobs"]})
        if route == "campaign":
            with self.lock:
                pending = self.script["fence_pending"] > 0
                self.script["fence_pending"] = max(0, self.script["fence_pending"] - 1)
            if pending:
                return problem(request, 503, "fence-pending", script)
            return reply(request, 200, {"scope": parts[2], "token": 41, "proof": None,
                                        "session": body["session"]})
        if route == "resign":
            return reply(request, 200, {"scope": parts[2], "session": body["session"],
                                        "released": True})
        if parts[:2] == ["v1", "scopes"] and method == "GET":
            with self.lock:
                self.queries.append(urllib.parse.parse_qs(url.query))
            return reply(request, 200, {"scope": parts[2], "session": SESSION_ID, "token": 41,
                                        "proof": None})
        return problem(request, 404, "not-found", script)

    def stop(self):
        self.released.set()
        self.server.shutdown()
        self.server.server_close()


def reply(request, status, body, content_type="application/json"):
    data = json.dumps(body).encode()
    request.send_response(status)
    request.send_header("Content-Type", content_type)
    request.send_header("Content-Length", str(len(data)))
    request.end_headers()
    request.wfile.write(data)


def problem(request, status, kind, script):
    body = {"type": f"https://palisade.invalid/problems/{kind}", "title": kind,
            "status": status, "detail": kind, "node_id": script["node_id"]}
    if script["leader_id"]:
        body["leader_id"] = script["leader_id"]
    reply(request, status, body, "application/problem+json")


@pytest.fixture
def nodes():
    started = []

    def start(*args, **kwargs):
        node = FakeNode(*args, **kwargs)
        started.append(node)
        return node

    yield start
    for node in started:
        node.stop()


def wait_for(condition, timeout=SEEN_TIMEOUT_S):
    """Polls ``condition`` until true or ``timeout`` seconds pass; returns its last value."""
    end = time.monotonic() + timeout
    while not condition():
        if time.monotonic() >= end:
            return False
        time.sleep(0.02)
    return True


def test_unanswered_keepalives_lose_the_session_by_trusted_until(nodes):
    """Goal: a session whose keepalives are never answered is lost when the trust the
    open gave runs out (its send plus the TTL less 1%), not before and not later.
    Method: a leader that hangs every keepalive; check the trust's bounds from the times
    around the open, ``is_lost`` just before it, and when ``wait_lost`` returns."""
    node = nodes(1, 1, keepalive="hang")
    before = time.monotonic()
    session = Session(node.url, ttl_ms=TTL_MS)
    after = time.monotonic()
    until = session.trusted_until
    assert session_trusted_until(before, TTL_MS) <= until <= session_trusted_until(after, TTL_MS)
    assert session_trusted_until(0.0, TTL_MS, DRIFT_PPM_DEFAULT) == pytest.approx(0.99)
    time.sleep(max(0.0, until - time.monotonic() - 0.05))  # Shows that nothing happens early.
    assert not session.is_lost()
    assert session.wait_lost(SEEN_TIMEOUT_S)
    assert time.monotonic() - until < 0.25, "lost was seen late"
    assert session.trusted_until == until, "an unanswered keepalive gives no trust"
    assert node.count("keepalive") >= 1
    assert "no keepalive answered" in session.loss
    with pytest.raises(SessionLost):
        session.campaign("jobs", timeout_ms=1_000)


def test_answered_keepalives_keep_the_session_trusted(nodes):
    """Goal: answered keepalives move the trust forward, so a kept session is not lost.
    Method: a leader that answers; after two TTLs the session is trusted, its trust ends
    within a TTL of now, and keepalives came about every third of the TTL."""
    node = nodes(1, 1)
    with Session([node.url], ttl_ms=TTL_MS) as session:
        assert not session.wait_lost(2 * TTL_MS / 1000)
        now = time.monotonic()
        assert now < session.trusted_until <= now + TTL_MS / 1000
        assert 4 <= node.count("keepalive") <= 7
    assert node.count("revoke") == 1, "the context manager revokes"


def test_an_unknown_session_answer_loses_the_session_at_once(nodes):
    """Goal: a 404 ``unknown-session`` loses the session at once, long before its trust
    would end. Method: a leader that 404s keepalives; lost at the first one."""
    node = nodes(1, 1, keepalive="unknown")
    session = Session(node.url, ttl_ms=TTL_MS)
    until = session.trusted_until
    assert session.wait_lost(SEEN_TIMEOUT_S)
    assert time.monotonic() < until - 0.3, "lost at the first keepalive, a third of the TTL"
    assert "unknown-session" in session.loss
    assert node.count("keepalive") == 1
    session.close()


def test_a_not_leader_answer_moves_the_session_to_the_node_named(nodes):
    """Goal: the session opens on the leader among the nodes, and a ``not-leader`` answer
    naming another node moves keepalives and campaigns there (its id mapped to its URL).
    Method: three nodes, node 2 leads; then every node names node 3."""
    cluster = [nodes(1, 2), nodes(2, 2), nodes(3, 2)]
    session = Session([n.url for n in cluster], ttl_ms=TTL_MS)
    assert [n.count("open") for n in cluster] == [0, 1, 0]
    for n in cluster:
        with n.lock:
            n.script["leader_id"] = 3
    assert wait_for(lambda: cluster[2].count("keepalive") >= 3), "node 3 got no keepalives"
    assert not session.is_lost(), session.loss
    assert session.campaign("jobs", timeout_ms=5_000)["token"] == 41
    assert [n.count("campaign") for n in cluster] == [0, 0, 1]
    session.close()


def test_campaign_returns_the_grant_after_fence_pending(nodes):
    """Goal: a campaign returns the grant, asking again after ``fence-pending`` within its
    timeout; a campaign that stays pending fails at its timeout with that kind; resign
    and observe work through the session. Method: a leader that answers
    ``fence-pending`` twice, then one that always does."""
    node = nodes(1, 1, fence_pending=2)
    with Session(node.url, ttl_ms=TTL_MS) as session:
        grant = session.campaign("jobs", timeout_ms=5_000)
        assert grant == {"scope": "jobs", "token": 41, "proof": None, "session": session.id}
        assert node.count("campaign") == 3
        assert session.observe("jobs", after_token=40, timeout_ms=100)["token"] == 41
        assert session.resign("jobs")["released"] is True
        with node.lock:
            node.script["fence_pending"] = 10**6
        start = time.monotonic()
        with pytest.raises(HTTPError) as pending:
            session.campaign("jobs", timeout_ms=500)
        assert pending.value.kind == "fence-pending"
        assert 0.5 <= time.monotonic() - start < 2.0


def test_observe_and_typed_errors(nodes):
    """Goal: ``observe`` sends the long poll's query; a follower's refusal is
    ``NotLeaderNode`` with the leader's id; bad TTLs, scopes and ids are refused before
    anything is sent. Method: a leader and a follower."""
    node = nodes(1, 1)
    view = observe(node.url, "jobs", after_token=7, timeout_ms=250)
    assert view["session"] == SESSION_ID
    assert node.queries[-1] == {"after_token": ["7"], "timeout_ms": ["250"]}
    observe(node.url, "jobs")
    assert "after_token" not in node.queries[-1]
    follower = nodes(5, 9)
    from palisade import _Base, _node_call

    with pytest.raises(NotLeaderNode) as refused:
        _node_call(_Base(follower.url), "POST", "/v1/sessions", {"ttl_ms": TTL_MS}, 1.0)
    assert (refused.value.node_id, refused.value.leader_id) == (5, 9)
    with pytest.raises(UnknownSession):
        gone = nodes(1, 1, keepalive="unknown")
        _node_call(_Base(gone.url), "POST", f"/v1/sessions/{SESSION_ID}/keepalive", None, 1.0)
    for ttl_ms in (999, 300_001):
        with pytest.raises(ValueError):
            Session(node.url, ttl_ms=ttl_ms)
    with Session(node.url, ttl_ms=TTL_MS) as session:
        for scope in ("..", ".", "a/b", "bad scope"):
            with pytest.raises(ValueError):
                session.campaign(scope)
    assert node.count("campaign") == 0
