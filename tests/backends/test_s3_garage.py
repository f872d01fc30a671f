"""S3 through the proxy: boto3 to ``palisade proxy`` to Garage 2.5.0.

The proxy runs ``docs/examples/proxy-s3.toml``: every bucket is its own scope (its first
path segment), Host and Fencing-Token reach Garage as the client sent them, so SigV4
with the token among the signed headers verifies at Garage. Garage runs
``docs/examples/garage.toml``. What is checked is always read back from Garage directly,
not through the proxy.

Two proxies share one Garage: one on plain HTTP, one serving HTTPS to the client. boto3
sends its default checksums differently on each: over HTTP it signs the payload's
SHA-256 and sends the CRC32 as a header; over HTTPS it streams the body with
``aws-chunked`` encoding, ``x-amz-content-sha256: STREAMING-UNSIGNED-PAYLOAD-TRAILER``
and the CRC32 in a trailer, which the proxy must pass to Garage (in plain HTTP/1.1
chunked encoding) for the upload to verify. The large uploads run over HTTPS, so the
trailer path is the one tested where it matters.
"""

import hashlib
import http.client
import os
from pathlib import Path

import pytest
from boto3.s3.transfer import TransferConfig
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from botocore.exceptions import ClientError

from conftest import (
    LEADERSHIP_MOVES,
    backend_fixtures,
    gc_paused_writer_is_refused,
    http as http_request,
    is_problem,
    start_proxy,
)
from garage import Garage
from s3 import REGION, s3_client

MIB = 1024 * 1024
# The single PUT: large enough that no proxy holding bodies whole in memory could pass
# it quietly, and the size a storage client really sends.
SINGLE_PUT_BYTES = 256 * MIB
# The multipart upload: 8 MiB parts, 4 in flight at once, 8 parts.
PART_BYTES = 8 * MIB
PARTS_IN_FLIGHT = 4
MULTIPART_BYTES = 8 * PART_BYTES
# The proxy's peak resident memory through the 256 MiB PUT must stay below this: the
# bound the proxy is required to keep for a 1 GiB upload, so generous here. A proxy that
# held the body whole would exceed it fourfold.
PROXY_PEAK_RSS_BYTES_MAX = 64 * MIB
# Data is written and hashed in blocks of this size, so the test's memory stays small.
BLOCK_BYTES = 1 * MIB


class Token:
    """The token a client sends; None sends none."""

    def __init__(self, value=None):
        self.value = value

    def __call__(self):
        return self.value


garage, proxy = backend_fixtures("garage", Garage, "proxy-s3.toml")


@pytest.fixture(scope="module")
def tls_proxy(tmp_path_factory, garage):
    work = tmp_path_factory.mktemp("proxy-s3-tls")
    p = start_proxy(work, "proxy-s3.toml", garage.url, tls=True)
    yield p
    p.stop()


def direct(garage):
    """A client of Garage itself, bypassing the proxy: the backend's own view."""
    return s3_client(garage.url, garage.access_key, garage.secret_key)


def through(proxy, garage, token, **config):
    return s3_client(proxy.url, garage.access_key, garage.secret_key, token,
                     ca=getattr(proxy, "ca", None), **config)


def header_recorder(client):
    """The headers of every request ``client`` sends, as sent (after signing)."""
    sent = []

    def record(request, **_):
        headers = {k.lower(): v for k, v in request.headers.items()}
        sent.append({k: (v.decode() if isinstance(v, bytes) else v) for k, v in headers.items()})

    client.meta.events.register("before-send.s3.*", record)
    return sent


def status_of(call):
    """The HTTP status of a boto3 call, error or not."""
    try:
        return call()["ResponseMetadata"]["HTTPStatusCode"]
    except ClientError as e:
        return e.response["ResponseMetadata"]["HTTPStatusCode"]


def write_pseudo_random(path: Path, size: int) -> str:
    """Writes ``size`` bytes that do not compress (blocks of a hash chain) and returns
    their SHA-256, holding one block at a time."""
    digest = hashlib.sha256()
    seed = os.urandom(32)
    block = hashlib.sha256(seed).digest() * (BLOCK_BYTES // 32)
    with path.open("wb") as f:
        written = 0
        while written < size:
            chunk = block[: size - written]
            f.write(chunk)
            digest.update(chunk)
            written += len(chunk)
            seed = hashlib.sha256(seed).digest()
            block = seed + block[32:]
    return digest.hexdigest()


def stored_sha256(client, bucket: str, key: str) -> str:
    digest = hashlib.sha256()
    for chunk in client.get_object(Bucket=bucket, Key=key)["Body"].iter_chunks(BLOCK_BYTES):
        digest.update(chunk)
    return digest.hexdigest()


@pytest.mark.parametrize("scheme", ["http", "https"])
def test_sigv4_with_the_token_signed_is_accepted_by_garage(proxy, tls_proxy, garage, scheme):
    """Goal: a SigV4 request whose signed headers include Fencing-Token and Host passes
    the proxy and verifies at Garage, over HTTP and HTTPS to the proxy. Method: record
    the Authorization header boto3 sends; PUT through the proxy; read the object from
    Garage directly."""
    front = proxy if scheme == "http" else tls_proxy
    bucket = f"signed-{scheme}"
    garage.create_bucket(bucket)
    client = through(front, garage, Token(1))
    sent = header_recorder(client)
    answer = client.put_object(Bucket=bucket, Key="greeting", Body=b"signed with the token")
    assert answer["ResponseMetadata"]["HTTPStatusCode"] == 200
    authorization = sent[-1]["authorization"]
    signed = authorization.split("SignedHeaders=")[1].split(",")[0].split(";")
    assert "fencing-token" in signed and "host" in signed, authorization
    body = direct(garage).get_object(Bucket=bucket, Key="greeting")["Body"].read()
    assert body == b"signed with the token"
    assert front.fence(bucket) == 1


def test_listing_a_bucket_needs_no_token(proxy, garage):
    """Goal: reads are not fenced. Method: ListObjectsV2 and ListBuckets (GET /, which
    has no bucket segment) through the proxy without a Fencing-Token, after a direct
    PUT."""
    garage.create_bucket("listed")
    direct(garage).put_object(Bucket="listed", Key="a", Body=b"a")
    client = through(proxy, garage, Token(None))
    answer = client.list_objects_v2(Bucket="listed")
    assert [o["Key"] for o in answer["Contents"]] == ["a"]
    assert "listed" in {b["Name"] for b in client.list_buckets()["Buckets"]}


def test_a_write_without_a_token_is_refused(proxy, garage):
    """Goal: a write carries a token or is refused before Garage sees it. Method: PUT
    with no token (428); the key is absent from Garage."""
    garage.create_bucket("untokened")
    client = through(proxy, garage, Token(None))
    assert status_of(lambda: client.put_object(Bucket="untokened", Key="k", Body=b"x")) == 428
    assert direct(garage).list_objects_v2(Bucket="untokened").get("KeyCount") == 0


def test_a_256_mib_single_put_with_default_checksums(tls_proxy, garage, tmp_path):
    """Goal: a 256 MiB object goes through in one PUT with boto3's default checksums,
    and arrives whole. Method: a file of pseudo-random data, put_object with a token over
    HTTPS to the proxy (boto3 streams it aws-chunked with its CRC32 in a trailer, with
    Expect: 100-continue; the recorded headers say so); Garage's ETag is the MD5 of a
    single PUT; the object read from Garage directly has the file's SHA-256; the proxy's
    peak resident memory stayed under 64 MiB (it streamed the body)."""
    proxy = tls_proxy
    garage.create_bucket("large")
    path = tmp_path / "large.bin"
    sha256 = write_pseudo_random(path, SINGLE_PUT_BYTES)
    md5 = hashlib.md5()
    with path.open("rb") as f:
        while chunk := f.read(BLOCK_BYTES):
            md5.update(chunk)
    client = through(proxy, garage, Token(1))
    sent = header_recorder(client)
    with path.open("rb") as f:
        answer = client.put_object(Bucket="large", Key="object", Body=f)
    assert sent[-1]["x-amz-content-sha256"] == "STREAMING-UNSIGNED-PAYLOAD-TRAILER", sent[-1]
    assert "x-amz-checksum-crc32" in sent[-1]["x-amz-trailer"], sent[-1]
    assert answer["ETag"].strip('"') == md5.hexdigest()
    assert proxy.peak_rss_bytes() < PROXY_PEAK_RSS_BYTES_MAX, "the proxy held the body"
    path.unlink()
    head = direct(garage).head_object(Bucket="large", Key="object")
    assert head["ContentLength"] == SINGLE_PUT_BYTES
    assert stored_sha256(direct(garage), "large", "object") == sha256


def test_a_multipart_upload_of_8_mib_parts_4_at_a_time(tls_proxy, garage, tmp_path):
    """Goal: a multipart upload with parts in parallel passes the proxy (each part a
    fenced write of the bucket's scope). Method: boto3's upload_file over HTTPS to the
    proxy with 8 MiB parts and 4 threads; the ETag says 8 parts; the object read from
    Garage directly has the file's SHA-256."""
    proxy = tls_proxy
    garage.create_bucket("multipart")
    path = tmp_path / "multi.bin"
    sha256 = write_pseudo_random(path, MULTIPART_BYTES)
    client = through(proxy, garage, Token(1))
    config = TransferConfig(multipart_threshold=PART_BYTES, multipart_chunksize=PART_BYTES,
                            max_concurrency=PARTS_IN_FLIGHT, use_threads=True)
    client.upload_file(str(path), "multipart", "object", Config=config)
    head = direct(garage).head_object(Bucket="multipart", Key="object")
    assert head["ETag"].strip('"').endswith(f"-{MULTIPART_BYTES // PART_BYTES}")
    assert stored_sha256(direct(garage), "multipart", "object") == sha256


def test_a_large_object_and_a_range_of_it_read_back_whole_through_the_proxy(
        proxy, garage, tmp_path):
    """Goal: a large answer streams back through the proxy unchanged (its HTTP/1
    exchange with the upstream reads bodies of any length in pieces, never whole).
    Method: store 64 MiB in Garage directly; read it through the proxy (a read, no
    token) and compare SHA-256; read a range across a piece boundary through the proxy
    and directly; the proxy's peak memory stays under the bound it keeps for uploads."""
    garage.create_bucket("download")
    path = tmp_path / "download.bin"
    sha256 = write_pseudo_random(path, MULTIPART_BYTES)
    direct(garage).upload_file(str(path), "download", "object")
    path.unlink()
    reader = through(proxy, garage, Token(None))
    assert stored_sha256(reader, "download", "object") == sha256
    span = "bytes=65000-9000000"
    ranged = reader.get_object(Bucket="download", Key="object", Range=span)
    expected = direct(garage).get_object(Bucket="download", Key="object", Range=span)
    assert ranged["ResponseMetadata"]["HTTPStatusCode"] == 206
    assert ranged["Body"].read() == expected["Body"].read()
    assert proxy.peak_rss_bytes() < PROXY_PEAK_RSS_BYTES_MAX, "the proxy held the body"


def test_a_stale_token_is_refused_on_put_delete_and_upload_part(proxy, garage):
    """Goal: once the bucket's fence is above a token, PutObject, DeleteObject and
    UploadPart with it get 409 and change nothing in Garage. Method: write and start a
    multipart upload with token 1; raise the fence to 2 by the admin API; the three
    calls with token 1; then Garage directly: the object unchanged, still present, and the
    upload without parts."""
    garage.create_bucket("stale")
    old = through(proxy, garage, Token(1))
    old.put_object(Bucket="stale", Key="k", Body=b"first")
    upload = old.create_multipart_upload(Bucket="stale", Key="parts")["UploadId"]
    proxy.advance("stale", 2)

    assert status_of(lambda: old.put_object(Bucket="stale", Key="k", Body=b"stale")) == 409
    assert status_of(lambda: old.delete_object(Bucket="stale", Key="k")) == 409
    assert status_of(lambda: old.upload_part(Bucket="stale", Key="parts", UploadId=upload,
                                             PartNumber=1, Body=b"p" * 1024)) == 409

    backend = direct(garage)
    assert backend.get_object(Bucket="stale", Key="k")["Body"].read() == b"first"
    assert backend.list_parts(Bucket="stale", Key="parts", UploadId=upload).get("Parts", []) == []
    fresh = through(proxy, garage, Token(2))
    assert status_of(lambda: fresh.put_object(Bucket="stale", Key="k", Body=b"second")) == 200


@pytest.mark.parametrize("path", ["/%62ypass/k", "//bypass/k", "/x/../bypass/k", "/./bypass/k",
                                  "/bypass%2Fk", "/bypass/%2E%2E/bypass/k"])
def test_spellings_of_a_bucket_do_not_escape_its_fence(proxy, garage, path):
    """Goal: a path that Garage reads as bucket ``bypass`` is fenced as scope ``bypass``
    however it is spelled. Method: with the bucket's fence at 2, a PUT with token 1 on
    each spelling is answered by the proxy itself (problem+json, 400 or 409), and the
    object in Garage is unchanged."""
    if "bypass" not in {b["Name"] for b in direct(garage).list_buckets()["Buckets"]}:
        garage.create_bucket("bypass")
        through(proxy, garage, Token(1)).put_object(Bucket="bypass", Key="k", Body=b"original")
        proxy.advance("bypass", 2)
    status, headers, _ = http_request("PUT", proxy.url + path, b"bypassed", {"Fencing-Token": "1"})
    assert status in (400, 409) and is_problem(headers), (path, status)
    assert direct(garage).get_object(Bucket="bypass", Key="k")["Body"].read() == b"original"


def signed_vhost_put(proxy, garage, bucket: str, key: str, body: bytes, token: int):
    """A correctly signed virtual-host-style PUT (the bucket in Host, not in the path),
    sent to the proxy; returns its status."""
    host = f"{bucket}.s3.garage.localhost:{proxy.port}"
    request = AWSRequest(method="PUT", url=f"http://{host}/{key}", data=body,
                         headers={"x-amz-content-sha256": hashlib.sha256(body).hexdigest(),
                                  "Fencing-Token": str(token)})
    SigV4Auth(Credentials(garage.access_key, garage.secret_key), "s3", REGION).add_auth(request)
    connection = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=30)
    try:
        connection.request("PUT", f"/{key}", body=body, headers={**dict(request.headers), "Host": host})
        answer = connection.getresponse()
        answer.read()
        return answer.status
    finally:
        connection.close()


def test_a_stale_token_is_refused_on_copy_and_batch_delete(proxy, garage):
    """Goal: S3's other writes are fenced too: CopyObject (a PUT naming its source in a
    header) and DeleteObjects (a POST). Method: with the bucket's fence at 2, both with
    token 1 get 409; Garage directly still has the source and no copy; with token 2
    both succeed."""
    garage.create_bucket("copies")
    old = through(proxy, garage, Token(1))
    old.put_object(Bucket="copies", Key="src", Body=b"source")
    proxy.advance("copies", 2)
    copy = {"Bucket": "copies", "Key": "dst", "CopySource": {"Bucket": "copies", "Key": "src"}}
    batch = {"Bucket": "copies", "Delete": {"Objects": [{"Key": "src"}]}}
    assert status_of(lambda: old.copy_object(**copy)) == 409
    assert status_of(lambda: old.delete_objects(**batch)) == 409
    assert [o["Key"] for o in direct(garage).list_objects_v2(Bucket="copies")["Contents"]] == ["src"]
    fresh = through(proxy, garage, Token(2))
    assert status_of(lambda: fresh.copy_object(**copy)) == 200
    assert status_of(lambda: fresh.delete_objects(**batch)) == 200
    assert [o["Key"] for o in direct(garage).list_objects_v2(Bucket="copies")["Contents"]] == ["dst"]


def test_a_virtual_host_style_write_cannot_reach_a_fenced_bucket(proxy, garage):
    """Goal: the bucket cannot be named where the proxy does not look (the Host header)
    to escape its fence. Method: bucket ``hosted`` fenced at 2; a virtual-host-style PUT
    signed for ``hosted.s3.garage.localhost`` with path ``/k`` and token 1 (the proxy sees
    scope ``k``, fence 0, so it forwards it); Garage, configured without root_domain,
    does not read the bucket from Host, so the object in ``hosted`` is unchanged. With
    ``root_domain`` set, this write lands: the example configuration must not set it."""
    garage.create_bucket("hosted")
    through(proxy, garage, Token(1)).put_object(Bucket="hosted", Key="k", Body=b"original")
    proxy.advance("hosted", 2)
    status = signed_vhost_put(proxy, garage, "hosted", "k", b"through the host header", 1)
    assert status != 200, "Garage took the bucket from the Host header"
    assert direct(garage).get_object(Bucket="hosted", Key="k")["Body"].read() == b"original"


@pytest.mark.parametrize("move", LEADERSHIP_MOVES)
def test_a_gc_paused_s3_writer_is_refused(proxy, garage, tmp_path, move):
    """Goal: a writer frozen between taking its token and writing cannot overwrite the
    new leader's object. Method: a 3-node cluster for the bucket's scope announcing to
    the proxy; the writer process stops itself (SIGSTOP) after taking the token;
    leadership moves (transferred, or the leader killed); the new token writes; SIGCONT:
    the stale PUT gets 409, and Garage directly holds the new leader's object. Each case
    has its own bucket, so its scope's fence starts at 0."""
    bucket = f"paused-{move}"
    garage.create_bucket(bucket)

    def fresh_write(token):
        client = through(proxy, garage, Token(token))
        assert status_of(lambda: client.put_object(Bucket=bucket, Key="k", Body=b"new leader")) == 200

    spec = {"kind": "s3", "endpoint": proxy.url, "bucket": bucket, "key": "k", "body": "stale leader",
            "access_key": garage.access_key, "secret_key": garage.secret_key}
    old, new, stored = gc_paused_writer_is_refused(
        tmp_path, proxy, bucket, spec, fresh_write,
        lambda: direct(garage).get_object(Bucket=bucket, Key="k")["Body"].read(), move)
    assert new > old
    assert stored == b"new leader"
