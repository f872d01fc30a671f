"""WebDAV through the proxy: wsgidav 4.4 (with cheroot).

The proxy runs ``docs/examples/proxy-webdav.toml``: one scope, ``dav``, for the tree;
PROPFIND is added to the reads; PUT, DELETE, MKCOL, MOVE and COPY (and every other
method) are fenced writes. wsgidav runs ``docs/examples/wsgidav.yaml``. What is checked
is the directory wsgidav serves, read from the file system: the backend's own contents.
"""

from pathlib import Path

import pytest

from conftest import (
    LEADERSHIP_MOVES,
    backend_fixtures,
    gc_paused_writer_is_refused,
    http,
    is_problem,
    start_proxy,
)
from webdav_backend import WsgiDav

SCOPE = "dav"

dav, proxy = backend_fixtures("dav", WsgiDav, "proxy-webdav.toml")


def req(proxy, method, path, body=b"", token=None, **headers):
    if token is not None:
        headers["Fencing-Token"] = str(token)
    return http(method, proxy.url + path, body, {k.replace("_", "-"): v for k, v in headers.items()})[0]


def snapshot(root: Path) -> dict:
    """Every file and directory under the share, with file contents."""
    return {
        str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None) for p in sorted(root.rglob("*"))
    }


def test_get_and_propfind_are_reads_without_a_token(proxy, dav):
    """Goal: GET and PROPFIND need no token. Method: a file made on disk is read with
    GET, and listed by PROPFIND Depth 1 (207 naming it), through the proxy."""
    (dav.root / "readable.txt").write_bytes(b"on disk")
    status, _, body = http("GET", proxy.url + "/readable.txt")
    assert (status, body) == (200, b"on disk")
    status, _, body = http("PROPFIND", proxy.url + "/", b"", {"Depth": "1"})
    assert status == 207 and b"readable.txt" in body


@pytest.mark.parametrize(
    "method, path, headers",
    [
        ("PUT", "/w/put.txt", {}),
        ("DELETE", "/w/kept.txt", {}),
        ("MKCOL", "/w/newdir", {}),
        ("MOVE", "/w/kept.txt", {"Destination": "/w/moved.txt"}),
        ("COPY", "/w/kept.txt", {"Destination": "/w/copied.txt"}),
    ],
)
def test_webdav_writes_are_fenced(proxy, dav, method, path, headers):
    """Goal: PUT, DELETE, MKCOL, MOVE and COPY are fenced writes, and a refused one
    changes nothing on disk. Method: with the fence at N, the request without a token
    (428) and with N-1 (409) leave the share's files as they were; with N it succeeds
    (2xx) and the share changed."""
    (dav.root / "w").mkdir(exist_ok=True)
    (dav.root / "w" / "kept.txt").write_bytes(b"kept")
    current = proxy.fence(SCOPE) + 2
    proxy.advance(SCOPE, current)
    if "Destination" in headers:
        headers = {"Destination": proxy.url + headers["Destination"]}
    # Only PUT has a body: wsgidav refuses one on MKCOL (415), as RFC 4918 allows.
    stale, fresh = (b"stale body", b"fresh body") if method == "PUT" else (b"", b"")
    before = snapshot(dav.root)
    assert req(proxy, method, path, stale, **headers) == 428
    assert req(proxy, method, path, stale, token=current - 1, **headers) == 409
    assert snapshot(dav.root) == before
    assert req(proxy, method, path, fresh, token=current, **headers) in (200, 201, 204)
    assert snapshot(dav.root) != before
    for leftover in ("put.txt", "moved.txt", "copied.txt"):
        (dav.root / "w" / leftover).unlink(missing_ok=True)
    if (dav.root / "w" / "newdir").exists():
        (dav.root / "w" / "newdir").rmdir()


@pytest.mark.parametrize("method, headers", [
    ("put", {}),
    ("Move", {"Destination": "/spelled-moved.txt"}),
    ("PROPPATCH", {}),
    ("LOCK", {}),
    ("GET", {"X-HTTP-Method-Override": "DELETE"}),
    ("PROPFIND", {"X-HTTP-Method": "MOVE", "Destination": "/spelled-moved.txt"}),
])
def test_method_spellings_and_overrides_are_fenced(proxy, dav, method, headers):
    """Goal: a write cannot pass as a read by its method's case, an extension method or
    an override header. Method: with a stale token, each request is answered by the
    proxy itself (409, problem+json), and the share is unchanged."""
    (dav.root / "spelled.txt").write_bytes(b"original")
    current = proxy.fence(SCOPE) + 1
    proxy.advance(SCOPE, current)
    if "Destination" in headers:
        headers = {**headers, "Destination": proxy.url + headers["Destination"]}
    before = snapshot(dav.root)
    status, answer, _ = http(method, proxy.url + "/spelled.txt", b"bypassed" if method == "put" else b"",
                             {**headers, "Fencing-Token": str(current - 1)})
    assert status == 409 and is_problem(answer), (method, status)
    assert snapshot(dav.root) == before


@pytest.mark.parametrize("move", LEADERSHIP_MOVES)
def test_a_gc_paused_webdav_writer_is_refused(dav, tmp_path, move):
    """Goal: a writer frozen between taking its token and writing cannot overwrite the new
    leader's file. Method: a 3-node cluster for scope dav announcing to a proxy of this
    test's own (its fence starts at 0); the writer process stops itself (SIGSTOP) after
    taking the token; leadership moves (transferred, or the leader killed); the new
    token PUTs; SIGCONT: the stale PUT gets 409, and the file on disk holds the new
    leader's bytes."""
    proxy = start_proxy(tmp_path / "proxy", "proxy-webdav.toml", dav.url)

    def fresh_write(token):
        assert req(proxy, "PUT", "/leader.txt", b"new leader", token=token) in (201, 204)

    spec = {"kind": "http", "method": "PUT", "url": proxy.url + "/leader.txt", "body": "stale leader"}
    try:
        old, new, stored = gc_paused_writer_is_refused(tmp_path, proxy, SCOPE, spec, fresh_write,
                                                       lambda: (dav.root / "leader.txt").read_bytes(), move)
    finally:
        proxy.stop()
    assert new > old
    assert stored == b"new leader"
