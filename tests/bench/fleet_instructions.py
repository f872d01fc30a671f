#!/usr/bin/env python3
"""Instructions per request of a fleet proxy against a standalone one, under callgrind.

Usage: fleet_instructions.py PALISADE WORKDIR UPSTREAM_PORT (an nginx `return 200` on
127.0.0.1:UPSTREAM_PORT, an empty WORKDIR). Starts a one-node cluster with
`--lease-ms 3000` announcing to the proxies' admin port, then for each mode (standalone,
with its fence set through the admin API; fleet, with `--cluster`) and N = 1,000 and
3,000: one proxy under `valgrind --tool=callgrind` (`--worker-threads 1`), one admitted
write, N keep-alive 1 KiB PUTs with the equal token from one connection, SIGTERM, and the
callgrind total. The difference of the two N divided by 2,000 removes start-up, the first
lease and shutdown; the fleet figure keeps the renewals inside the longer run. Prints the
per-request counts and their ratio. Instruction counts do not depend on the machine's
load, which CPU time on a shared machine does. Standard library only.
"""
import http.client, json, os, signal, socket, subprocess, sys, time, urllib.request
PAL = sys.argv[1]; WORK = sys.argv[2]; UP = int(sys.argv[3])
def free():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p
def wait_line(path, text, secs=120):
    end = time.time() + secs
    while time.time() < end:
        if os.path.exists(path) and text in open(path).read(): return
        time.sleep(0.2)
    raise SystemExit(f"no {text} in {path}")
def put(port, token, n):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    ok = 0
    for i in range(n):
        c.request("PUT", f"/bench/{i}", body=b"x" * 1024, headers={"Fencing-Token": str(token)})
        r = c.getresponse(); r.read(); ok += r.status == 200
    c.close(); return ok
admin = free(); raft = free(); api = free()
node = subprocess.Popen([PAL, "node", "--id", "1", "--peers", f"1=127.0.0.1:{raft}", "--api", f"127.0.0.1:{api}",
    "--data-dir", f"{WORK}/node", "--lease-ms", "3000", "--announce", f"http://127.0.0.1:{admin}"],
    stdout=open(f"{WORK}/node.out", "w"), stderr=open(f"{WORK}/node.err", "w"))
token = None
for _ in range(300):
    try:
        v = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{api}/v1/leader", timeout=1).read())
        if v.get("token"): token = v["token"]; break
    except Exception: pass
    time.sleep(0.1)
results = {}
try:
    for mode in ("standalone", "fleet"):
        for n in (1000, 3000):
            tag = f"{mode}-{n}"; port = free()
            cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={WORK}/cg.{tag}", PAL, "--worker-threads", "1",
                   "proxy", "--listen", f"127.0.0.1:{port}", "--admin-listen", f"127.0.0.1:{admin}",
                   "--data-dir", f"{WORK}/{tag}", "--upstream", f"http://127.0.0.1:{UP}"]
            if mode == "fleet": cmd += ["--cluster", f"http://127.0.0.1:{api}"]
            p = subprocess.Popen(cmd, stdout=open(f"{WORK}/{tag}.out", "w"), stderr=open(f"{WORK}/{tag}.err", "w"))
            wait_line(f"{WORK}/{tag}.out", "palisade proxy listening on")
            if mode == "standalone":
                req = urllib.request.Request(f"http://127.0.0.1:{admin}/v1/fences/default", data=json.dumps({"token": token}).encode(),
                                             headers={"Content-Type": "application/json"}, method="POST")
                urllib.request.urlopen(req, timeout=30).read()
            for _ in range(100):
                if put(port, token, 1) == 1: break
                time.sleep(0.3)
            t0 = time.time(); ok = put(port, token, n); dt = time.time() - t0
            p.send_signal(signal.SIGTERM); p.wait(120)
            total = None
            for line in open(f"{WORK}/cg.{tag}"):
                if line.startswith("summary:") or line.startswith("totals:"):
                    total = int(line.split()[1])
            results[tag] = total
            print(f"{tag}: {ok}/{n} ok in {dt:.1f} s, {total} instructions", flush=True)
finally:
    node.terminate(); node.wait(10)
per = {m: (results[f"{m}-3000"] - results[f"{m}-1000"]) / 2000 for m in ("standalone", "fleet")}
print(json.dumps(per), f"ratio fleet/standalone {per['fleet'] / per['standalone']:.4f}")
