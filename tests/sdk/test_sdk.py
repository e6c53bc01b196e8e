#!/usr/bin/env python3
"""End-to-end compatibility suite: the unmodified `langsmith` SDK
(`langsmith.sandbox.SandboxClient`, pinned in requirements.txt) against a
live `hearth up`.

Driven by `crates/hearth-cli/tests/cli/vm/sdk.rs`, which starts the server, makes a
second workspace and key, and runs this script. To run it by hand against a
server you started yourself:

    eval "$(hearth up)"        # sets LANGSMITH_ENDPOINT and LANGSMITH_API_KEY
    HEARTH_SDK_OTHER_KEY=$(hearth keys create --workspace \
        "$(hearth keys create-workspace --name other)") \
        python3 tests/sdk/test_sdk.py [test_name ...]

Environment:
    LANGSMITH_ENDPOINT, LANGSMITH_API_KEY  the server and a key with `*`
    HEARTH_SDK_OTHER_KEY      a key of another workspace (else that test skips)
    HEARTH_SDK_OCI_IMAGE      an image reference in a local registry for the
                              OCI snapshot test (else it skips loudly, or fails
                              when HEARTH_REQUIRE_OCI is set)
    HEARTH_SDK_CHECKPOINT     a path: after the burst, the ready sandboxes are
                              written to <path>.json and the burst test waits
                              for <path>.done before deleting them (the Rust
                              driver checks the server from outside meanwhile)

No test framework: each test is a function; the runner at the bottom runs
them in order, prints PASS/FAIL per test, and exits non-zero on a failure.
Tests share one default-image sandbox (created by the first test).
"""

import hashlib
import json
import os
import random
import socket
import sys
import threading
import time
import traceback
import urllib.error
import urllib.request

from langsmith.sandbox import (
    QuotaExceededError,
    ResourceCreationError,
    ResourceNotFoundError,
    SandboxAuthenticationError,
    SandboxClient,
    SandboxClientError,
    SandboxOperationError,
    ValidationError,
)

GIB = 1024**3
MIB = 1024**2
# CI machines are slow (2 cores, guests under emulation): generous waits.
CREATE_TIMEOUT = 180
BURST_SIZE = 30
BURST_CREATE_TIMEOUT = 300

client = SandboxClient()
# Shared between tests: "sb" (default image), "small" (busybox).
state = {}
# Every sandbox this script created and has not deleted, by name.
created = set()


class Skip(Exception):
    """The test cannot run in this environment."""


def log(msg):
    print(f"    {msg}", flush=True)


def check(cond, msg):
    if not cond:
        raise AssertionError(msg)


def expect_error(exc_type, fn, *args, **kwargs):
    """Calls fn and returns the exception, which must be an exc_type."""
    try:
        fn(*args, **kwargs)
    except exc_type as e:
        return e
    except Exception as e:
        raise AssertionError(
            f"expected {exc_type.__name__}, got {type(e).__name__}: {e}"
        ) from e
    raise AssertionError(f"expected {exc_type.__name__}, but the call succeeded")


def within(seconds, what, fn):
    """Runs fn in a thread; fails if it has not returned after `seconds`.
    Returns (result, exception)."""
    out = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as e:  # reported to the caller
            out["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    if t.is_alive():
        raise AssertionError(f"{what} did not finish within {seconds}s")
    return out.get("value"), out.get("error")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def create(**kwargs):
    sb = client.create_sandbox(**kwargs)
    created.add(sb.name)
    return sb


def delete(name):
    client.delete_sandbox(name)
    created.discard(name)


def main_sandbox():
    sb = state.get("sb")
    if sb is None:
        raise AssertionError("no sandbox: test_create_default_sandbox did not pass")
    return sb


def small_sandbox():
    """A busybox sandbox for the error tests (created on first use)."""
    if "small" not in state:
        state["small"] = create(snapshot_name="busybox", timeout=CREATE_TIMEOUT)
    return state["small"]


def wait_for_port(sb, port, seconds=60):
    """Waits until something listens on 127.0.0.1:port inside the sandbox."""
    probe = (
        "python3 -c \"import socket; "
        f"socket.create_connection(('127.0.0.1', {port}), 1).close()\""
    )
    deadline = time.monotonic() + seconds
    while True:
        if sb.run(probe).exit_code == 0:
            return
        check(time.monotonic() < deadline, f"nothing listens on port {port} in the sandbox")
        time.sleep(0.5)


# --------------------------------------------------------------------------
# 1-8: one default-image sandbox through its life


def test_create_default_sandbox():
    t = time.monotonic()
    sb = create(timeout=CREATE_TIMEOUT)
    state["sb"] = sb
    log(f"created {sb.name} in {time.monotonic() - t:.1f}s: {sb.dataplane_url}")
    check(sb.status == "ready", f"status {sb.status!r}, expected 'ready'")
    url = sb.dataplane_url or ""
    check(url.startswith(("http://", "https://")), f"dataplane_url {url!r}")
    check(not url.endswith("/") and "?" not in url, f"dataplane_url {url!r}")
    got = client.get_sandbox(sb.name)
    check(got.status == "ready", f"get_sandbox: status {got.status!r}")
    check(got.dataplane_url == url, f"get_sandbox: dataplane_url {got.dataplane_url!r}")
    check(
        client.get_sandbox_status(sb.name).status == "ready",
        "get_sandbox_status is not ready",
    )
    names = [s.name for s in client.list_sandboxes()]
    check(sb.name in names, f"{sb.name} not in list_sandboxes(): {names}")
    # The default image is the Debian one (python3 is used below).
    r = sb.run("cat /etc/debian_version")
    check(r.exit_code == 0 and r.stdout.strip(), f"not a Debian image: {r}")


def test_run_returns_stdout_and_exit_code():
    sb = main_sandbox()
    r = sb.run("python3 -c 'print(2+2)'")
    check(r.stdout == "4\n", f"stdout {r.stdout!r}, expected '4\\n'")
    check(r.stderr == "", f"stderr {r.stderr!r}")
    check(r.exit_code == 0, f"exit code {r.exit_code}")
    r = sb.run("echo to-stderr >&2; exit 3")
    check(r.exit_code == 3, f"exit code {r.exit_code}, expected 3")
    check(r.stderr == "to-stderr\n" and r.stdout == "", f"{r}")


def test_streaming_callbacks_arrive_in_order_with_stderr_separate():
    sb = main_sandbox()
    out, err, times = [], [], []

    def on_out(s):
        out.append(s)
        times.append(time.monotonic())

    r = sb.run(
        "for i in 1 2 3 4 5; do echo line$i; sleep 0.3; done; echo oops >&2",
        on_stdout=on_out,
        on_stderr=err.append,
    )
    expected = "".join(f"line{i}\n" for i in range(1, 6))
    check("".join(out) == expected, f"stdout chunks {out!r}")
    check(len(out) >= 3, f"expected several chunks, got {out!r}")
    # Streamed while running, not delivered at the end in one burst.
    check(times[-1] - times[0] >= 0.6, f"chunks arrived within {times[-1] - times[0]:.2f}s")
    check("".join(err) == "oops\n", f"stderr chunks {err!r}")
    check(r.stdout == expected and r.stderr == "oops\n", f"{r}")
    check(r.exit_code == 0, f"exit code {r.exit_code}")


def test_command_handle_streams_offsets_and_kill_ends_command():
    sb = main_sandbox()
    h = sb.run(
        "for i in 1 2 3; do echo out$i; sleep 0.2; done; echo e1 >&2; echo tail",
        wait=False,
    )
    check(h.command_id, "no command_id")
    chunks, error = within(60, "iterating the CommandHandle", lambda: list(h))
    if error:
        raise error
    pos = {"stdout": 0, "stderr": 0}
    for c in chunks:
        check(c.stream in pos, f"unknown stream {c.stream!r}")
        check(
            c.offset == pos[c.stream],
            f"{c.stream} chunk {c.data!r} at offset {c.offset}, expected {pos[c.stream]}",
        )
        pos[c.stream] += len(c.data.encode())
    stdout = "".join(c.data for c in chunks if c.stream == "stdout")
    stderr = "".join(c.data for c in chunks if c.stream == "stderr")
    check(stdout == "out1\nout2\nout3\ntail\n", f"stdout {stdout!r}")
    check(stderr == "e1\n", f"stderr {stderr!r}")
    check(len(chunks) >= 3, f"expected several chunks, got {chunks}")
    check(h.result.exit_code == 0, f"exit code {h.result.exit_code}")

    # A second command is killed: the handle ends and so does the process
    # group in the sandbox (bash and its `sleep`).
    k = sb.run(
        "sleep 60 & echo $$ $! > /tmp/hearth-kill.pids; echo started; wait",
        wait=False,
    )
    first, error = within(30, "the first chunk", lambda: next(iter(k)))
    if error:
        raise error
    check(first.data == "started\n", f"first chunk {first}")
    pids = sb.read("/tmp/hearth-kill.pids").decode().split()
    t = time.monotonic()
    k.kill()
    # After kill() the SDK closes the socket: iteration ends, by an exit
    # frame or an error, but promptly.
    _, error = within(15, "the killed handle", lambda: list(k))
    log(f"killed handle ended after {time.monotonic() - t:.2f}s ({type(error).__name__ if error else 'exit'})")
    alive = "for p in " + " ".join(pids) + "; do " \
        "if [ -e /proc/$p ] && ! grep -q '^State:.*Z' /proc/$p/status; then echo $p; fi; done"
    while True:
        left = sb.run(alive).stdout.split()
        if not left:
            break
        check(time.monotonic() - t < 10, f"processes {left} still alive 10s after kill()")
        time.sleep(0.2)
    log(f"processes {pids} gone {time.monotonic() - t:.2f}s after kill()")
    # The server recorded the end: a reattach replays and reports the exit.
    res, error = within(30, "reconnect to the killed command", lambda: sb.reconnect(k.command_id).result)
    if error:
        raise error
    check(res.exit_code != 0, f"killed command exited {res.exit_code}")
    check(res.stdout == "started\n", f"replayed stdout {res.stdout!r}")


def test_sse_transport_runs_streams_and_resumes():
    """The SDK's opt-in SSE exec transport (LANGSMITH_EXPERIMENTAL_FEATURES)."""
    sb = main_sandbox()
    old = os.environ.get("LANGSMITH_EXPERIMENTAL_FEATURES")
    os.environ["LANGSMITH_EXPERIMENTAL_FEATURES"] = "sandbox_sse_exec"
    try:
        r = sb.run("python3 -c 'print(2+2)'")
        check((r.stdout, r.exit_code) == ("4\n", 0), f"sse run {r!r}")
        out, err = [], []
        r = sb.run(
            "for i in 1 2 3; do echo o$i; echo e$i >&2; sleep 0.1; done; printf 'h\\xc3'; printf '\\xa9\\n'; exit 3",
            on_stdout=out.append,
            on_stderr=err.append,
        )
        check(r.exit_code == 3, f"sse exit code {r.exit_code}")
        check("".join(out) == "o1\no2\no3\nh\u00e9\n", f"sse stdout {''.join(out)!r}")
        check("".join(err) == "e1\ne2\ne3\n", f"sse stderr {''.join(err)!r}")
        check(r.stdout == "".join(out) and r.stderr == "".join(err), "callbacks and result differ")
        # wait=False, then a resume from offset zero replays everything.
        h = sb.run("echo first; sleep 0.5; echo second", wait=False)
        check(h.command_id, "no command_id over sse")
        res, error = within(60, "the sse handle", lambda: h.result)
        if error:
            raise error
        check(res.stdout == "first\nsecond\n", f"sse handle stdout {res.stdout!r}")
        again, error = within(30, "an sse resume", lambda: sb.reconnect(h.command_id).result)
        if error:
            raise error
        check(again.stdout == "first\nsecond\n" and again.exit_code == 0, f"sse resume {again!r}")
        e = expect_error(SandboxOperationError, lambda: sb.reconnect("no-such-command").result)
        log(f"resume of an unknown command: {type(e).__name__}: {e}")
    finally:
        if old is None:
            os.environ.pop("LANGSMITH_EXPERIMENTAL_FEATURES", None)
        else:
            os.environ["LANGSMITH_EXPERIMENTAL_FEATURES"] = old


def test_write_read_10mib_binary_byte_exact():
    sb = main_sandbox()
    data = random.randbytes(10 * MIB)
    digest = hashlib.sha256(data).hexdigest()
    t = time.monotonic()
    sb.write("/home/user/random.bin", data)
    back = sb.read("/home/user/random.bin")
    log(f"10 MiB up and down in {time.monotonic() - t:.1f}s")
    check(len(back) == len(data), f"read {len(back)} bytes, wrote {len(data)}")
    check(back == data, "read bytes differ from the written ones")
    r = sb.run("sha256sum /home/user/random.bin")
    check(r.stdout.split()[:1] == [digest], f"in-sandbox sha256 {r.stdout!r}, expected {digest}")
    state["random_sha256"] = digest


def test_stat_ranges_search_and_download_links():
    sb = main_sandbox()
    # stat (HEAD) and ranged reads with validators.
    sb.write("/home/user/proj/digits.txt", b"0123456789")
    st = sb.stat("/home/user/proj/digits.txt")
    check(st.size_bytes == 10, f"stat size {st.size_bytes}")
    check(st.etag and st.last_modified, f"stat validators {st!r}")
    chunk = sb.read_range("/home/user/proj/digits.txt", start=2, end=4, if_range=st.etag)
    check(
        (chunk.content, chunk.partial, chunk.start, chunk.total_bytes) == (b"234", True, 2, 10),
        f"range chunk {chunk!r}",
    )
    tail = sb.read_range("/home/user/proj/digits.txt", suffix_bytes=3)
    check((tail.content, tail.start) == (b"789", 7), f"suffix chunk {tail!r}")
    same = sb.read_range("/home/user/proj/digits.txt", start=0, if_none_match=st.etag)
    check(same.unchanged and same.content == b"", f"unchanged chunk {same!r}")
    sb.write("/home/user/proj/digits.txt", b"abcdefghijkl")
    restarted = sb.read_range("/home/user/proj/digits.txt", start=2, if_range=st.etag)
    check(
        not restarted.partial and restarted.content == b"abcdefghijkl",
        f"a rewrite must restart the read: {restarted!r}",
    )
    expect_error(SandboxOperationError, sb.read_range, "/home/user/proj/digits.txt", start=100)
    expect_error(ResourceNotFoundError, sb.stat, "/home/user/proj/missing")

    # ls / glob / grep.
    sb.write("/home/user/proj/src/app.py", b"import os\nprint('hello needle')\n")
    sb.write("/home/user/proj/src/lib/util.py", b"def f():\n    return 'needle'\n")
    sb.write("/home/user/proj/README.md", b"no match\n")
    names = sorted(f.path for f in sb.ls("/home/user/proj"))
    check(
        names
        == ["/home/user/proj/README.md", "/home/user/proj/digits.txt", "/home/user/proj/src"],
        f"ls {names}",
    )
    dirs = [f.path for f in sb.ls("/home/user/proj") if f.is_dir]
    check(dirs == ["/home/user/proj/src"], f"ls dirs {dirs}")
    py = sb.glob("**/*.py", "/home/user/proj")
    check(
        [f.path for f in py]
        == ["/home/user/proj/src/app.py", "/home/user/proj/src/lib/util.py"]
        and not py.truncated,
        f"glob {py!r}",
    )
    hits = sb.grep("needle", "/home/user/proj", glob="*.py")
    got = [(m.path, m.line, m.text) for m in hits]
    check(
        got
        == [
            ("/home/user/proj/src/app.py", 2, "print('hello needle')"),
            ("/home/user/proj/src/lib/util.py", 2, "    return 'needle'"),
        ],
        f"grep {got}",
    )
    one = sb.grep("needle", "/home/user/proj", limit=1)
    check(len(one) == 1 and one.truncated, f"grep limit {one!r}")
    expect_error(ResourceNotFoundError, sb.glob, "*", "/home/user/nowhere")

    # A download link: fetched with no credential, headers as minted.
    link = sb.generate_download_url(
        "/home/user/proj/src/app.py", content_type="text/plain", content_disposition="attachment"
    )
    check(link.token and link.token in link.download_url and link.expires_at, f"{link!r}")  # every Hearth link expires
    with urllib.request.urlopen(link.download_url, timeout=60) as r:
        body = r.read()
        check(body == b"import os\nprint('hello needle')\n", f"link body {body!r}")
        check(r.headers["Content-Type"] == "text/plain", f"link type {r.headers['Content-Type']}")
        check(
            r.headers["Content-Disposition"] == 'attachment; filename="app.py"',
            f"link disposition {r.headers['Content-Disposition']}",
        )
    timed = sb.generate_download_url("/home/user/proj/src/app.py", expires_in_seconds=600)
    check(timed.expires_at, f"expiring link without expires_at: {timed!r}")


def test_stop_start_keeps_filesystem():
    sb = main_sandbox()
    content = b"kept across stop and start\n"
    sb.write("/home/user/keep.txt", content)
    t = time.monotonic()
    client.stop_sandbox(sb.name)
    log(f"stop returned after {time.monotonic() - t:.1f}s")
    got = client.get_sandbox(sb.name)
    check(got.status == "stopped", f"status after stop {got.status!r}")
    check(
        client.get_sandbox_status(sb.name).status == "stopped",
        "get_sandbox_status is not stopped",
    )
    t = time.monotonic()
    sb2 = client.start_sandbox(sb.name, timeout=CREATE_TIMEOUT)
    log(f"start took {time.monotonic() - t:.1f}s")
    check(sb2.status == "ready", f"status after start {sb2.status!r}")
    check(sb2.dataplane_url == sb.dataplane_url, "dataplane_url changed across stop/start")
    state["sb"] = sb2
    check(sb2.read("/home/user/keep.txt") == content, "keep.txt changed across stop/start")
    if "random_sha256" in state:
        r = sb2.run("sha256sum /home/user/random.bin")
        check(
            r.stdout.split()[:1] == [state["random_sha256"]],
            f"random.bin after restart: {r.stdout!r} {r.stderr!r}",
        )


def test_tunnel_and_service_url_reach_servers_in_sandbox():
    sb = main_sandbox()
    sb.run("mkdir -p /home/user/www")
    sb.write("/home/user/www/hello.txt", b"hello through the tunnel\n")
    # Bigger than the yamux window (256 KiB) both ways.
    big = random.randbytes(2 * MIB)
    sb.write("/home/user/www/big.bin", big)
    sb.write(
        "/home/user/echo.py",
        b"import socket\n"
        b"s = socket.socket()\n"
        b"s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
        b"s.bind(('127.0.0.1', 9000))\n"
        b"s.listen()\n"
        b"while True:\n"
        b"    c, _ = s.accept()\n"
        b"    while True:\n"
        b"        d = c.recv(65536)\n"
        b"        if not d:\n"
        b"            break\n"
        b"        c.sendall(d)\n"
        b"    c.close()\n",
    )
    http = sb.run(
        "cd /home/user/www && exec python3 -m http.server 8000 --bind 127.0.0.1",
        wait=False,
    )
    echo = sb.run("exec python3 /home/user/echo.py", wait=False)
    try:
        wait_for_port(sb, 8000)
        wait_for_port(sb, 9000)
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with sb.tunnel(8000, local_port=free_port()) as t:
            base = f"http://127.0.0.1:{t.local_port}"
            body = opener.open(f"{base}/hello.txt", timeout=60).read()
            check(body == b"hello through the tunnel\n", f"GET hello.txt: {body!r}")
            t0 = time.monotonic()
            body = opener.open(f"{base}/big.bin", timeout=120).read()
            log(f"2 MiB through the tunnel in {time.monotonic() - t0:.1f}s")
            check(body == big, f"big.bin through the tunnel: {len(body)} bytes, differs")
        payload = random.randbytes(512 * 1024)
        with sb.tunnel(9000, local_port=free_port()) as t:
            with socket.create_connection(("127.0.0.1", t.local_port), timeout=60) as s:
                sender = threading.Thread(target=s.sendall, args=(payload,), daemon=True)
                sender.start()
                got = bytearray()
                while len(got) < len(payload):
                    d = s.recv(65536)
                    if not d:
                        break
                    got += d
                sender.join(10)
            check(bytes(got) == payload, f"echo through the tunnel: {len(got)} of {len(payload)} bytes")
        # The same HTTP server through a service URL (token mode).
        svc = sb.service(port=8000)
        check(svc.browser_url.startswith("http"), f"browser_url {svc.browser_url!r}")
        r = svc.get("/hello.txt", timeout=60)
        check(
            (r.status_code, r.content) == (200, b"hello through the tunnel\n"),
            f"service GET hello.txt: {r.status_code} {r.content[:200]!r}",
        )
        t0 = time.monotonic()
        r = svc.get("/big.bin", timeout=120)
        log(f"2 MiB through the service URL in {time.monotonic() - t0:.1f}s")
        check(r.content == big, f"big.bin through the service URL: {len(r.content)} bytes, differs")
        check(svc.get("/nope", timeout=60).status_code == 404, "the server's 404 passes through")
        check_service_upgrade(sb)
    finally:
        http.kill()
        echo.kill()


UPGRADE_SERVER = b"""
import socket, threading
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(('127.0.0.1', 9100))
s.listen()
def serve(c):
    req = b''
    while b'\\r\\n\\r\\n' not in req:
        d = c.recv(4096)
        if not d:
            return c.close()
        req += d
    head, rest = req.split(b'\\r\\n\\r\\n', 1)
    if b'upgrade: echo' in head.lower():
        c.sendall(b'HTTP/1.1 101 Switching Protocols\\r\\nUpgrade: echo\\r\\nConnection: Upgrade\\r\\n\\r\\n' + rest)
        while True:
            d = c.recv(65536)
            if not d:
                break
            c.sendall(d)
    else:
        c.sendall(b'HTTP/1.1 426 Upgrade Required\\r\\nContent-Length: 0\\r\\n\\r\\n')
    c.close()
while True:
    c, _ = s.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"""


def check_service_upgrade(sb):
    """A protocol switch (101) through a service URL, spliced both ways."""
    from urllib.parse import urlparse

    sb.write("/home/user/upgrade.py", UPGRADE_SERVER)
    server = sb.run("exec python3 /home/user/upgrade.py", wait=False)
    try:
        wait_for_port(sb, 9100)
        svc = sb.service(port=9100)
        api = urlparse(os.environ["LANGSMITH_ENDPOINT"])
        # The port's own origin (issue 39), reached at the API's address
        # as its wildcard name resolves; the token in the SDK's header.
        service = urlparse(svc.service_url)
        check(service.hostname.startswith("9100-"), f"service URL {svc.service_url}")
        with socket.create_connection((api.hostname, api.port or 80), timeout=60) as c:
            c.sendall(
                f"GET /chat HTTP/1.1\r\nHost: {service.netloc}\r\n"
                f"X-Langsmith-Sandbox-Service-Token: {svc.token}\r\n"
                "Connection: Upgrade\r\nUpgrade: echo\r\n\r\n".encode()
            )
            head = b""
            while b"\r\n\r\n" not in head:
                d = c.recv(4096)
                check(d, f"connection closed during the upgrade: {head!r}")
                head += d
            check(head.startswith(b"HTTP/1.1 101"), f"upgrade answer {head[:200]!r}")
            payload = random.randbytes(300 * 1024)
            c.sendall(payload)
            got = head.split(b"\r\n\r\n", 1)[1]
            while len(got) < len(payload):
                d = c.recv(65536)
                if not d:
                    break
                got += d
            check(got == payload, f"echo after the upgrade: {len(got)} of {len(payload)} bytes")
        log("a 101 upgrade through the service URL echoed 300 KiB")
    finally:
        server.kill()


def test_delete_then_get_is_not_found():
    sb = main_sandbox()
    delete(sb.name)
    state.pop("sb", None)
    e = expect_error(ResourceNotFoundError, client.get_sandbox, sb.name)
    log(f"get after delete: {e}")
    names = [s.name for s in client.list_sandboxes()]
    check(sb.name not in names, f"{sb.name} still listed: {names}")
    expect_error(ResourceNotFoundError, client.delete_sandbox, sb.name)


# --------------------------------------------------------------------------
# 9: errors, as the SDK's own exception types


def test_error_missing_file_is_resource_not_found():
    sb = small_sandbox()
    e = expect_error(ResourceNotFoundError, sb.read, "/no/such/file")
    log(f"{type(e).__name__}: {e}")


def test_error_bad_sizing_is_validation_error():
    before = {s.name for s in client.list_sandboxes()}
    e = expect_error(
        ValidationError,
        client.create_sandbox,
        snapshot_name="busybox",
        vcpus=1,
        mem_bytes=20 * GIB,
        timeout=CREATE_TIMEOUT,
    )
    log(f"{type(e).__name__} (field {getattr(e, 'field', None)!r}): {e}")
    after = {s.name for s in client.list_sandboxes()}
    check(after <= before, f"a refused create left sandboxes behind: {after - before}")


def test_error_wrong_api_key_is_authentication_error():
    bad = SandboxClient(api_key="hth_" + "0" * 40)
    e = expect_error(SandboxAuthenticationError, bad.list_sandboxes)
    log(f"{type(e).__name__}: {e}")
    expect_error(SandboxAuthenticationError, bad.get_sandbox, small_sandbox().name)
    expect_error(
        SandboxAuthenticationError,
        bad.create_sandbox,
        snapshot_name="busybox",
        timeout=CREATE_TIMEOUT,
    )


def test_error_other_workspace_sandbox_is_not_found():
    key = os.environ.get("HEARTH_SDK_OTHER_KEY")
    if not key:
        raise Skip("HEARTH_SDK_OTHER_KEY (a key of another workspace) is not set")
    sb = small_sandbox()
    other = SandboxClient(api_key=key)
    e = expect_error(ResourceNotFoundError, other.get_sandbox, sb.name)
    log(f"{type(e).__name__}: {e}")
    names = [s.name for s in other.list_sandboxes()]
    check(sb.name not in names, f"another workspace lists {sb.name}: {names}")
    expect_error(ResourceNotFoundError, other.delete_sandbox, sb.name)
    expect_error(ResourceNotFoundError, other.stop_sandbox, sb.name)
    # Untouched for its owner.
    check(client.get_sandbox(sb.name).status == "ready", "owner's sandbox changed")


# --------------------------------------------------------------------------
# 10: snapshots (captured disks, memory, OCI images) and preserved memory

# Snapshot builds and memory captures run under emulation here: generous.
SNAPSHOT_TIMEOUT = 600


def unique(prefix):
    return f"{prefix}-{os.getpid()}-{random.randrange(1 << 32):08x}"


def raw(method, path, body=None):
    """One request to the control plane's API (the SDK's base URL), outside
    the SDK: for what the SDK cannot send (`include_memory`) or does not
    keep (`memory_snapshot_size_bytes`). Returns (status, JSON body)."""
    url = client._base_url + path
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("X-Api-Key", os.environ["LANGSMITH_API_KEY"])
    if data is not None:
        req.add_header("Content-Type", "application/json")
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(req, timeout=120) as r:
            text = r.read()
            return r.status, json.loads(text) if text else None
    except urllib.error.HTTPError as e:
        text = e.read()
        try:
            return e.code, json.loads(text)
        except ValueError:
            return e.code, text.decode(errors="replace")


def http_status(e):
    """The HTTP status behind an SDK exception, when it kept the response."""
    cause = e.__cause__
    response = getattr(cause, "response", None)
    return getattr(response, "status_code", None)


def start_detached(sb, script, pidfile):
    """Starts `sh -c script` in its own session (it outlives the exec that
    started it) and returns its PID, which the script writes to pidfile."""
    r = sb.run(
        f"setsid -f sh -c 'echo $$ > {pidfile}; {script}' >/dev/null 2>&1 </dev/null",
        timeout=60,
    )
    check(r.exit_code == 0, f"start detached: {r}")
    deadline = time.monotonic() + 30
    while True:
        r = sb.run(f"cat {pidfile} 2>/dev/null")
        if r.stdout.strip().isdigit():
            return int(r.stdout.strip())
        check(time.monotonic() < deadline, f"no {pidfile} after 30s")
        time.sleep(0.2)


def process_alive(sb, pid):
    """Whether pid runs in the sandbox (not a zombie); returns its cmdline."""
    r = sb.run(
        f"[ -e /proc/{pid} ] && ! grep -q '^State:.*Z' /proc/{pid}/status "
        f"&& tr '\\0' ' ' < /proc/{pid}/cmdline"
    )
    return r.stdout if r.exit_code == 0 else None


def test_snapshot_capture_boots_a_copy_and_delete_is_refused_while_in_use():
    src = create(snapshot_name="busybox", timeout=CREATE_TIMEOUT)
    token = unique("captured")
    r = src.run(f"mkdir -p /root && echo {token} > /root/f && sync")
    check(r.exit_code == 0, f"write /root/f: {r}")
    name = unique("sdk-capture")
    t = time.monotonic()
    snap = client.capture_snapshot(src.name, name, tag="t1", timeout=SNAPSHOT_TIMEOUT)
    log(f"captured {snap.id} ({name}:t1) in {time.monotonic() - t:.1f}s")
    check(snap.status == "ready", f"snapshot status {snap.status!r}")
    check(snap.name == name, f"snapshot name {snap.name!r}")
    check(snap.source_sandbox_id == src.id, f"source_sandbox_id {snap.source_sandbox_id!r}, expected {src.id}")
    check("t1" in (snap.tags or []), f"tags {snap.tags!r}")

    by_id = client.get_snapshot(snap.id)
    by_ref = client.get_snapshot(f"{name}:t1")
    check(by_id.id == snap.id and by_ref.id == snap.id, f"get by id {by_id.id}, by name:tag {by_ref.id}")
    listed = [s.id for s in client.list_snapshots(name_contains=name)]
    check(listed == [snap.id], f"list_snapshots(name_contains={name!r}): {listed}")
    listed = [s.id for s in client.list_snapshots(limit=500)]
    check(snap.id in listed, f"{snap.id} not in list_snapshots(): {listed}")

    t = time.monotonic()
    copy = create(snapshot_id=snap.id, timeout=CREATE_TIMEOUT)
    log(f"booted {copy.name} from the snapshot in {time.monotonic() - t:.1f}s")
    got = copy.run("cat /root/f")
    check(got.stdout.strip() == token, f"/root/f in the copy: {got!r}, expected {token!r}")
    # The copy is its own disk: writing it does not change the source.
    copy.run("echo changed > /root/f")
    check(src.run("cat /root/f").stdout.strip() == token, "the copy's write reached the source")

    e = expect_error(SandboxClientError, client.delete_snapshot, snap.id)
    check(not isinstance(e, ResourceNotFoundError), f"delete while in use: {type(e).__name__}: {e}")
    check(http_status(e) in (None, 409), f"delete while in use: HTTP {http_status(e)}, expected 409")
    log(f"delete while {copy.name} uses it: {type(e).__name__} ({http_status(e)}): {e}")
    check(client.get_snapshot(snap.id).status == "ready", "the refused delete changed the snapshot")

    delete(copy.name)
    client.delete_snapshot(snap.id)
    expect_error(ResourceNotFoundError, client.get_snapshot, snap.id)
    expect_error(ResourceNotFoundError, client.get_snapshot, f"{name}:t1")
    listed = [s.id for s in client.list_snapshots(name_contains=name)]
    check(not listed, f"still listed after delete: {listed}")
    # The source sandbox is untouched by all of it.
    check(src.run("cat /root/f").stdout.strip() == token, "the source lost /root/f")

    # Capturing again under the same name:tag moves the tag: the newer
    # snapshot answers to it, the older one stays, by id only, untagged.
    older = client.capture_snapshot(src.name, name, tag="t2", timeout=SNAPSHOT_TIMEOUT)
    newer = client.capture_snapshot(src.name, name, tag="t2", timeout=SNAPSHOT_TIMEOUT)
    check(newer.id != older.id, "a second capture made no new snapshot")
    check(client.get_snapshot(f"{name}:t2").id == newer.id, "the tag did not move to the newer snapshot")
    dangling = client.get_snapshot(older.id)
    check(dangling.status == "ready" and not dangling.tags, f"the older snapshot: tags {dangling.tags!r}")
    log(f"re-capture under {name}:t2 moved the tag from {older.id} to {newer.id}")
    for s in (older, newer):
        client.delete_snapshot(s.id)
    delete(src.name)


COUNTER = "i=0; while true; do i=$((i+1)); echo $i > /tmp/count.new; mv /tmp/count.new /tmp/count; sleep 0.2; done"


def read_count(sb):
    r = sb.run("cat /tmp/count 2>/dev/null")
    return int(r.stdout) if r.stdout.strip().isdigit() else None


def wait_count_above(sb, floor, seconds=60):
    deadline = time.monotonic() + seconds
    while True:
        n = read_count(sb)
        if n is not None and n > floor:
            return n
        check(time.monotonic() < deadline, f"/tmp/count stayed at {n} (wanted > {floor}) for {seconds}s")
        time.sleep(0.5)


def test_preserve_memory_on_stop_resumes_processes_on_start():
    sb = create(timeout=CREATE_TIMEOUT, mem_bytes=2 * GIB, preserve_memory_on_stop=True)
    pid = start_detached(sb, COUNTER, "/tmp/counter.pid")
    wait_count_above(sb, 3)
    check(process_alive(sb, pid), f"counter {pid} not running")
    before = read_count(sb)
    t = time.monotonic()
    client.stop_sandbox(sb.name)
    deadline = time.monotonic() + CREATE_TIMEOUT
    while (status := client.get_sandbox(sb.name).status) != "stopped":
        check(time.monotonic() < deadline, f"status {status!r} {CREATE_TIMEOUT}s after stop")
        time.sleep(0.5)
    log(f"stopped (memory saved) in {time.monotonic() - t:.1f}s with /tmp/count at {before}")
    t = time.monotonic()
    sb = client.start_sandbox(sb.name, timeout=CREATE_TIMEOUT)
    log(f"started in {time.monotonic() - t:.1f}s")
    # /tmp is a tmpfs: a cold boot would have neither file.
    pidfile = sb.run("cat /tmp/counter.pid 2>/dev/null").stdout.strip()
    check(pidfile == str(pid), f"/tmp/counter.pid after start: {pidfile!r}, expected {pid} (memory lost?)")
    cmdline = process_alive(sb, pid)
    check(cmdline and "sh" in cmdline, f"counter {pid} not running after start: {cmdline!r}")
    after = read_count(sb)
    check(after is not None and after >= before, f"/tmp/count {after} after start, was {before}")
    later = wait_count_above(sb, max(after, before) + 2)
    log(f"/tmp/count {before} before stop, {after} after start, then {later}: pid {pid} kept running")
    # A sandbox resumed from its memory forks like any other (issue 39:
    # the device set of a restore is the saved VM's, never assumed).
    t = time.monotonic()
    status, out = raw("POST", f"/boxes/{sb.name}/fork", {"count": 2})
    check(status == 201, f"fork of a resumed sandbox: {status} {out}")
    kids = [client.get_sandbox(k["name"]) for k in out["sandboxes"]]
    for k in kids:
        created.add(k.name)
    log(f"forked the resumed sandbox into 2 children in {time.monotonic() - t:.1f}s")
    for k in kids:
        check(k.status == "ready", f"child {k.name} is {k.status}")
        check(process_alive(k, pid), f"the counter {pid} does not run in {k.name}")
    for k in kids:
        delete(k.name)
    delete(sb.name)


def test_snapshot_with_memory_resumes_a_server_and_restore_memory_false_does_not():
    src = create(timeout=CREATE_TIMEOUT, mem_bytes=2 * GIB)
    token = unique("served-from-memory")
    # Served from /tmp (tmpfs): only memory carries it into the copy.
    check(src.run(f"mkdir -p /tmp/www && echo {token} > /tmp/www/index.txt").exit_code == 0, "write index")
    pid = start_detached(
        src, "cd /tmp/www && exec python3 -m http.server 8000 --bind 127.0.0.1", "/tmp/http.pid"
    )
    wait_for_port(src, 8000)
    name = unique("sdk-memory")
    t = time.monotonic()
    status, body = raw("POST", f"/boxes/{src.name}/snapshot", {"name": name, "include_memory": True})
    check(status == 202, f"POST /boxes/{src.name}/snapshot: {status} {body}")
    snap_id = body["id"]
    check(body.get("status") in ("building", "ready"), f"capture answer {body}")
    snap = client.wait_for_snapshot(snap_id, timeout=SNAPSHOT_TIMEOUT)
    log(f"captured {snap_id} with memory in {time.monotonic() - t:.1f}s")
    status, got = raw("GET", f"/snapshots/{snap_id}")
    check(status == 200, f"GET /snapshots/{snap_id}: {status} {got}")
    mem = got.get("memory_snapshot_size_bytes")
    check(isinstance(mem, int) and mem > 0, f"memory_snapshot_size_bytes {mem!r}: {got}")
    log(f"memory_snapshot_size_bytes {mem}, fs_used_bytes {got.get('fs_used_bytes')}")
    # The source keeps serving after the capture.
    check(src.run("curl -s http://127.0.0.1:8000/index.txt").stdout.strip() == token, "source stopped serving")

    t = time.monotonic()
    warm = create(snapshot_id=snap_id, timeout=CREATE_TIMEOUT, mem_bytes=2 * GIB)
    log(f"resumed {warm.name} from the memory snapshot in {time.monotonic() - t:.1f}s")
    r = warm.run("curl -s --max-time 30 http://127.0.0.1:8000/index.txt")
    check(r.stdout.strip() == token, f"curl in the resumed sandbox: {r!r}, expected {token!r}")
    cmdline = process_alive(warm, pid)
    check(cmdline and "http.server" in cmdline, f"server pid {pid} in the resumed sandbox: {cmdline!r}")
    check(warm.run("cat /tmp/http.pid").stdout.strip() == str(pid), "pid file differs")

    t = time.monotonic()
    cold = create(snapshot_id=snap_id, restore_memory=False, timeout=CREATE_TIMEOUT, mem_bytes=2 * GIB)
    log(f"cold-booted {cold.name} from the same snapshot in {time.monotonic() - t:.1f}s")
    probe = "python3 -c \"import socket; socket.create_connection(('127.0.0.1', 8000), 1).close()\""
    r = cold.run(probe)
    check(r.exit_code != 0, f"something listens on 8000 in the restore_memory=False sandbox: {r!r}")
    r = cold.run("ls /tmp/www 2>&1; cat /tmp/http.pid 2>&1")
    check(token not in r.stdout and str(pid) not in r.stdout.split(), f"tmpfs state in a cold boot: {r.stdout!r}")

    for sb in (warm, cold, src):
        delete(sb.name)
    client.delete_snapshot(snap_id)
    expect_error(ResourceNotFoundError, client.get_snapshot, snap_id)


def oci_env(name, what):
    """The variable `name` that sdk.rs sets when the OCI tools are here;
    without it the test skips loudly, or fails under HEARTH_REQUIRE_OCI."""
    value = os.environ.get(name)
    if not value:
        msg = f"{name} ({what}) is not set"
        if os.environ.get("HEARTH_REQUIRE_OCI"):
            raise AssertionError(f"HEARTH_REQUIRE_OCI is set but {msg}")
        log(f"!!!!!!!! SKIPPED: {msg} !!!!!!!!")
        raise Skip(msg)
    return value


def test_snapshot_from_oci_image_runs_its_entrypoint_with_its_env():
    ref = oci_env("HEARTH_SDK_OCI_IMAGE", "an image in a local registry, pushed by sdk.rs")
    name = unique("sdk-oci")
    t = time.monotonic()
    snap = client.create_snapshot(name, docker_image=ref, fs_capacity_bytes=256 * MIB, timeout=SNAPSHOT_TIMEOUT)
    log(f"built {snap.id} from {ref} in {time.monotonic() - t:.1f}s")
    check(snap.status == "ready", f"status {snap.status!r}")
    check(snap.docker_image == ref, f"docker_image {snap.docker_image!r}")
    check((snap.image_digest or "").startswith("sha256:"), f"image_digest {snap.image_digest!r}")
    check(snap.fs_capacity_bytes == 256 * MIB, f"fs_capacity_bytes {snap.fs_capacity_bytes}")
    sb = create(snapshot_id=snap.id, timeout=CREATE_TIMEOUT, mem_bytes=2 * GIB)
    # The image has no bash: the SDK's default shell must be overridden.
    r = sb.run("/hello", shell="/bin/sh")
    check(r.exit_code == 0 and "hi-from-oci" in r.stdout, f"/hello: {r!r}")
    r = sb.run("pwd; echo $GREETING", shell="/bin/sh")
    check(r.stdout.split() == ["/work", "hi-from-oci"], f"working dir and env: {r.stdout!r}")
    delete(sb.name)
    client.delete_snapshot(snap.id)
    expect_error(ResourceNotFoundError, client.get_snapshot, snap.id)


DOCKERFILE = """\
# A multi-stage build: a build arg, a stage copied from, a target that
# leaves the last stage out.
ARG BASE={base}
FROM $BASE AS build
ARG GREETING=hi
RUN echo "$GREETING" > /greet && mkdir /out && cp /greet /out/g
FROM $BASE AS final
ENV APP=demo
WORKDIR /app
COPY --from=build /out/g /app/g
COPY f.txt /app/
USER nobody
CMD ["sh", "-c", "cat /app/g"]
FROM $BASE AS other
RUN echo other > /other
"""


def test_snapshot_from_dockerfile_builds_stages_with_args_and_a_target():
    """client.create_snapshot_from_dockerfile, unmodified: the SDK's builder
    sandbox runs its buildkitd/buildctl/docker script (the default image's
    buildah behind BuildKit's command line), then captures with
    docker_image. The base comes from a TLS registry the sandbox reaches
    through its egress proxy (sdk.rs starts it). A failing RUN and an
    unknown instruction fail the build, each named in the build's log."""
    import tempfile

    base = oci_env("HEARTH_SDK_GUEST_IMAGE", "an image in a registry sandboxes reach, from sdk.rs")
    ctx = tempfile.mkdtemp(prefix="hearth-dockerfile-")
    with open(os.path.join(ctx, "Dockerfile"), "w") as f:
        f.write(DOCKERFILE.format(base=base))
    with open(os.path.join(ctx, "f.txt"), "w") as f:
        f.write("from the context\n")
    name = unique("sdk-dockerfile")
    logs = []
    t = time.monotonic()
    snap = client.create_snapshot_from_dockerfile(
        name, os.path.join(ctx, "Dockerfile"), context=ctx,
        build_args={"GREETING": "built-with-arg"}, target="final",
        on_build_log=logs.append, timeout=SNAPSHOT_TIMEOUT)
    log(f"built {snap.id} from a Dockerfile in {time.monotonic() - t:.1f}s")
    text = "".join(logs)
    check(snap.status == "ready", f"status {snap.status!r}")
    check("COPY --from=build /out/g /app/g" in text, f"the build's log: {text[-2000:]!r}")
    check("Loaded image:" in text, f"docker load: {text[-500:]!r}")
    rc = snap.run_config
    check(rc is not None and rc.user == "nobody" and rc.work_dir == "/app"
          and (rc.env_vars or {}).get("APP") == "demo", f"run config {rc!r}")
    # The builder sandbox is gone.
    left = [s.name for s in client.list_sandboxes() if s.name.startswith("snapshot-builder-")]
    check(not left, f"builders left: {left}")

    sb = create(snapshot_id=snap.id, timeout=CREATE_TIMEOUT, mem_bytes=2 * GIB)
    # A busybox base: no bash.
    r = sb.run("id -un; pwd; echo $APP; cat /app/g /app/f.txt; test -e /other || echo no-other",
               shell="/bin/sh")
    check(r.exit_code == 0 and r.stdout.split("\n")[:6] ==
          ["nobody", "/app", "demo", "built-with-arg", "from the context", "no-other"],
          f"the sandbox: {r!r}")
    delete(sb.name)
    client.delete_snapshot(snap.id)

    # A failing RUN, then an instruction that is none: each fails the
    # build, the log naming it.
    for body, named in [
        (f"FROM {base}\nRUN echo before\nRUN echo failing-step && false\n",
         'RUN echo failing-step && false'),
        (f"FROM {base}\nFROBNICATE everything\n", "FROBNICATE"),
    ]:
        with open(os.path.join(ctx, "Dockerfile.bad"), "w") as f:
            f.write(body)
        logs = []
        try:
            client.create_snapshot_from_dockerfile(
                unique("sdk-dockerfile-bad"), os.path.join(ctx, "Dockerfile.bad"), context=ctx,
                on_build_log=logs.append, timeout=SNAPSHOT_TIMEOUT)
            raise AssertionError(f"the build of {body!r} did not fail")
        except ResourceCreationError as e:
            text = "".join(logs)
            check(named in text and "Error" in text, f"{named!r} not named: {e}; {text[-1500:]!r}")
    left = [s.name for s in client.list_sandboxes() if s.name.startswith("snapshot-builder-")]
    check(not left, f"builders left after failures: {left}")


def test_private_registry_pulls_with_its_credentials_over_tls():
    """client.registries and create_snapshot(registry_id=...): a registry
    that wants a password, over TLS with a test CA's certificate (sdk.rs
    makes both and has the server trust the CA)."""
    url = os.environ.get("HEARTH_SDK_PRIVATE_REGISTRY")
    ref = os.environ.get("HEARTH_SDK_PRIVATE_IMAGE")
    if not url or not ref:
        msg = "HEARTH_SDK_PRIVATE_REGISTRY/_IMAGE (a registry with a password, from sdk.rs) are not set"
        if os.environ.get("HEARTH_REQUIRE_OCI"):
            raise AssertionError(f"HEARTH_REQUIRE_OCI is set but {msg}")
        log(f"!!!!!!!! SKIPPED: {msg} !!!!!!!!")
        raise Skip(msg)
    user = os.environ["HEARTH_SDK_PRIVATE_USER"]
    password = os.environ["HEARTH_SDK_PRIVATE_PASSWORD"]
    registries = client.registries
    name = unique("sdk-registry")

    # Without the registry the pull fails, saying why (a registry on
    # loopback is spoken to over plain HTTP unless its registry says
    # https://), never a ready snapshot.
    e = expect_error(
        ResourceCreationError, client.create_snapshot, unique("sdk-anon"), docker_image=ref,
        fs_capacity_bytes=256 * MIB, timeout=SNAPSHOT_TIMEOUT,
    )
    check("HTTPS" in str(e) or "not authorized" in str(e), f"a pull without the registry: {e}")

    reg = registries.create(name=name, url=url, username=user, password="wrong-" + password)
    check(reg.name == name and reg.url == url and reg.auth_type == "DOCKER_CONFIG", f"created {reg!r}")
    check(password not in repr(reg), "the password came back")
    e = expect_error(
        ResourceCreationError, client.create_snapshot, unique("sdk-wrong"), docker_image=ref,
        fs_capacity_bytes=256 * MIB, registry_id=reg.id, timeout=SNAPSHOT_TIMEOUT,
    )
    check("not authorized" in str(e), f"a pull with a wrong password: {e}")

    reg = registries.update(name, password=password)
    got = registries.retrieve(name)
    check(got.id == reg.id and password not in repr(got), f"retrieved {got!r}")
    listed = registries.list(name_contains=name)
    check([r.id for r in listed.items or []] == [reg.id], f"listed {listed!r}")

    t = time.monotonic()
    snap = client.create_snapshot(
        unique("sdk-private"), docker_image=ref, fs_capacity_bytes=256 * MIB,
        registry_id=reg.id, timeout=SNAPSHOT_TIMEOUT,
    )
    log(f"built {snap.id} from {ref} with registry {reg.id} in {time.monotonic() - t:.1f}s")
    check(snap.status == "ready", f"status {snap.status!r}")
    check(snap.registry_id == reg.id, f"registry_id {snap.registry_id!r}")
    check((snap.image_digest or "").startswith("sha256:"), f"image_digest {snap.image_digest!r}")
    sb = create(snapshot_id=snap.id, timeout=CREATE_TIMEOUT, mem_bytes=2 * GIB)
    r = sb.run("/hello", shell="/bin/sh")
    check(r.exit_code == 0 and "hi-from-oci" in r.stdout, f"/hello: {r!r}")
    delete(sb.name)
    client.delete_snapshot(snap.id)
    registries.delete(name)
    e = expect_error(Exception, registries.retrieve, name)
    check("NotFound" in type(e).__name__, f"retrieve after delete: {type(e).__name__}: {e}")


# --------------------------------------------------------------------------
# 11: a burst of creates


def metric(name):
    """A counter of the server's /metrics (0 when absent)."""
    url = os.environ["LANGSMITH_ENDPOINT"].rstrip("/") + "/metrics"
    req = urllib.request.Request(url)
    req.add_header("X-Api-Key", os.environ["LANGSMITH_API_KEY"])
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(req, timeout=60) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.split()[-1])
    return 0.0


def wait_pool(name, ready, seconds):
    """Waits until the pool has `ready` members ready and none warming;
    returns the seconds it took."""
    t = time.monotonic()
    while True:
        status, p = raw("GET", f"/pools/{name}")
        check(status == 200, f"GET pool: {status} {p}")
        if p["status"]["ready"] == ready and p["status"]["warming"] == 0:
            return time.monotonic() - t
        check(time.monotonic() - t < seconds, f"pool never had {ready} ready in {seconds}s: {p}")
        time.sleep(0.5)


IDENTITY = (
    'echo "$(cat /proc/sys/kernel/hostname)"; echo "$(cat /etc/machine-id 2>/dev/null)"; '
    'echo "$(cat /proc/sys/kernel/random/boot_id)"; '
    "head -c 64 /dev/urandom | od -An -tx1 | tr -d ' \\n'; echo; date +%s"
)


def check_clock(name, guest_s, before, after):
    """The guest read its clock (`date +%s`, whole seconds) during an exec
    that ran between the host's `before` and `after`: outside that window
    by more than a second, the guest's clock is wrong. (Measured from one
    end only, a slow exec under TCG reads as skew.)"""
    # `date +%s` truncates, so an exact clock reads at least before - 1.
    check(before - 2 <= guest_s <= after + 1,
          f"{name}'s clock read {guest_s}; the exec ran from {before:.1f} to {after:.1f} on the host")


def fork_ready(parent, count, what):
    """Forks `parent` into `count` children, each ready and running."""
    t = time.monotonic()
    status, out = raw("POST", f"/boxes/{parent.name}/fork", {"count": count})
    check(status == 201, f"fork of {what}: {status} {out}")
    kids = [client.get_sandbox(k["name"]) for k in out["sandboxes"]]
    for k in kids:
        created.add(k.name)
        check(k.status == "ready", f"{what}'s child {k.name} is {k.status}")
        check(k.run("echo forked").stdout == "forked\n", f"{what}'s child {k.name} runs")
    log(f"forked {what} into {count} in {time.monotonic() - t:.1f}s")
    return kids


def test_pool_hands_out_sandboxes_without_a_boot_each_a_machine_of_its_own():
    pool = unique("pool")
    status, p = raw(
        "POST", "/pools", {"name": pool, "snapshot": "busybox", "size": 3, "mem_bytes": 2 * GIB}
    )
    check(status == 201, f"create pool: {status} {p}")
    try:
        log(f"pool of 3 ready in {wait_pool(pool, 3, 300):.1f}s")
        # Its members are copies of one template, whose RAM they share.
        check(metric("hearth_pool_templates") >= 1, "no pool template on the host")
        check(metric("hearth_pool_template_memory_bytes") > 0, "the template holds no memory")
        claims0 = metric("hearth_pool_claims_total")
        # Four creates at once against 3 ready members: three claims, and a
        # miss, which is a create of a built-in image: a copy of its host's
        # template of that shape (the pool's), not a boot.
        results = [None] * 4

        def one(i):
            t = time.monotonic()
            sb = create(snapshot_name="busybox", mem_bytes=2 * GIB, timeout=CREATE_TIMEOUT)
            results[i] = (time.monotonic() - t, sb)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        check(all(results), f"a create failed: {results}")
        # A claim takes its member's id, minted (UUIDv7, in time order)
        # when the pool warmed; the miss's is minted at its create.
        results.sort(key=lambda r: r[1].id)
        took = [r[0] for r in results[:3]]
        boxes = [r[1] for r in results[:3]]
        miss_took, miss = results[3]
        for sb in boxes + [miss]:
            check("mem-path=/proc/self/fd/" in (vmm_cmdline(sb.id) or ""),
                  f"{sb.name} is no copy of the template")
        log(f"pooled creates {', '.join(f'{x:.2f}s' for x in took)}; the miss {miss_took:.2f}s")
        check(miss.run("echo miss").stdout == "miss\n", "the miss runs")
        status, p = raw("GET", f"/pools/{pool}")
        check(p["status"]["claims"] == 3, f"three claims: {p}")
        check(p["status"]["misses"] == 1, f"one miss: {p}")
        check(metric("hearth_pool_claims_total") - claims0 == 3, "the metric counts 3 claims")
        seen = []
        for sb in boxes + [miss]:
            before = time.time()
            out = sb.run(IDENTITY)
            lines = out.stdout.split("\n")
            check(out.exit_code == 0 and len(lines) >= 5, f"identity: {out.stdout!r} {out.stderr!r}")
            check_clock(sb.name, int(lines[4]), before, time.time())
            check(lines[0] == "sandbox-" + sb.id.replace("-", "")[-12:], f"host name {lines[0]}")
            check(sb.name == lines[0], f"default name {sb.name}, host name {lines[0]}")
            seen.append(lines[:4])
        for i, what in enumerate(["host name", "machine id", "boot id", "urandom"]):
            values = [s[i] for s in seen]
            check(len(set(values)) == 4, f"copies of one template share a {what}: {values}")
        # Issue 39, finding 7: a claimed sandbox forks like any other (its
        # memory is saved with the devices it runs with), and so does a
        # child of that fork.
        kids = fork_ready(boxes[0], 2, "a claimed sandbox")
        grandkids = fork_ready(kids[0], 2, "a fork's child")
        # Refilled to its size in the background.
        log(f"refilled to 3 in {wait_pool(pool, 3, 300):.1f}s")
        for sb in boxes + [miss] + kids + grandkids:
            delete(sb.name)
    finally:
        status, body = raw("DELETE", f"/pools/{pool}")
        check(status == 204, f"delete pool: {status} {body}")


def exec_latency(sb, n=5):
    """Median seconds of `true` through the SDK."""
    times = []
    for _ in range(n):
        t = time.monotonic()
        check(sb.run("true").exit_code == 0, "true failed")
        times.append(time.monotonic() - t)
    return sorted(times)[n // 2]


def vmm_cmdline(sandbox_id):
    """The command line of a sandbox's QEMU (hearth runs on this machine)."""
    names = {f"hearth-vm-{sandbox_id}", "hearth-vm-" + str(sandbox_id).replace("-", "")}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if " -name " in cmd and any(n in cmd for n in names):
            return cmd
    return None


def test_fork_children_resume_the_parents_processes_each_a_machine_of_its_own():
    parent = create(mem_bytes=2 * GIB, timeout=CREATE_TIMEOUT)
    pid = start_detached(parent, COUNTER, "/tmp/counter.pid")
    wait_count_above(parent, 3)
    token = unique("before-fork")
    check(parent.run(f"echo {token} > /root/before && sync").exit_code == 0, "write /root/before")
    before = exec_latency(parent)
    at_fork = read_count(parent)
    t = time.monotonic()
    status, out = raw("POST", f"/boxes/{parent.name}/fork", {"count": 2})
    check(status == 201, f"fork: {status} {out}")
    kids = [client.get_sandbox(k["name"]) for k in out["sandboxes"]]
    for k in kids:
        created.add(k.name)
    log(f"forked 2 children in {time.monotonic() - t:.1f}s; the parent paused {out['parent_pause_ms']} ms")
    # Both map one template of the parent's memory copy-on-write.
    for k in kids:
        cmd = vmm_cmdline(k.id)
        check(cmd is not None and "mem-path=/proc/self/fd/" in cmd and "share=off" in cmd,
              f"{k.name}'s memory is not a shared template's: {cmd}")
    for k in kids:
        check(k.status == "ready", f"child {k.name} is {k.status}")
        # The counting shell goes on from where the parent was.
        check(process_alive(k, pid), f"the counter {pid} does not run in {k.name}")
        n = read_count(k)
        check(n is not None and n >= at_fork, f"{k.name} counts from {n}, the parent was at {at_fork}")
        wait_count_above(k, n + 2)
        got = k.run("cat /root/before").stdout.strip()
        check(got == token, f"{k.name}: /root/before is {got!r}")
    # Writes after the fork are their writer's alone.
    check(parent.run("echo parent > /root/after").exit_code == 0, "parent write")
    check(kids[0].run("echo first > /root/after").exit_code == 0, "child write")
    seen = {sb.name: sb.run("cat /root/after 2>/dev/null || echo none").stdout.strip()
            for sb in [parent] + kids}
    check(seen == {parent.name: "parent", kids[0].name: "first", kids[1].name: "none"}, f"{seen}")
    # Each is a machine of its own.
    ids = []
    for sb in [parent] + kids:
        asked = time.time()
        lines = sb.run(IDENTITY).stdout.split("\n")
        check(len(lines) >= 5, f"identity of {sb.name}: {lines}")
        check_clock(sb.name, int(lines[4]), asked, time.time())
        ids.append(lines[:4])
    for i, what in enumerate(["host name", "machine id", "boot id", "urandom"]):
        values = [x[i] for x in ids]
        check(len(set(values)) == 3, f"parent and children share a {what}: {values}")
    # The parent runs on.
    wait_count_above(parent, at_fork + 2)
    exec_latency(parent)
    after = exec_latency(parent)
    # Reported, not asserted: a timing under a loaded CI host is no test
    # (0.666 s against 0.103 s was seen there); the fork benchmarks
    # measure the parent (docs/benchmarks.md).
    log(f"the parent's exec: {before * 1000:.0f} ms before the fork, {after * 1000:.0f} ms after")
    for sb in kids + [parent]:
        delete(sb.name)


def test_burst_of_creates_ends_ready_or_with_clear_errors():
    # Start from an empty workspace (as far as this script is concerned).
    for name in sorted(created):
        delete(name)
    state.clear()

    results = [None] * BURST_SIZE

    def one(i):
        t = time.monotonic()
        try:
            sb = client.create_sandbox(
                snapshot_name="busybox",
                mem_bytes=2 * GIB,
                timeout=BURST_CREATE_TIMEOUT,
            )
            created.add(sb.name)
            results[i] = ("ok", sb, time.monotonic() - t)
        except Exception as e:
            results[i] = ("error", e, time.monotonic() - t)

    t0 = time.monotonic()
    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(BURST_SIZE)]
    for t in threads:
        t.start()
    # The SDK's own bound: timeout + 30 s per attempt; allow a minute more.
    deadline = t0 + BURST_CREATE_TIMEOUT + 30 + 60
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    hung = [i for i, r in enumerate(results) if r is None]
    check(not hung, f"{len(hung)} create calls still running after {deadline - t0:.0f}s")
    log(f"burst of {BURST_SIZE} finished in {time.monotonic() - t0:.1f}s")

    # Every check below runs (and the driver's outside check too) even when
    # an earlier one failed; the problems are raised together at the end.
    problems = []

    def expect(cond, msg):
        if not cond:
            log(f"problem: {msg}")
            problems.append(msg)

    def outcome(r):
        kind, value, _ = r
        if kind == "ok":
            return "ok"
        if isinstance(value, QuotaExceededError):
            return "quota"  # 429
        if isinstance(value, ResourceCreationError) and getattr(value, "error_type", None) in (
            "NoSandboxHostsAvailable",
            "Unschedulable",
        ):
            return "no_host"  # 503
        return "other"

    ok = [r for r in results if outcome(r) == "ok"]
    quota = [r for r in results if outcome(r) == "quota"]
    no_host = [r for r in results if outcome(r) == "no_host"]
    other = [r for r in results if outcome(r) == "other"]
    log(
        f"ready {len(ok)} (slowest {max((r[2] for r in ok), default=0):.1f}s), "
        f"quota {len(quota)} {sorted({getattr(r[1], 'quota_type', None) or '?' for r in quota})}, "
        f"no host {len(no_host)}, other {len(other)}; errors took "
        f"{min((r[2] for r in results if r[0] == 'error'), default=0):.1f}-"
        f"{max((r[2] for r in results if r[0] == 'error'), default=0):.1f}s"
    )
    for _, e, dt in other:
        log(f"unexpected after {dt:.1f}s: {type(e).__name__}: {e}")
    expect(
        not other,
        f"{len(other)} creates failed with an error other than 429/503: "
        + "; ".join(f"{type(e).__name__}: {e}" for _, e, _ in other[:3]),
    )
    for _, sb, _ in ok:
        expect(sb.status == "ready" and sb.dataplane_url, f"{sb.name}: status {sb.status!r}")
    check(ok, "no create of the burst succeeded")
    # Default quota: 16 vCPU and 64 GiB per workspace; 1 vCPU and 2 GiB each.
    expect(len(ok) <= 16, f"{len(ok)} sandboxes of 1 vCPU exceed the 16 vCPU quota")
    if len(ok) != 16:
        log(f"note: {len(ok)} succeeded where the quota allows 16")

    listed = client.list_sandboxes()
    statuses = {s.name: s.status for s in listed}
    provisioning = [n for n, s in statuses.items() if s == "provisioning"]
    expect(not provisioning, f"still provisioning after the burst: {provisioning}")
    ok_names = {sb.name for _, sb, _ in ok}
    ready = {n for n, s in statuses.items() if s == "ready"}
    expect(ready == ok_names, f"ready sandboxes {sorted(ready)} != created {sorted(ok_names)}")
    not_ready = {n: s for n, s in statuses.items() if s != "ready"}
    expect(not not_ready, f"sandboxes left in other states: {not_ready}")
    for s in listed:
        if s.status == "ready":
            r = s.run("true", timeout=60)
            expect(r.exit_code == 0, f"{s.name}: run('true') exited {r.exit_code}")

    checkpoint = os.environ.get("HEARTH_SDK_CHECKPOINT")
    if checkpoint:
        tmp = checkpoint + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"ready": [{"name": s.name, "id": s.id} for s in listed]}, f)
        os.rename(tmp, checkpoint + ".json")
        log("waiting for the driver's outside check")
        wait_until = time.monotonic() + 300
        while not os.path.exists(checkpoint + ".done"):
            check(time.monotonic() < wait_until, "the driver did not answer the checkpoint")
            time.sleep(0.2)

    t = time.monotonic()
    for name in sorted(ok_names | created):
        delete(name)
    log(f"deleted {len(ok_names)} in {time.monotonic() - t:.1f}s")
    left = [s.name for s in client.list_sandboxes() if s.name in ok_names]
    expect(not left, f"still listed after delete: {left}")
    check(not problems, "; ".join(problems))


def test_volumes_have_one_writer_any_readers_and_outlive_their_sandboxes():
    """The SDK's API client (the one `client.registries` is part of:
    `sandboxes.volumes`, and `boxes.create(volumes=...)`): a volume made,
    written by its one writer and kept across that sandbox's stop and
    start; a second writer refused naming the first; after the writer's
    delete, a reader sees what it wrote and cannot change it; a held
    volume is not deleted; a clone holds the same files and changes apart;
    deleted once free."""
    client.registries  # makes the SDK's API client
    api = client._registries_client.sandboxes
    name = unique("sdk-vol")
    v = api.volumes.create(name=name, size_bytes=GIB, description="suite")
    check(v.name == name and v.size_bytes == GIB and v.status == "ready", f"made {v!r}")

    def box(box_name, mount, read_only=False, volume=name):
        api.boxes.create(
            name=box_name, snapshot="busybox",
            volumes=[{"volume": volume, "mount_path": mount, "read_only": read_only}],
            extra_body={"wait_for_ready": True, "timeout": CREATE_TIMEOUT},
            timeout=CREATE_TIMEOUT + 30,
        )
        created.add(box_name)
        return client.get_sandbox(box_name)

    writer = box(unique("sdk-vol-w"), "/mnt/data")
    r = writer.run("echo kept > /mnt/data/f && ls -A /mnt/data && df -k /mnt/data | tail -1")
    check(r.exit_code == 0 and r.stdout.split()[0] == "f", f"written: {r.stdout!r} {r.stderr!r}")
    client.stop_sandbox(writer.name)
    writer = client.start_sandbox(writer.name, timeout=CREATE_TIMEOUT)
    check(writer.read("/mnt/data/f") == b"kept\n", "kept across stop and start")
    got = api.volumes.retrieve(name)
    check([a.sandbox_name for a in got.attachments] == [writer.name], f"held by {got.attachments!r}")
    e = expect_error(Exception, box, unique("sdk-vol-2"), "/data")
    check("one writer at a time" in str(e) and writer.name in str(e), f"a second writer: {e}")
    e = expect_error(Exception, api.volumes.delete, name)
    check("attached to sandbox" in str(e), f"a held volume's delete: {e}")
    client.delete_sandbox(writer.name)
    created.discard(writer.name)

    reader = box(unique("sdk-vol-r"), "/data", read_only=True)
    check(reader.read("/data/f") == b"kept\n", "a reader sees what its writer wrote")
    r = reader.run("touch /data/g")
    check(r.exit_code != 0 and "Read-only" in r.stderr, f"a reader's write: {r.stderr!r}")
    client.delete_sandbox(reader.name)
    created.discard(reader.name)
    # A clone holds what the source held, and changes apart from it.
    copy = api.volumes.clone(name, name=unique("sdk-vol-c"), description="a copy")
    check(copy.size_bytes == GIB and copy.description == "a copy" and not copy.attachments,
          f"cloned {copy!r}")
    w = box(unique("sdk-vol-cw"), "/c", volume=copy.name)
    check(w.read("/c/f") == b"kept\n", "the clone holds the source's files")
    w.run("echo changed > /c/f")
    client.delete_sandbox(w.name)
    created.discard(w.name)
    r = box(unique("sdk-vol-r2"), "/data", read_only=True)
    check(r.read("/data/f") == b"kept\n", "the source is unchanged by its clone's writer")
    client.delete_sandbox(r.name)
    created.discard(r.name)
    api.volumes.delete(copy.name)
    api.volumes.delete(name)
    expect_error(Exception, api.volumes.retrieve, name)


def test_usage_and_batch_delete_through_the_api_client():
    """The SDK's API client: `retrieve_usage` counts what the workspace
    holds; `boxes.batch_delete` deletes what it can and says why it
    skipped the rest."""
    client.registries  # makes the SDK's API client
    api = client._registries_client.sandboxes
    names = [unique("sdk-batch") for _ in range(2)]
    for n in names:
        client.create_sandbox(snapshot_name="busybox", name=n, timeout=CREATE_TIMEOUT)
        created.add(n)
    u = api.retrieve_usage()
    check(u.sandboxes_used >= 2 and u.sandbox_running_count >= 2, f"usage: {u!r}")
    check(u.cpu_used_millicores > 0 and u.memory_used_bytes > 0, f"usage: {u!r}")
    ghost = unique("sdk-ghost")
    r = api.boxes.batch_delete(names=names + [ghost])
    check(sorted(r.deleted) == sorted(names), f"deleted {r.deleted}")
    check([x.name for x in r.skipped] == [ghost] and "not found" in r.skipped[0].reason,
          f"skipped {r.skipped}")
    for n in names:
        created.discard(n)
        expect_error(ResourceNotFoundError, client.get_sandbox, n)


TESTS = [
    test_create_default_sandbox,
    test_run_returns_stdout_and_exit_code,
    test_streaming_callbacks_arrive_in_order_with_stderr_separate,
    test_command_handle_streams_offsets_and_kill_ends_command,
    test_sse_transport_runs_streams_and_resumes,
    test_write_read_10mib_binary_byte_exact,
    test_stat_ranges_search_and_download_links,
    test_stop_start_keeps_filesystem,
    test_tunnel_and_service_url_reach_servers_in_sandbox,
    test_delete_then_get_is_not_found,
    test_error_missing_file_is_resource_not_found,
    test_error_bad_sizing_is_validation_error,
    test_error_wrong_api_key_is_authentication_error,
    test_error_other_workspace_sandbox_is_not_found,
    test_snapshot_capture_boots_a_copy_and_delete_is_refused_while_in_use,
    test_preserve_memory_on_stop_resumes_processes_on_start,
    test_pool_hands_out_sandboxes_without_a_boot_each_a_machine_of_its_own,
    test_snapshot_with_memory_resumes_a_server_and_restore_memory_false_does_not,
    test_snapshot_from_oci_image_runs_its_entrypoint_with_its_env,
    test_private_registry_pulls_with_its_credentials_over_tls,
    test_snapshot_from_dockerfile_builds_stages_with_args_and_a_target,
    test_volumes_have_one_writer_any_readers_and_outlive_their_sandboxes,
    test_usage_and_batch_delete_through_the_api_client,
    test_fork_children_resume_the_parents_processes_each_a_machine_of_its_own,
    test_burst_of_creates_ends_ready_or_with_clear_errors,
]


def main(argv):
    by_name = {t.__name__: t for t in TESTS}
    unknown = [a for a in argv if a not in by_name]
    if unknown:
        print(f"unknown tests: {unknown}; known: {list(by_name)}")
        return 2
    selected = [t for t in TESTS if not argv or t.__name__ in argv]
    counts = {"PASS": 0, "FAIL": 0, "SKIP": 0}
    t_all = time.monotonic()
    for test in selected:
        print(f"--- {test.__name__}", flush=True)
        t = time.monotonic()
        try:
            test()
            outcome, detail = "PASS", ""
        except Skip as e:
            outcome, detail = "SKIP", f": {e}"
        except Exception as e:
            outcome, detail = "FAIL", f": {type(e).__name__}: {e}"
            traceback.print_exc(file=sys.stdout)
        counts[outcome] += 1
        print(f"{outcome} {test.__name__} ({time.monotonic() - t:.1f}s){detail}", flush=True)
    # Best effort: leave nothing behind.
    for name in sorted(created):
        try:
            client.delete_sandbox(name)
        except Exception as e:
            print(f"cleanup: delete {name}: {type(e).__name__}: {e}")
    print(
        f"sdk suite: {counts['PASS']} PASS, {counts['FAIL']} FAIL, {counts['SKIP']} SKIP "
        f"in {time.monotonic() - t_all:.0f}s",
        flush=True,
    )
    return 1 if counts["FAIL"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
