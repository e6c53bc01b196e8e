"""Create -> first exec, end to end through the unmodified langsmith SDK.

Run against a live `hearth up` (LANGSMITH_ENDPOINT / LANGSMITH_API_KEY set):
    python tests/sdk/bench_create.py [runs] [snapshot ...]
Prints the median, min and max of create_sandbox() + run("true"), and of
the create alone, per snapshot; deletes what it creates.
"""

import statistics
import sys
import time

from langsmith.sandbox import SandboxClient


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    snapshots = sys.argv[2:] or ["default", "busybox"]
    client = SandboxClient()
    for snap in snapshots:
        total, create = [], []
        for _ in range(runs):
            t0 = time.monotonic()
            sb = client.create_sandbox(snapshot_name=snap, mem_bytes=2 * 1024**3, timeout=180)
            t1 = time.monotonic()
            result = sb.run("true")
            t2 = time.monotonic()
            assert result.exit_code == 0, result
            create.append(t1 - t0)
            total.append(t2 - t0)
            client.delete_sandbox(sb.name)
        print(
            f"create -> first exec via SDK [{snap}]: median {statistics.median(total):.2f} s "
            f"(min {min(total):.2f}, max {max(total):.2f}; create alone median "
            f"{statistics.median(create):.2f} s; n={runs})"
        )


if __name__ == "__main__":
    main()
