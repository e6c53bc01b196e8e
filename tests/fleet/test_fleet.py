#!/usr/bin/env python3
"""Fleet end to end, the SDK's side: the unmodified `langsmith` SDK against
a control plane (one or more replicas) whose sandboxes run on host agents.

Driven by `crates/hearth-cli/tests/fleet.rs`, one step at a time: the Rust
driver builds the fleet, kills, partitions and drains hosts, and looks at
placement from outside (the database, `/metrics`, `/proc`); each run of
this script does one SDK step and prints `RESULT <json>` as its last line.

    test_fleet.py create [--preserve-memory] [--parallel N] NAME...
        create the sandboxes (2 GiB, no idle stop), N at a time (default
        3); RESULT: one entry each
    test_fleet.py exercise NAME...
        per sandbox: run a command, write and read back a file, serve a
        file over HTTP inside it and fetch it through the SDK's tunnel
    test_fleet.py write NAME PATH TEXT      write TEXT (then `sync`)
    test_fleet.py read NAME PATH            RESULT: {"content": ...}
    test_fleet.py run NAME COMMAND          RESULT: exit code, stdout
    test_fleet.py bg NAME                   start a detached `sleep 1000`;
                                            RESULT: its pid
    test_fleet.py check-bg NAME PID         RESULT: the pid file (a tmpfs)
                                            and the process's cmdline
    test_fleet.py start NAME                start_sandbox, waiting for ready
    test_fleet.py status NAME...            RESULT: {name: status}
    test_fleet.py burst --endpoints URL,URL... NAME...
        create every NAME at once, NAME number i through endpoint i modulo
        their count (round robin over the control plane's replicas); a
        failed create is an outcome, not a failure of the step. RESULT:
        per name its endpoint, outcome ("ready"; "connection": no
        connection, after the SDK's retries; "disconnected": the server
        went away with the request in flight, which the SDK does not retry,
        a create not being idempotent; "http_<status>" for an error answer;
        "other"), id and seconds
    test_fleet.py exec-via NAME@URL...
        per sandbox: read it and run a command in it through the replica at
        URL; RESULT: {name: {stdout, dataplane_url}}

Environment: LANGSMITH_ENDPOINT, LANGSMITH_API_KEY. Exits non-zero (with a
traceback) when a step fails.
"""

import argparse
import json
import os
import socket
import sys
import time
import traceback
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from langsmith.sandbox import SandboxClient, SandboxConnectionError

GIB = 1024**3
# Guests boot under emulation on a 2-core machine, several at once.
CREATE_TIMEOUT = 240
BG_PIDFILE = "/tmp/fleet-bg.pid"

client = SandboxClient()


def client_at(endpoint):
    """A client of one replica, as a user configures one."""
    return SandboxClient(api_endpoint=f"{endpoint.rstrip('/')}/api/v2/sandboxes")


def log(msg):
    print(f"    {msg}", flush=True)


def check(cond, msg):
    if not cond:
        raise AssertionError(msg)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(sb, cmd, timeout=120):
    r = sb.run(cmd, timeout=timeout)
    log(f"{sb.name}$ {cmd[:90]} -> {r.exit_code}: {r.stdout.strip()[:120]!r} {r.stderr.strip()[:120]!r}")
    return r


def wait_for_port(sb, port, seconds=60):
    probe = (
        "python3 -c \"import socket; "
        f"socket.create_connection(('127.0.0.1', {port}), 1).close()\""
    )
    deadline = time.monotonic() + seconds
    while sb.run(probe).exit_code != 0:
        check(time.monotonic() < deadline, f"{sb.name}: nothing listens on port {port}")
        time.sleep(0.5)


# --------------------------------------------------------------------------


def cmd_create(args):
    def one(name):
        t = time.monotonic()
        sb = client.create_sandbox(
            name=name,
            timeout=CREATE_TIMEOUT,
            mem_bytes=2 * GIB,
            idle_ttl_seconds=0,
            preserve_memory_on_stop=True if args.preserve_memory else None,
        )
        took = time.monotonic() - t
        log(f"created {sb.name} ({sb.id}) in {took:.1f}s: {sb.status}")
        check(sb.status == "ready", f"{sb.name}: status {sb.status!r} after create")
        return {"name": sb.name, "id": str(sb.id), "status": sb.status, "seconds": round(took, 2)}

    with ThreadPoolExecutor(max(1, args.parallel)) as pool:
        return list(pool.map(one, args.names))


def http_status(e):
    """The status of the answer behind an SDK error, if there was one."""
    while e is not None:
        response = getattr(e, "response", None)
        if response is not None and hasattr(response, "status_code"):
            return response.status_code
        e = e.__cause__ or e.__context__
    return None


def cmd_burst(args):
    endpoints = args.endpoints.split(",")
    clients = [client_at(e) for e in endpoints]

    def one(item):
        i, name = item
        via = i % len(endpoints)
        if i > 0:
            # The first create (through replica 1) goes out alone: with more
            # creates than places, replica 1 otherwise lost every race for
            # a place now and then (about one run in eleven), and the
            # caller's kill -9 of replica 1 mid-boot had no boot to catch.
            time.sleep(0.3)
        t = time.monotonic()
        entry = {"name": name, "via": via}
        try:
            sb = clients[via].create_sandbox(
                name=name, timeout=CREATE_TIMEOUT, mem_bytes=2 * GIB, idle_ttl_seconds=0
            )
            entry.update(outcome="ready" if sb.status == "ready" else f"status_{sb.status}", id=str(sb.id))
        except SandboxConnectionError as e:
            entry.update(outcome="connection", error=f"{type(e).__name__}: {e}")
        except Exception as e:  # every other error is an outcome too
            status = http_status(e)
            # The HTTP client's own transport errors (the SDK's httpx).
            dropped = any(c.__name__ == "TransportError" for c in type(e).__mro__)
            entry.update(
                outcome="disconnected" if dropped else f"http_{status}" if status else "other",
                error=f"{type(e).__name__}: {e}",
            )
        entry["seconds"] = round(time.monotonic() - t, 2)
        log(f"{name} via replica {via + 1}: {entry['outcome']} in {entry['seconds']}s {entry.get('error', '')[:160]}")
        return entry

    with ThreadPoolExecutor(len(args.names)) as pool:
        return list(pool.map(one, enumerate(args.names)))


def cmd_exec_via(args):
    out = {}
    for pair in args.pairs:
        name, endpoint = pair.split("@", 1)
        sb = client_at(endpoint).get_sandbox(name)
        r = run(sb, f"echo via {endpoint} in {name}")
        check(r.exit_code == 0, f"{name} through {endpoint}: {r}")
        out[name] = {"stdout": r.stdout, "dataplane_url": sb.dataplane_url}
    return out


def cmd_exercise(args):
    out = {}
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    for name in args.names:
        sb = client.get_sandbox(name)
        t = time.monotonic()
        r = run(sb, f"echo fleet-{name}; cat /proc/sys/kernel/random/boot_id")
        check(r.exit_code == 0 and r.stdout.startswith(f"fleet-{name}\n"), f"{name}: run: {r}")
        payload = os.urandom(256 * 1024)
        sb.write("/home/user/fleet.bin", payload)
        back = sb.read("/home/user/fleet.bin")
        check(back == payload, f"{name}: read back {len(back)} bytes, differs from the 256 KiB written")

        token = f"through the tunnel to {name} {os.urandom(4).hex()}\n".encode()
        run(sb, "mkdir -p /home/user/www")
        sb.write("/home/user/www/hello.txt", token)
        server = sb.run(
            "cd /home/user/www && exec python3 -m http.server 8000 --bind 127.0.0.1",
            wait=False,
        )
        try:
            wait_for_port(sb, 8000)
            with sb.tunnel(8000, local_port=free_port()) as tun:
                body = opener.open(f"http://127.0.0.1:{tun.local_port}/hello.txt", timeout=60).read()
            check(body == token, f"{name}: GET through the tunnel gave {body!r}, expected {token!r}")
        finally:
            server.kill()
        took = time.monotonic() - t
        log(f"{name}: run, 256 KiB write/read and a tunnel GET in {took:.1f}s")
        out[name] = {"boot_id": r.stdout.split("\n")[1].strip(), "seconds": round(took, 2)}
    return out


def cmd_write(args):
    sb = client.get_sandbox(args.name)
    sb.write(args.path, args.text.encode())
    # The store gets what the guest's disk holds: flush the page cache.
    r = run(sb, "sync")
    check(r.exit_code == 0, f"sync: {r}")
    return {"written": len(args.text)}


def cmd_read(args):
    t = time.monotonic()
    sb = client.get_sandbox(args.name)
    data = sb.read(args.path)
    took = time.monotonic() - t
    log(f"read {args.name}:{args.path} ({len(data)} bytes) in {took:.1f}s")
    return {"content": data.decode(errors="replace"), "seconds": round(took, 2)}


def cmd_run(args):
    sb = client.get_sandbox(args.name)
    r = run(sb, args.command)
    return {"exit_code": r.exit_code, "stdout": r.stdout, "stderr": r.stderr}


def cmd_bg(args):
    sb = client.get_sandbox(args.name)
    # Its own session, so it outlives the exec that started it; the pid
    # file is on /tmp, a tmpfs, so only a memory restore keeps it.
    r = run(sb, f"setsid -f sh -c 'echo $$ > {BG_PIDFILE}; exec sleep 1000' >/dev/null 2>&1 </dev/null")
    check(r.exit_code == 0, f"start sleep: {r}")
    deadline = time.monotonic() + 30
    while True:
        pid = sb.run(f"cat {BG_PIDFILE} 2>/dev/null").stdout.strip()
        if pid.isdigit():
            break
        check(time.monotonic() < deadline, f"no {BG_PIDFILE} after 30s")
        time.sleep(0.2)
    alive = bg_state(sb, pid)
    check("sleep 1000" in alive["cmdline"], f"pid {pid} is not the sleep: {alive}")
    return {"pid": int(pid)}


def bg_state(sb, pid):
    pidfile = sb.run(f"cat {BG_PIDFILE} 2>/dev/null").stdout.strip()
    r = sb.run(
        f"[ -e /proc/{pid} ] && ! grep -q '^State:.*Z' /proc/{pid}/status "
        f"&& tr '\\0' ' ' < /proc/{pid}/cmdline"
    )
    return {"pidfile": pidfile, "cmdline": r.stdout.strip() if r.exit_code == 0 else ""}


def cmd_check_bg(args):
    sb = client.get_sandbox(args.name)
    state = bg_state(sb, args.pid)
    log(f"{args.name}: {BG_PIDFILE}={state['pidfile']!r}, /proc/{args.pid}: {state['cmdline']!r}")
    return state


def cmd_start(args):
    t = time.monotonic()
    sb = client.start_sandbox(args.name, timeout=CREATE_TIMEOUT)
    took = time.monotonic() - t
    log(f"started {sb.name} in {took:.1f}s: {sb.status}")
    return {"status": sb.status, "seconds": round(took, 2)}


def cmd_status(args):
    return {name: client.get_sandbox(name).status for name in args.names}


def main(argv):
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("create")
    c.add_argument("--preserve-memory", action="store_true")
    c.add_argument("--parallel", type=int, default=3)
    c.add_argument("names", nargs="+")
    c.set_defaults(fn=cmd_create)
    c = sub.add_parser("exercise")
    c.add_argument("names", nargs="+")
    c.set_defaults(fn=cmd_exercise)
    c = sub.add_parser("write")
    c.add_argument("name")
    c.add_argument("path")
    c.add_argument("text")
    c.set_defaults(fn=cmd_write)
    c = sub.add_parser("read")
    c.add_argument("name")
    c.add_argument("path")
    c.set_defaults(fn=cmd_read)
    c = sub.add_parser("run")
    c.add_argument("name")
    c.add_argument("command")
    c.set_defaults(fn=cmd_run)
    c = sub.add_parser("bg")
    c.add_argument("name")
    c.set_defaults(fn=cmd_bg)
    c = sub.add_parser("check-bg")
    c.add_argument("name")
    c.add_argument("pid", type=int)
    c.set_defaults(fn=cmd_check_bg)
    c = sub.add_parser("start")
    c.add_argument("name")
    c.set_defaults(fn=cmd_start)
    c = sub.add_parser("burst")
    c.add_argument("--endpoints", required=True)
    c.add_argument("names", nargs="+")
    c.set_defaults(fn=cmd_burst)
    c = sub.add_parser("exec-via")
    c.add_argument("pairs", nargs="+")
    c.set_defaults(fn=cmd_exec_via)
    c = sub.add_parser("status")
    c.add_argument("names", nargs="+")
    c.set_defaults(fn=cmd_status)
    args = p.parse_args(argv)
    try:
        result = args.fn(args)
    except Exception as e:
        traceback.print_exc(file=sys.stdout)
        print(f"FAIL {args.cmd}: {type(e).__name__}: {e}", flush=True)
        return 1
    print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
