"""Warm pools against plain creates (a cold boot, or for a built-in image
a copy of its host's template once it holds one), end to end through the unmodified
langsmith SDK (issue 18): create -> first exec, p50 and p99, one at a time
and 8 at once; how fast a pool refills; host memory (PSS) per VM.

Run against a live `hearth up` on this machine (LANGSMITH_ENDPOINT /
LANGSMITH_API_KEY set; root, to read the VMMs' /proc for PSS):
    python tests/sdk/bench_pool.py [runs] [snapshot]
Default: 20 runs of busybox. Pool requests go over raw HTTP (the SDK has
no pools: they are a Hearth extension); everything a user times goes
through the SDK. Deletes what it creates.
"""

import json
import os
import statistics
import sys
import threading
import time
import urllib.request

from langsmith.sandbox import SandboxClient

GIB = 1024**3
MEM = 2 * GIB
client = SandboxClient()


def raw(method, path, body=None):
    url = client._base_url + path
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("X-Api-Key", os.environ["LANGSMITH_API_KEY"])
    if data is not None:
        req.add_header("Content-Type", "application/json")
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(req, timeout=120) as r:
        text = r.read()
        return json.loads(text) if text else None


def pool_status(name):
    return raw("GET", f"/pools/{name}")["status"]


def wait_ready(name, n, limit=600):
    t = time.monotonic()
    while True:
        st = pool_status(name)
        if (st["ready"] == n if n == 0 else st["ready"] >= n) and st["warming"] == 0:
            return time.monotonic() - t
        if time.monotonic() - t > limit:
            raise RuntimeError(f"pool {name} never had {n} ready: {st}")
        time.sleep(0.05)


def create_to_exec(snap):
    t0 = time.monotonic()
    sb = client.create_sandbox(snapshot_name=snap, mem_bytes=MEM, timeout=300)
    r = sb.run("true")
    dt = time.monotonic() - t0
    assert r.exit_code == 0, r
    return sb, dt


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(p / 100 * len(xs) + 0.5) - 1))]


def summary(label, xs):
    print(
        f"{label}: p50 {statistics.median(xs) * 1000:.0f} ms, p99 {pct(xs, 99) * 1000:.0f} ms "
        f"(min {min(xs) * 1000:.0f}, max {max(xs) * 1000:.0f}; n={len(xs)})",
        flush=True,
    )


def concurrent(snap, n):
    out = [None] * n

    def one(i):
        out[i] = create_to_exec(snap)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def pss_kib(ids):
    """PSS of the VMMs of these sandbox ids (QEMU's command line names the
    VM by its id without dashes)."""
    want = {i.replace("-", "") for i in ids}
    total, found = 0, 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            # QEMU names its process `hearth-vm-<id>` (a jail's helper
            # process carries the same command line but not the name).
            comm = open(f"/proc/{pid}/comm").read().strip()
            cmd = open(f"/proc/{pid}/cmdline", "rb").read().decode(errors="replace")
            if not comm.startswith("hearth-vm-") or not any(w in cmd for w in want):
                continue
            for line in open(f"/proc/{pid}/smaps_rollup"):
                if line.startswith("Pss:"):
                    total += int(line.split()[1])
                    found += 1
        except OSError:
            continue
    return total, found


def main():
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    snap = sys.argv[2] if len(sys.argv) > 2 else "busybox"
    cold = []
    for _ in range(runs):
        sb, dt = create_to_exec(snap)
        cold.append(dt)
        client.delete_sandbox(sb.name)
    summary(f"plain  create -> first exec [{snap}]", cold)

    name = f"bench-{os.getpid()}"
    raw("POST", "/pools", {"name": name, "snapshot": snap, "size": 8, "mem_bytes": MEM})
    try:
        wait_ready(name, 8)
        pooled = []
        for _ in range(runs):
            wait_ready(name, 1)
            sb, dt = create_to_exec(snap)
            pooled.append(dt)
            client.delete_sandbox(sb.name)
        summary(f"pooled create -> first exec [{snap}]", pooled)
        print(
            f"pooled / plain (p50): 1/{statistics.median(cold) / statistics.median(pooled):.0f}",
            flush=True,
        )

        # 8 at once from a full pool, then 8 at once with no pool members
        # left (they refill meanwhile: the cold batch is timed after the
        # pool is resized to 0).
        wait_ready(name, 8)
        before = pool_status(name)["claims"]
        got = concurrent(snap, 8)
        summary(f"pooled 8 at once [{snap}]", [dt for _, dt in got])
        claimed = pool_status(name)["claims"] - before
        refill = wait_ready(name, 8)
        print(
            f"refill: 8 members in {refill:.1f} s ({8 / refill:.2f} members/s; "
            f"{claimed} of the 8 were claims)",
            flush=True,
        )
        ids = [sb.id for sb, _ in got]
        idle_claimed, n1 = pss_kib(ids)
        for sb, _ in got:
            client.delete_sandbox(sb.name)
        raw("PATCH", f"/pools/{name}", {"size": 0})
        wait_ready(name, 0)
        got = concurrent(snap, 8)
        summary(f"plain  8 at once [{snap}]", [dt for _, dt in got])
        idle_cold, n2 = pss_kib([sb.id for sb, _ in got])
        if n1 and n2:
            print(
                f"PSS per VM, idle: claimed from the pool {idle_claimed / n1 / 1024:.0f} MiB "
                f"(n={n1}), a plain create's {idle_cold / n2 / 1024:.0f} MiB (n={n2})",
                flush=True,
            )
        for sb, _ in got:
            client.delete_sandbox(sb.name)
    finally:
        raw("DELETE", f"/pools/{name}")


if __name__ == "__main__":
    main()
