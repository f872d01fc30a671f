#!/usr/bin/env python3
"""The POLE paper's wide-area evaluation, reproduced with palisade (driven by pole_eval.sh).

Three sites with the round trips of the paper's Table 2 (slac-caltech 9.88 ms, slac-fnal
53.26 ms, caltech-fnal 77.06 ms) are emulated on this machine: every node runs in a network
namespace of its own, joined to this (the host's) namespace by a veth pair on a private
bridge, and `tc netem` delays each packet by half the round trip between the sites of its
source and its destination, on the sender's side. The proxy (and the storage behind it,
an nginx answering 200 on 127.0.0.1) runs in the host's namespace, "near" one site: its
round trip to a node is that site's round trip to the node's site (0 added for a node of
its own site).

Layouts (node id: site):
  3 nodes: 1 caltech, 2 fnal, 3 slac (a node per site, in the 5-node layout's order);
  5 nodes: the paper's Fig. 5 with its Deployment 2 (D1 slac, D2 caltech, D3 fnal):
           1 caltech, 2 caltech, 3 fnal, 4 slac, 5 slac.
The nodes nearest the proxy's default site (slac) have the highest ids on purpose: ties
between scores go to the lower id, so an oracle that does not measure what matters here
cannot find slac by its id.

Every node has a worker (`pole_eval.py worker`, in the node's namespace) that writes
through the proxy only while its node is the established leader, with the token from its
node's leader view: a 1 KiB PUT every --interval-ms on one kept-alive connection, logging
each answer's latency. One trial: a fresh cluster and proxy start; after --warm-s, the
leader's writes during --measure-s give the "before" latency; then the leader is killed
(SIGKILL); recovery is the time from the kill until the answer of the first write admitted
with a higher token reaches its worker; the writes during --measure-s after recovery (plus
1 s) give the "after" latency. Everything is stopped by pid at the end of the trial.

Subcommands: eval (the above), worker (one worker), failover (loopback SIGSTOP failover
with any node flags, timed like `palisade bench failover`), cleanup (removes a run's
namespaces and bridge). Standard library only.
"""

import argparse
import http.client
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

# Round trips between the sites, in milliseconds (the paper's Table 2).
RTT_MS = {
    frozenset(("slac", "caltech")): 9.88,
    frozenset(("slac", "fnal")): 53.26,
    frozenset(("caltech", "fnal")): 77.06,
}
LAYOUTS = {
    3: ["caltech", "fnal", "slac"],
    5: ["caltech", "caltech", "fnal", "slac", "slac"],
}
# Ports inside each node's namespace (each has its own address, so they never collide).
RAFT_PORT = 7000
API_PORT = 8000
# Longest wait for a process to print its ready line, or for a first leader.
START_TIMEOUT_S = 30.0
# Longest wait for a failover (recovery or SIGSTOP trial) before the trial counts as failed.
RECOVERY_TIMEOUT_S = 30.0
# Timeout of one HTTP query of a node's API from the driver or a worker.
QUERY_TIMEOUT_S = 1.0
# Timeout of one write through the proxy: the slowest emulated round trip is 77 ms.
WRITE_TIMEOUT_S = 5.0
# Bytes of each write's body (the paper's requests are 1 kB).
BODY_BYTES = 1024
# How often a worker whose node does not lead asks it again.
WORKER_POLL_MS = 10


def rtt(a, b):
    return 0.0 if a == b else RTT_MS[frozenset((a, b))]


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def run(*args, check=True):
    out = subprocess.run(args, capture_output=True, text=True)
    if check and out.returncode != 0:
        raise RuntimeError(f"`{' '.join(args)}` failed: {out.stderr.strip()}")
    return out


def get_json(url, timeout=QUERY_TIMEOUT_S):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read())


def free_ports(host, count):
    """`count` distinct free ports: all are held bound until the last is picked, so the
    kernel cannot hand the same port out twice."""
    socks = []
    try:
        for _ in range(count):
            s = socket.socket()
            socks.append(s)
            s.bind((host, 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def pct(values, q):
    v = sorted(values)
    if not v:
        return None
    return v[min(len(v) - 1, int(round(q * (len(v) - 1))))]


class Net:
    """Namespaces pole{tag}-{i}, bridge polebr{tag}, subnet 10.214.{x}.0/24 (host at .254)."""

    def __init__(self, tag, x):
        self.tag, self.x = tag, x
        self.bridge = f"polebr{tag}"
        self.namespaces = []

    def ns(self, i):
        return f"pole{self.tag}-{i}"

    def ip(self, i):
        return f"10.214.{self.x}.{i}"

    @property
    def host(self):
        return f"10.214.{self.x}.254"

    def create(self, sites, proxy_site):
        run("ip", "link", "add", self.bridge, "type", "bridge")
        run("ip", "addr", "add", f"{self.host}/24", "dev", self.bridge)
        run("ip", "link", "set", self.bridge, "up")
        n = len(sites)
        for i in range(1, n + 1):
            ns, inner, outer = self.ns(i), f"pe{self.tag}n{i}a", f"pe{self.tag}n{i}b"
            run("ip", "netns", "add", ns)
            self.namespaces.append(ns)
            run("ip", "link", "add", inner, "type", "veth", "peer", "name", outer)
            run("ip", "link", "set", inner, "netns", ns)
            run("ip", "link", "set", outer, "master", self.bridge, "up")
            run("ip", "netns", "exec", ns, "ip", "addr", "add", f"{self.ip(i)}/24", "dev", inner)
            run("ip", "netns", "exec", ns, "ip", "link", "set", inner, "up")
            run("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
            # Node i's egress: half the round trip to each destination's site.
            delays = {self.ip(j): rtt(sites[i - 1], sites[j - 1]) / 2 for j in range(1, n + 1) if j != i}
            delays[self.host] = rtt(sites[i - 1], proxy_site) / 2
            self.shape(["ip", "netns", "exec", ns], inner, "dst", delays)
            # The host's egress towards node i (the bridge's port): only what the host
            # itself sends (the proxy, the driver) is delayed here; node-to-node packets
            # were delayed by their sender.
            self.shape([], outer, "src", {self.host: rtt(sites[i - 1], proxy_site) / 2})

    @staticmethod
    def shape(prefix, dev, field, delays):
        """A prio qdisc on dev: band 1 (the default) undelayed, one netem band per delay."""
        wanted = sorted({d for d in delays.values() if d > 0})
        if not wanted:
            return
        bands = len(wanted) + 1
        run(*prefix, "tc", "qdisc", "add", "dev", dev, "root", "handle", "1:", "prio",
            "bands", str(max(bands, 3)), "priomap", *(["0"] * 16))
        for k, d in enumerate(wanted, start=2):
            run(*prefix, "tc", "qdisc", "add", "dev", dev, "parent", f"1:{k}", "handle",
                f"{k}0:", "netem", "delay", f"{d:.2f}ms", "limit", "100000")
        for addr, d in delays.items():
            if d > 0:
                k = wanted.index(d) + 2
                run(*prefix, "tc", "filter", "add", "dev", dev, "parent", "1:", "protocol",
                    "ip", "prio", "1", "u32", "match", "ip", field, f"{addr}/32",
                    "flowid", f"1:{k}")

    def remove(self):
        for ns in self.namespaces:
            run("ip", "netns", "del", ns, check=False)
        self.namespaces = []
        run("ip", "link", "del", self.bridge, check=False)


def cleanup_tag(tag):
    """Removes every namespace and the bridge of a run (used by the shell's exit trap)."""
    for line in run("ip", "netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        if name.startswith(f"pole{tag}-"):
            run("ip", "netns", "del", name, check=False)
    run("ip", "link", "del", f"polebr{tag}", check=False)


class Procs:
    """Processes started by the driver, each in its own process group, stopped by pid."""

    def __init__(self, work):
        self.work, self.procs = work, []

    def start(self, name, args, env=None):
        out = open(os.path.join(self.work, f"{name}.out"), "w")
        err = open(os.path.join(self.work, f"{name}.err"), "w")
        p = subprocess.Popen(args, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                             start_new_session=True, env=env)
        p.name = name
        self.procs.append(p)
        return p

    def wait_line(self, name, text, timeout=START_TIMEOUT_S):
        path = os.path.join(self.work, f"{name}.out")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with open(path) as f:
                if text in f.read():
                    return
            time.sleep(0.05)
        with open(os.path.join(self.work, f"{name}.err")) as f:
            tail = f.read()[-800:]
        raise RuntimeError(f"{name}: no '{text}' after {timeout:.0f}s: {tail}")

    @staticmethod
    def kill(p, sig):
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            pass

    def stop_all(self):
        for p in self.procs:
            self.kill(p, signal.SIGCONT)
            self.kill(p, signal.SIGTERM)
        deadline = time.monotonic() + 5
        for p in self.procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.kill(p, signal.SIGKILL)
                p.wait()
        self.procs = []


def config_flags(config, i, sites, proxy_site):
    """The node flags of one election configuration."""
    if config == "default":
        # The node's defaults: the static oracle with every score 0, so ranks go by id.
        return []
    if config == "off":
        # raft's randomized election at the same tick settings.
        return ["--score-oracle", "off"]
    if config == "static":
        # The operator's number: the closer the node's site to the proxy, the higher.
        score = round(1000 - rtt(sites[i - 1], proxy_site) * 10)
        return ["--score-oracle", "static", "--score", str(score)]
    return ["--score-oracle", config]


def read_writes(path):
    writes = []
    try:
        with open(path) as f:
            for line in f:
                try:
                    writes.append(json.loads(line))
                except ValueError:
                    pass
    except FileNotFoundError:
        pass
    return writes


class NetemTopo:
    """Nodes in namespaces of their own, delays by `tc netem` (see Net)."""

    name = "netem"

    def __init__(self, net, sites, proxy_site):
        self.net, self.sites, self.proxy_site = net, sites, proxy_site
        self.proxy_host = net.host

    def setup(self, procs, proxy_port, admin_port):
        self.proxy_port, self.admin_port = proxy_port, admin_port

    def prefix(self, i):
        return ["ip", "netns", "exec", self.net.ns(i)]

    def env(self, i):
        return None

    def peers(self):
        return ",".join(f"{j}={self.net.ip(j)}:{RAFT_PORT}" for j in range(1, len(self.sites) + 1))

    def api(self, i):
        return f"{self.net.ip(i)}:{API_PORT}"

    def node_flags(self, i):
        return ["--announce", f"http://{self.net.host}:{self.admin_port}", "--insecure"]

    def worker_proxy(self, i):
        return f"http://{self.net.host}:{self.proxy_port}"

    def after_start(self):
        pass


class RelayTopo:
    """Everything on loopback: the nodes' peer links delayed by their transport's test
    faults (PALISADE_TEST_FAULTS=1, POST /v1/test/faults: each node delays what it sends
    to a peer by half the round trip, rounded to whole milliseconds), and each node's path
    to the proxy (its announcements, its worker's writes) through a relay of its own
    (`pole_eval.py relay`) that delays each direction by half the round trip between its
    site and the proxy's."""

    name = "relay"

    def __init__(self, sites, proxy_site):
        self.sites, self.proxy_site = sites, proxy_site
        self.proxy_host = "127.0.0.1"
        self.n = len(sites)

    def setup(self, procs, proxy_port, admin_port):
        # Fresh ports every trial (a killed node's ports may linger in TIME_WAIT).
        n = self.n
        ports = free_ports("127.0.0.1", 4 * n)
        ids = range(1, n + 1)
        self.raft = dict(zip(ids, ports[0:n]))
        self.api_port = dict(zip(ids, ports[n:2 * n]))
        self.relay_admin = dict(zip(ids, ports[2 * n:3 * n]))
        self.relay_data = dict(zip(ids, ports[3 * n:4 * n]))
        routes = []
        for i, site in enumerate(self.sites, start=1):
            half = rtt(site, self.proxy_site) / 2
            routes += ["--route", f"{self.relay_admin[i]}:{admin_port}:{half}",
                       "--route", f"{self.relay_data[i]}:{proxy_port}:{half}"]
        procs.start("relay", [sys.executable, os.path.abspath(__file__), "relay", *routes])
        procs.wait_line("relay", "relay ready")

    def prefix(self, i):
        return []

    def env(self, i):
        return dict(os.environ, PALISADE_TEST_FAULTS="1")

    def peers(self):
        return ",".join(f"{j}=127.0.0.1:{self.raft[j]}" for j in range(1, len(self.sites) + 1))

    def api(self, i):
        return f"127.0.0.1:{self.api_port[i]}"

    def node_flags(self, i):
        return ["--announce", f"http://127.0.0.1:{self.relay_admin[i]}"]

    def worker_proxy(self, i):
        return f"http://127.0.0.1:{self.relay_data[i]}"

    def after_start(self):
        n = len(self.sites)
        for i in range(1, n + 1):
            spec = {"delay_ms": {str(j): round(rtt(self.sites[i - 1], self.sites[j - 1]) / 2)
                                 for j in range(1, n + 1)
                                 if j != i and rtt(self.sites[i - 1], self.sites[j - 1]) > 0}}
            req = urllib.request.Request(f"http://{self.api(i)}/v1/test/faults",
                                         data=json.dumps(spec).encode(), method="POST",
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=QUERY_TIMEOUT_S) as r:
                r.read()


def leader_of(topo, n):
    """(leader id, term, token, view) of an established leader, from the nodes' views."""
    for i in range(1, n + 1):
        try:
            v = get_json(f"http://{topo.api(i)}/v1/leader")
        except (OSError, urllib.error.URLError, ValueError):
            continue
        if v.get("role") == "leader" and v.get("token") is not None:
            return i, v["term"], v["token"], v
    return None


def eval_trial(args, topo, sites, config, trial):
    n = len(sites)
    work = os.path.join(args.work, f"{n}-{config}-{trial}")
    os.makedirs(work)
    procs = Procs(work)
    proxy_port, admin_port = free_ports(topo.proxy_host, 2)
    result = {"nodes": n, "config": config, "trial": trial}
    try:
        procs.start("proxy", [args.bin, "proxy", "--listen", f"{topo.proxy_host}:{proxy_port}",
                              "--admin-listen", f"{topo.proxy_host}:{admin_port}",
                              "--data-dir", os.path.join(work, "proxy"),
                              "--upstream", f"http://127.0.0.1:{args.upstream_port}"])
        procs.wait_line("proxy", "palisade proxy listening on")
        topo.setup(procs, proxy_port, admin_port)
        nodes = {}
        for i in range(1, n + 1):
            cmd = [*topo.prefix(i), args.bin, "node", "--id", str(i), "--peers", topo.peers(),
                   "--data-dir", os.path.join(work, f"node{i}"), "--api", topo.api(i),
                   *topo.node_flags(i), *config_flags(config, i, sites, args.proxy_site),
                   *args.node_arg]
            nodes[i] = procs.start(f"node{i}", cmd, env=topo.env(i))
        for i in range(1, n + 1):
            procs.wait_line(f"node{i}", "listening on")
        topo.after_start()
        result["leader_before_delays"] = leader_of(topo, n) is not None
        for i in range(1, n + 1):
            procs.start(f"worker{i}", [*topo.prefix(i), sys.executable,
                                       os.path.abspath(__file__), "worker",
                                       "--node", f"http://{topo.api(i)}",
                                       "--proxy", topo.worker_proxy(i),
                                       "--name", f"n{i}", "--interval-ms", str(args.interval_ms)])
        deadline = time.monotonic() + START_TIMEOUT_S
        while leader_of(topo, n) is None:
            if time.monotonic() > deadline:
                raise RuntimeError("no established leader")
            time.sleep(0.1)
        time.sleep(args.warm_s)
        t0 = time.monotonic()
        time.sleep(args.measure_s)
        t1 = time.monotonic()
        led = leader_of(topo, n)
        if led is None:
            raise RuntimeError("no established leader at the end of the first window")
        victim, term, token, view = led
        result["view"] = view
        procs.kill(nodes[victim], signal.SIGKILL)
        t_kill = time.monotonic()
        result["killed"] = victim
        result["killed_site"] = sites[victim - 1]
        recovered = None
        while time.monotonic() < t_kill + RECOVERY_TIMEOUT_S:
            for i in range(1, n + 1):
                if i == victim:
                    continue
                for w in read_writes(os.path.join(work, f"worker{i}.out")):
                    if w["t"] > t_kill and 200 <= w["status"] < 300 and w["token"] > token:
                        if recovered is None or w["t"] < recovered[0]:
                            recovered = (w["t"], i, w["token"])
            if recovered is not None:
                break
            time.sleep(0.05)
        if recovered is None:
            raise RuntimeError("no write admitted with a new token after the kill")
        result["recovery_ms"] = (recovered[0] - t_kill) * 1000
        result["new_leader"] = recovered[1]
        result["new_site"] = sites[recovered[1] - 1]
        t2 = recovered[0] + 1.0
        time.sleep(max(0.0, t2 + args.measure_s - time.monotonic()))
        t3 = time.monotonic()
        all_writes = {i: read_writes(os.path.join(work, f"worker{i}.out")) for i in range(1, n + 1)}

        def window(a, b):
            lat, sites_seen, bad, tokens = [], {}, 0, set()
            for i, ws in all_writes.items():
                for w in ws:
                    if a <= w["t"] <= b:
                        if 200 <= w["status"] < 300:
                            lat.append(w["lat_ms"])
                            sites_seen[sites[i - 1]] = sites_seen.get(sites[i - 1], 0) + 1
                            tokens.add(w["token"])
                        else:
                            bad += 1
            return lat, sites_seen, bad, tokens

        for label, a, b in (("before", t0, t1), ("after", t2, t3)):
            lat, seen, bad, tokens = window(a, b)
            result[label] = {
                # More than one token in a window: leadership moved within it.
                "writes": len(lat), "refused": bad, "sites": seen, "tokens": sorted(tokens),
                "mean_ms": statistics.fmean(lat) if lat else None,
                "p99_ms": pct(lat, 0.99), "p50_ms": pct(lat, 0.5),
            }
        result["leader_site"] = max(result["before"]["sites"], key=result["before"]["sites"].get,
                                    default=None)
        result["ok"] = True
    except Exception as e:  # one failed trial is reported, and the run goes on
        result["ok"] = False
        result["error"] = str(e)
        log(f"trial failed: {e}")
    finally:
        procs.stop_all()
    return result


def cmd_eval(args):
    results = []
    layouts = [int(x) for x in args.layouts.split(",")]
    configs = args.configs.split(",")
    for n in layouts:
        sites = LAYOUTS[n]
        net = Net(args.tag, args.subnet)
        try:
            if args.net == "netem":
                net.create(sites, args.proxy_site)
                topo = NetemTopo(net, sites, args.proxy_site)
            else:
                topo = RelayTopo(sites, args.proxy_site)
            # Trials alternate between the configurations, so that a burst of load from
            # elsewhere falls on all of them alike.
            for trial in range(1, args.trials + 1):
                for config in configs:
                    r = eval_trial(args, topo, sites, config, trial)
                    b, a = r.get("before", {}), r.get("after", {})
                    log(f"{n} nodes, {config}, trial {trial}: "
                        + (f"leader at {r['leader_site']} mean {b.get('mean_ms') or 0:.2f} ms "
                           f"p99 {b.get('p99_ms') or 0:.2f} ms; killed {r['killed']}; "
                           f"recovery {r['recovery_ms']:.0f} ms to {r['new_site']}; "
                           f"after: mean {a.get('mean_ms') or 0:.2f} ms"
                           if r["ok"] else f"failed: {r['error']}"))
                    results.append(r)
                    with open(args.out, "w") as f:
                        json.dump(results, f, indent=1)
        finally:
            net.remove()
    print_table(results, layouts, configs, args.proxy_site)


def med(values):
    v = [x for x in values if x is not None]
    return statistics.median(v) if v else None


def fmt(x, digits=1):
    return "-" if x is None else f"{x:,.{digits}f}"


def print_table(results, layouts, configs, proxy_site):
    print(f"\nPOLE evaluation: proxy near {proxy_site}; medians over trials of each trial's "
          "mean and p99 write latency of the leader's worker, and of the recovery time; "
          "moves: leadership changes inside the measured windows\n")
    print("| nodes | election | trials ok | leader sites (before) | mean ms | p99 ms | "
          "recovery ms (median, max) | new leader sites | mean ms after | p99 ms after | "
          "moves in windows |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    summary = {}
    for n in layouts:
        for c in configs:
            rs = [r for r in results if r["nodes"] == n and r["config"] == c and r["ok"]]
            tried = [r for r in results if r["nodes"] == n and r["config"] == c]
            sites_b, sites_a = {}, {}
            for r in rs:
                sites_b[r["leader_site"]] = sites_b.get(r["leader_site"], 0) + 1
                sites_a[r["new_site"]] = sites_a.get(r["new_site"], 0) + 1
            rec = [r["recovery_ms"] for r in rs]
            m = med(r["before"]["mean_ms"] for r in rs)
            summary[(n, c)] = (m, med(rec))
            print(f"| {n} | {c} | {len(rs)}/{len(tried)} | "
                  f"{', '.join(f'{k} {v}' for k, v in sorted(sites_b.items()))} | "
                  f"{fmt(m, 2)} | {fmt(med(r['before']['p99_ms'] for r in rs), 2)} | "
                  f"{fmt(med(rec), 0)}, {fmt(max(rec) if rec else None, 0)} | "
                  f"{', '.join(f'{k} {v}' for k, v in sorted(sites_a.items()))} | "
                  f"{fmt(med(r['after']['mean_ms'] for r in rs), 2)} | "
                  f"{fmt(med(r['after']['p99_ms'] for r in rs), 2)} | "
                  f"{sum(max(0, len(r[w]['tokens']) - 1) for r in rs for w in ('before', 'after'))} |")
    for n in layouts:
        s = summary.get((n, "storage-rtt"))
        for base in ("off", "default"):
            d = summary.get((n, base))
            if d and s and None not in d + s and s[0] > 0:
                print(f"\n{n} nodes: {base}/storage-rtt mean latency {d[0] / s[0]:.1f}x; "
                      f"recovery storage-rtt/{base} {s[1] / d[1]:.2f}")


def cmd_worker(args):
    """Writes through the proxy while the node is the established leader; one JSON line
    per answer: monotonic time of the answer, latency, token, status."""
    node = urllib.parse.urlsplit(args.node)
    proxy = urllib.parse.urlsplit(args.proxy)
    body = b"x" * BODY_BYTES
    conn = None
    seq = 0
    next_at = time.monotonic()
    out = sys.stdout
    while True:
        try:
            nc = http.client.HTTPConnection(node.hostname, node.port, timeout=QUERY_TIMEOUT_S)
            nc.request("GET", "/v1/leader")
            view = json.loads(nc.getresponse().read())
            nc.close()
        except (OSError, ValueError, http.client.HTTPException):
            time.sleep(WORKER_POLL_MS / 1000)
            continue
        if view.get("role") != "leader" or view.get("token") is None:
            time.sleep(WORKER_POLL_MS / 1000)
            continue
        token = view["token"]
        seq += 1
        headers = {"Fencing-Token": str(token), "Content-Length": str(len(body))}
        if view.get("proof"):
            headers["Fencing-Token-Proof"] = view["proof"]
        start = time.monotonic()
        try:
            if conn is None:
                conn = http.client.HTTPConnection(proxy.hostname, proxy.port, timeout=WRITE_TIMEOUT_S)
            conn.request("PUT", f"/pole/{args.name}/{seq}", body=body, headers=headers)
            resp = conn.getresponse()
            resp.read()
            status = resp.status
        except (OSError, http.client.HTTPException):
            status = 0
            if conn is not None:
                conn.close()
            conn = None
        end = time.monotonic()
        out.write(json.dumps({"t": end, "lat_ms": (end - start) * 1000, "token": token,
                              "status": status}) + "\n")
        out.flush()
        next_at = max(next_at + args.interval_ms / 1000, end)
        time.sleep(max(0.0, next_at - time.monotonic()))


def cmd_relay(args):
    """TCP relays on 127.0.0.1, each `LISTEN:TARGET:DELAY_MS`: every byte read from either
    side is written to the other DELAY_MS later, in order (latency without a bandwidth
    limit). Prints `relay ready` once every route listens."""
    import asyncio

    async def pump(reader, writer, delay):
        loop = asyncio.get_running_loop()
        queue = asyncio.Queue()

        async def send():
            while True:
                due, data = await queue.get()
                wait = due - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                if not data:
                    break
                writer.write(data)
                await writer.drain()

        sender = asyncio.create_task(send())
        try:
            while True:
                data = await reader.read(65536)
                queue.put_nowait((loop.time() + delay, data))
                if not data:
                    break
            await sender
        except (OSError, asyncio.CancelledError):
            sender.cancel()
        finally:
            writer.close()

    async def serve(listen, target, delay):
        async def handle(r1, w1):
            try:
                r2, w2 = await asyncio.open_connection("127.0.0.1", target)
            except OSError:
                w1.close()
                return
            await asyncio.gather(pump(r1, w2, delay), pump(r2, w1, delay),
                                 return_exceptions=True)

        return await asyncio.start_server(handle, "127.0.0.1", listen)

    async def main():
        servers = []
        for route in args.route:
            listen, target, delay_ms = route.split(":")
            servers.append(await serve(int(listen), int(target), float(delay_ms) / 1000))
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        print("relay ready", flush=True)
        await stop.wait()
        for server in servers:
            server.close()

    asyncio.run(main())


def cmd_failover(args):
    """Loopback SIGSTOP failover of palisade with any node flags: from the signal until a
    new leader is elected and until the proxy's fence rose, like `palisade bench failover`."""
    procs = Procs(args.work)
    n = args.nodes
    ports = free_ports("127.0.0.1", 2 * n + 2)
    raft = dict(zip(range(1, n + 1), ports[0:n]))
    api = dict(zip(range(1, n + 1), ports[n:2 * n]))
    proxy_port, admin_port = ports[2 * n], ports[2 * n + 1]
    trials = []
    try:
        procs.start("proxy", [args.bin, "proxy", "--listen", f"127.0.0.1:{proxy_port}",
                              "--admin-listen", f"127.0.0.1:{admin_port}",
                              "--data-dir", os.path.join(args.work, "proxy")])
        procs.wait_line("proxy", "palisade proxy listening on")
        peers = ",".join(f"{j}=127.0.0.1:{raft[j]}" for j in range(1, n + 1))
        nodes = {}
        for i in range(1, n + 1):
            nodes[i] = procs.start(f"node{i}", [
                args.bin, "node", "--id", str(i), "--peers", peers,
                "--data-dir", os.path.join(args.work, f"node{i}"), "--api", f"127.0.0.1:{api[i]}",
                "--announce", f"http://127.0.0.1:{admin_port}", *args.node_arg])
        for i in range(1, n + 1):
            procs.wait_line(f"node{i}", "listening on")

        def views(skip=None):
            # The paused node is skipped while it is paused: a query of it would wait out
            # its timeout and hold up the polling.
            out = {}
            for i in range(1, n + 1):
                if i == skip:
                    continue
                try:
                    out[i] = get_json(f"http://127.0.0.1:{api[i]}/v1/leader", 0.5)
                except (OSError, urllib.error.URLError, ValueError):
                    pass
            return out

        def fence():
            try:
                return get_json(f"http://127.0.0.1:{admin_port}/v1/fences/default", 0.5).get("token")
            except (OSError, urllib.error.URLError, ValueError):
                return None

        def settled():
            vs = views()
            leaders = [v for v in vs.values() if v.get("role") == "leader" and v.get("token")]
            if len(vs) == n and len(leaders) == 1 and all(
                    v.get("leader_id") == leaders[0]["node_id"] for v in vs.values()) \
                    and fence() == leaders[0]["token"]:
                return leaders[0]
            return None

        started = time.monotonic()
        for trial in range(1, args.trials + 1):
            if time.monotonic() - started > args.budget_s:
                break
            deadline = time.monotonic() + RECOVERY_TIMEOUT_S
            leader = settled()
            while leader is None and time.monotonic() < deadline:
                time.sleep(0.05)
                leader = settled()
            if leader is None:
                trials.append({"paused_node": None, "elected_ms": None, "announced_ms": None})
                continue
            time.sleep(args.settle_ms / 1000)
            leader = settled()
            if leader is None:
                continue
            victim, old = leader["node_id"], leader["token"]
            procs.kill(nodes[victim], signal.SIGSTOP)
            t0 = time.monotonic()
            elected = announced = None
            while time.monotonic() < t0 + RECOVERY_TIMEOUT_S and announced is None:
                now = time.monotonic()
                if elected is None:
                    for i, v in views(skip=victim).items():
                        if v.get("role") == "leader" and v.get("term", 0) > leader["term"]:
                            elected = (time.monotonic() - t0) * 1000
                f = fence()
                if f is not None and f > old:
                    announced = (time.monotonic() - t0) * 1000
                    if elected is None:
                        elected = announced
                time.sleep(max(0.0, args.poll_ms / 1000 - (time.monotonic() - now)))
            procs.kill(nodes[victim], signal.SIGCONT)
            trials.append({"paused_node": victim, "elected_ms": elected, "announced_ms": announced})
            log(f"palisade trial {trial}: paused {victim}, elected {fmt(elected, 0)} ms, "
                f"token at the proxy {fmt(announced, 0)} ms")
    finally:
        procs.stop_all()
    json.dump({"trials": trials, "node_args": args.node_arg}, sys.stdout)
    print()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("eval")
    e.add_argument("--bin", required=True)
    e.add_argument("--work", required=True)
    e.add_argument("--tag", required=True, help="suffix of namespace and bridge names")
    e.add_argument("--subnet", type=int, required=True, help="third octet of 10.214.X.0/24")
    e.add_argument("--upstream-port", type=int, required=True)
    e.add_argument("--net", choices=["netem", "relay"], default="netem",
                   help="how the wide area is emulated (see NetemTopo, RelayTopo)")
    e.add_argument("--layouts", default="3,5")
    e.add_argument("--configs",
                   default="off,default,storage-rtt,consensus-latency,rotating,static")
    e.add_argument("--proxy-site", default="slac", choices=["slac", "caltech", "fnal"])
    e.add_argument("--trials", type=int, default=5)
    e.add_argument("--warm-s", type=float, default=6.0)
    e.add_argument("--measure-s", type=float, default=6.0)
    e.add_argument("--interval-ms", type=int, default=20)
    e.add_argument("--node-arg", action="append", default=[], help="extra flag for every node")
    e.add_argument("--out", required=True)
    w = sub.add_parser("worker")
    w.add_argument("--node", required=True)
    w.add_argument("--proxy", required=True)
    w.add_argument("--name", required=True)
    w.add_argument("--interval-ms", type=int, default=20)
    f = sub.add_parser("failover")
    f.add_argument("--bin", required=True)
    f.add_argument("--work", required=True)
    f.add_argument("--nodes", type=int, default=3)
    f.add_argument("--trials", type=int, default=10)
    f.add_argument("--poll-ms", type=int, default=10)
    f.add_argument("--settle-ms", type=int, default=1000)
    f.add_argument("--budget-s", type=int, default=240)
    f.add_argument("--node-arg", action="append", default=[], help="extra flag for every node")
    r = sub.add_parser("relay")
    r.add_argument("--route", action="append", default=[], help="LISTEN:TARGET:DELAY_MS")
    c = sub.add_parser("cleanup")
    c.add_argument("--tag", required=True)
    args = p.parse_args()
    # A TERM from the shell's trap ends the run through the finally blocks above.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    {"eval": cmd_eval, "worker": cmd_worker, "failover": cmd_failover, "relay": cmd_relay,
     "cleanup": lambda a: cleanup_tag(a.tag)}[args.cmd](args)


if __name__ == "__main__":
    main()
