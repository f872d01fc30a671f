"""Palisade client for Python: writes through a fencing proxy that carry a fencing token.

Standard library only. A ``FencedClient`` attaches ``Fencing-Token`` to every write
(PUT, POST, PATCH, DELETE), with ``Fencing-Token-Proof`` whenever its token source has the
token's proof (a proxy run with ``--token-pub`` admits no token without one), refuses to send a write while its token source says this
process is not the established leader (``NotLeader``), and turns the proxy's 409 into
``Fenced(current, presented)``, after which the source reports "not leader" so the
application stops.

    from palisade import FencedClient, Fenced, NotLeader

    client = FencedClient("http://127.0.0.1:8080", 7, scope="billing")
    client.put("charges/sub-1", b'{"amount_cents": 4200}')
    print(client.get("charges/sub-1").body)

The client sends each request once: it does not retry. A timeout after sending is
``Indeterminate`` (the write may have been applied); a refused connection is
``Unreachable`` (nothing was sent).

For ``https://`` URLs (a node API served with ``--cert/--key/--ca``, which requires a
client certificate), give ``ca=``, ``cert=`` and ``key=`` (PEM file paths), or a ready
``ssl_context=``, to ``NodeTokenSource``, ``FencedClient`` and ``Session``.

Named leaderships: a ``Session`` is opened on the cluster's leader with a TTL, kept alive
by a background thread every third of it, and campaigns for a scope; the grant carries
the scope's fencing token. The session is trusted until the send of the last answered
keepalive plus the TTL less the drift bound (``session_trusted_until``); past that, or
once the cluster no longer knows it, ``is_lost()`` is true for good and the holder must
stop.

    from palisade import Session

    with Session(["http://127.0.0.1:7001", "http://127.0.0.1:7002"], ttl_ms=10_000) as s:
        grant = s.campaign("nightly-report", timeout_ms=60_000)
        client = FencedClient("http://127.0.0.1:8080", StaticToken(grant["token"],
                              grant["proof"]), scope="nightly-report")
        while not s.is_lost() and work_left():
            client.put(...)
"""

from __future__ import annotations

import http.client
import json
import re
import socket
import ssl
import threading
import time
import urllib.parse
from dataclasses import dataclass
from typing import Mapping, Optional, Protocol, Union

__all__ = [
    "FENCING_SCOPE",
    "FENCING_TOKEN",
    "FENCING_TOKEN_CURRENT",
    "FENCING_TOKEN_PROOF",
    "SCOPE_BYTES_MAX",
    "Fenced",
    "FencedClient",
    "HTTPError",
    "Indeterminate",
    "Leadership",
    "NodeTokenSource",
    "NotLeader",
    "NotLeaderNode",
    "PROOF_CHARS_MAX",
    "PalisadeError",
    "Response",
    "Session",
    "SessionLost",
    "StaticToken",
    "TokenSource",
    "UnknownSession",
    "Unreachable",
    "observe",
    "parse_token",
    "session_trusted_until",
    "valid_scope",
]

#: Request header carrying the fencing token (fixed by the contract).
FENCING_TOKEN = "Fencing-Token"
#: Request header naming the fencing scope (fixed by the contract).
FENCING_SCOPE = "Fencing-Scope"
#: Response header with the scope's fence on a rejection (fixed by the contract).
FENCING_TOKEN_CURRENT = "Fencing-Token-Current"
#: Header with the signature that proves a token was issued by the cluster (fixed by the
#: contract): base64url without padding, sent with the token when the source has it.
FENCING_TOKEN_PROOF = "Fencing-Token-Proof"
#: Longest proof sent, in characters (an Ed25519 signature is 86); a longer or odd value
#: from a token source is refused before sending rather than passed on.
PROOF_CHARS_MAX = 128
_PROOF_RE = re.compile(r"[A-Za-z0-9_-]{1,%d}" % PROOF_CHARS_MAX)

#: Longest scope name, in bytes: 1 to 128 of ``[A-Za-z0-9._-]``. This copy of the rule, and
#: the header names above, are checked against ``protocol/cases.json`` by
#: ``tests/test_cases.py``; the Rust definitions are checked against the same table.
SCOPE_BYTES_MAX = 128
#: Digits in the largest token (2**64 - 1): a longer string is refused, leading zeros
#: included, as the proxy refuses it.
_TOKEN_DIGITS_MAX = 20
_TOKEN_MAX = 2**64 - 1

#: Default limit, in seconds, on one request from connecting to the whole answer. Above
#: the proxy's default barrier wait (5 s), so that a barrier 503 is seen as such.
REQUEST_TIMEOUT_S = 10.0
#: Limit, in seconds, on one ``GET /v1/leader``: the node answers from memory.
NODE_TIMEOUT_S = 2.0
#: Largest response body read into memory (the proxy's default object limit, twice).
RESPONSE_BYTES_MAX = 32 * 1024 * 1024

WRITE_METHODS = frozenset({"PUT", "POST", "PATCH", "DELETE"})

# Named leaderships: the contract's names and bounds (the Rust definitions are in
# ``protocol/src/scopes.rs``).
#: Problem kinds a session's caller acts on.
NOT_LEADER = "not-leader"
UNKNOWN_SESSION = "unknown-session"
CAMPAIGN_TIMEOUT = "campaign-timeout"
FENCE_PENDING = "fence-pending"
#: Session TTL bounds a node accepts, and the TTL asked for unless told otherwise (ms).
SESSION_TTL_MS_MIN = 1_000
SESSION_TTL_MS_MAX = 300_000
SESSION_TTL_MS_DEFAULT = 10_000
#: How long a campaign waits for its scope unless told otherwise (ms).
CAMPAIGN_TIMEOUT_MS_DEFAULT = 30_000
#: Longest wait one campaign or observe request asks for (ms): a longer one only delays
#: noticing a leader that moved; ``campaign`` asks again until its own timeout.
WAIT_MS_MAX = 60_000
#: How much longer than its wait a long request may take before it counts as unanswered.
LONG_POLL_SLACK_S = 1.0
#: Keepalives per TTL: one every third of it, so two may fail before the trust runs out.
KEEPALIVES_PER_TTL = 3
#: The clock-rate drift bound (parts per million) assumed between client and leader: 1%,
#: far above what quartz clocks drift and NTP slews, so only a broken clock breaks it.
DRIFT_PPM_DEFAULT = 10_000
#: How long opening, resigning or revoking tries the nodes (an election's worth), seconds.
SESSION_CALL_TIMEOUT_S = 10.0
#: First and longest pause between rounds of failed calls to the nodes, seconds.
SESSION_RETRY_MIN_S = 0.05
SESSION_RETRY_MAX_S = 0.5
#: Longest session id put in a path; a node's are tens of characters.
SESSION_ID_CHARS_MAX = 128
_SESSION_ID_RE = re.compile(r"[A-Za-z0-9._~-]{1,%d}" % SESSION_ID_CHARS_MAX)


class PalisadeError(Exception):
    """Base class of every error this module raises."""


class NotLeader(PalisadeError):
    """The token source says this process is not the established leader; nothing was sent."""

    def __init__(self, term: int, leader_id: Optional[int]):
        self.term = term
        self.leader_id = leader_id
        leader = "unknown" if leader_id is None else str(leader_id)
        super().__init__(
            f"not the established leader (term {term}, leader {leader}): request not sent"
        )


class Fenced(PalisadeError):
    """The proxy rejected the token as stale: a newer leader holds the scope."""

    def __init__(self, current: int, presented: int, scope: str = "default"):
        self.current = current
        self.presented = presented
        self.scope = scope
        super().__init__(
            f"stale fencing token {presented} for scope {scope}: current is {current}"
        )


class HTTPError(PalisadeError):
    """An HTTP error answer other than a fencing rejection (400, 404, 428, 503, ...).
    ``kind`` is the problem+json kind (``campaign-timeout``, ``fence-pending``, ...) when
    the answer had one."""

    def __init__(self, status: int, detail: str, kind: Optional[str] = None):
        self.status = status
        self.detail = detail
        self.kind = kind
        super().__init__(f"HTTP {status}: {detail}")


class NotLeaderNode(HTTPError):
    """503 ``not-leader``: the node asked does not lead; ``leader_id`` is the leader it
    knows (None: none known)."""

    def __init__(self, detail: str, node_id: Optional[int], leader_id: Optional[int]):
        super().__init__(503, detail, NOT_LEADER)
        self.node_id = node_id
        self.leader_id = leader_id


class UnknownSession(HTTPError):
    """404 ``unknown-session``: the cluster has no live session with this id (never
    opened, revoked, or expired)."""

    def __init__(self, detail: str, session_id: str):
        super().__init__(404, detail, UNKNOWN_SESSION)
        self.session_id = session_id


class SessionLost(PalisadeError):
    """The session can no longer be trusted: whatever it held may be someone else's."""

    def __init__(self, session_id: str, cause: str):
        self.session_id = session_id
        self.cause = cause
        super().__init__(f"session {session_id} is lost: {cause}")


class Unreachable(PalisadeError):
    """No connection could be made: nothing was sent."""


class Indeterminate(PalisadeError):
    """No answer in time, or the connection broke after sending: the request may have
    been applied."""


@dataclass(frozen=True)
class Leadership:
    """What a token source knows. ``token`` is set only on the established leader."""

    token: Optional[int]
    term: int
    leader_id: Optional[int]
    is_leader: bool
    #: The token's proof (base64url), when the source has one; None without a token.
    proof: Optional[str] = None

    @property
    def write_token(self) -> Optional[int]:
        """The token to attach to a write, or None when not the established leader."""
        return self.token if self.is_leader else None

    @property
    def write_proof(self) -> Optional[str]:
        """The proof to attach with ``write_token``, or None."""
        return self.proof if self.write_token is not None else None

    def below_floor_removed(self, floor: int) -> "Leadership":
        """This leadership without a token below ``floor`` (a proxy's fence); its proof
        goes with the token."""
        if self.token is not None and self.token < floor:
            return Leadership(None, self.term, self.leader_id, False)
        return self


class TokenSource(Protocol):
    """Anything with ``current()`` and ``mark_not_leader(current)``."""

    def current(self) -> Leadership: ...

    def mark_not_leader(self, current: int) -> None: ...


class StaticToken:
    """A fixed token: leads until a proxy fences it out, and never again after that."""

    def __init__(self, token: int, proof: Optional[str] = None):
        if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < 2**64:
            raise ValueError(f"a fencing token is a u64, not {token!r}")
        if proof is not None and not _valid_proof(proof):
            raise ValueError(
                f"a token proof is 1 to {PROOF_CHARS_MAX} characters of unpadded base64url"
            )
        self.token = token
        self.proof = proof
        self._floor = 0
        self._lock = threading.Lock()

    def current(self) -> Leadership:
        with self._lock:
            floor = self._floor
        return Leadership(self.token, self.token, None, True, self.proof).below_floor_removed(
            floor
        )

    def mark_not_leader(self, current: int) -> None:
        with self._lock:
            self._floor = max(self._floor, current)


class NodeTokenSource:
    """Reads a node's ``GET /v1/leader`` on every ``current()``.

    The token is the node's, and only while the node is the established leader. A node
    that does not answer counts as "not leader". After a proxy reports fence ``current``,
    tokens below it are not offered again.
    """

    def __init__(
        self,
        node_url: str,
        timeout: float = NODE_TIMEOUT_S,
        *,
        ca: Optional[str] = None,
        cert: Optional[str] = None,
        key: Optional[str] = None,
        ssl_context: Optional[ssl.SSLContext] = None,
    ):
        self._base = _Base(node_url, _ssl_context(ca, cert, key, ssl_context))
        self.timeout = timeout
        self._floor = 0
        self._term = 0
        self._lock = threading.Lock()
        #: The node's last answer (a dict), or None.
        self.last_answer: Optional[dict] = None

    def current(self) -> Leadership:
        try:
            status, _, body = _exchange(self._base, "GET", "/v1/leader", None, {}, self.timeout)
            if status != 200:
                raise PalisadeError(f"node answered HTTP {status}")
            view = json.loads(body)
        except (PalisadeError, ValueError):
            with self._lock:
                return Leadership(None, self._term, None, False)
        self.last_answer = view
        term = int(view.get("term") or 0)
        leader_id = view.get("leader_id") or None
        token = view.get("token")
        is_leader = view.get("role") == "leader"
        proof = view.get("proof")
        if not isinstance(proof, str) or token is None:
            proof = None
        with self._lock:
            self._term = term
            floor = self._floor
        leadership = Leadership(
            token if is_leader else None, term, leader_id, is_leader, proof if is_leader else None
        )
        return leadership.below_floor_removed(floor)

    def mark_not_leader(self, current: int) -> None:
        with self._lock:
            self._floor = max(self._floor, current)


@dataclass
class Response:
    """A successful (2xx) answer."""

    status: int
    headers: Mapping[str, str]
    body: bytes
    #: The token this request carried, if it was fenced.
    sent_token: Optional[int]

    @property
    def stored_token(self) -> Optional[int]:
        """The ``Fencing-Token`` of the answer: the embedded store's writer token."""
        value = self.headers.get(FENCING_TOKEN.lower())
        return parse_token(value) if value is not None else None

    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")

    def json(self):
        return json.loads(self.body)


class FencedClient:
    """An HTTP client for one proxy and one scope that fences its writes.

    ``token_source`` is a token source (``StaticToken``, ``NodeTokenSource``, or any
    object with ``current()`` and ``mark_not_leader(current)``) or a plain int token.
    """

    def __init__(
        self,
        proxy_url: str,
        token_source: Union[TokenSource, int],
        scope: Optional[str] = None,
        timeout: float = REQUEST_TIMEOUT_S,
        *,
        ca: Optional[str] = None,
        cert: Optional[str] = None,
        key: Optional[str] = None,
        ssl_context: Optional[ssl.SSLContext] = None,
    ):
        self._base = _Base(proxy_url, _ssl_context(ca, cert, key, ssl_context))
        self.source = StaticToken(token_source) if isinstance(token_source, int) else token_source
        if scope is not None and not valid_scope(scope):
            raise ValueError(f"scope {scope!r}: a scope is 1-128 of [A-Za-z0-9._-]")
        self.scope = scope
        self.timeout = timeout

    def get(self, path: str) -> Response:
        return self.request("GET", path)

    def put(self, path: str, body: Union[bytes, str]) -> Response:
        return self.request("PUT", path, body)

    def post(self, path: str, body: Union[bytes, str]) -> Response:
        return self.request("POST", path, body)

    def delete(self, path: str) -> Response:
        return self.request("DELETE", path)

    def request(
        self,
        method: str,
        path: str,
        body: Union[bytes, str, None] = None,
        headers: Optional[Mapping[str, str]] = None,
    ) -> Response:
        """Sends one request; writes carry the token. Raises ``NotLeader`` before sending
        when the source has no token, ``Fenced`` on a fencing rejection, ``HTTPError`` on
        other error answers, ``Unreachable`` and ``Indeterminate`` on transport failures."""
        method = method.upper()
        # The token and its proof are the source's to set, together.
        ours = (FENCING_TOKEN.lower(), FENCING_TOKEN_PROOF.lower())
        sent = {k: v for k, v in (headers or {}).items() if k.lower() not in ours}
        token = None
        if method in WRITE_METHODS:
            leadership = self.source.current()
            token = leadership.write_token
            if token is None:
                raise NotLeader(leadership.term, leadership.leader_id)
            sent[FENCING_TOKEN] = str(token)
            proof = leadership.write_proof
            if proof is not None:
                if not _valid_proof(proof):
                    raise PalisadeError(
                        "the token source's proof is not 1 to "
                        f"{PROOF_CHARS_MAX} characters of unpadded base64url: not sent"
                    )
                sent[FENCING_TOKEN_PROOF] = proof
        if self.scope is not None:
            sent[FENCING_SCOPE] = self.scope
        if isinstance(body, str):
            body = body.encode("utf-8")
        status, answer_headers, answer_body = _exchange(
            self._base, method, path, body, sent, self.timeout
        )
        if 200 <= status < 300:
            return Response(status, answer_headers, answer_body, token)
        if status == 409 and token is not None:
            fenced = _fenced(answer_headers, answer_body, token, self.scope or "default")
            if fenced is not None:
                self.source.mark_not_leader(fenced.current)
                raise fenced
        raise HTTPError(status, _detail(status, answer_body))


class _Base:
    """``http(s)://host:port[/prefix]``; a URL without a scheme is taken as http://."""

    def __init__(self, url: str, context: Optional[ssl.SSLContext] = None):
        self.context = context
        parts = urllib.parse.urlsplit(url if "://" in url else f"http://{url}")
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"invalid URL {url!r}: want http://host:port")
        self.url = url
        self.scheme = parts.scheme
        self.host = parts.hostname
        self.port = parts.port
        self.prefix = parts.path.rstrip("/")

    def target(self, path: str) -> str:
        path, _, query = path.partition("?")
        quoted = urllib.parse.quote(path.lstrip("/"), safe="/%:@!$&'()*+,;=~-._")
        return f"{self.prefix}/{quoted}" + (f"?{query}" if query else "")


def _exchange(base: _Base, method, path, body, headers, timeout):
    """One request over a fresh connection: (status, lowercased headers, body)."""
    if base.scheme == "https":
        conn = http.client.HTTPSConnection(
            base.host, base.port, timeout=timeout, context=base.context
        )
    else:
        conn = http.client.HTTPConnection(base.host, base.port, timeout=timeout)
    try:
        try:
            conn.connect()
        except (OSError, socket.timeout) as e:
            raise Unreachable(f"cannot reach {base.url}: {e}") from e
        try:
            conn.request(method, base.target(path), body=body, headers=dict(headers))
            response = conn.getresponse()
            data = response.read(RESPONSE_BYTES_MAX + 1)
        except (OSError, socket.timeout, http.client.HTTPException) as e:
            raise Indeterminate(
                f"outcome unknown for {method} {path}: {e or type(e).__name__}; "
                "it may have been applied"
            ) from e
        if len(data) > RESPONSE_BYTES_MAX:
            raise PalisadeError(f"response body is over {RESPONSE_BYTES_MAX} bytes")
        return response.status, {k.lower(): v for k, v in response.getheaders()}, data
    finally:
        conn.close()


def _fenced(headers, body, presented: int, scope: str) -> Optional[Fenced]:
    """A fencing rejection, if the 409 is one: the proxy's carry ``Fencing-Token-Current``
    and a problem+json body. A 409 without either is the storage's own conflict."""
    try:
        problem = json.loads(body)
        if not isinstance(problem, dict):
            problem = {}
    except ValueError:
        problem = {}
    current = problem.get("current")
    header = headers.get(FENCING_TOKEN_CURRENT.lower())
    if not isinstance(current, int):
        current = parse_token(header) if header is not None else None
    if current is None:
        return None
    presented = problem.get("presented", presented)
    return Fenced(current, presented, problem.get("scope", scope))


def _detail(status: int, body: bytes) -> str:
    try:
        detail = json.loads(body).get("detail")
        if detail:
            return str(detail)
    except (ValueError, AttributeError):
        pass
    text = body.decode("utf-8", errors="replace").strip()
    return text or http.client.responses.get(status, "error")


def _ssl_context(ca, cert, key, context):
    """The TLS settings for https URLs: ``context`` as given, else one trusting ``ca``
    (a PEM file; without it, the system's roots) and presenting ``cert``/``key`` (PEM
    files) when given; None (the defaults) when nothing is given."""
    if context is not None:
        if ca or cert or key:
            raise ValueError("give ssl_context or ca/cert/key, not both")
        return context
    if (cert is None) != (key is None):
        raise ValueError("a client certificate needs both cert= and key=")
    if ca is None and cert is None:
        return None
    context = ssl.create_default_context(cafile=ca)
    if cert is not None:
        context.load_cert_chain(cert, key)
    return context


def _valid_proof(proof) -> bool:
    return isinstance(proof, str) and _PROOF_RE.fullmatch(proof) is not None


def valid_scope(scope: str) -> bool:
    """Whether ``scope`` is a scope name: 1 to ``SCOPE_BYTES_MAX`` of ``[A-Za-z0-9._-]``."""
    return 1 <= len(scope.encode("utf-8")) <= SCOPE_BYTES_MAX and all(
        c.isascii() and (c.isalnum() or c in "._-") for c in scope
    )


def parse_token(text: str) -> Optional[int]:
    """A ``Fencing-Token`` value: decimal ASCII digits (surrounding spaces allowed), at most
    2**64 - 1; ``None`` for anything else (signs, hex, exponents, overflow), never a guess."""
    text = text.strip()
    if not text or len(text) > _TOKEN_DIGITS_MAX:
        return None
    if not all(c in "0123456789" for c in text):
        return None
    value = int(text)
    return value if value <= _TOKEN_MAX else None


def session_trusted_until(sent: float, ttl_ms: int, drift_ppm: int = DRIFT_PPM_DEFAULT) -> float:
    """The ``time.monotonic()`` instant after which a session must be taken as lost, given
    that the last keepalive the leader answered was **sent** at ``sent``: the leader
    expires it no earlier than ``ttl_ms`` of its own time after receiving it, and
    ``ttl * (1 - drift)`` of ours after the send is no later than that. The same integer
    arithmetic as the Rust client (microseconds)."""
    ttl_us = ttl_ms * 1000
    drift_us = ttl_us * min(drift_ppm, 1_000_000) // 1_000_000
    return sent + (ttl_us - drift_us) / 1e6


def _segment(value: str, what: str) -> str:
    """``value`` as one path segment: a session id or a scope name, never ``.``/``..``."""
    ok = _SESSION_ID_RE.fullmatch(value) if what == "session id" else valid_scope(value)
    if not ok or set(value) == {"."}:
        raise ValueError(f"{what} {value!r} cannot be named in a URL path")
    return value


def _node_call(base: _Base, method: str, path: str, body, timeout: float, session=""):
    """One node API call: the JSON of a 2xx answer, else the typed error."""
    data = None if body is None else json.dumps(body).encode()
    headers = {"Accept": "application/json", "Content-Type": "application/json"}
    status, _, answer = _exchange(base, method, path, data, headers, timeout)
    if 200 <= status < 300:
        try:
            return json.loads(answer)
        except ValueError as e:
            raise PalisadeError(f"bad response from {base.url}: {e}") from e
    try:
        problem = json.loads(answer)
        problem = problem if isinstance(problem, dict) else {}
    except ValueError:
        problem = {}
    kind = str(problem.get("type", "")).rsplit("/", 1)[-1] or None
    detail = _detail(status, answer)
    if kind == NOT_LEADER:
        leader_id = problem.get("leader_id") or None
        raise NotLeaderNode(f"{base.url}: {detail}", problem.get("node_id"), leader_id)
    if kind == UNKNOWN_SESSION:
        raise UnknownSession(detail, session)
    raise HTTPError(status, detail, kind)


def _observe(base, scope, after_token, timeout_ms):
    wait_ms = min(max(int(timeout_ms), 0), WAIT_MS_MAX)
    after = "" if after_token is None else f"&after_token={after_token}"
    path = f"/v1/scopes/{_segment(scope, 'scope')}?timeout_ms={wait_ms}{after}"
    return _node_call(base, "GET", path, None, wait_ms / 1000 + LONG_POLL_SLACK_S)


def observe(node_url: str, scope: str, after_token: Optional[int] = None,
            timeout_ms: int = 10_000, *, ca=None, cert=None, key=None, ssl_context=None) -> dict:
    """``GET /v1/scopes/{scope}`` as a long poll on one node: the scope's view
    (``{"scope", "session", "token", "proof"}``) once its token is not ``after_token``
    (None: "none held"), or after ``timeout_ms`` (at most ``WAIT_MS_MAX``) unchanged."""
    return _observe(_Base(node_url, _ssl_context(ca, cert, key, ssl_context)), scope,
                    after_token, timeout_ms)


def _retryable(error: PalisadeError) -> bool:
    """Whether another node may answer where this one could not."""
    unavailable = isinstance(error, HTTPError) and error.status in (502, 503, 504)
    return isinstance(error, (Unreachable, Indeterminate)) or (
        unavailable and error.kind != FENCE_PENDING)  # not-leader is a 503 too


class Session:
    """A named-leadership session on a cluster, kept alive by a daemon thread every third
    of its TTL (following ``not-leader`` answers to the leader, trying other nodes when
    one does not answer) until revoked, closed, or lost.

    ``nodes`` is one node URL or a list of them (any of the cluster's). The session is
    trusted until ``trusted_until`` (``time.monotonic()``): the send of the last answered
    keepalive (or the open) plus the TTL less ``drift_ppm``. Past it, or after a 404
    ``unknown-session``, ``is_lost()`` is true for good. As a context manager it revokes
    the session on exit.
    """

    def __init__(self, nodes, ttl_ms: int = SESSION_TTL_MS_DEFAULT, *,
                 drift_ppm: int = DRIFT_PPM_DEFAULT, ca=None, cert=None, key=None,
                 ssl_context=None):
        urls = [nodes] if isinstance(nodes, str) else list(nodes)
        if not urls:
            raise ValueError("a session needs at least one node URL")
        if not SESSION_TTL_MS_MIN <= ttl_ms <= SESSION_TTL_MS_MAX:
            raise ValueError(
                f"session TTL {ttl_ms} ms is outside {SESSION_TTL_MS_MIN}..={SESSION_TTL_MS_MAX}"
            )
        if not 0 <= drift_ppm < 1_000_000:
            raise ValueError(f"drift bound {drift_ppm} ppm must be in 0..1000000")
        context = _ssl_context(ca, cert, key, ssl_context)
        self._bases = [_Base(url, context) for url in urls]
        self._ids: list = [None] * len(urls)
        self._current = 0
        self.drift_ppm = drift_ppm
        #: Each attempt's limit: a keepalive to a paused node leaves time for another.
        self._try_s = min(ttl_ms / 1000 / KEEPALIVES_PER_TTL, NODE_TIMEOUT_S)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._lost = threading.Event()
        self._loss: Optional[str] = None
        self.last_error: Optional[str] = None
        self._locate()

        def open_once(base):
            sent = time.monotonic()
            return sent, _node_call(base, "POST", "/v1/sessions", {"ttl_ms": ttl_ms}, self._try_s)

        sent, view = self._call(open_once, time.monotonic() + SESSION_CALL_TIMEOUT_S)
        self.id: str = _segment(str(view.get("id", "")), "session id")
        #: The TTL: the one asked for, or the node's if shorter.
        self.ttl_ms = min(ttl_ms, int(view.get("ttl_ms", ttl_ms)))
        self._until = session_trusted_until(sent, self.ttl_ms, drift_ppm)
        self._thread = threading.Thread(
            target=self._keep_alive, args=(sent,), name=f"palisade-session-{self.id}", daemon=True
        )
        self._thread.start()

    @property
    def trusted_until(self) -> float:
        """The ``time.monotonic()`` instant before which the session is trusted."""
        with self._lock:
            return self._until

    @property
    def loss(self) -> Optional[str]:
        """Why the session is lost, or None while it is trusted."""
        with self._lock:
            if self._loss is None and time.monotonic() >= self._until:
                self._loss = (f"no keepalive answered within its trust ({self.ttl_ms} ms TTL "
                              f"less {self.drift_ppm} ppm drift); last error: {self.last_error}")
                self._lost.set()
            return self._loss

    def is_lost(self) -> bool:
        """Whether the session is lost: past ``trusted_until`` or unknown to the cluster."""
        return self.loss is not None

    def wait_lost(self, timeout: Optional[float] = None) -> bool:
        """Blocks until the session is lost (True) or ``timeout`` seconds pass (False)."""
        end = None if timeout is None else time.monotonic() + timeout
        while not self.is_lost():
            now = time.monotonic()
            if end is not None and now >= end:
                return False
            step = self.trusted_until - now
            self._lost.wait(max(0.0, step if end is None else min(step, end - now)))
        return True

    def campaign(self, scope: str, timeout_ms: int = CAMPAIGN_TIMEOUT_MS_DEFAULT) -> dict:
        """Campaigns for ``scope`` until held and fenced by every announce proxy, waiting
        at most ``timeout_ms`` while another session holds it; asks again after
        ``fence-pending``. Returns the grant (``{"scope", "token", "proof", "session"}``).
        Raises ``SessionLost`` once lost (a grant arriving after that is worthless), and
        ``HTTPError`` of kind ``campaign-timeout`` when the timeout passes first."""
        scope = _segment(scope, "scope")
        deadline = time.monotonic() + timeout_ms / 1000
        pause = SESSION_RETRY_MIN_S

        def campaign_once(base):
            wait_ms = min(max(int((deadline - time.monotonic()) * 1000), 0), WAIT_MS_MAX)
            path = f"/v1/scopes/{scope}/campaign?timeout_ms={wait_ms}"
            return _node_call(base, "POST", path, {"session": self.id},
                              max(wait_ms / 1000 + LONG_POLL_SLACK_S, self._try_s), self.id)

        while True:
            self._check_trusted()
            try:
                grant = self._call(campaign_once, deadline)
            except HTTPError as e:
                now = time.monotonic()
                if e.kind in (FENCE_PENDING, CAMPAIGN_TIMEOUT) and now < deadline:
                    time.sleep(min(pause, deadline - now))
                    pause = min(pause * 2, SESSION_RETRY_MAX_S)
                    continue
                raise
            if grant.get("scope") != scope or grant.get("session") != self.id:
                raise PalisadeError(f"campaign for {scope} by {self.id} answered {grant!r}")
            self._check_trusted()
            return grant

    def resign(self, scope: str) -> dict:
        """Gives ``scope`` up (or stops waiting for it); ``released`` is False when the
        session held nothing."""
        path = f"/v1/scopes/{_segment(scope, 'scope')}/resign"
        return self._call(
            lambda base: _node_call(base, "POST", path, {"session": self.id}, self._try_s,
                                    self.id),
            time.monotonic() + SESSION_CALL_TIMEOUT_S,
        )

    def observe(self, scope: str, after_token: Optional[int] = None, timeout_ms: int = 10_000):
        """The long poll of ``observe()``, on the cluster's nodes."""
        return self._call(lambda base: _observe(base, scope, after_token, timeout_ms),
                          time.monotonic() + timeout_ms / 1000 + LONG_POLL_SLACK_S)

    def close(self) -> None:
        """Stops the keepalives (the leader expires the session after its TTL)."""
        self._stop.set()

    def revoke(self) -> dict:
        """Stops the keepalives and revokes the session, releasing what it holds.
        ``UnknownSession`` means it was gone already."""
        self.close()
        path = f"/v1/sessions/{self.id}"
        return self._call(
            lambda base: _node_call(base, "DELETE", path, None, self._try_s, self.id),
            time.monotonic() + SESSION_CALL_TIMEOUT_S,
        )

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.revoke()
        except PalisadeError:
            pass  # The leader expires it after its TTL.

    def _check_trusted(self) -> None:
        loss = self.loss
        if loss is not None:
            raise SessionLost(self.id, loss)

    def _lose(self, cause: str) -> None:
        with self._lock:
            if self._loss is None:
                self._loss = cause
        self._lost.set()

    def _keep_alive(self, opened: float) -> None:
        period = self.ttl_ms / 1000 / KEEPALIVES_PER_TTL
        next_at = opened + period
        pause = SESSION_RETRY_MIN_S
        path = f"/v1/sessions/{self.id}/keepalive"
        while not self._stop.is_set() and not self.is_lost():
            wait = min(next_at, self.trusted_until) - time.monotonic()
            if wait > 0:
                if self._stop.wait(wait):
                    return
                continue
            sent = time.monotonic()
            limit = min(self._try_s, max(self.trusted_until - sent, 0.001))
            try:
                view = _node_call(self._bases[self._current], "POST", path, None, limit, self.id)
            except UnknownSession:
                self._lose("the cluster no longer knows the session (404 unknown-session)")
                return
            except PalisadeError as e:
                self.last_error = str(e)
                if _retryable(e):
                    self._move(e)
                next_at = time.monotonic() + pause
                pause = min(pause * 2, SESSION_RETRY_MAX_S)
                continue
            ttl_ms = min(self.ttl_ms, int(view.get("ttl_ms", self.ttl_ms)))
            trust = session_trusted_until(sent, ttl_ms, self.drift_ppm)
            with self._lock:
                # An answer never revives a session whose trust already ran out.
                if self._loss is None and time.monotonic() < self._until:
                    self._until = max(self._until, trust)
            self.last_error = None
            next_at, pause = sent + period, SESSION_RETRY_MIN_S

    def _locate(self) -> None:
        """Asks each node's ``GET /v1/leader``, learns their ids, and takes the leader."""
        named = None
        for index, base in enumerate(self._bases):
            try:
                view = _node_call(base, "GET", "/v1/leader", None, self._try_s)
            except PalisadeError:
                continue
            self._ids[index] = view.get("node_id")
            if view.get("role") == "leader":
                self._current = index
                return
            named = named or view.get("leader_id") or None
        if named in self._ids:
            self._current = self._ids.index(named)

    def _move(self, error: PalisadeError) -> None:
        """After ``error`` from the current node: to the leader it names, else the next."""
        leader_id = getattr(error, "leader_id", None)
        if leader_id is not None and leader_id not in self._ids:
            self._locate()
        if leader_id is not None and leader_id in self._ids:
            self._current = self._ids.index(leader_id)
        else:
            self._current = (self._current + 1) % len(self._bases)

    def _call(self, op, deadline: float):
        """``op(base)`` on the node believed to lead, moving on as ``_retryable`` says and
        pausing after each round of failures, until an answer or ``deadline``."""
        failures, pause = 0, SESSION_RETRY_MIN_S
        while True:
            try:
                return op(self._bases[self._current])
            except PalisadeError as e:
                if not _retryable(e):
                    raise
                self.last_error = str(e)
                self._move(e)
                failures += 1
                now = time.monotonic()
                if now >= deadline:
                    raise
                if failures % len(self._bases) == 0:
                    time.sleep(min(pause, deadline - now))
                    pause = min(pause * 2, SESSION_RETRY_MAX_S)
