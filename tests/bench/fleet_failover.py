#!/usr/bin/env python3
"""Failover of a palisade fleet on loopback: 3 nodes with leases on (`--lease-ms`) and N
proxies in fleet mode (`--cluster`), all in front of one upstream.

Each trial pauses the leader with SIGSTOP and times, from the signal:
  elected:  another node reports itself leader of a higher term (GET /v1/leader on every
            node but the paused one, every --poll-ms);
  released: that leader's view shows its token (the release: every proxy acknowledged the
            new term, or the lease wait passed);
  admitted: a write carrying that token (PUT with Fencing-Token) through one proxy is
            answered 2xx by the upstream; it is retried every --poll-ms while the proxy
            answers otherwise (503 while it renews its lease, for example).
The proxy written through rotates with the trial. Then SIGCONT, wait until every node
agrees on one leader whose token every proxy admits, wait --settle-ms, repeat.

Standard library only. Every palisade process runs in this process's group and is killed
(after a SIGCONT) when this helper exits, however it exits. Prints one JSON object on
stdout; progress on stderr.
"""

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request

from failover_lib import QUERY_TIMEOUT_S, START_TIMEOUT_S, TRIAL_TIMEOUT_S, free_port, show_ms

# A write may wait for a lease renewal inside the proxy (its bounded wait), so it gets
# more time than a query.
WRITE_TIMEOUT_S = 5.0


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def view(port):
    """The leader view of the node whose API listens on port, or None."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/leader", timeout=QUERY_TIMEOUT_S) as r:
            return json.loads(r.read())
    except (OSError, urllib.error.URLError, ValueError):
        return None


def write(port, token, path):
    """Status of one PUT with the token through the proxy listening on port (None: no answer)."""
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", data=b"x", method="PUT", headers={"Fencing-Token": str(token)}
    )
    try:
        with urllib.request.urlopen(req, timeout=WRITE_TIMEOUT_S) as r:
            r.read()
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except (OSError, urllib.error.URLError):
        return None


def releases(port):
    """The node's palisade_node_token_releases_total by cause ({} when it has none)."""
    out = {}
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=QUERY_TIMEOUT_S) as r:
            text = r.read().decode()
    except (OSError, urllib.error.URLError):
        return out
    for line in text.splitlines():
        if line.startswith("palisade_node_token_releases_total{") and 'by="' in line:
            by = line.split('by="', 1)[1].split('"', 1)[0]
            try:
                out[by] = out.get(by, 0.0) + float(line.rsplit(" ", 1)[1])
            except ValueError:
                pass
    return out


class Fleet:
    def __init__(self, args):
        self.args = args
        self.procs = []
        n = args.proxies
        self.raft = [free_port() for _ in range(3)]
        self.api = [free_port() for _ in range(3)]
        self.listen = [free_port() for _ in range(n)]
        self.admin = [free_port() for _ in range(n)]
        self.node_pids = []
        self.proxy_pids = []

    def spawn(self, name, cmd, env=None, cpus=None):
        if cpus:
            cmd = ["taskset", "-c", cpus] + cmd
        out = open(os.path.join(self.args.dir, f"{name}.out"), "w")
        err = open(os.path.join(self.args.dir, f"{name}.err"), "w")
        p = subprocess.Popen(cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=env)
        self.procs.append(p)
        return p

    def wait_line(self, name, text):
        path = os.path.join(self.args.dir, f"{name}.out")
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            with open(path) as f:
                if text in f.read():
                    return
            time.sleep(0.05)
        with open(os.path.join(self.args.dir, f"{name}.err")) as f:
            tail = f.read()[-800:]
        raise SystemExit(f"{name}: no '{text}' after {START_TIMEOUT_S} s: {tail}")

    def start(self):
        a = self.args
        peers = ",".join(f"{i + 1}=127.0.0.1:{p}" for i, p in enumerate(self.raft))
        cluster = ",".join(f"http://127.0.0.1:{p}" for p in self.api)
        announce = [f"http://127.0.0.1:{p}" for p in self.admin]
        env = dict(os.environ, PALISADE_WORKER_THREADS="1")
        for j in range(a.proxies):
            cmd = [a.palisade, "proxy", "--listen", f"127.0.0.1:{self.listen[j]}",
                   "--admin-listen", f"127.0.0.1:{self.admin[j]}",
                   "--data-dir", os.path.join(a.dir, f"proxy-{j + 1}-data"),
                   "--upstream", a.upstream]
            if a.lease_ms > 0:
                cmd += ["--cluster", cluster]
            if a.lease_ms > 0 and a.fleet_name:
                cmd += ["--fleet-name", announce[j]]
            self.proxy_pids.append(self.spawn(f"proxy-{j + 1}", cmd, env, a.proxy_cpus).pid)
        for i in range(3):
            cmd = [a.palisade, "node", "--id", str(i + 1), "--peers", peers,
                   "--api", f"127.0.0.1:{self.api[i]}",
                   "--data-dir", os.path.join(a.dir, f"node-{i + 1}-data"),
                   "--tick-ms", str(a.tick_ms), "--heartbeat-ticks", "1",
                   "--election-ticks", str(a.election_ticks)]
            if a.lease_ms > 0:
                cmd += ["--lease-ms", str(a.lease_ms)]
            for url in announce:
                cmd += ["--announce", url]
            self.node_pids.append(self.spawn(f"node-{i + 1}", cmd, env, a.node_cpus).pid)
        for j in range(a.proxies):
            self.wait_line(f"proxy-{j + 1}", "palisade proxy listening on")
        for i in range(3):
            self.wait_line(f"node-{i + 1}", "listening on")

    def stop(self):
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.kill(p.pid, signal.SIGCONT)
                    p.terminate()
                except OSError:
                    pass
        deadline = time.monotonic() + 5
        for p in self.procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()

    def settled(self, path):
        """(leader index, term, token) once every node agrees on one leader whose token is
        released and every proxy admits a write with it; None otherwise."""
        views = [view(p) for p in self.api]
        if any(v is None for v in views):
            return None
        leaders = {(v["leader_id"], v["term"]) for v in views}
        if len(leaders) != 1:
            return None
        (leader_id, term), = leaders
        if leader_id is None:
            return None
        lv = views[leader_id - 1]
        if lv["role"] != "leader" or lv["token"] is None:
            return None
        for port in self.listen:
            status = write(port, lv["token"], path)
            if status is None or not 200 <= status < 300:
                return None
        return leader_id - 1, term, lv["token"]


def trial(fleet, n, poll):
    deadline = time.monotonic() + TRIAL_TIMEOUT_S
    state = None
    while state is None:
        if time.monotonic() > deadline:
            raise SystemExit(f"trial {n}: the fleet did not settle within {TRIAL_TIMEOUT_S} s")
        state = fleet.settled(f"/settle/{n}")
        if state is None:
            time.sleep(poll)
    leader, old_term, old_token = state
    target = (n - 1) % len(fleet.listen)
    others = [i for i in range(3) if i != leader]
    t = {"paused_node": leader + 1, "old_term": old_term, "old_token": old_token, "proxy": target + 1,
         "new_term": None, "elected_ms": None, "released_ms": None, "admitted_ms": None,
         "refusals": {}, "released_by": {}}
    before = {i: releases(fleet.api[i]) for i in others}
    os.kill(fleet.node_pids[leader], signal.SIGSTOP)
    t0 = time.monotonic()
    ms = lambda: (time.monotonic() - t0) * 1000.0
    try:
        deadline = t0 + TRIAL_TIMEOUT_S
        new = None
        while time.monotonic() < deadline and t["released_ms"] is None:
            for i in others:
                v = view(fleet.api[i])
                if v and v["role"] == "leader" and v["term"] > old_term:
                    if t["elected_ms"] is None:
                        t["elected_ms"] = ms()
                        t["new_term"] = v["term"]
                    if v["token"] is not None:
                        t["released_ms"] = ms()
                        new = v["token"]
                        winner = i
                        break
            else:
                time.sleep(poll)
        while new is not None and time.monotonic() < deadline:
            status = write(fleet.listen[target], new, f"/trial/{n}")
            if status is not None and 200 <= status < 300:
                t["admitted_ms"] = ms()
                break
            key = str(status)
            t["refusals"][key] = t["refusals"].get(key, 0) + 1
            time.sleep(poll)
    finally:
        os.kill(fleet.node_pids[leader], signal.SIGCONT)
    if new is not None:
        # Why the new leader released its token: every proxy acknowledged the term
        # ("announce") or the release wait passed ("lease-expiry").
        after = releases(fleet.api[winner])
        t["released_by"] = {k: v - before[winner].get(k, 0.0) for k, v in after.items() if v != before[winner].get(k, 0.0)}
    return t


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--palisade", required=True)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--upstream", required=True, help="upstream URL of every proxy")
    ap.add_argument("--proxies", type=int, default=1)
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--lease-ms", type=int, default=3000,
                    help="the nodes' --lease-ms; 0: no fleet (nodes without leases, standalone proxies), for comparison")
    ap.add_argument("--tick-ms", type=int, default=100)
    ap.add_argument("--election-ticks", type=int, default=10)
    ap.add_argument("--poll-ms", type=int, default=10)
    ap.add_argument("--settle-ms", type=int, default=1000)
    ap.add_argument("--budget-s", type=int, default=300)
    ap.add_argument("--jitter-ms", type=int, default=None,
                    help="random extra settle time, up to this (default: lease_ms / 3, the renewal period)")
    ap.add_argument("--fleet-name", action="store_true", help="pass --fleet-name (the admin URL) to each proxy")
    ap.add_argument("--node-cpus", default=None)
    ap.add_argument("--proxy-cpus", default=None)
    a = ap.parse_args()
    fleet = Fleet(a)
    trials = []
    started = time.monotonic()
    try:
        fleet.start()
        for n in range(1, a.trials + 1):
            if time.monotonic() - started > a.budget_s:
                log(f"time budget of {a.budget_s} s spent after {n - 1} trials")
                break
            t = trial(fleet, n, a.poll_ms / 1000.0)
            trials.append(t)
            log(f"{a.proxies} proxies, trial {n}: paused node {t['paused_node']} (term {t['old_term']}): "
                f"elected {show_ms(t['elected_ms'])} ms, released {show_ms(t['released_ms'])} ms, "
                f"admitted at proxy {t['proxy']} {show_ms(t['admitted_ms'])} ms; refusals {t['refusals']}; "
                f"released by {t['released_by']}")
            # A random extra wait of up to a third of the lease (the proxies' renewal
            # period), so the pause lands at a random moment of their renewal cycle: a
            # fixed wait would pause the leader at the same phase every trial.
            jitter = a.lease_ms / 3 if a.jitter_ms is None else a.jitter_ms
            time.sleep((a.settle_ms + random.uniform(0, jitter)) / 1000.0)
    finally:
        fleet.stop()
    def med(key):
        v = [t[key] for t in trials if t[key] is not None]
        return statistics.median(v) if v else None
    print(json.dumps({"proxies": a.proxies, "lease_ms": a.lease_ms, "trials": trials,
                      "median_elected_ms": med("elected_ms"), "median_released_ms": med("released_ms"),
                      "median_admitted_ms": med("admitted_ms")}))
    return 0 if any(t["admitted_ms"] is not None for t in trials) else 1


if __name__ == "__main__":
    sys.exit(main())
