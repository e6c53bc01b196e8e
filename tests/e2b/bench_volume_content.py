"""E2B's volume content API through the unmodified e2b SDK: the first call
on a volume no sandbox holds (a service sandbox boots to hold it), then
small reads through that service sandbox and through a sandbox that
mounts the volume, against `files.read` of the same file in that sandbox
(the baseline: the same guest, through envd), in one run.

Run against a live `hearth up` (E2B_API_KEY, E2B_API_URL, E2B_SANDBOX_URL,
E2B_VOLUME_API_URL set, as `hearth up` prints them):
    python tests/e2b/bench_volume_content.py [runs]
Default: 30 reads each. Deletes what it creates.
"""

import statistics
import sys
import time

from e2b import Sandbox, Volume

RUNS = int(sys.argv[1]) if len(sys.argv) > 1 else 30


def p50(f):
    xs = []
    for _ in range(RUNS):
        t = time.monotonic()
        f()
        xs.append(time.monotonic() - t)
    return statistics.median(xs)


vol = Volume.create(f"bench-content-{int(time.time())}")
try:
    t = time.monotonic()
    vol.write_file("/f.txt", "x" * 1024)
    print(f"first call (a service sandbox boots to hold the volume): "
          f"{time.monotonic() - t:.2f} s", flush=True)
    service = p50(lambda: vol.read_file("/f.txt"))
    sb = Sandbox.create("busybox", timeout=300, volume_mounts={"/mnt/v": vol})
    try:
        holder = p50(lambda: vol.read_file("/f.txt"))
        envd = p50(lambda: sb.files.read("/mnt/v/f.txt"))
    finally:
        sb.kill()
    print(f"read_file, 1 KiB, p50: through the service sandbox {service * 1000:.1f} ms, "
          f"through the mounting sandbox {holder * 1000:.1f} ms; "
          f"files.read in that sandbox {envd * 1000:.1f} ms", flush=True)
    print(f"content API / files.read (through the holder, p50): {holder / envd:.2f}", flush=True)
finally:
    Volume.destroy(vol.volume_id)
