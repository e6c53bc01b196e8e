"""One sandbox through both doors (issue 20): exec round trip and file
throughput through E2B's API (the unmodified `e2b` SDK) against LangSmith's
(the unmodified `langsmith` SDK), in the same run on the same sandbox.

Run against a live `hearth up` (LANGSMITH_ENDPOINT / LANGSMITH_API_KEY and
E2B_API_URL / E2B_SANDBOX_URL / E2B_API_KEY set, as `hearth up` prints):
    python tests/sdk/bench_doors.py [runs] [snapshot]
Default: 50 exec round trips per door, busybox. Deletes what it creates.
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


def main():
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 50
    snap = sys.argv[2] if len(sys.argv) > 2 else "busybox"
    ls = SandboxClient()
    sb = ls.create_sandbox(snapshot_name=snap, timeout=300)
    try:
        e2b = Sandbox.connect(str(sb.id))
        # Warm both paths up first.
        sb.run("true")
        e2b.commands.run("true")
        rows = []
        for door, run in (
            ("langsmith", lambda: sb.run("true")),
            ("e2b", lambda: e2b.commands.run("true")),
        ):
            xs = timed(run, runs)
            rows.append((door, statistics.median(xs) * 1000, pct(xs, 99) * 1000))
        for door, p50, p99 in rows:
            print(f"exec `true` via {door:9}: p50 {p50:.1f} ms, p99 {p99:.1f} ms (n={runs})", flush=True)
        print(f"e2b / langsmith exec p50: {rows[1][1] / rows[0][1]:.2f}", flush=True)

        data = os.urandom(32 * MIB)
        speeds = {}
        for door, write, read in (
            ("langsmith", lambda p: sb.write(p, data), lambda p: sb.read(p)),
            ("e2b", lambda p: e2b.files.write(p, data), lambda p: e2b.files.read(p, format="bytes")),
        ):
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
    finally:
        ls.delete_sandbox(sb.name)


if __name__ == "__main__":
    main()
