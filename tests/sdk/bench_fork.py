"""Fork, end to end through the unmodified langsmith SDK (issue 18): the
parent's pause, the time until a child answers an exec, 10 children at
once, the parent's exec latency before and after, and host memory (PSS)
per child against a plain create's (for a built-in image, a copy of its
host's template of that shape once it holds one).

Run against a live `hearth up` on this machine (LANGSMITH_ENDPOINT /
LANGSMITH_API_KEY set; root, to read the VMMs' /proc for PSS):
    python tests/sdk/bench_fork.py [snapshot]
Default snapshot: the server's default (Debian). The fork request goes
over raw HTTP (a Hearth extension); everything else through the SDK.
Deletes what it creates.
"""

import statistics
import sys
import time

from bench_pool import client, pss_kib, raw

GIB = 1024**3
COUNTER = "i=0; while true; do i=$((i+1)); echo $i > /tmp/count.new; mv /tmp/count.new /tmp/count; sleep 0.2; done"


def exec_ms(sb, n=9):
    times = []
    for _ in range(n):
        t = time.monotonic()
        assert sb.run("true").exit_code == 0
        times.append(time.monotonic() - t)
    return statistics.median(times) * 1000


def main():
    snap = sys.argv[1] if len(sys.argv) > 1 else None
    kwargs = {"mem_bytes": 2 * GIB, "timeout": 300}
    if snap:
        kwargs["snapshot_name"] = snap
    parent = client.create_sandbox(**kwargs)
    made = [parent.name]
    try:
        parent.run(f"setsid -f sh -c '{COUNTER}' >/dev/null 2>&1 </dev/null")
        before = exec_ms(parent)
        # One child: the pause, and the time until it answers an exec.
        t = time.monotonic()
        out = raw("POST", f"/boxes/{parent.name}/fork", {"count": 1})
        child = client.get_sandbox(out["sandboxes"][0]["name"])
        made.append(child.name)
        assert child.run("true").exit_code == 0
        first = time.monotonic() - t
        print(
            f"fork of 1: parent paused {out['parent_pause_ms']} ms; the child answered an exec "
            f"{first * 1000:.0f} ms after the request",
            flush=True,
        )
        exec_ms(parent, 3)
        after = exec_ms(parent)
        print(f"parent exec p50: {before:.1f} ms before, {after:.1f} ms after", flush=True)
        # Ten at once.
        t = time.monotonic()
        out = raw("POST", f"/boxes/{parent.name}/fork", {"count": 10})
        kids = [client.get_sandbox(k["name"]) for k in out["sandboxes"]]
        made.extend(k.name for k in kids)
        for k in kids:
            assert k.run("true").exit_code == 0
        ten = time.monotonic() - t
        ready = sum(1 for k in out["sandboxes"] if k["status"] == "ready")
        print(
            f"fork of 10: parent paused {out['parent_pause_ms']} ms; all 10 answered an exec "
            f"{ten:.1f} s after the request ({ready} ready)",
            flush=True,
        )
        time.sleep(5)
        kids_pss, n1 = pss_kib([k.id for k in kids])
        cold = client.create_sandbox(**kwargs)
        made.append(cold.name)
        time.sleep(5)
        cold_pss, n2 = pss_kib([cold.id])
        if n1 and n2:
            print(
                f"PSS per VM, idle: forked child {kids_pss / n1 / 1024:.0f} MiB (n={n1}), "
                f"a plain create's {cold_pss / n2 / 1024:.0f} MiB (n={n2})",
                flush=True,
            )
    finally:
        for name in made:
            try:
                client.delete_sandbox(name)
            except Exception as e:  # report and go on
                print(f"cleanup {name}: {e}", file=sys.stderr)


if __name__ == "__main__":
    main()
