"""What a volume adds to a create, end to end through the unmodified e2b SDK.

Run against a live `hearth up` (E2B_API_KEY, E2B_API_URL, E2B_SANDBOX_URL
set, as `hearth up` prints them):
    python tests/e2b/bench_volumes.py [runs] [template]
Alternates creates without and with one volume (read-write, 4 GiB; its
filesystem made at the first attach, which is timed apart), each through
the first command's answer; prints the median, min and max of both and
their ratio; deletes what it creates.
"""

import statistics
import sys
import time

from e2b import Sandbox, Volume


def timed(**kw):
    t0 = time.monotonic()
    sb = Sandbox.create(TEMPLATE, timeout=300, **kw)
    r = sb.commands.run("true")
    t1 = time.monotonic()
    assert r.exit_code == 0, r
    sb.kill()
    return t1 - t0


def show(label, xs):
    print(f"{label}: median {statistics.median(xs):.3f}s min {min(xs):.3f}s max {max(xs):.3f}s "
          f"({len(xs)} runs)", flush=True)


RUNS = int(sys.argv[1]) if len(sys.argv) > 1 else 5
TEMPLATE = sys.argv[2] if len(sys.argv) > 2 else "busybox"

vol = Volume.create(f"bench-vol-{int(time.time())}")
try:
    first = timed(volume_mounts={"/mnt/v": vol})
    print(f"first attach (the filesystem made): {first:.3f}s", flush=True)
    without, with_volume = [], []
    for _ in range(RUNS):
        without.append(timed())
        with_volume.append(timed(volume_mounts={"/mnt/v": vol}))
    show(f"{TEMPLATE} without a volume", without)
    show(f"{TEMPLATE} with a volume", with_volume)
    print(f"ratio with/without (medians): "
          f"{statistics.median(with_volume) / statistics.median(without):.2f}", flush=True)
finally:
    Volume.destroy(vol.volume_id)
