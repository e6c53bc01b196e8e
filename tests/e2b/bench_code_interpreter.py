"""e2b-code-interpreter on Hearth's code-interpreter-v1 template: time to a
ready sandbox, the first run (its kernel's start), then `run_code("1 + 1")`
round trips against `commands.run("true")` on the same sandbox (the
baseline: the same door without the kernel), in one run.

Run against a live `hearth up` with E2B_API_KEY and E2B_API_URL /
E2B_SANDBOX_URL (or E2B_DOMAIN and SSL_CERT_FILE) set:
    python tests/e2b/bench_code_interpreter.py [runs]
Default: 30 round trips each. Kills what it creates.
"""

import statistics
import sys
import time

from e2b_code_interpreter import Sandbox


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(p / 100 * len(xs) + 0.5) - 1))]


def main():
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 30
    t = time.monotonic()
    sb = Sandbox.create(timeout=300)
    print(f"create to ready: {time.monotonic() - t:.1f} s", flush=True)
    try:
        t = time.monotonic()
        sb.run_code("1 + 1")
        print(f"first run_code (the kernel starts): {time.monotonic() - t:.1f} s", flush=True)
        rows = {}
        for what, f in (
            ("commands.run('true')", lambda: sb.commands.run("true")),
            ("run_code('1 + 1')", lambda: sb.run_code("1 + 1")),
        ):
            xs = []
            for _ in range(runs):
                t = time.monotonic()
                f()
                xs.append(time.monotonic() - t)
            rows[what] = (statistics.median(xs) * 1000, pct(xs, 99) * 1000)
            print(f"{what:22}: p50 {rows[what][0]:.1f} ms, p99 {rows[what][1]:.1f} ms (n={runs})",
                  flush=True)
        base, code = rows["commands.run('true')"][0], rows["run_code('1 + 1')"][0]
        print(f"run_code / commands.run p50: {code / base:.2f}", flush=True)
    finally:
        sb.kill()


if __name__ == "__main__":
    main()
