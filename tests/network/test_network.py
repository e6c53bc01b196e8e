#!/usr/bin/env python3
"""Network end to end: sandboxes reach a test "internet" only through
Hearth's egress proxy, which enforces each sandbox's `proxy_config`.

Driven by `crates/hearth-cli/tests/network.rs`, which creates the test
internet (a network namespace running tests/network/inet.py), starts
`hearth up` with `[network]` settings that name its hosts and allow its
private subnet, and runs this script with the unmodified `langsmith` SDK.

Environment:
    LANGSMITH_ENDPOINT, LANGSMITH_API_KEY
    NET_IP        the test internet's address (every *.test name maps to it)
    NET_DIR       its state directory (requests.log, dns.log)
    NET_CA        the test CA (PEM) the test servers' certificate chains to
    HOST_IP       an address of the host itself (its services must be unreachable)
    CONTROL_PORT  the control plane's port

Prints PASS/FAIL per test; exits non-zero on a failure.
"""

import json
import os
import shutil
import subprocess
import sys
import time
import traceback
import urllib.error
import urllib.parse
import urllib.request

from langsmith.sandbox import (
    SandboxClient,
    SandboxTokenVerificationError,
    SandboxTokenVerifier,
    git_mount,
    mount_config,
    workspace_secret,
)

client = SandboxClient()
NET_IP = os.environ["NET_IP"]
NET_DIR = os.environ["NET_DIR"]
NET_CA = open(os.environ["NET_CA"]).read()
HOST_IP = os.environ["HOST_IP"]
CONTROL_PORT = os.environ["CONTROL_PORT"]
CREATE_TIMEOUT = 240
SECRET = "s3cret-" + os.urandom(8).hex()
created = set()
state = {}


def log(msg):
    print(f"    {msg}", flush=True)


def check(cond, msg):
    if not cond:
        raise AssertionError(msg)


def raw(method, path, body=None, api="/api/v2/sandboxes"):
    url = client._base_url.split("/api/v2/sandboxes")[0].split("/v2/sandboxes")[0] + api + path
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("X-Api-Key", os.environ["LANGSMITH_API_KEY"])
    if data is not None:
        req.add_header("Content-Type", "application/json")
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(req, timeout=120) as r:
            text = r.read()
            try:
                return r.status, json.loads(text) if text else None
            except ValueError:
                return r.status, text.decode(errors="replace")
    except urllib.error.HTTPError as e:
        text = e.read()
        try:
            return e.code, json.loads(text)
        except ValueError:
            return e.code, text.decode(errors="replace")


def create(name, **kwargs):
    sb = client.create_sandbox(name=f"{name}-{os.getpid()}", timeout=CREATE_TIMEOUT, **kwargs)
    created.add(sb.name)
    return sb


def create_fails(name, **kwargs):
    """A create that must fail (a mount that cannot be made): its error."""
    try:
        sb = create(name, **kwargs)
    except Exception as e:
        log(f"refused as it should be: {e}")
        return str(e)
    raise AssertionError(f"a mount that cannot be made fails the create, got {sb.name} ready")


def run(sb, cmd, timeout=120):
    r = sb.run(cmd, timeout=timeout)
    log(f"$ {cmd[:100]} -> {r.exit_code}: {r.stdout.strip()[:160]!r} {r.stderr.strip()[:160]!r}")
    return r


def status_of(sb, url, transparent=False, extra=""):
    """The HTTP status curl gets for url in the sandbox ('000': no answer)."""
    via = "--noproxy '*'" if transparent else ""
    r = run(sb, f"rm -f /tmp/body; curl -s -o /tmp/body -w '%{{http_code}} %{{http_connect}}' --max-time 15 {via} {extra} {url}; echo; cat /tmp/body 2>/dev/null | head -c 300")
    first, _, rest = r.stdout.partition("\n")
    code, _, connect = first.strip().partition(" ")
    # A refused CONNECT (explicit proxy) has no response, only its answer.
    if code == "000" and connect not in ("", "000", "200"):
        code = connect
    return code, rest


def requests_log():
    try:
        with open(os.path.join(NET_DIR, "requests.log")) as f:
            return [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []


def patch_proxy(sb, cfg):
    status, body = raw("PATCH", f"/boxes/{sb.name}", {"proxy_config": cfg})
    check(status == 200, f"PATCH proxy_config: {status} {body}")


# --------------------------------------------------------------------------


def test_names_resolve_through_hearth_dns_and_both_proxy_paths_work():
    sb = create("net-open")
    state["open"] = sb
    r = run(sb, "getent hosts echo.test")
    check(r.exit_code == 0 and NET_IP in r.stdout, f"echo.test resolves to {NET_IP}: {r.stdout!r}")
    r = run(sb, "cat /etc/resolv.conf; ip -4 addr show eth0 2>/dev/null || cat /proc/net/fib_trie | head -5")
    check("nameserver 10.200.0.1" in r.stdout, f"resolv.conf names Hearth's DNS: {r.stdout!r}")
    for transparent in (False, True):
        code, body = status_of(sb, "http://echo.test/echo", transparent)
        check(code == "200", f"http echo.test (transparent={transparent}): {code} {body}")
        check('"host": "echo.test"' in body, f"the upstream saw Host echo.test: {body}")
    # An origin with a private CA: the guest trusts it like any user would.
    sb.write("/tmp/testca.pem", NET_CA)
    for transparent in (False, True):
        code, body = status_of(sb, "https://echo.test/echo", transparent, "--cacert /tmp/testca.pem")
        check(code == "200", f"https echo.test spliced (transparent={transparent}): {code} {body}")
        check('"tls": true' in body, f"the upstream saw TLS: {body}")


def test_pip_install_from_the_test_index():
    sb = state["open"]
    r = run(sb, "cat /tmp/testca.pem >> /etc/ssl/certs/ca-certificates.crt")
    check(r.exit_code == 0, "trust the test CA")
    r = run(sb, "pip install --no-cache-dir --index-url https://pypi.test/simple hearthdemo 2>&1 | tail -3", timeout=300)
    r = run(sb, "python3 -c 'import hearthdemo; print(hearthdemo.VALUE)'")
    check(r.stdout.strip() == "hearthdemo-from-the-test-index", f"the package from the test index imports: {r.stdout!r} {r.stderr!r}")


def test_other_dns_servers_private_addresses_and_the_host_are_unreachable():
    sb = state["open"]
    # A query to another resolver (the test internet runs one) gets nothing back.
    script = (
        "import socket;s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM);s.settimeout(3);"
        f"s.sendto(bytes.fromhex('123401000001000000000000056f74686572047465737400000100 01'.replace(' ','')),('{NET_IP}',53));"
        "\ntry:\n  s.recv(512); print('ANSWERED')\nexcept Exception as e: print('BLOCKED', type(e).__name__)"
    )
    sb.write("/tmp/dns.py", script)
    r = run(sb, "python3 /tmp/dns.py")
    check("BLOCKED" in r.stdout, f"an outside resolver is unreachable: {r.stdout!r}")
    dns_log = os.path.join(NET_DIR, "dns.log")
    check(not os.path.exists(dns_log) or os.path.getsize(dns_log) == 0, "no query reached the outside resolver")
    # The metadata address and the host's own services, through either path.
    for url in ("http://169.254.169.254/latest/meta-data/", f"http://{HOST_IP}:{CONTROL_PORT}/healthz", f"http://127.0.0.1:{CONTROL_PORT}/healthz"):
        for transparent in (False, True):
            code, body = status_of(sb, url, transparent)
            check(code != "200", f"{url} (transparent={transparent}) must be unreachable: {code} {body}")
    code, body = status_of(sb, "http://169.254.169.254/", True)
    check(code == "403" and "private" in body, f"the metadata address is refused as private: {code} {body}")
    # The gateway's own ports are closed except the proxy's.
    code, _ = status_of(sb, f"http://10.200.0.1:{CONTROL_PORT}/healthz", True, "--connect-timeout 3")
    check(code == "000", f"the gateway does not forward to the host: {code}")


def test_sandboxes_cannot_reach_each_other():
    a = state["open"]
    b = create("net-b")
    # Python's start under TCG can take seconds: wait until it answers.
    run(b, "setsid -f python3 -m http.server 8000 --bind 0.0.0.0 >/dev/null 2>&1 </dev/null; "
           "for i in $(seq 1 60); do curl -s --noproxy '*' -o /dev/null http://127.0.0.1:8000/ && break; sleep 0.5; done")
    r = run(b, "curl -s --noproxy '*' -o /dev/null -w '%{http_code}' http://127.0.0.1:8000/")
    check(r.stdout.strip() == "200", "B serves on its port 8000")
    # Every sandbox is 10.200.0.2 in its own namespace: A reaching that
    # address reaches itself, the gateway forwards nothing, and the proxy
    # refuses private addresses.
    for url in ("http://10.200.0.2:8000/", "http://10.200.0.1:8000/", "http://10.200.0.3:8000/"):
        code, body = status_of(a, url, True, "--connect-timeout 3")
        check(code != "200", f"A reaching {url} must fail: {code} {body}")
    client.delete_sandbox(b.name)
    created.discard(b.name)


def test_allow_list_then_deny_list_applied_live():
    allow = {"access_control": {"allow_list": ["echo.test", "*.glob.test", "~^re[0-9]+\\.test$"]}}
    sb = create("net-acl", proxy_config=allow)
    state["acl"] = sb
    for host in ("echo.test", "a.glob.test", "deep.a.glob.test", "re42.test"):
        for transparent in (False, True):
            code, body = status_of(sb, f"http://{host}/echo", transparent)
            check(code == "200", f"{host} is allowed (transparent={transparent}): {code} {body}")
    for host in ("other.test", "glob.test", "re.test"):
        # Through the explicit proxy: a 403 with the reason.
        code, body = status_of(sb, f"http://{host}/echo", False)
        check(code == "403" and "allow_list" in body, f"{host} is refused with a reason: {code} {body}")
        # Transparently: the name does not even resolve.
        code, body = status_of(sb, f"http://{host}/echo", True)
        check(code == "000", f"{host} does not resolve for a direct connection: {code} {body}")
    code, body = status_of(sb, "https://other.test/echo", False)
    check(code == "403", f"https other.test: the proxy refuses the CONNECT: {code} {body}")
    # Straight to the address with the name in SNI: intercepted, then 403.
    code, body = status_of(sb, "https://other.test/echo", True, f"--resolve other.test:443:{NET_IP}")
    check(code == "403" and "allow_list" in body, f"https other.test is refused after interception: {code} {body}")
    r = run(sb, "getent hosts other.test")
    check(r.exit_code != 0, "DNS does not resolve a name outside the allow_list")
    n_before = len(requests_log())

    patch_proxy(sb, {"access_control": {"deny_list": ["other.test", "*.glob.test", "~^re[0-9]+\\.test$"]}})
    code, body = status_of(sb, "http://echo.test/echo", True)
    check(code == "200", f"echo.test is not denied: {code} {body}")
    for host in ("other.test", "a.glob.test", "re7.test"):
        code, body = status_of(sb, f"http://{host}/echo", False)
        check(code == "403" and "deny_list" in body, f"{host} is denied at once after PATCH: {code} {body}")
        r = run(sb, f"getent hosts {host}")
        check(r.exit_code != 0, f"DNS refuses a denied name: {host}")

    patch_proxy(sb, {"access_control": {"deny_list": [f"{NET_IP}/32"]}})
    # A raw IP straight to the denied address, and a name through the
    # explicit proxy (DNS answers no denied address, so a direct
    # connection to the name cannot even start).
    for url, transparent in ((f"http://{NET_IP}/echo", True), ("http://echo.test/echo", False)):
        code, body = status_of(sb, url, transparent)
        check(code == "403" and "deny_list" in body, f"{url} is denied by CIDR: {code} {body}")
    r = run(sb, "getent hosts echo.test")
    check(r.exit_code != 0, "DNS answers no denied address")
    hosts = [e["host"] for e in requests_log()[n_before:]]
    check("other.test" not in hosts and "a.glob.test" not in hosts, f"no refused request reached the upstream: {hosts}")
    client.delete_sandbox(sb.name)
    created.discard(sb.name)


def test_e2b_network_rules_inject_headers_and_update_live():
    """E2B's network through the unmodified e2b SDK: an allow list with
    transform rules that set headers on HTTPS requests, one from a
    secret made by `Secret.create` and named by `Secret.fill`, one a
    literal (sealed); the guest
    sees neither; `update_network` replaces the lists and the rules."""
    from e2b import Sandbox, Secret
    # Made through E2B's own secrets API: the workspace's secret.
    Secret.create("E2B_TOKEN", SECRET)
    literal = "lit-" + SECRET[::-1]
    sb = Sandbox.create(timeout=300, network={
        "allow_out": ["api.test", "echo.test"],
        "deny_out": ["0.0.0.0/0"],
        "rules": {
            "api.test": [{"transform": {"headers": {"Authorization": f"Bearer {Secret.fill('E2B_TOKEN')}"}}}],
            "*.test": [{"transform": {"headers": {"X-Literal": literal}}}],
        },
    })
    try:
        def echo(url):
            r = sb.commands.run(f"curl -sS --max-time 15 {url}", user="root")
            return json.loads(r.stdout)["headers"]
        h = echo("https://api.test/echo")
        check(h.get("authorization") == f"Bearer {SECRET}", f"the secret reached api.test: {h}")
        check("x-literal" not in h, f"the exact rule wins over the wildcard, unmerged: {h}")
        h = echo("https://echo.test/echo")
        check(h.get("x-literal") == literal and "authorization" not in h, f"the wildcard's header: {h}")
        r = sb.commands.run("curl -s -o /dev/null -w '%{http_code}' --max-time 15 https://other.test/echo || true")
        check(r.stdout.strip() in ("000", "403"), f"other.test is outside the allow list: {r.stdout!r}")
        env = sb.commands.run("env", user="root").stdout
        check(SECRET not in env and literal not in env, "neither value is in the guest's environment")
        info = Sandbox.get_info(sb.sandbox_id)
        check(SECRET not in str(info) and literal not in str(info), "the API does not show the values")
        sb.update_network({"allow_out": ["echo.test"], "deny_out": ["0.0.0.0/0"],
                           "rules": {"echo.test": [{"transform": {"headers": {"X-New": "n"}}}]}})
        h = echo("https://echo.test/echo")
        check(h.get("x-new") == "n" and "x-literal" not in h, f"the update replaced the rules: {h}")
        r = sb.commands.run("curl -s -o /dev/null -w '%{http_code}' --max-time 15 https://api.test/echo || true")
        check(r.stdout.strip() in ("000", "403"), f"api.test is no longer allowed: {r.stdout!r}")
    finally:
        sb.kill()
        Secret.destroy("E2B_TOKEN")


def test_header_rule_with_a_workspace_secret_never_enters_the_guest():
    status, body = raw("POST", "", [{"key": "API_TOKEN", "value": SECRET}], api="/api/v1/workspaces/current/secrets")
    check(status == 200, f"set the workspace secret: {status} {body}")
    rule = {
        "name": "api",
        "match_hosts": ["api.test"],
        "headers": [
            {"name": "Authorization", "type": "workspace_secret", "value": "Bearer {API_TOKEN}"},
            {"name": "X-Opaque", "type": "opaque", "value": "opaque-" + SECRET},
        ],
        "env_vars": {"API_TOKEN": "dummy-token"},
    }
    sb = create("net-secret", proxy_config={"rules": [rule]})
    status, body = raw("GET", f"/boxes/{sb.name}")
    check(SECRET not in json.dumps(body), "the API never returns the opaque value")
    r = run(sb, "echo $API_TOKEN")
    check(r.stdout.strip() == "dummy-token", f"the guest gets the dummy variable: {r.stdout!r}")
    for scheme in ("https", "http"):
        r = run(sb, f"curl -sS -v {scheme}://api.test/echo -H \"Authorization: Bearer $API_TOKEN\" 2>/tmp/curl-{scheme}.err")
        check(r.exit_code == 0, f"{scheme} api.test: {r.stderr}")
        echoed = json.loads(r.stdout)
        if scheme == "https":
            check(echoed["headers"].get("authorization") == f"Bearer {SECRET}", f"the upstream got the secret ({scheme}): {echoed['headers']}")
            check(echoed["headers"].get("x-opaque") == f"opaque-{SECRET}", f"the upstream got the opaque header ({scheme})")
        else:
            # Secrets travel only inside TLS: plain HTTP keeps the guest's own value.
            check(echoed["headers"].get("authorization") == "Bearer dummy-token", f"no secret over plain HTTP: {echoed['headers']}")
            check("x-opaque" not in echoed["headers"], f"no opaque header over plain HTTP: {echoed['headers']}")
        r = run(sb, f"grep -c 'Bearer dummy-token' /tmp/curl-{scheme}.err")
        check(r.stdout.strip() != "0", "the request as the guest sent it carried the dummy")
    # The search gets the secret reversed, so that its own command line
    # does not hold it.
    sb.write("/tmp/find.py", FIND_SCRIPT)
    r = run(sb, f"python3 /tmp/find.py {SECRET[::-1]}", timeout=900)
    check(r.exit_code == 0 and r.stdout.strip().endswith("FOUND NOTHING"), f"the secret is nowhere in the guest: {r.stdout!r} {r.stderr!r}")
    client.delete_sandbox(sb.name)
    created.discard(sb.name)


def git(*args, cwd=None):
    subprocess.run(
        ["git", "-c", "user.name=test", "-c", "user.email=test@git.test", *args],
        cwd=cwd, check=True, capture_output=True, env={**os.environ, "HOME": NET_DIR},
    )


def commit(work, bare, text):
    with open(os.path.join(work, "README"), "w") as f:
        f.write(text + "\n")
    git("add", "README", cwd=work)
    git("commit", "-q", "-m", text, cwd=work)
    git("push", "-q", "origin", "main", cwd=work)
    # What git's dumb HTTP reads instead of asking the server.
    git("update-server-info", cwd=bare)


def test_git_mount_clones_a_private_repository_and_follows_its_branch():
    root = os.path.join(NET_DIR, "git")
    bare, work = os.path.join(root, "repo.git"), os.path.join(NET_DIR, "git-work")
    for d in (root, work):
        shutil.rmtree(d, ignore_errors=True)
    git("init", "-q", "--bare", "-b", "main", bare)
    git("init", "-q", "-b", "main", work)
    git("remote", "add", "origin", bare, cwd=work)
    commit(work, bare, "one")
    token = "git-" + os.urandom(8).hex()
    with open(os.path.join(NET_DIR, "git-token"), "w") as f:
        f.write(token)
    mounts = mount_config(mounts=[git_mount(
        id="repo", mount_path="/mnt/repo", remote_url="https://git.test/git/repo.git",
        ref={"type": "branch", "name": "main"}, refresh_interval_seconds=2,
    )])
    # The repository is private: the proxy adds its token, which the
    # guest never holds.
    rule = {"name": "git", "match_hosts": ["git.test"],
            "headers": [{"name": "X-Git-Token", "type": "opaque", "value": token}]}
    sb = create("net-git", proxy_config={"rules": [rule]}, mount_config=mounts)
    r = run(sb, "cat /mnt/repo/README; git -C /mnt/repo log --format=%s")
    check(r.stdout.split() == ["one", "one"], f"the clone is at /mnt/repo before any user code: {r.stdout!r}")
    status, body = raw("GET", f"/boxes/{sb.name}")
    check(body["mount_config"]["mounts"][0]["git"]["remote_url"] == "https://git.test/git/repo.git", f"the mount is shown: {body.get('mount_config')}")
    # A new commit on the branch is in the sandbox after the refresh interval.
    commit(work, bare, "two")
    deadline = time.monotonic() + 120
    while True:
        r = run(sb, "cat /mnt/repo/README")
        if r.stdout.strip() == "two":
            break
        check(time.monotonic() < deadline, f"the refresh brought the new commit: {r.stdout!r}")
        time.sleep(2)
    r = run(sb, f"grep -rl {token} /mnt/repo /root /etc /proc/self/environ 2>/dev/null; echo end")
    check(r.stdout.strip() == "end", f"the token is not in the guest: {r.stdout!r}")
    client.delete_sandbox(sb.name)
    created.discard(sb.name)
    # With a wrong token the server refuses the clone: the create fails and
    # says why, never an empty directory.
    wrong = {**rule, "headers": [{"name": "X-Git-Token", "type": "opaque", "value": "wrong"}]}
    e = create_fails("net-git-denied", proxy_config={"rules": [wrong]}, mount_config=mounts)
    check("mount 'repo' at /mnt/repo" in e and "403" in e, f"the failure names the mount and why: {e}")


FIND_SCRIPT = r"""
import os, sys
secret = sys.argv[1][::-1].encode()
me = str(os.getpid())
hits = []
for pid in os.listdir("/proc"):
    if not pid.isdigit() or pid == me:
        continue
    for what in ("environ", "cmdline"):
        try:
            with open(f"/proc/{pid}/{what}", "rb") as f:
                if secret in f.read():
                    hits.append(f"/proc/{pid}/{what}")
        except OSError:
            pass
files = 0
for root, dirs, names in os.walk("/"):
    if root == "/":
        dirs[:] = [d for d in dirs if d not in ("proc", "sys", "dev")]
    for n in names:
        p = os.path.join(root, n)
        try:
            if os.path.islink(p) or not os.path.isfile(p):
                continue
            files += 1
            with open(p, "rb") as f:
                tail = b""
                while True:
                    chunk = f.read(1 << 20)
                    if not chunk:
                        break
                    if secret in tail + chunk:
                        hits.append(p)
                        break
                    tail = chunk[-len(secret):]
        except OSError:
            pass
print(f"searched {files} files")
print("\n".join(hits) if hits else "FOUND NOTHING")
"""


def test_callbacks_fail_closed_and_cache_their_headers():
    cfg = {
        "callbacks": [
            {"match_hosts": ["cbfail.test"], "url": f"http://{NET_IP}/callback/fail", "ttl_seconds": 60},
            {"match_hosts": ["cbok.test", "static.test"], "url": f"http://{NET_IP}/callback/ok", "ttl_seconds": 60},
            {"match_hosts": ["cbfull.test"], "url": f"http://{NET_IP}/callback/ok?full", "ttl_seconds": 60, "full_request": True},
        ],
        "rules": [{"name": "static", "match_hosts": ["static.test"], "headers": [{"name": "X-Static", "type": "plaintext", "value": "yes"}]}],
    }
    sb = create("net-cb", proxy_config=cfg)
    before = len(requests_log())
    # Callback headers are credentials: set only on requests that go out over TLS.
    code, body = status_of(sb, "https://cbfail.test/echo", True)
    check(code == "502" and "header callback for \"cbfail.test\" failed" in body, f"a failing callback gives 502: {code} {body}")
    check("500" not in body and NET_IP not in body, f"the guest learns nothing of the callback's answer: {body}")
    code, body = status_of(sb, "https://cbfail.test/echo", False)
    check(code == "502", f"also through the explicit proxy: {code} {body}")
    upstream = [e for e in requests_log()[before:] if e["host"].startswith("cbfail.test")]
    check(not upstream, f"no request reached the upstream: {upstream}")
    for _ in range(2):
        code, body = status_of(sb, "https://cbok.test/echo", True)
        check(code == "200" and '"x-callback": "from-callback"' in body, f"the callback's header is set: {code} {body}")
    calls = [e for e in requests_log()[before:] if e["path"] == "/callback/ok" and "cbok.test" in e.get("body", "")]
    check(len(calls) == 1, f"the callback was called once within its TTL: {len(calls)}")
    code, body = status_of(sb, "https://static.test/echo", True)
    check('"x-static": "yes"' in body and "x-callback" not in body, f"a static rule beats a callback: {body}")

    # Each callback is signed; LangSmith's own verifier checks it against
    # Hearth's /.well-known/jwks.json (plain HTTP is allowed on loopback).
    verifier = SandboxTokenVerifier(api_url=os.environ["LANGSMITH_ENDPOINT"])
    call = calls[0]
    signature = call["headers"].get("x-langsmith-signature-jwt", "")
    got = verifier.verify_callback(body=call["body"].encode(), signature=signature, aud=f"http://{NET_IP}/callback/ok")
    check(got.host == "cbok.test" and got.port == 443, f"the verified callback names the request's host: {got}")
    check(got.identity.sandbox_id == sb.id, f"and the sandbox: {got.identity} vs {sb.id}")
    check(got.identity.tenant_id != "" and got.request is None, f"and its workspace, no request: {got}")
    for what, kwargs in [
        ("a tampered body", dict(body=call["body"].replace("cbok", "cbno").encode(), signature=signature, aud=f"http://{NET_IP}/callback/ok")),
        ("another audience", dict(body=call["body"].encode(), signature=signature, aud="https://elsewhere.test/hook")),
        ("a forged signature", dict(body=call["body"].encode(), signature=signature[:-4] + ("AAAA" if not signature.endswith("AAAA") else "BBBB"), aud=f"http://{NET_IP}/callback/ok")),
    ]:
        try:
            verifier.verify_callback(**kwargs)
            check(False, f"the SDK's verifier accepts {what}")
        except SandboxTokenVerificationError as e:
            log(f"{what} refused: {e}")

    # full_request: the callback is sent the request itself, signed with it.
    r = run(sb, "curl -s --noproxy '*' --max-time 15 -X POST -H 'X-Guest: g1' --data-binary hello-body 'https://cbfull.test/echo?q=1'")
    check('"x-callback": "from-callback"' in r.stdout and "hello-body" in r.stdout, f"the full_request callback's header and the body reach the upstream: {r.stdout}")
    full = [e for e in requests_log()[before:] if e["path"] == "/callback/ok?full"]
    check(len(full) == 1, f"one full_request callback: {full}")
    got = verifier.verify_callback(body=full[0]["body"].encode(), signature=full[0]["headers"].get("x-langsmith-signature-jwt", ""), aud=f"http://{NET_IP}/callback/ok?full")
    req = got.request
    check(req is not None and req.method == "POST" and req.host == "cbfull.test" and req.path == "/echo" and req.query == "q=1", f"the request as sent: {req}")
    check(req.body == b"hello-body" and not req.body_truncated and req.headers.get("x-guest") == ["g1"], f"its body and headers: {req}")
    client.delete_sandbox(sb.name)
    created.discard(sb.name)


def service_account(token_uri, key=None):
    """A service account key's JSON with a fresh RSA key (or `key`)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = key or rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()).decode()
    return json.dumps({
        "type": "service_account", "project_id": "p", "private_key_id": "k1", "private_key": pem,
        "client_email": "sa@p.iam.gserviceaccount.com", "token_uri": token_uri,
    })


def test_gcp_rule_sets_tokens_minted_from_the_service_account():
    # The SDK's gcp_auth with a service account key made here; the test
    # internet's /token is its token endpoint, storage.googleapis.com its API.
    import base64
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import padding, rsa
    from langsmith.sandbox import gcp_auth, opaque_secret, proxy_config

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    account = service_account(f"http://{NET_IP}/token", key)
    cfg = proxy_config(rules=[gcp_auth(service_account_json=opaque_secret(account), scopes=["https://www.googleapis.com/auth/devstorage.read_only"])])
    sb = create("net-gcp", proxy_config=cfg)
    status, body = raw("GET", f"/boxes/{sb.name}")
    check("PRIVATE KEY" not in json.dumps(body), "the API never returns the key")
    before = len(requests_log())
    for _ in range(2):
        r = run(sb, "curl -sS https://storage.googleapis.com/echo -H 'Authorization: Bearer dummy'")
        echoed = json.loads(r.stdout)
        check(echoed["headers"].get("authorization") == "Bearer ya29.inet-1", f"the upstream got the minted token: {echoed['headers']}")
    grants = [e for e in requests_log()[before:] if e["path"] == "/token"]
    check(len(grants) == 1, f"one token for both requests: {len(grants)}")
    form = dict(p.split("=", 1) for p in grants[0]["body"].split("&"))
    check(form["grant_type"] == "urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Ajwt-bearer", f"the JWT-bearer grant: {form}")
    head, claims, sig = form["assertion"].split(".")
    unb64 = lambda s: base64.urlsafe_b64decode(s + "=" * (-len(s) % 4))
    key.public_key().verify(unb64(sig), f"{head}.{claims}".encode(), padding.PKCS1v15(), hashes.SHA256())
    claims = json.loads(unb64(claims))
    check(claims["iss"] == "sa@p.iam.gserviceaccount.com" and claims["aud"] == f"http://{NET_IP}/token", f"the assertion's claims: {claims}")
    check(claims["scope"] == "https://www.googleapis.com/auth/devstorage.read_only", f"its scope: {claims}")
    client.delete_sandbox(sb.name)
    created.discard(sb.name)


S3_GET = r"""
import sys, boto3, botocore
url, ca, key_id, secret, bucket, key = sys.argv[1:]
s3 = boto3.client("s3", endpoint_url=url, region_name="us-east-1", verify=ca,
                  aws_access_key_id=key_id, aws_secret_access_key=secret)
try:
    sys.stdout.write("200\n" + s3.get_object(Bucket=bucket, Key=key)["Body"].read().decode())
except botocore.exceptions.ClientError as e:
    sys.stdout.write(str(e.response["ResponseMetadata"]["HTTPStatusCode"]) + "\n")
"""


BOTO3_LS = r"""
import sys, boto3
from botocore.config import Config
s3 = boto3.client("s3", endpoint_url=sys.argv[1], region_name="us-east-1", aws_access_key_id="dummy",
                  aws_secret_access_key="dummy", config=Config(s3={"addressing_style": "path"}))
for o in s3.list_objects_v2(Bucket=sys.argv[2], Prefix="data/").get("Contents", []):
    print(o["Key"])
"""


def s3_get(s3, key):
    """(HTTP status, body) of a GET of an object from moto, signed with the
    real key by boto3 on the host (the test's side, not the sandbox's)."""
    out = subprocess.run(
        [s3["python"], "-c", S3_GET, f"https://{NET_IP}:{s3['port']}", os.environ["NET_CA"],
         s3["key_id"], s3["secret"], s3["bucket"], key],
        capture_output=True, text=True, timeout=60, env={**os.environ, "NO_PROXY": "*"})
    check(out.returncode == 0, f"boto3 on the host: {out.stderr}")
    code, _, body = out.stdout.partition("\n")
    return code, body


def gcs_get(gcs, name):
    """(HTTP status, body) of an object in the GCS emulator (no auth)."""
    url = f"http://{NET_IP}:{gcs['port']}/download/storage/v1/b/{gcs['bucket']}/o/{urllib.parse.quote(name, safe='')}?alt=media"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=30) as r:
            return str(r.status), r.read().decode()
    except urllib.error.HTTPError as e:
        return str(e.code), ""


def eventually(what, probe, want, limit=120):
    deadline = time.monotonic() + limit
    while True:
        got = probe()
        if got == want:
            return
        check(time.monotonic() < deadline, f"{what}: {got!r}")
        time.sleep(2)


def test_bucket_mounts_s3_and_gcs_through_the_signing_proxy():
    # moto (S3 with real signature checks) at https://s3.test:9000 and GCS's
    # API behind storage.googleapis.com (tests/network/buckets.py); the
    # mounts' credentials live only in the proxy.
    from langsmith.sandbox import aws_auth, gcp_auth, gcs_mount, opaque_secret, s3_mount

    with open(os.path.join(NET_DIR, "buckets.json")) as f:
        buckets = json.load(f)
    s3, gcs = buckets["s3"], buckets["gcs"]
    status, body = raw("POST", "", [{"key": "MOUNT_S3_SECRET", "value": s3["secret"]}], api="/api/v1/workspaces/current/secrets")
    check(status == 200, f"set the workspace secret: {status} {body}")
    account = service_account(f"http://{NET_IP}/token")
    endpoint = f"https://s3.test:{s3['port']}"

    def config(secret):
        return mount_config(
            mounts=[
                s3_mount(id="data", mount_path="/mnt/data", bucket=s3["bucket"], endpoint_url=endpoint,
                         path_style=True, cache={"writeback_seconds": 1}),
                s3_mount(id="ro", mount_path="/mnt/ro", bucket=s3["bucket"], endpoint_url=endpoint,
                         path_style=True, prefix="data", read_only=True),
                # A prefix: rclone's uploads name their objects in their
                # bodies, which the proxy reads to keep them under it.
                gcs_mount(id="media", mount_path="/mnt/media", bucket=gcs["bucket"], prefix="dir"),
            ],
            auth=[aws_auth(access_key_id=opaque_secret(s3["key_id"]), secret_access_key=secret),
                  gcp_auth(service_account_json=opaque_secret(account))],
        )

    sb = create("net-buckets", mount_config=config(workspace_secret("MOUNT_S3_SECRET")))
    status, body = raw("GET", f"/boxes/{sb.name}")
    shown = body["mount_config"]
    check([m["type"] for m in shown["mounts"]] == ["s3", "s3", "gcs"] and shown["mounts"][1]["read_only"] is True, f"the mounts are shown: {shown}")
    check(shown["auth"]["aws"]["secret_access_key"] == {"type": "workspace_secret", "value": "{MOUNT_S3_SECRET}"}
          and shown["auth"]["aws"]["access_key_id"].get("is_set") is True and "value" not in shown["auth"]["aws"]["access_key_id"],
          f"opaque credentials are never returned: {shown['auth']}")
    # Read: the objects are there before any user code runs.
    r = run(sb, "cat /mnt/data/data/hello.txt /mnt/ro/hello.txt /mnt/media/hello.txt")
    check(r.stdout.split("\n")[:3] == ["hi from moto", "hi from moto", "hi from gcs"], f"the buckets' objects: {r.stdout!r} {r.stderr!r}")
    # Write: the objects appear in the buckets.
    r = run(sb, "mkdir -p /mnt/data/out && echo written-in-sandbox > /mnt/data/out/new.txt && echo to-gcs > /mnt/media/new.txt && echo ok")
    check(r.stdout.strip() == "ok", f"writes: {r.stdout!r} {r.stderr!r}")
    eventually("the S3 object is in moto", lambda: s3_get(s3, "out/new.txt"), ("200", "written-in-sandbox\n"))
    eventually("the GCS object is in the emulator", lambda: gcs_get(gcs, "dir/new.txt"), ("200", "to-gcs\n"))
    # Read only means read only.
    r = run(sb, "echo no > /mnt/ro/nope.txt")
    check(r.exit_code != 0 and "Read-only file system" in r.stderr, f"a read-only mount refuses writes: {r.stderr!r}")
    check(s3_get(s3, "data/nope.txt")[0] == "404", "nothing was written through the read-only mount")
    # The mounts come back after a stop and a start.
    client.stop_sandbox(sb.name)
    sb = client.start_sandbox(sb.name, timeout=CREATE_TIMEOUT)
    r = run(sb, "cat /mnt/data/out/new.txt /mnt/media/new.txt /mnt/ro/hello.txt")
    check(r.stdout.split("\n")[:3] == ["written-in-sandbox", "to-gcs", "hi from moto"], f"mounted again after a start: {r.stdout!r} {r.stderr!r}")
    # The proxy added the tokens: every GCS request the emulator served
    # carried one (inet.py refuses the others), and the guest's own
    # requests carried none.
    gcs_reqs = [e for e in requests_log() if e["host"].startswith("storage.googleapis.com") and "/b/" + gcs["bucket"] in e["path"]]
    check(gcs_reqs and all(e["headers"].get("authorization", "").startswith("Bearer ya29.inet-") for e in gcs_reqs), f"tokens on {len(gcs_reqs)} GCS requests")
    # The secret key is nowhere in the guest.
    sb.write("/tmp/find.py", FIND_SCRIPT)
    r = run(sb, f"python3 /tmp/find.py {s3['secret'][::-1]}", timeout=900)
    check(r.exit_code == 0 and r.stdout.strip().endswith("FOUND NOTHING"), f"the secret is nowhere in the guest: {r.stdout!r} {r.stderr!r}")
    client.delete_sandbox(sb.name)
    created.discard(sb.name)
    # Any S3 client in the sandbox (boto3 here), with dummy keys only, works
    # through a proxy_config aws rule: not while the rule is disabled, at
    # once when a PATCH enables it.
    rule = aws_auth(access_key_id=opaque_secret(s3["key_id"]), secret_access_key=opaque_secret(s3["secret"]), enabled=False)
    rule["match_hosts"] = ["s3.test"]
    sb = create("net-s3-client", proxy_config={"rules": [rule]})
    # Trusting moto's CA too, so that without the rule (the connection is
    # then spliced, not intercepted) it is the signature that fails.
    sb.write("/tmp/testca.pem", NET_CA.encode())
    sb.write("/tmp/ls.py", BOTO3_LS.encode())
    ls = ("cat /etc/ssl/certs/ca-certificates.crt /tmp/testca.pem > /tmp/both.pem; "
          f"AWS_CA_BUNDLE=/tmp/both.pem python3 /tmp/ls.py {endpoint} {s3['bucket']}")
    r = run(sb, ls)
    check(r.exit_code != 0 and "InvalidAccessKeyId" in r.stderr, f"a dummy key is refused without the rule: {r.stderr[-300:]!r}")
    patch_proxy(sb, {"rules": [{**rule, "enabled": True}]})
    r = run(sb, ls)
    check(r.exit_code == 0 and r.stdout.split() == ["data/hello.txt"], f"re-signed by the enabled rule: {r.stdout!r} {r.stderr[-300:]!r}")
    r = run(sb, "node -e 'console.log(typeof fetch)'; npm --version")
    check(r.stdout.split() == ["function", "10.8.2"], f"the image has node and npm: {r.stdout!r} {r.stderr!r}")
    client.delete_sandbox(sb.name)
    created.discard(sb.name)
    # A wrong key: the create fails and says why, never an empty directory.
    e = create_fails("net-buckets-denied", mount_config=config(opaque_secret("wrong-" + s3["secret"])))
    check("mount 'data' at /mnt/data" in e and "SignatureDoesNotMatch" in e, f"the failure names the mount and why: {e}")
    # A bucket that does not exist: the remote's own answer (issue 39,
    # finding 8: the error used to drop it) reaches the SDK.
    missing = mount_config(
        mounts=[s3_mount(id="gone", mount_path="/mnt/gone", bucket="hearth-no-such-bucket",
                         endpoint_url=endpoint, path_style=True)],
        auth=[aws_auth(access_key_id=opaque_secret(s3["key_id"]), secret_access_key=opaque_secret(s3["secret"]))],
    )
    e = create_fails("net-buckets-missing", mount_config=missing)
    check("mount 'gone' at /mnt/gone" in e and "NoSuchBucket" in e, f"the failure names the mount and the remote's answer: {e}")


S3_PUT_AND_PRESIGN = r"""
import sys, boto3
url, ca, key_id, secret, bucket, key, kib, public = sys.argv[1:]
kw = dict(region_name="us-east-1", aws_access_key_id=key_id, aws_secret_access_key=secret)
s3 = boto3.client("s3", endpoint_url=url, verify=ca, **kw)
s3.put_object(Bucket=bucket, Key=key, Body=bytes(int(kib) << 10))
# Presigned for the name the sandbox uses (path style, like the mount).
from botocore.config import Config
pub = boto3.client("s3", endpoint_url=public, config=Config(s3={"addressing_style": "path"}), **kw)
print(pub.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": key}, ExpiresIn=3600))
"""


def bench_bucket_mount_read():
    """`docs/benchmarks.md`: reading an object through an S3 mount (rclone
    through FUSE, its requests re-signed by the proxy) against reading it
    with curl through the same proxy (a presigned URL: no re-signing), and
    a small object's read through each (the re-signing per request)."""
    from langsmith.sandbox import aws_auth, opaque_secret, s3_mount

    with open(os.path.join(NET_DIR, "buckets.json")) as f:
        s3 = json.load(f)["s3"]
    endpoint = f"https://s3.test:{s3['port']}"
    urls = {}
    for key, kib in (("bench/big.bin", 64 << 10), ("bench/small.bin", 1)):
        out = subprocess.run(
            [s3["python"], "-c", S3_PUT_AND_PRESIGN, f"https://{NET_IP}:{s3['port']}", os.environ["NET_CA"],
             s3["key_id"], s3["secret"], s3["bucket"], key, str(kib), endpoint],
            capture_output=True, text=True, timeout=300, env={**os.environ, "NO_PROXY": "*"})
        check(out.returncode == 0, f"upload: {out.stderr}")
        urls[key] = out.stdout.strip()
    cfg = mount_config(
        mounts=[s3_mount(id="data", mount_path="/mnt/data", bucket=s3["bucket"], endpoint_url=endpoint,
                         path_style=True, read_only=True)],
        auth=[aws_auth(access_key_id=opaque_secret(s3["key_id"]), secret_access_key=opaque_secret(s3["secret"]))],
    )
    sb = create("net-mount-bench", mount_config=cfg, vcpus=1)
    timed = "s=$(date +%s%N); {cmd} >/dev/null; e=$(date +%s%N); echo $(( (e - s) / 1000 ))"

    def best_us(cmd, n):
        r = run(sb, "; ".join([timed.format(cmd=cmd)] * n), timeout=600)
        got = [int(x) for x in r.stdout.split()]
        check(r.exit_code == 0 and len(got) == n, f"{cmd}: {r.stdout!r} {r.stderr!r}")
        return sorted(got)

    big_mount = best_us("cat /mnt/data/bench/big.bin", 3)[0]
    big_curl = best_us(f"curl -sS -o /dev/null '{urls['bench/big.bin']}'", 3)[0]
    mib_s = lambda us: 64 / (us / 1e6)
    small_mount = best_us("cat /mnt/data/bench/small.bin", 20)
    small_curl = best_us(f"curl -sS -o /dev/null '{urls['bench/small.bin']}'", 20)
    med = lambda v: v[len(v) // 2] / 1000
    print(f"BENCH 64 MiB object: S3 mount {mib_s(big_mount):.1f} MiB/s, curl through the proxy {mib_s(big_curl):.1f} MiB/s "
          f"(mount/curl {mib_s(big_mount) / mib_s(big_curl):.2f}), best of 3", flush=True)
    print(f"BENCH 1 KiB object, median of 20: S3 mount {med(small_mount):.1f} ms (re-signed), "
          f"curl through the proxy {med(small_curl):.1f} ms (presigned, not re-signed)", flush=True)
    client.delete_sandbox(sb.name)
    created.discard(sb.name)


BENCHES = [bench_bucket_mount_read]


WS_CLIENT = r"""
import base64, json, os, socket, ssl, struct, sys
host = sys.argv[1]
ctx = ssl.create_default_context(cafile="/etc/ssl/certs/ca-certificates.crt")
s = ctx.wrap_socket(socket.create_connection((host, 443), timeout=30), server_hostname=host)
key = base64.b64encode(os.urandom(16)).decode()
s.sendall((f"GET /ws HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
           f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n").encode())
buf = b""
while b"\r\n\r\n" not in buf:
    buf += s.recv(4096)
head, buf = buf.split(b"\r\n\r\n", 1)
def read(n):
    global buf
    while len(buf) < n:
        buf += s.recv(4096)
    out, buf = buf[:n], buf[n:]
    return out
def recv():
    b0, b1 = read(2)
    n = b1 & 0x7F
    if n == 126:
        n = struct.unpack(">H", read(2))[0]
    return read(n).decode()
def send(text, opcode=1):
    data, mask = text.encode(), os.urandom(4)
    s.sendall(bytes([0x80 | opcode, 0x80 | len(data)]) + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data)))
first = json.loads(recv())
send("hello over a websocket")
echo = recv()
send("", 8)
print(json.dumps({"status": head.split(b"\r\n")[0].decode(), "handshake": first["headers"], "echo": echo}))
"""


def test_websocket_through_an_intercepted_connection_gets_the_rules_headers():
    # A header rule on ws.test: the proxy intercepts the guest's TLS, adds
    # the rule's header to the WebSocket handshake, and then relays the
    # upgraded connection both ways.
    token = "ws-" + os.urandom(8).hex()
    rule = {"name": "ws", "match_hosts": ["ws.test"], "headers": [{"name": "X-Ws-Token", "type": "opaque", "value": token}]}
    sb = create("net-ws", proxy_config={"rules": [rule]})
    sb.write("/tmp/ws.py", WS_CLIENT.encode())
    r = run(sb, "python3 /tmp/ws.py ws.test")
    check(r.exit_code == 0, f"the WebSocket client: {r.stderr[-400:]!r}")
    got = json.loads(r.stdout)
    check(got["status"].startswith("HTTP/1.1 101"), f"switched protocols: {got}")
    check(got["handshake"].get("x-ws-token") == token, f"the rule's header on the handshake: {got['handshake']}")
    check(got["echo"] == "hello over a websocket", f"messages relayed both ways: {got}")
    client.delete_sandbox(sb.name)
    created.discard(sb.name)


def test_access_delegation_calls_the_api_as_the_creator_within_its_grant():
    sb = create("net-deleg", access_delegation={"mode": "EXPLICIT", "permissions": ["sandboxes:read"]})
    check(sb.name, "created")
    status, body = raw("GET", f"/boxes/{sb.name}")
    check(body.get("access_delegation") == {"mode": "EXPLICIT", "permissions": ["sandboxes:read"]}, f"reported as requested: {body.get('access_delegation')}")
    r = run(sb, 'echo $LANGSMITH_ENDPOINT; curl -sS -w "\n%{http_code}" "$LANGSMITH_ENDPOINT/api/v2/sandboxes/boxes?limit=100" -H "X-Api-Key: $LANGSMITH_API_KEY"')
    lines = r.stdout.strip().split("\n")
    check(lines[0] == "http://api.hearth.internal", f"the endpoint the proxy serves: {lines[0]}")
    check(lines[-1] == "200" and sb.name in r.stdout, f"sandboxes:read is granted: {r.stdout[-300:]}")
    # Not granted, though the creator holds them: create and delete.
    r = run(sb, 'curl -sS -o /dev/null -w "%{http_code}" -X POST "$LANGSMITH_ENDPOINT/api/v2/sandboxes/boxes" -H "Content-Type: application/json" -d "{}"')
    check(r.stdout.strip() == "403", f"sandboxes:create is not granted: {r.stdout}")
    r = run(sb, f'curl -sS -o /dev/null -w "%{{http_code}}" -X DELETE "$LANGSMITH_ENDPOINT/api/v2/sandboxes/boxes/{sb.name}"')
    check(r.stdout.strip() == "403", f"sandboxes:delete is not granted: {r.stdout}")
    # A sandbox without a delegation reaches nothing there.
    other = state["open"]
    r = run(other, 'curl -sS -w "\n%{http_code}" http://api.hearth.internal/api/v2/sandboxes/boxes')
    check(r.stdout.strip().endswith("403") and "without access_delegation" in r.stdout, f"no delegation, no access: {r.stdout}")
    client.delete_sandbox(sb.name)
    created.discard(sb.name)


def test_metrics_count_each_sandbox_traffic():
    status, text = raw("GET", "", api="/metrics")
    text = text if isinstance(text, str) else json.dumps(text)
    sb = state["open"]
    lines = [l for l in text.splitlines() if sb.id in l and l.startswith("hearth_sandbox_egress")]
    log("\n    ".join(lines[:8]))
    got = {l.split("{")[0]: float(l.rsplit(" ", 1)[1]) for l in lines}
    check(got.get("hearth_sandbox_egress_bytes_in_total", 0) > 0, f"bytes in counted: {got}")
    check(got.get("hearth_sandbox_egress_bytes_out_total", 0) > 0, f"bytes out counted: {got}")
    check(got.get("hearth_sandbox_egress_connections_refused_total", 0) > 0, f"refusals counted: {got}")
    check(got.get("hearth_sandbox_egress_connections_allowed_total", 0) > 0, f"connections counted: {got}")


TESTS = [
    test_names_resolve_through_hearth_dns_and_both_proxy_paths_work,
    test_pip_install_from_the_test_index,
    test_other_dns_servers_private_addresses_and_the_host_are_unreachable,
    test_sandboxes_cannot_reach_each_other,
    test_allow_list_then_deny_list_applied_live,
    test_header_rule_with_a_workspace_secret_never_enters_the_guest,
    test_e2b_network_rules_inject_headers_and_update_live,
    test_callbacks_fail_closed_and_cache_their_headers,
    test_gcp_rule_sets_tokens_minted_from_the_service_account,
    test_access_delegation_calls_the_api_as_the_creator_within_its_grant,
    test_bucket_mounts_s3_and_gcs_through_the_signing_proxy,
    test_websocket_through_an_intercepted_connection_gets_the_rules_headers,
    test_git_mount_clones_a_private_repository_and_follows_its_branch,
    test_metrics_count_each_sandbox_traffic,
]


def main(argv):
    only = set(argv[1:])
    failed = 0
    for t in TESTS + BENCHES:
        if t in BENCHES and t.__name__ not in only:
            continue
        if only and t.__name__ not in only:
            continue
        started = time.monotonic()
        print(f"RUN  {t.__name__}", flush=True)
        try:
            t()
            print(f"PASS {t.__name__} ({time.monotonic() - started:.1f}s)", flush=True)
        except Exception:
            failed += 1
            traceback.print_exc()
            print(f"FAIL {t.__name__} ({time.monotonic() - started:.1f}s)", flush=True)
    for name in list(created):
        try:
            client.delete_sandbox(name)
        except Exception as e:
            print(f"cleanup {name}: {e}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
