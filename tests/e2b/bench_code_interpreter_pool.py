"""e2b-code-interpreter's create to its first result, claimed from the
warm pool `hearth up` keeps (`code-interpreter`: one code interpreter
paused and ready, its kernel running) against a create no member serves
(the pool set to 0, then back): a copy of its host's template of that
shape, the pool's, once it holds one, else a cold boot.

Run against a live `hearth up` (the E2B_* and LANGSMITH_* lines it
printed exported):
    python tests/e2b/bench_code_interpreter_pool.py [runs] [pool]
Default: 3 claimed creates, the pool `code-interpreter`. Kills what it
creates; leaves the pool at the size it found.
"""

import json
import os
import statistics
import sys
import time
import urllib.request

from e2b_code_interpreter import Sandbox


def api(method, path, body=None):
    req = urllib.request.Request(
        f"{os.environ['LANGSMITH_ENDPOINT']}/api/v2/sandboxes/pools/{path}",
        method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"X-Api-Key": os.environ["LANGSMITH_API_KEY"],
                 "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read() or b"null")


def wait_ready(pool, want, limit=600):
    t = time.monotonic()
    while time.monotonic() - t < limit:
        s = api("GET", pool)["status"]
        if (s["ready"] >= want) if want else (s["ready"] + s["warming"] == 0):
            return
        time.sleep(1)
    raise SystemExit(f"pool {pool} did not reach {want} ready in {limit} s")


def first_result():
    """Seconds from create to the first run_code's result, and whether
    the pool served it."""
    t = time.monotonic()
    sb = Sandbox.create(timeout=300)
    try:
        sb.run_code("x = 41")
        text = sb.run_code("x + 1").text
        took = time.monotonic() - t
        assert text == "42", text
        return took
    finally:
        sb.kill()


def main():
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    pool = sys.argv[2] if len(sys.argv) > 2 else "code-interpreter"
    size = api("GET", pool)["size"]
    wait_ready(pool, 1)
    claimed = []
    for _ in range(runs):
        before = api("GET", pool)["status"]["claims"]
        claimed.append(first_result())
        assert api("GET", pool)["status"]["claims"] == before + 1, "not served by the pool"
        wait_ready(pool, 1)
    api("PATCH", pool, {"size": 0})
    try:
        wait_ready(pool, 0)
        cold = first_result()
    finally:
        api("PATCH", pool, {"size": size})
    p50 = statistics.median(claimed)
    print(f"create to first result, claimed from the pool: p50 {p50:.2f} s "
          f"(each: {', '.join(f'{x:.2f}' for x in claimed)})")
    print(f"create to first result, no member (a copy of its host's template of the shape, else a cold boot): {cold:.2f} s")
    print(f"claimed / no member: {p50 / cold:.3f}")


if __name__ == "__main__":
    main()
