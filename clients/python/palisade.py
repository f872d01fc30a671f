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
``ssl_context=``, to ``NodeTokenSource`` and ``FencedClient``.
"""

from __future__ import annotations

import http.client
import json
import re
import socket
import ssl
import threading
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
    "PROOF_CHARS_MAX",
    "PalisadeError",
    "Response",
    "StaticToken",
    "TokenSource",
    "Unreachable",
    "parse_token",
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
    """An HTTP error answer other than a fencing rejection (400, 404, 428, 503, ...)."""

    def __init__(self, status: int, detail: str):
        self.status = status
        self.detail = detail
        super().__init__(f"HTTP {status}: {detail}")


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
