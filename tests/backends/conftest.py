"""Shared fixtures of the backend tests: real processes on loopback.

Each backend (Garage, etcd, wsgidav), the proxy and a 3-node ``palisade node`` cluster
are started by the tests themselves on free loopback ports, waited for by polling with a
deadline, and stopped at the end. Every process writes its log to a file under pytest's
temporary directory; when a test fails, the tails of the logs of the processes it used
are printed with the failure, and the files stay where pytest keeps its last runs.

The backends' configuration files and the proxy's are the examples in ``docs/examples``:
the tests load them, replace the example's addresses and directories with the ones of
the run (each replacement must find its text, so an example that drifts from the tests
fails them), and use the result. So the examples are tested as written.

The palisade binary is ``$PALISADE_BIN``, else ``target/debug/palisade``. A backend
whose binary is absent skips its tests, unless ``PALISADE_BACKENDS_REQUIRED=1`` (as
``.ci/run`` sets it), which makes that a failure.
"""

import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = REPO_ROOT / "docs" / "examples"
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(REPO_ROOT / "clients" / "python"))
sys.path.insert(0, str(REPO_ROOT / "clients" / "python" / "tests"))

from palisade_binary import palisade_bin  # noqa: E402 - found through the path above

# How long a process may take to start answering, in seconds. Garage on a cold disk and
# a debug palisade on a loaded 2-core machine take a few seconds; this is a deadline,
# not a wait: every start returns as soon as its condition holds.
START_TIMEOUT_S = 60
# How long an election, a transfer or an announce may take, in seconds.
ELECTION_TIMEOUT_S = 30
# How often a condition is polled, in seconds.
POLL_INTERVAL_S = 0.05

# Processes started by the current test, for printing their logs if it fails.
_STARTED: list = []


def wait_until(what: str, condition, timeout_s: float = START_TIMEOUT_S):
    """Polls ``condition`` until it returns something truthy, which is returned; fails
    the test naming ``what`` after ``timeout_s``. Exceptions count as not yet."""
    deadline = time.monotonic() + timeout_s
    last_error = None
    while time.monotonic() < deadline:
        try:
            value = condition()
            if value:
                return value
        except Exception as e:  # noqa: BLE001 - "not yet", reported at the deadline
            last_error = e
        time.sleep(POLL_INTERVAL_S)
    pytest.fail(f"timed out after {timeout_s} s waiting for {what} (last error: {last_error!r})")


def free_port() -> int:
    """A loopback port that was free a moment ago (for processes that must be told their
    port before they start, such as raft peers)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def tool(name: str, hint: str) -> str:
    """The path of a backend's binary, or a skip naming what installs it (``.ci/run``
    installs all of them and fails if one is still missing, so CI never skips)."""
    found = shutil.which(name)
    if name == "garage" and found is None:
        cargo_bin = Path(os.environ.get("CARGO_HOME", Path.home() / ".cargo")) / "bin" / "garage"
        found = str(cargo_bin) if cargo_bin.is_file() else None
    if found is None:
        if os.environ.get("PALISADE_BACKENDS_REQUIRED") == "1":
            pytest.fail(f"{name} is not installed ({hint}), and PALISADE_BACKENDS_REQUIRED=1", pytrace=False)
        pytest.skip(f"{name} is not installed ({hint})")
    return found


def example(name: str, replacements: dict) -> str:
    """The text of ``docs/examples/NAME`` with each key replaced by its value; a key the
    example does not contain fails the test, so example and test cannot drift apart."""
    text = (EXAMPLES / name).read_text()
    for old, new in replacements.items():
        assert old in text, f"docs/examples/{name} no longer contains {old!r}"
        text = text.replace(old, str(new))
    return text


class Process:
    """A child process with its output in a log file; killed (its process group) at stop."""

    def __init__(self, name: str, argv, log: Path, env=None, cwd=None):
        self.name = name
        self.log = log
        self._log_file = log.open("wb")
        self.popen = subprocess.Popen(
            [str(a) for a in argv],
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            cwd=cwd,
            start_new_session=True,
        )
        _STARTED.append(self)

    def wait_or_stop(self, what: str, condition):
        """``wait_until``, stopping this process if the wait fails, so that no process of a
        failed start outlives the test."""
        try:
            return wait_until(what, condition)
        except BaseException:
            self.stop()
            raise

    def alive(self) -> bool:
        return self.popen.poll() is None

    def check_alive(self):
        if not self.alive():
            pytest.fail(f"{self.name} exited with {self.popen.returncode}; log:\n{self.tail()}")

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError as e:
            return f"(no log: {e})"

    def stop(self):
        if self.alive():
            try:
                os.killpg(self.popen.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            self.popen.wait(timeout=10)
        finally:
            self._log_file.close()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.when == "call" and report.failed:
        for p in list(_STARTED):
            report.sections.append((f"log of {p.name} ({p.log})", p.tail()))


@pytest.fixture(autouse=True)
def _forget_started():
    """Lets a failing test show only the logs of processes alive during it."""
    yield
    _STARTED[:] = [p for p in _STARTED if p.alive()]


# ---------------------------------------------------------------------------- HTTP


def http(method: str, url: str, body: bytes = b"", headers=None, timeout: float = 30):
    """One request with urllib; returns (status, headers, body) for every status."""
    request = urllib.request.Request(url, data=body if body or method in ("PUT", "POST") else None,
                                     method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return answer.status, answer.headers, answer.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read()


def http_json(method: str, url: str, payload=None, headers=None):
    body = b"" if payload is None else json.dumps(payload).encode()
    status, _, data = http(method, url, body, {"Content-Type": "application/json", **(headers or {})})
    return status, (json.loads(data) if data else None)


# ---------------------------------------------------------------------------- proxy


class Proxy:
    """A ``palisade proxy`` on free loopback ports in front of ``upstream``, with the
    configuration file ``config`` (a path)."""

    def __init__(self, workdir: Path, config: Path, upstream: str, tls: bool = False):
        workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.admin_port = free_port()
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}"
        self.admin = f"http://127.0.0.1:{self.admin_port}"
        # With tls, the client listener serves HTTPS with a certificate for 127.0.0.1
        # from a CA made for this proxy (``self.ca``, for the client to trust).
        tls_flags = []
        if tls:
            pki = workdir / "pki"
            done = subprocess.run(
                [str(palisade_bin()), "certs", "generate", "--out", str(pki), "--names", "proxy-tls",
                 "--hosts", "127.0.0.1"], capture_output=True, text=True, timeout=60)
            assert done.returncode == 0, done.stderr
            self.ca = pki / "ca.pem"
            tls_flags = ["--tls-cert", pki / "proxy-tls.pem", "--tls-key", pki / "proxy-tls.key"]
        self.process = Process(
            "palisade proxy",
            [palisade_bin(), "proxy", "--config", config,
             "--listen", f"127.0.0.1:{self.port}", "--admin-listen", f"127.0.0.1:{self.admin_port}",
             "--data-dir", workdir / "data", "--upstream", upstream, *tls_flags],
            workdir / "proxy.log",
        )
        self.process.wait_or_stop("the proxy's /healthz", self._healthy)

    def _healthy(self):
        self.process.check_alive()
        return http("GET", self.admin + "/healthz", timeout=2)[0] == 200

    def fence(self, scope: str) -> int:
        status, body = http_json("GET", f"{self.admin}/v1/fences/{scope}")
        assert status == 200, body
        return body["token"]

    def advance(self, scope: str, token: int):
        status, body = http_json("POST", f"{self.admin}/v1/fences/{scope}", {"token": token})
        assert status == 200, (status, body)

    def rejections(self, reason: str) -> int:
        """How many requests the proxy has refused for ``reason`` (a problem kind:
        ``missing-token``, ``stale-token``...), from ``palisade_proxy_rejections_total``
        in its metrics: the proxy's own count, whatever the client made of the answer."""
        status, _, body = http("GET", self.admin + "/metrics")
        assert status == 200, body
        pattern = re.compile(r'^palisade_proxy_rejections_total\{[^}]*reason="' + re.escape(reason)
                             + r'"[^}]*\} (\S+)$')
        return sum(int(float(m.group(1))) for line in body.decode().splitlines() if (m := pattern.match(line)))

    def peak_rss_bytes(self) -> int:
        """The proxy's peak resident memory so far (``VmHWM``), in bytes."""
        with open(f"/proc/{self.process.popen.pid}/status") as f:
            line = next(line for line in f if line.startswith("VmHWM:"))
        return int(line.split()[1]) * 1024

    def stop(self):
        self.process.stop()


def proxy_config(workdir: Path, example_name: str) -> Path:
    """The example proxy configuration, written where the proxy reads it. The example's
    listen addresses, data directory and upstream are overridden by flags."""
    path = workdir / example_name
    workdir.mkdir(parents=True, exist_ok=True)
    path.write_text((EXAMPLES / example_name).read_text())
    return path


def start_proxy(workdir: Path, example_name: str, upstream: str, tls: bool = False) -> Proxy:
    """A proxy in ``workdir`` running the example configuration ``example_name`` in front
    of ``upstream``."""
    return Proxy(workdir, proxy_config(workdir, example_name), upstream, tls=tls)


class Backend:
    """A backend's process (``self.process``), serving at ``self.url``."""

    process: Process
    url: str

    def stop(self):
        self.process.stop()


def backend_fixtures(name: str, start, example_name: str):
    """The two module fixtures a backend's tests use: ``NAME``, the backend ``start(dir)``
    makes in a fresh directory, and ``proxy``, running the example configuration
    ``example_name`` in front of it. Assign them to module globals of the same names:
    ``etcd, proxy = backend_fixtures("etcd", Etcd, "proxy-etcd.toml")``."""

    @pytest.fixture(scope="module", name=name)
    def backend(tmp_path_factory):
        b = start(tmp_path_factory.mktemp(name))
        yield b
        b.stop()

    @pytest.fixture(scope="module", name="proxy")
    def proxy(tmp_path_factory, request):
        work = tmp_path_factory.mktemp(f"proxy-{name}")
        p = start_proxy(work, example_name, request.getfixturevalue(name).url)
        yield p
        p.stop()

    return backend, proxy


# ---------------------------------------------------------------------------- cluster


class Cluster:
    """Three ``palisade node`` processes on loopback, plaintext, with tokens for
    ``scope``, announcing to the proxy admin API ``announce``."""

    SIZE = 3

    def __init__(self, workdir: Path, scope: str, announce: str):
        self.scope = scope
        raft_ports = [free_port() for _ in range(self.SIZE)]
        self.api_ports = [free_port() for _ in range(self.SIZE)]
        peers = ",".join(f"{i + 1}=127.0.0.1:{p}" for i, p in enumerate(raft_ports))
        self.nodes = {}
        for i in range(self.SIZE):
            node_id = i + 1
            d = workdir / f"node{node_id}"
            d.mkdir(parents=True, exist_ok=True)
            self.nodes[node_id] = Process(
                f"palisade node {node_id}",
                [palisade_bin(), "node", "--id", node_id, "--peers", peers,
                 "--data-dir", d / "data", "--api", f"127.0.0.1:{self.api_ports[i]}",
                 "--scope", scope, "--announce", announce],
                d / "node.log",
            )

    def api(self, node_id: int) -> str:
        return f"http://127.0.0.1:{self.api_ports[node_id - 1]}"

    def view(self, node_id: int):
        status, body = http_json("GET", self.api(node_id) + "/v1/leader")
        return body if status == 200 else None

    def announced_leader(self, above: int = 0):
        """The view of an established leader whose token exceeds ``above`` and that every
        proxy accepted, or None."""
        for node_id, p in self.nodes.items():
            if not p.alive():
                continue
            try:
                v = self.view(node_id)
            except OSError:
                continue
            if v and v["token"] is not None and v["token"] > above and v["announced"]:
                return v
        return None

    def wait_leader(self, above: int = 0):
        return wait_until(f"an announced leader with a token above {above}",
                          lambda: self.announced_leader(above), ELECTION_TIMEOUT_S)

    def transfer_away(self, leader_id: int) -> int:
        """Moves leadership from ``leader_id`` to another node; returns the new leader."""
        to = next(i for i in self.nodes if i != leader_id)
        status, body = http_json("POST", self.api(leader_id) + "/v1/transfer", {"to": to})
        assert status == 200, (status, body)
        return to

    def stop(self):
        for p in self.nodes.values():
            p.stop()


# ---------------------------------------------------------------------------- stale writer


class StaleWriter:
    """A writer process (``stale_writer.py``) that takes the leader's token from the
    node API, then stops itself with SIGSTOP just before its write, as a worker frozen by
    a garbage-collection pause would; ``resume`` sends SIGCONT and returns what its write
    got. The write is described by ``spec`` (see ``stale_writer.py``)."""

    def __init__(self, workdir: Path, node_urls, spec: dict):
        workdir.mkdir(parents=True, exist_ok=True)
        self.result = workdir / "writer-result.json"
        spec_file = workdir / "writer-spec.json"
        spec_file.write_text(json.dumps({**spec, "nodes": node_urls, "result": str(self.result)}))
        self.process = Process("stale writer", [sys.executable, HERE / "stale_writer.py", spec_file],
                               workdir / "writer.log")
        self.process.wait_or_stop("the writer to take its token and stop itself", self._stopped)
        self.token = json.loads(Path(f"{self.result}.token").read_text())["token"]

    def _stopped(self):
        self.process.check_alive()
        with open(f"/proc/{self.process.popen.pid}/stat") as f:
            # The state is the field after the parenthesised command name.
            return f.read().rsplit(")", 1)[1].split()[0] == "T"

    def resume(self) -> dict:
        os.kill(self.process.popen.pid, signal.SIGCONT)
        self.process.popen.wait(timeout=60)
        assert self.process.popen.returncode == 0, self.process.tail()
        return json.loads(self.result.read_text())


# How leadership moves away from the paused writer's leader: a transfer (the leader
# hands over) or a crash (kill -9: the other two elect a new leader).
LEADERSHIP_MOVES = ["transfer", "kill"]


def gc_paused_writer_is_refused(tmp: Path, proxy: Proxy, scope: str, spec: dict, fresh_write, backend_value,
                                move: str = "transfer"):
    """The stale-writer scenario shared by every backend, with real processes.

    A 3-node cluster announces its tokens for ``scope`` to ``proxy``. The writer takes
    the leader's token and freezes before its write (``spec``); leadership moves
    (``move``: transferred, or the leader killed with SIGKILL); the new leader's token
    is announced, and ``fresh_write(token)`` writes the new value through the proxy. The
    writer resumes: its write must get 409, and ``backend_value()``, read from the
    backend directly, must still be the new value. Returns the old and new tokens and
    that value."""
    cluster = Cluster(tmp / "cluster", scope, proxy.admin)
    writer = None
    try:
        first = cluster.wait_leader()
        node_urls = [cluster.api(i) for i in cluster.nodes]
        writer = StaleWriter(tmp / "writer", node_urls, spec)
        assert writer.token == first["token"]
        if move == "transfer":
            cluster.transfer_away(first["node_id"])
        else:
            cluster.nodes[first["node_id"]].stop()
        second = cluster.wait_leader(above=first["token"])
        assert proxy.fence(scope) == second["token"], "the announce did not raise the proxy's fence"
        fresh_write(second["token"])
        outcome = writer.resume()
        assert outcome["status"] == 409, f"the stale write was not refused: {outcome}"
        assert outcome["token"] == first["token"]
        return first["token"], second["token"], backend_value()
    finally:
        # A writer left stopped by a failure would stay stopped forever: SIGKILL ends it.
        if writer is not None:
            writer.process.stop()
        cluster.stop()


def is_problem(headers) -> bool:
    """Whether an answer is the proxy's own problem+json (the backends never send one)."""
    return headers.get("Content-Type", "").startswith("application/problem+json")


def random_secret_hex(n_bytes: int) -> str:
    return secrets.token_hex(n_bytes)
