"""A template's create (a memory resume, its start command running)
against a cold boot of the image it was built from, in the same run;
and the build itself, first and again unchanged (from the layer cache).

Run as root (it reads the VMMs' /proc/<pid>/smaps_rollup) against a live
`hearth up` (the E2B_* and LANGSMITH_* lines it printed exported):
    python tests/e2b/bench_template.py [runs] [image]
Default: 5 creates of each, the `default` (Debian) image. Prints the build
times, create -> first exec (p50, p90) of the template, of the image (a
copy of its host's template of a fresh boot) and of a cold boot of the
same disk (a workspace's snapshot of it), their ratios, and the PSS of
idle sandboxes of each; kills what it creates.
"""

import os
import statistics
import sys
import time

from e2b import Sandbox, Template, wait_for_port
from langsmith.sandbox import SandboxClient

client = SandboxClient()


def create_to_exec(template):
    t = time.monotonic()
    sb = Sandbox.create(template, timeout=300)
    r = sb.commands.run("true")
    took = time.monotonic() - t
    assert r.exit_code == 0, r
    return sb, took


def pss_kib(names):
    """PSS of the VMMs of these sandboxes (QEMU's command line names the
    VM by its id without dashes)."""
    want = {str(client.get_sandbox(n).id).replace("-", "") for n in names}
    total, found = 0, 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
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


def summary(what, xs):
    xs = sorted(xs)
    p90 = xs[min(len(xs) - 1, int(len(xs) * 0.9))]
    print(f"{what}: p50 {statistics.median(xs):.2f} s, p90 {p90:.2f} s ({len(xs)} runs)", flush=True)
    return statistics.median(xs)


def main():
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    image = sys.argv[2] if len(sys.argv) > 2 else "default"
    name = f"bench-template-{image}"
    # A new object each time: the SDK's skip_cache marks the one it builds.
    recipe = lambda: (Template()
                      .from_template(image)
                      .run_cmd("echo bench > /tmp/bench.txt")
                      .set_start_cmd("python3 -m http.server 8000", wait_for_port(8000)))
    started = time.monotonic()
    Template.build(recipe(), name, skip_cache=True)
    first = time.monotonic() - started
    started = time.monotonic()
    Template.build(recipe(), name)
    again = time.monotonic() - started
    print(f"build of {name}: first {first:.1f} s, unchanged again {again:.2f} s "
          f"(ratio {again / first:.3f})", flush=True)
    # The first create after a build may wait for the template's memory to
    # be made ready on its host (the build does it in the background).
    sb, took = create_to_exec(name)
    print(f"first create -> first exec after the build: {took:.2f} s", flush=True)
    sb.kill()
    # A create of the built-in image is itself a copy of its host's
    # template of a fresh boot; a cold boot of the same disk is a create of
    # a workspace's own snapshot of it, which no create shares.
    base, _ = create_to_exec(image)
    disk = f"{name}-disk"
    client.capture_snapshot(base.sandbox_id, disk, timeout=600)
    base.kill()
    templ, built_in, cold = [], [], []
    for _ in range(runs):
        for series, of in [(templ, name), (built_in, image), (cold, disk)]:
            sb, took = create_to_exec(of)
            series.append(took)
            sb.kill()
    a = summary(f"template create -> first exec [{name}]", templ)
    i = summary(f"image    create -> first exec [{image}]", built_in)
    b = summary(f"cold     create -> first exec [{disk}]", cold)
    print(f"ratio template / cold (p50): {a / b:.3f}", flush=True)
    print(f"ratio image / cold (p50): {i / b:.3f}", flush=True)
    # Memory: three idle sandboxes of each.
    for what, tpl in [("template", name), ("image", image), ("cold", disk)]:
        sbs = [Sandbox.create(tpl, timeout=300) for _ in range(3)]
        for s in sbs:
            s.commands.run("true")
        time.sleep(5)
        kib, n = pss_kib([s.sandbox_id for s in sbs])
        print(f"PSS per idle sandbox, {what}: {kib / max(n, 1) / 1024:.0f} MiB ({n} VMMs)", flush=True)
        for s in sbs:
            s.kill()
    client.delete_snapshot(client.get_snapshot(disk).id)


if __name__ == "__main__":
    main()
