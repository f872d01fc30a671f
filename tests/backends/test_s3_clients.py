"""Which S3 clients carry ``Fencing-Token`` on every request: boto3, rclone, aws-cli and
s3cmd, each through ``palisade proxy`` (``docs/examples/proxy-s3.toml``) to Garage 2.5.0.

A client is only fenced if the token reaches the proxy on every write it sends: a PUT of
a whole object, each request of a multipart upload (initiate, every part, complete), a
DELETE. The proxy refuses a write without a token (428), so a client that drops the
header on one kind of request cannot make that kind of write at all. Each case makes the
three writes with its way of adding the header and checks each against the proxy's own
count of the requests it refused, by reason (``palisade_proxy_rejections_total``: none
for an admitted write, a missing token for a refused one), what the client reported
(exit status, HTTP status), what Garage holds, read directly, and the bucket's fence,
which each admitted write raises to its token. A stale write (a token below the fence)
must be refused with 409.

The outcomes are the table in ``docs/backends.md`` ("S3 clients and the token"). A
client whose program is missing is skipped, naming what installs it (a failure under
``PALISADE_BACKENDS_REQUIRED=1``, as for the backends).
"""

import hashlib
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
from boto3.s3.transfer import TransferConfig

from conftest import HERE, backend_fixtures, tool
from garage import Garage
from s3 import REGION, s3_client

MIB = 1024 * 1024
# The multipart upload: 5 MiB parts (the smallest S3 allows but for the last), 3 parts.
PART_BYTES = 5 * MIB
MULTIPART_BYTES = 2 * PART_BYTES + MIB
PARTS = 3
WHOLE_BYTES = 4 * 1024
# How long one client command may take, in seconds (each takes well under one).
COMMAND_TIMEOUT_S = 60

# What a write gets through a client:
ADMITTED = "admitted"  # the token reached the proxy on every request; the write is done
REFUSED = "428"  # the first request went without the token: 428, nothing written
PARTS_REFUSED = "initiated, parts 428"  # multipart: the initiate carried it, a part did not
# The proxy's refusals counted by the test (palisade_proxy_rejections_total's reasons).
REASONS = ("missing-token", "stale-token")
# How a client says the connection was closed under a request body it was still sending.
CONNECTION_LOST = r"(?i)broken pipe|connection reset"

garage, proxy = backend_fixtures("garage", Garage, "proxy-s3.toml")


@dataclass
class Outcome:
    ok: bool
    status: int | None  # the HTTP status the client reported for its failure
    output: str

    def __str__(self):
        """The end of the client's output, for a failure message (aws --debug is long)."""
        return f"exit ok={self.ok}, status {self.status}, output ending:\n{self.output[-3000:]}"


def failure_status(pattern: str, output: str):
    found = re.search(pattern, output)
    return int(found.group(1)) if found else None


def clean_env(home: Path) -> dict:
    """The environment of a client command: no AWS_* variables (an ``AWS_CA_BUNDLE``
    alone stops rclone: "unable to load custom CA bundle"), and a fresh HOME, so that no
    ~/.aws, ~/.s3cfg or rclone configuration of the machine is read."""
    home.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "RCLONE_"))}
    env["HOME"] = str(home)
    return env


class CommandClient:
    """A command-line client, run in ``work`` with the environment ``env``; ``STATUS``
    finds the HTTP status of a failure in its output."""

    STATUS = r"$^"

    def __init__(self, work: Path, env: dict):
        self.work = work
        self.env = env

    def run(self, argv) -> Outcome:
        done = subprocess.run([str(a) for a in argv], env=self.env, capture_output=True, text=True,
                              timeout=COMMAND_TIMEOUT_S, cwd=self.work)
        output = done.stdout + done.stderr
        return Outcome(done.returncode == 0, failure_status(self.STATUS, output), output)


class Boto3:
    """boto3 with the token added in ``before-sign`` (``tests/backends/s3.py``), so it is
    signed; in process, not a command."""

    STATUS = r"An error occurred \((\d{3})\)"

    def __init__(self, work, proxy, garage):
        self.token = None
        self.client = s3_client(proxy.url, garage.access_key, garage.secret_key, lambda: self.token)

    def _call(self, token, call) -> Outcome:
        self.token = token
        try:
            call()
            return Outcome(True, None, "")
        except Exception as e:  # noqa: BLE001 - ClientError, S3UploadFailedError: both name the status
            return Outcome(False, failure_status(self.STATUS, str(e)), str(e))

    def put(self, path, bucket, key, token):
        return self._call(token, lambda: self.client.put_object(Bucket=bucket, Key=key, Body=path.read_bytes()))

    def multipart(self, path, bucket, key, token):
        config = TransferConfig(multipart_threshold=PART_BYTES, multipart_chunksize=PART_BYTES)
        return self._call(token, lambda: self.client.upload_file(str(path), bucket, key, Config=config))

    def delete(self, bucket, key, token):
        return self._call(token, lambda: self.client.delete_object(Bucket=bucket, Key=key))


class Rclone(CommandClient):
    """rclone with the token in ``--header`` (every request) or ``--header-upload``
    (``flag``); the remote ``palisade:`` is defined by environment variables."""

    STATUS = r"status code: (\d{3})"

    def __init__(self, work, proxy, garage, flag):
        self.bin = tool("rclone", "apt-get install rclone")
        env = clean_env(work / "home")
        (work / "rclone.conf").write_text("")
        env.update({
            "RCLONE_CONFIG": str(work / "rclone.conf"),
            "RCLONE_CONFIG_PALISADE_TYPE": "s3",
            "RCLONE_CONFIG_PALISADE_PROVIDER": "Other",
            "RCLONE_CONFIG_PALISADE_ENDPOINT": proxy.url,
            "RCLONE_CONFIG_PALISADE_REGION": REGION,
            "RCLONE_CONFIG_PALISADE_FORCE_PATH_STYLE": "true",
            "RCLONE_CONFIG_PALISADE_ACCESS_KEY_ID": garage.access_key,
            "RCLONE_CONFIG_PALISADE_SECRET_ACCESS_KEY": garage.secret_key,
        })
        super().__init__(work, env)
        self.flag = flag

    def _rclone(self, token, *args):
        # --s3-no-check-bucket: no CreateBucket before the upload (a fenced write too, which
        # Garage answers 409, the bucket existing); no retries, so each refusal is once.
        return self.run([self.bin, *args, self.flag, f"Fencing-Token: {token}", "--s3-no-check-bucket",
                         "--retries", "1", "--low-level-retries", "1", "-v"])

    def put(self, path, bucket, key, token):
        return self._rclone(token, "copyto", path, f"palisade:{bucket}/{key}")

    def multipart(self, path, bucket, key, token):
        return self._rclone(token, "copyto", path, f"palisade:{bucket}/{key}",
                            "--s3-upload-cutoff", "5M", "--s3-chunk-size", "5M")

    def delete(self, bucket, key, token):
        return self._rclone(token, "deletefile", f"palisade:{bucket}/{key}")


class AwsCli(CommandClient):
    """aws-cli v1 with the plugin ``tests/backends/awscli_fencing_token.py`` named in its
    config file, reading the token from ``PALISADE_FENCING_TOKEN``."""

    STATUS = r"An error occurred \((\d{3})\)"

    def __init__(self, work, proxy, garage):
        self.bin = tool("aws", "pip install awscli")
        version = subprocess.run([self.bin, "--version"], capture_output=True, text=True, timeout=60)
        if not (version.stdout + version.stderr).startswith("aws-cli/1."):
            pytest.skip(f"only aws-cli v1 (pip install awscli) was tried; found {version.stdout}{version.stderr}")
        plugins = work / "plugins"
        plugins.mkdir(parents=True)
        shutil.copy(HERE / "awscli_fencing_token.py", plugins)
        config = work / "aws-config"
        config.write_text(
            "[default]\n"
            f"region = {REGION}\n"
            "s3 =\n"
            "  addressing_style = path\n"
            "  multipart_threshold = 5MB\n"
            "  multipart_chunksize = 5MB\n"
            "[plugins]\n"
            "fencing_token = awscli_fencing_token\n")
        env = clean_env(work / "home")
        env.update({
            "AWS_CONFIG_FILE": str(config),
            "AWS_SHARED_CREDENTIALS_FILE": str(work / "no-credentials"),
            "AWS_ACCESS_KEY_ID": garage.access_key,
            "AWS_SECRET_ACCESS_KEY": garage.secret_key,
            "AWS_MAX_ATTEMPTS": "1",
            "PYTHONPATH": str(plugins),
        })
        super().__init__(work, env)
        self.endpoint = proxy.url

    def _aws(self, token, *args):
        self.env["PALISADE_FENCING_TOKEN"] = str(token)
        return self.run([self.bin, "--endpoint-url", self.endpoint, *args])

    def put(self, path, bucket, key, token):
        # --debug prints the request's SignedHeaders: the test checks the token is signed.
        return self._aws(token, "s3api", "put-object", "--bucket", bucket, "--key", key, "--body", path, "--debug")

    def multipart(self, path, bucket, key, token):
        return self._aws(token, "s3", "cp", "--no-progress", path, f"s3://{bucket}/{key}")

    def delete(self, bucket, key, token):
        return self._aws(token, "s3", "rm", f"s3://{bucket}/{key}")


class S3cmd(CommandClient):
    """s3cmd with the token in ``--add-header``, path style from its config file."""

    STATUS = r"S3 error: (\d{3})"

    def __init__(self, work, proxy, garage):
        self.bin = tool("s3cmd", "apt-get install s3cmd, or pip install s3cmd")
        host = proxy.url.removeprefix("http://")
        self.config = work / "s3cfg"
        self.config.write_text(
            "[default]\n"
            f"access_key = {garage.access_key}\n"
            f"secret_key = {garage.secret_key}\n"
            f"host_base = {host}\n"
            f"host_bucket = {host}\n"
            f"bucket_location = {REGION}\n"
            "use_https = False\n"
            "signature_v2 = False\n")
        super().__init__(work, clean_env(work / "home"))

    def s3cmd(self, token, *args):
        return self.run([self.bin, "-c", self.config, "--add-header", f"Fencing-Token:{token}", *args])

    def put(self, path, bucket, key, token):
        return self.s3cmd(token, "put", path, f"s3://{bucket}/{key}")

    def multipart(self, path, bucket, key, token):
        return self.s3cmd(token, "put", "--multipart-chunk-size-mb=5", path, f"s3://{bucket}/{key}")

    def delete(self, bucket, key, token):
        return self.s3cmd(token, "del", f"s3://{bucket}/{key}")

    def abort(self, bucket, key, upload_id, token):
        """``s3cmd abortmp``, which s3cmd suggests after a failed part."""
        return self.s3cmd(token, "abortmp", f"s3://{bucket}/{key}", upload_id)


@dataclass
class Case:
    id: str
    make: object  # (work, proxy, garage) -> client
    put: str
    multipart: str
    delete: str


CASES = [
    Case("boto3-before-sign", Boto3, ADMITTED, ADMITTED, ADMITTED),
    Case("rclone-header", lambda w, p, g: Rclone(w, p, g, "--header"), ADMITTED, ADMITTED, ADMITTED),
    Case("rclone-header-upload", lambda w, p, g: Rclone(w, p, g, "--header-upload"), REFUSED, REFUSED, REFUSED),
    Case("awscli-plugin", AwsCli, ADMITTED, ADMITTED, ADMITTED),
    Case("s3cmd-add-header", S3cmd, ADMITTED, PARTS_REFUSED, REFUSED),
]


def direct(garage):
    """A client of Garage itself, bypassing the proxy: the backend's own view."""
    return s3_client(garage.url, garage.access_key, garage.secret_key)


def keys(backend, bucket):
    return [o["Key"] for o in backend.list_objects_v2(Bucket=bucket).get("Contents", [])]


def uploads_in_progress(backend, bucket, key):
    """The multipart uploads of ``key`` in Garage, each with its number of parts."""
    uploads = backend.list_multipart_uploads(Bucket=bucket).get("Uploads", [])
    return [len(backend.list_parts(Bucket=bucket, Key=key, UploadId=u["UploadId"]).get("Parts", []))
            for u in uploads if u["Key"] == key]


class Counted:
    """What a client command got, with the proxy's own refusals during it (by reason)."""

    def __init__(self, proxy, command):
        before = {r: proxy.rejections(r) for r in REASONS}
        self.outcome = command()
        self.refused = {r: proxy.rejections(r) - before[r] for r in REASONS}


def assert_admitted(done: Counted):
    """Every request of the command carried a current token: it succeeded and the proxy
    refused none of its requests."""
    assert done.outcome.ok, str(done.outcome)
    assert done.refused == {"missing-token": 0, "stale-token": 0}, (done.refused, str(done.outcome))


def assert_refused(done: Counted, reason: str):
    """The proxy refused a request of the command for ``reason`` and the client failed,
    reporting the proxy's status (428 or 409), or, for a request whose body was still
    being sent, the connection the proxy closed after answering (seen with rclone, a Go
    client: "write: broken pipe" for a 64 KiB PUT in 2 runs of 6)."""
    outcome = done.outcome
    assert not outcome.ok, f"the client reported success: {outcome}"
    assert done.refused[reason] >= 1, (done.refused, str(outcome))
    assert sum(done.refused.values()) == done.refused[reason], (done.refused, str(outcome))
    status = {"missing-token": 428, "stale-token": 409}[reason]
    assert outcome.status == status or re.search(CONNECTION_LOST, outcome.output), \
        f"expected {status}: {outcome}"


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_an_s3_client_carries_the_token_or_is_refused(proxy, garage, tmp_path, case):
    """Goal: record, per client and way of adding the header, which writes carry
    Fencing-Token on every request. Method: in a bucket of its own (fence 0), the client
    makes a whole-object PUT with token 1, a 3-part multipart upload (5 MiB parts) with
    token 2, and a DELETE with token 3. Each is checked against the case's expected
    outcome, in the proxy's refusal counts, in Garage (read directly) and in the bucket's
    fence: admitted (no request refused, the object stored or deleted, the fence raised
    to the token), 428 (a missing-token refusal, Garage unchanged, the fence unchanged),
    or, for a multipart upload, initiated with the token but a part refused for a missing
    token (an upload without parts in Garage, no object, the fence raised by the
    initiate; s3cmd's abortmp of that upload is refused for a missing token too). A
    client whose PUT carries the token then PUTs with token 1, now stale: refused as
    stale (409), nothing stored."""
    client = case.make(tmp_path, proxy, garage)
    bucket = f"client-{case.id}"
    garage.create_bucket(bucket)
    backend = direct(garage)
    whole = tmp_path / "whole.bin"
    whole.write_bytes(os.urandom(WHOLE_BYTES))
    multi = tmp_path / "multi.bin"
    multi.write_bytes(os.urandom(MULTIPART_BYTES))
    fence = 0

    # A PUT of a whole object, token 1.
    done = Counted(proxy, lambda: client.put(whole, bucket, "whole", 1))
    if case.put == ADMITTED:
        assert_admitted(done)
        assert backend.get_object(Bucket=bucket, Key="whole")["Body"].read() == whole.read_bytes()
        fence = 1
        if isinstance(client, AwsCli):
            assert re.search(r"SignedHeaders=[^,\s]*fencing-token", done.outcome.output), "the token is not signed"
    else:
        assert_refused(done, "missing-token")
        assert keys(backend, bucket) == []
    assert proxy.fence(bucket) == fence

    # A multipart upload, token 2.
    done = Counted(proxy, lambda: client.multipart(multi, bucket, "multi", 2))
    if case.multipart == ADMITTED:
        assert_admitted(done)
        head = backend.head_object(Bucket=bucket, Key="multi")
        assert head["ETag"].strip('"').endswith(f"-{PARTS}"), head["ETag"]
        stored = backend.get_object(Bucket=bucket, Key="multi")["Body"].read()
        assert hashlib.sha256(stored).digest() == hashlib.sha256(multi.read_bytes()).digest()
        assert uploads_in_progress(backend, bucket, "multi") == []
        fence = 2
    elif case.multipart == PARTS_REFUSED:
        assert_refused(done, "missing-token")
        assert "multi" not in keys(backend, bucket)
        assert uploads_in_progress(backend, bucket, "multi") == [0], "not initiated, or a part was stored"
        fence = 2
        # The abort the client then suggests (a DELETE of the upload) goes without it too.
        upload = backend.list_multipart_uploads(Bucket=bucket)["Uploads"][0]["UploadId"]
        assert_refused(Counted(proxy, lambda: client.abort(bucket, "multi", upload, 2)), "missing-token")
        assert uploads_in_progress(backend, bucket, "multi") == [0]
    else:
        assert_refused(done, "missing-token")
        assert "multi" not in keys(backend, bucket)
        assert uploads_in_progress(backend, bucket, "multi") == []
    assert proxy.fence(bucket) == fence

    # A DELETE, token 3, of an object that exists (put directly when the client could not).
    if "whole" not in keys(backend, bucket):
        backend.put_object(Bucket=bucket, Key="whole", Body=b"put directly")
    done = Counted(proxy, lambda: client.delete(bucket, "whole", 3))
    if case.delete == ADMITTED:
        assert_admitted(done)
        assert "whole" not in keys(backend, bucket)
        fence = 3
    else:
        assert_refused(done, "missing-token")
        assert "whole" in keys(backend, bucket)
    assert proxy.fence(bucket) == fence

    # A stale token, below the fence: refused as stale, and the client says so.
    if case.put == ADMITTED:
        done = Counted(proxy, lambda: client.put(whole, bucket, "stale", 1))
        assert_refused(done, "stale-token")
        assert "stale" not in keys(backend, bucket)


def test_s3cmd_puts_a_large_object_whole_with_disable_multipart(proxy, garage, tmp_path):
    """Goal: the one way s3cmd writes a large object with the token: ``--disable-multipart``
    sends it in a single PUT, which carries ``--add-header``. Method: the 11 MiB file that
    s3cmd otherwise uploads in 5 MiB parts (refused, above), with --disable-multipart:
    admitted with no refusal, stored whole (no part count in the ETag), the fence raised
    to the token."""
    client = S3cmd(tmp_path, proxy, garage)
    bucket = "client-s3cmd-whole"
    garage.create_bucket(bucket)
    data = os.urandom(MULTIPART_BYTES)
    (tmp_path / "large.bin").write_bytes(data)
    done = Counted(proxy, lambda: client.s3cmd(1, "put", "--multipart-chunk-size-mb=5", "--disable-multipart",
                                                tmp_path / "large.bin", f"s3://{bucket}/large"))
    assert_admitted(done)
    backend = direct(garage)
    assert "-" not in backend.head_object(Bucket=bucket, Key="large")["ETag"]
    assert backend.get_object(Bucket=bucket, Key="large")["Body"].read() == data
    assert proxy.fence(bucket) == 1
