#!/usr/bin/env python3
"""Failover of a 3-member etcd cluster on loopback, timed like `palisade bench failover`.

Each trial pauses the leader with SIGSTOP and times, from the signal:
  elected:     another member reports a leader other than the paused one
               (POST /v3/maintenance/status on the HTTP gateway, every --poll-ms);
  first_write: a put through another member commits in a higher raft term (puts are
               retried back to back, each with a 50 ms client timeout).
Then SIGCONT, wait until every member agrees on one leader, wait --settle-ms, repeat.

Standard library only. Every etcd runs in this process's group and is killed (after a
SIGCONT) when this helper exits, however it exits. Prints one JSON object on stdout.
"""

import argparse
import base64
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

from failover_lib import QUERY_TIMEOUT_S, START_TIMEOUT_S, TRIAL_TIMEOUT_S, free_port, show_ms

PUT_TIMEOUT_S = 0.05


def post(port, path, body, timeout):
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def status(port):
    """(member_id, leader_id, raft_term) of one member, or None if it does not answer."""
    try:
        s = post(port, "/v3/maintenance/status", {}, QUERY_TIMEOUT_S)
    except (OSError, urllib.error.URLError, ValueError):
        return None
    return s["header"]["member_id"], s.get("leader", "0"), int(s.get("raftTerm", 0))


class Cluster:
    def __init__(self, etcd, workdir, heartbeat_ms, election_ms):
        self.members = []
        names = [f"m{i}" for i in range(1, 4)]
        peers = {n: free_port() for n in names}
        initial = ",".join(f"{n}=http://127.0.0.1:{p}" for n, p in peers.items())
        for n in names:
            client = free_port()
            log = open(os.path.join(workdir, f"etcd-{n}.log"), "wb")
            proc = subprocess.Popen(
                [etcd, "--name", n, "--data-dir", os.path.join(workdir, f"etcd-{n}"),
                 "--listen-client-urls", f"http://127.0.0.1:{client}",
                 "--advertise-client-urls", f"http://127.0.0.1:{client}",
                 "--listen-peer-urls", f"http://127.0.0.1:{peers[n]}",
                 "--initial-advertise-peer-urls", f"http://127.0.0.1:{peers[n]}",
                 "--initial-cluster", initial, "--initial-cluster-state", "new",
                 "--heartbeat-interval", str(heartbeat_ms),
                 "--election-timeout", str(election_ms),
                 "--pre-vote=true", "--logger", "zap", "--log-level", "warn"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log)
            self.members.append({"name": n, "client": client, "proc": proc})

    def stop(self):
        for m in self.members:
            try:
                m["proc"].send_signal(signal.SIGCONT)
                m["proc"].kill()
                m["proc"].wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                pass

    def settled(self, timeout):
        """Waits until all members answer and agree on one leader; returns
        (leader member dict, term) or None."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            views = [status(m["client"]) for m in self.members]
            if all(views):
                for m, v in zip(self.members, views):
                    m["id"] = v[0]
                leaders = {v[1] for v in views}
                terms = {v[2] for v in views}
                if len(leaders) == 1 and len(terms) == 1 and "0" not in leaders:
                    leader_id = leaders.pop()
                    leader = next((m for m in self.members if m["id"] == leader_id), None)
                    if leader is not None:
                        return leader, terms.pop()
            time.sleep(0.02)
        return None


def trial(cluster, leader, old_term, poll_s):
    others = [m for m in cluster.members if m is not leader]
    result = {"paused": leader["name"], "old_term": old_term,
              "elected_ms": None, "first_write_ms": None}
    stop = threading.Event()
    value = base64.b64encode(b"x" * 16).decode()

    def writer(t0):
        i = 0
        while not stop.is_set():
            m = others[i % len(others)]
            i += 1
            try:
                r = post(m["client"], "/v3/kv/put",
                         {"key": base64.b64encode(b"failover").decode(), "value": value},
                         PUT_TIMEOUT_S)
            except (OSError, urllib.error.URLError, ValueError):
                continue
            if int(r["header"].get("raft_term", 0)) > old_term:
                result["first_write_ms"] = (time.monotonic() - t0) * 1000
                return

    t0 = time.monotonic()
    leader["proc"].send_signal(signal.SIGSTOP)
    thread = threading.Thread(target=writer, args=(t0,), daemon=True)
    thread.start()
    try:
        while time.monotonic() - t0 < TRIAL_TIMEOUT_S:
            if result["elected_ms"] is None:
                for m in others:
                    v = status(m["client"])
                    if v and v[1] not in ("0", leader["id"]) and v[2] > old_term:
                        result["elected_ms"] = (time.monotonic() - t0) * 1000
                        result["new_term"] = v[2]
                        break
            if result["elected_ms"] is not None and result["first_write_ms"] is not None:
                break
            time.sleep(poll_s)
    finally:
        stop.set()
        leader["proc"].send_signal(signal.SIGCONT)
        thread.join(timeout=5)
    if result["first_write_ms"] is not None and result["elected_ms"] is None:
        # The write proves a new leader; the status poll merely missed the moment.
        result["elected_ms"] = result["first_write_ms"]
    return result


def summary(values):
    v = [x for x in values if x is not None]
    return {"count": len(v), "median_ms": statistics.median(v) if v else None,
            "min_ms": min(v) if v else None, "max_ms": max(v) if v else None}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--etcd", default="etcd")
    p.add_argument("--dir", required=True, help="work directory for data and logs")
    p.add_argument("--trials", type=int, default=20)
    p.add_argument("--heartbeat-ms", type=int, default=100)
    p.add_argument("--election-ms", type=int, default=1000)
    p.add_argument("--poll-ms", type=int, default=10)
    p.add_argument("--settle-ms", type=int, default=1000)
    p.add_argument("--budget-s", type=float, default=240)
    a = p.parse_args()
    if not 1 <= a.trials <= 1000 or a.poll_ms < 1 or a.budget_s <= 0:
        p.error("--trials must be 1 to 1000, --poll-ms and --budget-s positive")

    # SIGTERM (from the script's trap) unwinds through `finally`, which kills the members.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    started = time.monotonic()
    cluster = Cluster(a.etcd, a.dir, a.heartbeat_ms, a.election_ms)
    trials = []
    try:
        for n in range(1, a.trials + 1):
            if time.monotonic() - started > a.budget_s:
                print(f"etcd failover: time budget spent after {n - 1} trials", file=sys.stderr)
                break
            settled = cluster.settled(START_TIMEOUT_S if n == 1 else TRIAL_TIMEOUT_S)
            if settled is None:
                print(f"trial {n}: etcd did not settle on a leader", file=sys.stderr)
                break
            leader, term = settled
            time.sleep(a.settle_ms / 1000)
            r = trial(cluster, leader, term, a.poll_ms / 1000)
            trials.append(r)
            print(f"trial {n:>3}: paused {r['paused']} (term {term}): elected "
                  f"{show_ms(r['elected_ms'])} ms, first write {show_ms(r['first_write_ms'])} ms",
                  file=sys.stderr)
    finally:
        cluster.stop()
    print(json.dumps({
        "heartbeat_ms": a.heartbeat_ms, "election_ms": a.election_ms, "poll_ms": a.poll_ms,
        "trials_requested": a.trials, "trials": trials,
        "elected": summary(t["elected_ms"] for t in trials),
        "first_write": summary(t["first_write_ms"] for t in trials),
    }))
    return 0 if any(t["elected_ms"] is not None for t in trials) else 1


if __name__ == "__main__":
    sys.exit(main())
