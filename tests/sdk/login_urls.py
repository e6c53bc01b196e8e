#!/usr/bin/env python3
"""Login-mode service URLs with the unmodified `langsmith` SDK, a browser's
way of signing in (a cookie jar, following redirects), and the SDK's own
`SandboxTokenVerifier` for the user token the service receives.

Driven by `crates/hearth-control/tests/control/login.rs` (a control plane on
a simulated host, whose port 8000 answers with the request it got).

Each service is on a host name of its own (`{port}-{id}.{domain}`,
issue 39): the browser here connects every such name to the control plane's
address, as `*.localhost` or a wildcard DNS name would, and sends what a
browser sends (the Host, its cookies for that host, Origin on a POST).

Environment: LANGSMITH_ENDPOINT, LANGSMITH_API_KEY (every permission in
workspace 1), OTHER_API_KEY (workspace 2), SANDBOX (a ready sandbox of
workspace 1). Prints PASS or raises.
"""

import base64
import http.client
import http.cookiejar
import json
import os
import socket
import urllib.error
import urllib.parse
import urllib.request

from langsmith.sandbox import (
    SandboxClient,
    SandboxTokenVerificationError,
    SandboxTokenVerifier,
)

ENDPOINT = os.environ["LANGSMITH_ENDPOINT"].rstrip("/")
ORIGIN = ENDPOINT
KEY = os.environ["LANGSMITH_API_KEY"]
NAME = os.environ["SANDBOX"]
client = SandboxClient()


def check(cond, msg):
    if not cond:
        raise AssertionError(msg)


def api(method, path, key, body=None):
    req = urllib.request.Request(ORIGIN + path, method=method,
                                 data=None if body is None else json.dumps(body).encode(),
                                 headers={"X-Api-Key": key, "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


_API = urllib.parse.urlsplit(ENDPOINT)


class _Loopback(http.client.HTTPConnection):
    """Any host name, connected to the control plane's address."""

    def connect(self):
        self.sock = socket.create_connection((_API.hostname, _API.port or 80), self.timeout)


class _LoopbackHandler(urllib.request.HTTPHandler):
    def http_open(self, req):
        return self.do_open(_Loopback, req)


class Browser:
    """Cookies kept per host, redirects followed, Origin on a POST: like a
    browser."""

    def __init__(self):
        self.jar = http.cookiejar.CookieJar()
        self.opener = urllib.request.build_opener(
            urllib.request.HTTPCookieProcessor(self.jar), urllib.request.ProxyHandler({}),
            _LoopbackHandler())

    def open(self, url, form=None, origin=None):
        data = None if form is None else urllib.parse.urlencode(form).encode()
        req = urllib.request.Request(url, data=data)
        if data is not None:
            if origin is None:
                parts = urllib.parse.urlsplit(url)
                origin = f"{parts.scheme}://{parts.netloc}"
            if origin:
                req.add_header("Origin", origin)
        try:
            with self.opener.open(req, timeout=30) as r:
                return r.status, r.geturl(), r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.geturl(), e.read().decode()

    def form(self, url):
        """Opens `url` unsigned-in: the sign-in form's URL and fields."""
        status, at, page = self.open(url)
        check(status == 200 and "Sign in to Hearth" in page and "/.hearth/signin" in at,
              f"not signed in: the sign-in form ({status} {at})")
        check(urllib.parse.urlsplit(at).netloc == urllib.parse.urlsplit(url).netloc,
              f"the form is on the service's own origin: {at}")
        nxt = urllib.parse.parse_qs(urllib.parse.urlsplit(at).query)["next"][0]
        csrf = page.split('name="csrf" value="', 1)[1].split('"', 1)[0]
        return at.split("?", 1)[0], {"next": nxt, "csrf": csrf}

    def sign_in(self, url, key, origin=None):
        action, fields = self.form(url)
        return self.open(action, {"api_key": key, **fields}, origin=origin)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


def seen(body):
    """What the simulated service got: {header name: value}."""
    got = json.loads(body)
    return dict(h.split(": ", 1) for h in got["headers"])


def main():
    # A login grant, as the SDK asks for it.
    login = client.service(NAME, 8000, access="workspace")
    url = login.url
    host_name = urllib.parse.urlsplit(url).hostname
    check(login.access == "workspace" and host_name.startswith("8000-") and url.endswith("/"),
          f"the login URL is the port's own origin: {login}")
    # Token mode is refused while the grant is in place.
    try:
        client.service(NAME, 8000)
        raise AssertionError("a token URL on a port with a login grant")
    except AssertionError:
        raise
    except Exception as e:
        check("409" in str(e) or "login" in str(e), f"token mode refused with 409: {e}")

    # A browser signs in with a key of the workspace and reaches the service.
    b = Browser()
    status, at, body = b.sign_in(url, KEY)
    check(status == 200 and at == url, f"back at the service after signing in: {status} {at} {body[:200]}")
    headers = seen(body)
    check("cookie" not in headers, f"the sign-in cookie never reaches the service: {headers}")
    token, host = headers["x-langsmith-user-token"], headers["host"]
    verifier = SandboxTokenVerifier(api_url=ORIGIN, allow_insecure_jwks=True)
    user = verifier.verify_user_token(token, audience=host)
    check(user.subject and user.expires_at, f"the SDK verifies the user token: {user}")
    # Tampered, or presented to another service: refused by the SDK.
    head, claims, sig = token.split(".")
    forged = json.loads(base64.urlsafe_b64decode(claims + "=" * (-len(claims) % 4)))
    forged["sub"] = "someone-else"
    forged_claims = base64.urlsafe_b64encode(json.dumps(forged).encode()).decode().rstrip("=")
    for bad, aud in (
        (f"{head}.{forged_claims}.{sig}", host),
        (token, "8001-" + host.split("-", 1)[1]),
    ):
        try:
            verifier.verify_user_token(bad, audience=aud)
            raise AssertionError(f"accepted: {bad[:40]}… for {aud}")
        except SandboxTokenVerificationError:
            pass
    # A path under the URL, and the query, reach the service as sent.
    status, _, body = b.open(url + "deep/page?q=1")
    check(status == 200 and json.loads(body)["request"] == "GET /deep/page?q=1 HTTP/1.1", f"a path: {body}")
    # Without signing in: the form; with a forged cookie: the form again.
    status, at, _ = Browser().open(url)
    check("/.hearth/signin" in at, f"not signed in: {at}")

    def plant(browser, value, domain):
        browser.jar.set_cookie(http.cookiejar.Cookie(
            0, "hearth_login", value, None, False, domain, domain.startswith("."),
            domain.startswith("."), "/", True, False, None, False, None, None, {}))

    forged_browser = Browser()
    plant(forged_browser, "0190a8c3-0000-7000-8000-000000000000.99999999999.AAAA", host_name)
    status, at, _ = forged_browser.open(url)
    check("/.hearth/signin" in at, f"a forged cookie signs no one in: {at}")
    # A junk cookie planted for the whole domain (a sibling sandbox's page
    # can) signs no one out: every cookie is checked, none wins by order.
    plant(b, "junk.1.AAAA", "." + host_name.split(".", 1)[1])
    status, _, body = b.open(url)
    check(status == 200 and "x-langsmith-user-token" in seen(body), f"a planted cookie signed the user out: {status}")
    # Login CSRF: a form posted from another site, or with no Origin, or
    # without the form's CSRF token, signs no one in.
    for origin, what in (("http://evil.test", "another site"), ("", "no Origin")):
        status, _, body = Browser().sign_in(url, KEY, origin=origin)
        check(status == 403 and "Origin" in body, f"a sign-in from {what}: {status} {body[:200]}")
    action, fields = Browser().form(url)
    status, _, body = Browser().open(action, {"api_key": KEY, **fields})
    check(status == 403 and "CSRF" in body, f"a sign-in without the form's cookie: {status} {body[:200]}")
    # The old login URL on the API's origin only redirects to the service's.
    sandbox_id = host_name.split(".", 1)[0].split("-", 1)[1]
    old = f"{ORIGIN}/services/login/{sandbox_id}/8000/deep?q=1"
    req = urllib.request.Request(old)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirect())
    try:
        opener.open(req, timeout=30)
        raise AssertionError("the old login URL served something")
    except urllib.error.HTTPError as e:
        check(e.code == 308 and e.headers["Location"] == url + "deep?q=1",
              f"the old login URL: {e.code} {e.headers.get('Location')}")
    # A wrong key: 401 and the form.
    status, _, page = Browser().sign_in(url, "hth_not-a-key")
    check(status == 401 and "not an API key" in page, f"a wrong key: {status}")
    # Another workspace's key: 403.
    status, _, body = Browser().sign_in(url, os.environ["OTHER_API_KEY"])
    check(status == 403, f"another workspace is refused: {status} {body[:200]}")
    # restricted: a key of the workspace without sandboxes:read is refused.
    client.service(NAME, 8000, access="restricted")
    runner = api("POST", "/api/v1/api-key", KEY, {"description": "runs commands", "permissions": ["sandboxes:exec"]})
    status, _, _ = Browser().sign_in(url, runner["key"])
    check(status == 403, f"restricted needs sandboxes:read: {status}")
    reader = api("POST", "/api/v1/api-key", KEY, {"description": "reader", "permissions": ["sandboxes:read"]})
    rb = Browser()
    status, _, body = rb.sign_in(url, reader["key"])
    check(status == 200, f"restricted admits sandboxes:read: {status} {body[:200]}")
    user = verifier.verify_user_token(seen(body)["x-langsmith-user-token"], audience=host)
    check(user.name == "reader", f"the token names the key: {user}")
    # Revoking the key signs its browser out at once.
    req = urllib.request.Request(f"{ORIGIN}/api/v1/api-key/{reader['id']}", method="DELETE", headers={"X-Api-Key": KEY})
    urllib.request.urlopen(req, timeout=30).read()
    status, at, _ = rb.open(url)
    check("/.hearth/signin" in at, f"a revoked key is signed out: {status} {at}")
    print("PASS")


if __name__ == "__main__":
    main()
