"""Feed hearth-api's fixtures to the langsmith SDK's own parsers.

Usage (needs the `langsmith` package, 0.15.1 or later):
    HEARTH_SDK_FIXTURES=/tmp/f.json cargo test -p hearth-api --test wire -- --ignored
    python3 crates/hearth-api/tests/sdk_check.py /tmp/f.json

Prints one line per check and exits non-zero on the first mismatch.
"""

import json
import sys

from langsmith._httpx import httpx
from langsmith.sandbox import _helpers as h
from langsmith.sandbox._models import ResourceStatus, Snapshot, SnapshotTag
from langsmith.sandbox._sandbox import Sandbox

# What each error should become: (call, status) -> (exception class, attrs).
EXPECTED = [
    ("create", "ValidationError", {"field": "mem_bytes"}),
    ("create", "ValidationError", {"field": "vcpus"}),
    ("update", "ValidationError", {"field": "idle_ttl_seconds"}),
    ("create", "QuotaExceededError", {"quota_type": "sandbox_count"}),
    ("create", "QuotaExceededError", {"quota_type": "cpu"}),
    ("create", "QuotaExceededError", {"quota_type": "memory"}),
    ("create", "QuotaExceededError", {"quota_type": "storage"}),
    ("create", "ResourceCreationError", {"error_type": "NoSandboxHostsAvailable"}),
    ("create", "ResourceCreationError", {"error_type": "ImagePull"}),
    ("create", "ResourceTimeoutError", {}),
    ("create", "SandboxAuthenticationError", {}),
    ("update", "SandboxClientError", {}),  # the client turns any 409 into ResourceNameConflictError itself
    ("update", "SandboxNotReadyError", {}),
    ("get", "ResourceNotFoundError", {}),
    ("get", "SandboxAuthenticationError", {}),
    ("get", "SandboxAPIError", {}),
    ("dataplane", "ResourceNotFoundError", {"resource_type": "file"}),
    ("dataplane", "SandboxNotReadyError", {}),
    ("dataplane", "SandboxNotReadyError", {}),
    ("dataplane", "SandboxOperationError", {"error_type": "PermissionDenied"}),
    ("dataplane", "SandboxOperationError", {"operation": "write"}),
    ("dataplane", "SandboxOperationError", {"operation": "read"}),
    ("dataplane", "SandboxOperationError", {"operation": "command"}),
    ("dataplane", "SandboxConnectionError", {}),
]


def raised(call, status, body):
    req = httpx.Request("POST", "http://hearth.test/x")
    resp = httpx.Response(status, json=body, request=req)
    err = httpx.HTTPStatusError("error", request=req, response=resp)
    try:
        if call == "create":
            h.handle_sandbox_creation_error(err)
        elif call == "update":
            h.raise_if_not_ready(err, "b")
            h.handle_client_http_error(err)
        elif call == "dataplane":
            h.handle_sandbox_http_error(err)
        else:
            h.handle_client_http_error(err)
    except Exception as e:  # noqa: BLE001 - we inspect whatever the SDK raised
        return e
    raise AssertionError(f"nothing raised for {call} {status}")


def main(path):
    f = json.load(open(path))
    sb = Sandbox.from_dict(f["sandbox"], client=None, auto_delete=False)
    assert sb.name == "box" and sb.status == "ready" and sb.dataplane_url, sb
    assert sb.vcpus == 1 and sb.mem_bytes == 2 * 1024**3 and sb.idle_ttl_seconds == 0, sb
    assert sb.run_config.user == "app" and sb.run_config.env_vars == {"A": "1"}, sb.run_config
    assert sb.access_delegation == {"mode": "EXPLICIT", "permissions": ["sandboxes:read"]}
    assert sb.labels == {"team": "infra"} and sb.preserve_memory_on_stop is False
    print("ok Sandbox.from_dict")
    listed = [Sandbox.from_dict(c, client=None) for c in f["list"].get("sandboxes", [])]
    assert [s.name for s in listed] == ["box"], listed
    print("ok list_sandboxes reads 'sandboxes'")
    st = ResourceStatus.from_dict(f["status"])
    assert st.status == "ready", st
    print("ok ResourceStatus.from_dict")
    snap = Snapshot.from_dict(f["snapshot"])
    assert snap.status == "ready" and snap.tags == ["latest"] and snap.run_config.user == "0", snap
    assert snap.fs_capacity_bytes == 4 * 1024**3
    print("ok Snapshot.from_dict")
    snaps = [Snapshot.from_dict(s) for s in f["snapshot_list"].get("snapshots", [])]
    assert [s.name for s in snaps] == ["python"], snaps
    print("ok list_snapshots reads 'snapshots'")
    tags = [SnapshotTag.from_dict(t) for t in f["by_name"].get("tags") or []]
    assert tags[0].tag == "latest" and tags[0].snapshot_id == snap.id, tags
    print("ok list_snapshot_tags")

    assert len(f["errors"]) == len(EXPECTED), (len(f["errors"]), len(EXPECTED))
    for fx, (call, cls, attrs) in zip(f["errors"], EXPECTED):
        assert fx["call"] == call, (fx["call"], call)
        e = raised(call, fx["status"], fx["body"])
        got = type(e).__name__
        assert got == cls, f"{call} {fx['status']} {fx['body']}: got {got}({e}), want {cls}"
        for k, v in attrs.items():
            assert getattr(e, k) == v, f"{call} {fx['status']}: {k}={getattr(e, k)!r}, want {v!r}"
        print(f"ok {call} {fx['status']} -> {got} {attrs or ''} | {e}")


if __name__ == "__main__":
    main(sys.argv[1])
