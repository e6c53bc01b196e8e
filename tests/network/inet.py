#!/usr/bin/env python3
"""A test "internet" for Hearth's network tests: run inside a network
namespace the test creates (never on a real network).

Serves, on every address of the namespace:
  :80 HTTP and :443 HTTPS (certificate for every test name, signed by the
  test CA) with
    GET  /echo            JSON {host, path, headers} of the request as received
    POST /echo            the same, with the body
    GET  /simple/, /simple/hearthdemo/   a PyPI "simple" index
    GET  /packages/hearthdemo-1.0-py3-none-any.whl   a tiny wheel built here
    GET  /bytes?mib=N     N MiB of zeros (throughput benchmark)
    POST /token           an OAuth token endpoint: {"access_token": "ya29.inet-<n>"}
    POST /callback/ok     {"headers": {"x-callback": "from-callback"}}
    POST /callback/fail   500
    GET  /ws              a WebSocket: first a text message with the
                          handshake's headers (JSON), then each message echoed
    storage.googleapis.com's JSON API (/storage/v1/, /upload/storage/v1/,
      /download/storage/v1/): forwarded to gcp-storage-emulator on
      127.0.0.1:<--gcs> (buckets.py) when the request carries a token
      minted by /token (401 without), its URLs answered as
      https://storage.googleapis.com
  UDP :53 a DNS "resolver" that answers every query with 203.0.113.7
  (sandboxes must never reach it: only Hearth's DNS is allowed).

Every request is appended as one JSON line to <dir>/requests.log (callback
calls too), so the test can count what reached the upstream. Prints READY
once listening.
"""

import argparse
import base64
import hashlib
import http.client
import http.server
import io
import json
import os
import socket
import socketserver
import ssl
import struct
import sys
import threading
import zipfile

LOCK = threading.Lock()
STATE = {}


def wheel_bytes():
    files = {
        "hearthdemo/__init__.py": b"VALUE = 'hearthdemo-from-the-test-index'\n",
        "hearthdemo-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: hearthdemo\nVersion: 1.0\n",
        "hearthdemo-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: hearth-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append("hearthdemo-1.0.dist-info/RECORD,,")
    files["hearthdemo-1.0.dist-info/RECORD"] = ("\n".join(record) + "\n").encode()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
    return buf.getvalue()


WHEEL = wheel_bytes()
WHEEL_NAME = "hearthdemo-1.0-py3-none-any.whl"
WHEEL_SHA = hashlib.sha256(WHEEL).hexdigest()


GCS_PATHS = ("/storage/v1/", "/upload/storage/v1/", "/download/storage/v1/")
# Hop-by-hop headers, and what the forwarder sets itself.
NOT_FORWARDED = {"host", "authorization", "connection", "transfer-encoding", "content-length",
                 "keep-alive", "accept-encoding", "server", "date"}


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def body(self):
        """The request's body, sent with a length or chunked."""
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            out = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return out
                out += self.rfile.read(size)
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def is_gcs(self):
        host = self.headers.get("Host", "").split(":")[0]
        return ARGS.gcs and host == "storage.googleapis.com" and self.path.startswith(GCS_PATHS)

    def gcs(self, body):
        """Google Cloud Storage: the emulator, behind the tokens /token mints."""
        if not self.headers.get("Authorization", "").startswith("Bearer ya29.inet-"):
            self.send(401, json.dumps({"error": {"code": 401, "message": "no access token"}}).encode())
            return
        conn = http.client.HTTPConnection("127.0.0.1", ARGS.gcs, timeout=120)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in NOT_FORWARDED}
        if body or self.command in ("POST", "PUT", "PATCH"):
            headers["Content-Length"] = str(len(body))
        conn.request(self.command, self.path, body=body or None, headers=headers)
        r = conn.getresponse()
        data = r.read().replace(f"http://127.0.0.1:{ARGS.gcs}".encode(), b"https://storage.googleapis.com")
        conn.close()
        self.send_response(r.status)
        for k, v in r.getheaders():
            if k.lower() not in NOT_FORWARDED:
                self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def do_PUT(self):
        body = self.body()
        self.record(body)
        if self.is_gcs():
            self.gcs(body)
        else:
            self.send(404, b'{"error": "not found"}')

    do_PATCH = do_PUT

    def do_DELETE(self):
        self.record()
        if self.is_gcs():
            self.gcs(b"")
        else:
            self.send(404, b'{"error": "not found"}')

    def do_HEAD(self):
        self.record()
        if self.is_gcs():
            self.gcs(b"")
        else:
            self.send(404, b"")

    def log_message(self, *args):
        pass

    def record(self, body=None):
        entry = {
            "method": self.command,
            "host": self.headers.get("Host", ""),
            "path": self.path,
            "tls": isinstance(self.connection, ssl.SSLSocket),
            "headers": {k.lower(): v for k, v in self.headers.items()},
        }
        if body is not None:
            entry["body"] = body.decode(errors="replace")
        with LOCK:
            with open(os.path.join(ARGS.dir, "requests.log"), "a") as f:
                f.write(json.dumps(entry) + "\n")
        return entry

    def send(self, code, body, ctype="application/json"):
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        entry = self.record()
        path = self.path.split("?")[0]
        if self.is_gcs():
            self.gcs(b"")
        elif path == "/ws" and self.headers.get("Upgrade", "").lower() == "websocket":
            self.websocket(entry)
        elif path == "/echo":
            self.send(200, json.dumps(entry).encode())
        elif path in ("/simple", "/simple/"):
            self.send(200, b'<html><body><a href="hearthdemo/">hearthdemo</a></body></html>', "text/html")
        elif path in ("/simple/hearthdemo", "/simple/hearthdemo/"):
            body = f'<html><body><a href="/packages/{WHEEL_NAME}#sha256={WHEEL_SHA}">{WHEEL_NAME}</a></body></html>'
            self.send(200, body.encode(), "text/html")
        elif path == f"/packages/{WHEEL_NAME}":
            self.send(200, WHEEL, "application/octet-stream")
        elif path.startswith("/git/"):
            self.git(path)
        elif path == "/bytes":
            mib = int(self.path.split("mib=")[1]) if "mib=" in self.path else 1
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(mib << 20))
            self.end_headers()
            chunk = b"\0" * (1 << 20)
            for _ in range(mib):
                self.wfile.write(chunk)
        else:
            self.send(404, b'{"error": "not found"}')

    def websocket(self, entry):
        """RFC 6455, text messages only: the handshake's headers, then an
        echo of each message until the client closes."""
        key = self.headers.get("Sec-WebSocket-Key", "")
        accept = base64.b64encode(hashlib.sha1((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest()).decode()
        self.send_response(101)
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", accept)
        self.end_headers()
        self.wfile.flush()
        self.close_connection = True

        def send(opcode, payload):
            head = bytes([0x80 | opcode])
            n = len(payload)
            if n < 126:
                head += bytes([n])
            elif n < 65536:
                head += bytes([126]) + struct.pack(">H", n)
            else:
                head += bytes([127]) + struct.pack(">Q", n)
            self.wfile.write(head + payload)
            self.wfile.flush()

        send(1, json.dumps({"headers": entry["headers"]}).encode())
        while True:
            head = self.rfile.read(2)
            if len(head) < 2:
                return
            opcode, n = head[0] & 0x0F, head[1] & 0x7F
            if n == 126:
                n = struct.unpack(">H", self.rfile.read(2))[0]
            elif n == 127:
                n = struct.unpack(">Q", self.rfile.read(8))[0]
            mask = self.rfile.read(4) if head[1] & 0x80 else b"\0\0\0\0"
            payload = bytes(b ^ mask[i % 4] for i, b in enumerate(self.rfile.read(n)))
            if opcode == 8:
                send(8, payload[:2])
                return
            if opcode == 1:
                send(1, payload)

    def git(self, path):
        """A private git repository over git's dumb HTTP: the files under
        <dir>/git, to a request that carries the token in <dir>/git-token."""
        try:
            with open(os.path.join(ARGS.dir, "git-token")) as f:
                token = f.read().strip()
        except FileNotFoundError:
            token = None
        if not token or self.headers.get("X-Git-Token") != token:
            self.send(403, b"no token\n", "text/plain")
            return
        root = os.path.realpath(os.path.join(ARGS.dir, "git"))
        file = os.path.realpath(os.path.join(root, path[len("/git/"):]))
        if not file.startswith(root + os.sep) or not os.path.isfile(file):
            self.send(404, b"not found\n", "text/plain")
            return
        with open(file, "rb") as f:
            self.send(200, f.read(), "application/octet-stream")

    def do_POST(self):
        body = self.body()
        entry = self.record(body if len(body) < 65536 else body[:65536])
        path = self.path.split("?")[0]
        if self.is_gcs():
            self.gcs(body)
        elif path == "/echo":
            self.send(200, json.dumps(entry).encode())
        elif path == "/token":
            # An OAuth token endpoint (GCP's JWT-bearer grant); the test
            # checks the assertion it recorded.
            with LOCK:
                STATE["tokens"] = STATE.get("tokens", 0) + 1
                n = STATE["tokens"]
            self.send(200, json.dumps({"access_token": f"ya29.inet-{n}", "expires_in": 3600, "token_type": "Bearer"}).encode())
        elif path == "/callback/ok":
            self.send(200, json.dumps({"headers": {"x-callback": "from-callback"}}).encode())
        elif self.path == "/callback/fail":
            self.send(500, b'{"error": "callback says no"}')
        else:
            self.send(404, b'{"error": "not found"}')


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True


def dns_server(sock):
    """Answers every A query with 203.0.113.7 (a documentation address)."""
    while True:
        data, peer = sock.recvfrom(512)
        if len(data) < 12:
            continue
        qid = data[:2]
        question = data[12:]
        end = question.find(b"\0")
        if end < 0:
            continue
        q = question[: end + 5]
        header = qid + struct.pack(">HHHHH", 0x8180, 1, 1, 0, 0)
        answer = b"\xc0\x0c" + struct.pack(">HHIH", 1, 1, 60, 4) + socket.inet_aton("203.0.113.7")
        with LOCK:
            with open(os.path.join(ARGS.dir, "dns.log"), "a") as f:
                f.write(json.dumps({"peer": peer[0]}) + "\n")
        sock.sendto(header + q + answer, peer)


def main():
    global ARGS
    p = argparse.ArgumentParser()
    p.add_argument("--dir", required=True)
    p.add_argument("--cert", required=True)
    p.add_argument("--key", required=True)
    p.add_argument("--http-only", type=int, metavar="PORT",
                   help="serve only HTTP on PORT and HTTPS on PORT+1 (the benchmark's bare-TAP server)")
    p.add_argument("--gcs", type=int, metavar="PORT",
                   help="serve storage.googleapis.com from gcp-storage-emulator on 127.0.0.1:PORT")
    ARGS = p.parse_args()
    if ARGS.http_only:
        srv = Server(("0.0.0.0", ARGS.http_only), Handler)
        tls = Server(("0.0.0.0", ARGS.http_only + 1), Handler)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(ARGS.cert, ARGS.key)
        tls.socket = ctx.wrap_socket(tls.socket, server_side=True)
        threading.Thread(target=tls.serve_forever, daemon=True).start()
        print("READY", flush=True)
        srv.serve_forever()
        return
    http_srv = Server(("0.0.0.0", 80), Handler)
    https_srv = Server(("0.0.0.0", 443), Handler)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(ARGS.cert, ARGS.key)
    https_srv.socket = ctx.wrap_socket(https_srv.socket, server_side=True)
    dns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    dns.bind(("0.0.0.0", 53))
    for target in (http_srv.serve_forever, https_srv.serve_forever):
        threading.Thread(target=target, daemon=True).start()
    threading.Thread(target=dns_server, args=(dns,), daemon=True).start()
    print("READY", flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main()
