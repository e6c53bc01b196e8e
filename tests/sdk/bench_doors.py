"""One sandbox through both doors (issue 20): exec round trip and file
throughput through E2B's API (the unmodified `e2b` SDK) against LangSmith's
(the unmodified `langsmith` SDK), in the same run on the same sandbox.

Run against a live `hearth up` (LANGSMITH_ENDPOINT / LANGSMITH_API_KEY and
E2B_API_URL / E2B_SANDBOX_URL / E2B_API_KEY set, as `hearth up` prints):
    python tests/sdk/bench_doors.py [runs] [snapshot]
Default: 50 exec round trips per door, busybox. Deletes what it creates.
With E2B_DOMAIN too (and SSL_CERT_FILE at Hearth's CA, `<data>/tls/ca.pem`),
a third door: E2B's SDK without the single URLs, over https to the sandbox's
host by name (`49983-{id}.{domain}`).
"""

import os
import statistics
import sys
import time

from e2b import Sandbox
from langsmith.sandbox import SandboxClient

MIB = 1 << 20


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(p / 100 * len(xs) + 0.5) - 1))]


def timed(f, n):
    out = []
    for _ in range(n):
        t = time.monotonic()
        f()
        out.append(time.monotonic() - t)
    return out


def by_name(sandbox_id):
    """The sandbox through E2B's SDK configured by E2B_DOMAIN alone (its
    connection config is read now, so the single URLs are hidden only
    meanwhile)."""
    saved = {k: os.environ.pop(k) for k in ("E2B_API_URL", "E2B_SANDBOX_URL") if k in os.environ}
    try:
        return Sandbox.connect(sandbox_id)
    finally:
        os.environ.update(saved)


def main():
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 50
    snap = sys.argv[2] if len(sys.argv) > 2 else "busybox"
    ls = SandboxClient()
    sb = ls.create_sandbox(snapshot_name=snap, timeout=300)
    try:
        e2b = Sandbox.connect(str(sb.id))
        named = by_name(str(sb.id)) if os.environ.get("E2B_DOMAIN") else None
        # Warm the paths up first.
        sb.run("true")
        e2b.commands.run("true")
        doors = [
            ("langsmith", lambda: sb.run("true")),
            ("e2b", lambda: e2b.commands.run("true")),
        ]
        if named is not None:
            named.commands.run("true")
            doors.append(("e2b-named", lambda: named.commands.run("true")))
        rows = []
        for door, run in doors:
            xs = timed(run, runs)
            rows.append((door, statistics.median(xs) * 1000, pct(xs, 99) * 1000))
        for door, p50, p99 in rows:
            print(f"exec `true` via {door:9}: p50 {p50:.1f} ms, p99 {p99:.1f} ms (n={runs})", flush=True)
        print(f"e2b / langsmith exec p50: {rows[1][1] / rows[0][1]:.2f}", flush=True)
        if named is not None:
            print(f"e2b-named (TLS) / e2b exec p50: {rows[2][1] / rows[1][1]:.2f}", flush=True)

        data = os.urandom(32 * MIB)
        speeds = {}
        transfers = [
            ("langsmith", lambda p: sb.write(p, data), lambda p: sb.read(p)),
            ("e2b", lambda p: e2b.files.write(p, data), lambda p: e2b.files.read(p, format="bytes")),
        ]
        if named is not None:
            transfers.append(("e2b-named", lambda p: named.files.write(p, data),
                              lambda p: named.files.read(p, format="bytes")))
        for door, write, read in transfers:
            path = f"/root/bench-{door}.bin"
            t = time.monotonic()
            write(path)
            up = time.monotonic() - t
            t = time.monotonic()
            back = read(path)
            down = time.monotonic() - t
            assert bytes(back) == data, f"{door}: the file came back different"
            sb.run(f"rm -f {path}")  # a small image's disk holds one at a time
            speeds[door] = (32 / up, 32 / down)
            print(f"32 MiB via {door:9}: write {32 / up:.1f} MiB/s, read {32 / down:.1f} MiB/s", flush=True)
        print(
            f"e2b / langsmith: write {speeds['e2b'][0] / speeds['langsmith'][0]:.2f}, "
            f"read {speeds['e2b'][1] / speeds['langsmith'][1]:.2f}",
            flush=True,
        )
        if named is not None:
            print(
                f"e2b-named (TLS) / e2b: write {speeds['e2b-named'][0] / speeds['e2b'][0]:.2f}, "
                f"read {speeds['e2b-named'][1] / speeds['e2b'][1]:.2f}",
                flush=True,
            )
    finally:
        ls.delete_sandbox(sb.name)


if __name__ == "__main__":
    main()
