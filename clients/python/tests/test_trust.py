"""The Python client against a proxy that checks token proofs (``--token-pub``) and a
node API that requires client certificates: the proof is attached whenever the token
source has one, a caller's own proof header is never sent in its place, and the node
API is reached over https with ``ca=``, ``cert=``, ``key=``.

Keys and certificates are made by the binary (``palisade keys generate``, ``palisade
certs generate``). Signing proofs here needs the ``cryptography`` package; the tests
that sign are skipped without it.
"""

import base64
import ssl
import subprocess
import threading

import pytest

from palisade import (
    FENCING_TOKEN_PROOF,
    FencedClient,
    HTTPError,
    Leadership,
    NodeTokenSource,
    NotLeader,
    PalisadeError,
    StaticToken,
)
from test_client import FakeNode, Proxy, leader_view, palisade_bin

ADMIN_TOKEN = "python-test-admin-token-0123456789"
#: The bytes a proof signs, as ``protocol/src/proof.rs`` fixes them.
PROOF_DOMAIN = b"palisade fencing token proof v1\0"


def proof_message(scope: str, token: int) -> bytes:
    return PROOF_DOMAIN + scope.encode() + b"\0" + token.to_bytes(8, "big")


def run_palisade(*args):
    subprocess.run([str(palisade_bin()), *args], check=True, capture_output=True)


@pytest.fixture
def keys(tmp_path):
    run_palisade("keys", "generate", "--out", str(tmp_path / "keys"))
    return tmp_path / "keys"


@pytest.fixture
def signed_proxy(tmp_path, keys):
    admin_token = tmp_path / "admin.token"
    admin_token.write_text(ADMIN_TOKEN + "\n")
    admin_token.chmod(0o600)
    running = Proxy(
        tmp_path,
        extra=["--token-pub", str(keys / "token.pub"), "--admin-token-file", str(admin_token)],
        admin_token=ADMIN_TOKEN,
    )
    yield running
    running.stop()


def signer(keys):
    """A function (scope, token) -> proof, signing with ``token.key`` as a node does."""
    ed25519 = pytest.importorskip("cryptography.hazmat.primitives.asymmetric.ed25519")
    lines = (keys / "token.key").read_text().strip().splitlines()
    assert lines[0] == "-----BEGIN PRIVATE KEY-----", lines[0]
    der = base64.b64decode("".join(lines[1:-1]))
    # ring's PKCS#8 v2 document (which `cryptography` does not parse): a SEQUENCE, a
    # fixed 14-byte header, then the 32-byte seed.
    assert der[0] == 0x30 and der[2:16] == bytes.fromhex("020101300506032b657004220420"), der.hex()
    key = ed25519.Ed25519PrivateKey.from_private_bytes(der[16:48])

    def prove(scope: str, token: int) -> str:
        signature = key.sign(proof_message(scope, token))
        return base64.urlsafe_b64encode(signature).rstrip(b"=").decode()

    return prove


def test_a_token_without_its_proof_is_refused_and_a_callers_header_is_not_sent(signed_proxy, keys):
    """Goal: a proof-checking proxy refuses (401) a token without a proof, and a proof the
    caller put in the headers is dropped, not sent for the source's token; the fence does
    not move. Method: a static token without a proof, once with a header of its own."""
    client = FencedClient(signed_proxy.url, 5)
    with pytest.raises(HTTPError) as refused:
        client.put("k", "forged")
    assert refused.value.status == 401
    with pytest.raises(HTTPError) as again:
        client.request("PUT", "k", "forged", headers={FENCING_TOKEN_PROOF: "A" * 86})
    assert again.value.status == 401
    assert signed_proxy.admin_json("/v1/fences/default")["token"] == 0


def test_the_proof_of_the_source_is_attached(signed_proxy, keys):
    """Goal: a write whose source has the token's proof is admitted; a proof for another
    scope or token is refused with 401; a node's proof reaches the proxy through
    NodeTokenSource. Method: sign with the generated key; a fake node serving the proof."""
    prove = signer(keys)
    assert FencedClient(signed_proxy.url, StaticToken(4, prove("default", 4))).put("a", "4")
    for forged in (prove("other", 5), prove("default", 4)):
        with pytest.raises(HTTPError) as refused:
            FencedClient(signed_proxy.url, StaticToken(5, forged)).put("a", "x")
        assert refused.value.status == 401
    assert signed_proxy.admin_json("/v1/fences/default")["token"] == 4
    node = FakeNode({**leader_view(6, 6), "proof": prove("default", 6)})
    try:
        sent = FencedClient(signed_proxy.url, NodeTokenSource(node.url)).put("a", "6")
        assert sent.sent_token == 6
    finally:
        node.stop()
    assert signed_proxy.admin_json("/v1/fences/default")["token"] == 6


def test_odd_proofs_are_refused_before_sending():
    """Goal: a proof that is not unpadded base64url (padding, a newline, too long, not a
    string) is never put in a header. Method: construct sources and send to nowhere."""
    for bad in ("abc=", "ab\r\nX-Evil: 1", "A" * 129, "", 7):
        with pytest.raises(ValueError):
            StaticToken(3, bad)

    class Odd:
        def current(self):
            return Leadership(3, 3, None, True, "ab\ncd")

        def mark_not_leader(self, current):
            pass

    with pytest.raises(PalisadeError):
        FencedClient("http://127.0.0.1:9", Odd()).put("k", "v")
    assert Leadership(None, 3, None, False, "abc").write_proof is None
    assert StaticToken(3, "abc").current().below_floor_removed(4).proof is None


class TlsNode(FakeNode):
    """``FakeNode`` over https, requiring a client certificate from ``ca``."""

    def __init__(self, view, certs):
        super().__init__(view)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(certs / "node-1.pem", certs / "node-1.key")
        context.load_verify_locations(certs / "ca.pem")
        context.verify_mode = ssl.CERT_REQUIRED
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.url = self.url.replace("http://", "https://")


def test_node_api_over_https_with_a_client_certificate(tmp_path):
    """Goal: NodeTokenSource reaches a node API that requires client certificates when
    given ca=, cert=, key=; without a certificate, or trusting another CA, the node is
    unreachable, which means "not leader". Method: certificates from the binary; a fake
    node behind TLS."""
    certs = tmp_path / "certs"
    run_palisade(
        "certs", "generate", "--out", str(certs), "--names", "node-1,writer-client",
        "--hosts", "127.0.0.1,localhost",
    )
    node = TlsNode(leader_view(3, 3), certs)
    try:
        good = NodeTokenSource(
            node.url, ca=str(certs / "ca.pem"), cert=str(certs / "writer-client.pem"),
            key=str(certs / "writer-client.key"),
        )
        assert good.current().write_token == 3
        without_cert = NodeTokenSource(node.url, ca=str(certs / "ca.pem"))
        assert without_cert.current().write_token is None
        untrusted = NodeTokenSource(node.url, cert=str(certs / "writer-client.pem"),
                                    key=str(certs / "writer-client.key"))
        assert untrusted.current().write_token is None
    finally:
        node.stop()
    with pytest.raises(ValueError):
        NodeTokenSource("https://127.0.0.1:1", cert=str(certs / "writer-client.pem"))
