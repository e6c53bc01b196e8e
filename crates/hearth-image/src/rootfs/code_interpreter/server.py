"""Hearth's code-interpreter server: what `e2b-code-interpreter`'s
`Sandbox.run_code` and its contexts talk to, on port 49999 of a sandbox made
from the `code-interpreter-v1` template. Each context is a Jupyter kernel
(ipykernel, driven with jupyter_client); `python` is the only language.

    POST   /execute               {"code", "context_id", "language", "env_vars"}
                                  -> NDJSON: stdout/stderr lines as they come,
                                     results (execute_result, display_data),
                                     an error with its traceback, and the
                                     execution count
    POST   /contexts              {"language", "cwd"} -> {"id", "language", "cwd"}
    GET    /contexts              -> [context, ...]
    DELETE /contexts/{id}         -> 204
    POST   /contexts/{id}/restart -> 204
    GET    /health                -> 200

Started at boot by /etc/hearth/boot.d/code-interpreter. Written for Hearth;
it speaks the wire the SDK expects, nothing more.
"""

import json
import os
import queue
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from jupyter_client.manager import KernelManager

PORT = 49999
DEFAULT_CWD = "/home/user"
# How long an execution waits for its kernel to start (a boot under
# emulation imports slowly).
KERNEL_READY_TIMEOUT = 180
# How long the server waits for its default kernel before it listens
# anyway (well within the 60 s the guest agent waits for the port).
LISTEN_WAIT = 25
# The largest request body accepted (code and its environment).
MAX_BODY = 16 << 20

# Run in a kernel before its first execution: its `random` seeded again
# from the sandbox's own CRNG. A sandbox claimed from a pool, or made as a
# copy of its host's template, resumes a kernel started in the template,
# whose `random` every such sandbox would share (the same "random"
# numbers in each); the guest's CRNG was reseeded with the sandbox's
# identity before anything ran. A kernel that has run code keeps the state
# that code made (a fork's child continues its parent's, as it does every
# other memory).
RESEED = "import random as __hearth_random\n__hearth_random.seed()\ndel __hearth_random\n"

# Jupyter's MIME types as the SDK's Result fields.
MIME_FIELDS = {
    "text/plain": "text",
    "text/html": "html",
    "text/markdown": "markdown",
    "image/svg+xml": "svg",
    "image/png": "png",
    "image/jpeg": "jpeg",
    "application/pdf": "pdf",
    "text/latex": "latex",
    "application/json": "json",
    "application/javascript": "javascript",
}


def log(*args):
    print(time.strftime("%H:%M:%S"), *args, file=sys.stderr, flush=True)


class Context:
    """One kernel and the lock that runs one execution at a time on it."""

    def __init__(self, cid, language, cwd):
        self.id = cid
        self.language = language
        self.cwd = cwd
        self.lock = threading.Lock()
        self.ready = threading.Event()
        self.failed = None
        self.km = None
        self.kc = None
        # No execution has run in the kernel yet (see RESEED).
        self.fresh = True
        threading.Thread(target=self._start, daemon=True).start()

    def _start(self):
        try:
            os.makedirs(self.cwd, exist_ok=True)
            km = KernelManager(kernel_name="python3")
            km.start_kernel(cwd=self.cwd)
            kc = km.client()
            kc.start_channels()
            kc.wait_for_ready(timeout=KERNEL_READY_TIMEOUT)
            self.km, self.kc = km, kc
            log("context", self.id, "ready in", self.cwd)
        except Exception as e:  # the next execution reports it
            self.failed = f"the kernel did not start: {e!r}"
            log("context", self.id, self.failed)
        finally:
            self.ready.set()

    def wait(self):
        if not self.ready.wait(KERNEL_READY_TIMEOUT):
            raise RuntimeError("the kernel is still starting")
        if self.failed:
            raise RuntimeError(self.failed)

    def json(self):
        return {"id": self.id, "language": self.language, "cwd": self.cwd}

    def restart(self):
        self.wait()
        with self.lock:
            self.km.restart_kernel(now=True)
            self.kc.stop_channels()
            self.kc = self.km.client()
            self.kc.start_channels()
            self.kc.wait_for_ready(timeout=KERNEL_READY_TIMEOUT)
            self.fresh = True

    def shutdown(self):
        try:
            self.wait()
            self.kc.stop_channels()
            self.km.shutdown_kernel(now=True)
        except Exception as e:
            log("context", self.id, "shutdown:", repr(e))

    def run(self, code, env_vars, emit):
        """Runs `code`, calling `emit(event)` for each output as it comes."""
        self.wait()
        with self.lock:
            if self.fresh:
                self._silent(RESEED)
                self.fresh = False
            if env_vars:
                self._silent(
                    "import os as __hearth_os\n"
                    f"__hearth_env = {{k: __hearth_os.environ.get(k) for k in {list(env_vars)!r}}}\n"
                    f"__hearth_os.environ.update({dict(env_vars)!r})\n"
                )
            try:
                self._run(code, emit)
            finally:
                if env_vars:
                    self._silent(
                        "for __k, __v in __hearth_env.items():\n"
                        "    if __v is None: __hearth_os.environ.pop(__k, None)\n"
                        "    else: __hearth_os.environ[__k] = __v\n"
                        "del __hearth_env\n"
                    )

    def _silent(self, code):
        msg_id = self.kc.execute(code, silent=True, store_history=False)
        self._drain(msg_id, lambda _event: None)

    def _run(self, code, emit):
        msg_id = self.kc.execute(code, store_history=True, allow_stdin=False)
        count = self._drain(msg_id, emit)
        if count is not None:
            emit({"type": "number_of_executions", "execution_count": count})

    def _drain(self, msg_id, emit):
        """Forwards the kernel's messages for `msg_id` until it is idle;
        returns the execution count."""
        count = None
        while True:
            try:
                msg = self.kc.get_iopub_msg(timeout=1)
            except queue.Empty:
                if not self.km.is_alive():
                    emit(error_event("KernelDied", "the kernel died", ""))
                    return count
                continue
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            kind = msg["msg_type"]
            content = msg["content"]
            if kind == "status" and content.get("execution_state") == "idle":
                return count
            if kind == "execute_input":
                count = content.get("execution_count")
            elif kind == "stream":
                channel = "stderr" if content.get("name") == "stderr" else "stdout"
                emit({"type": channel, "text": content.get("text", ""),
                      "timestamp": time.time_ns()})
            elif kind in ("execute_result", "display_data"):
                emit(result_event(content.get("data", {}), kind == "execute_result"))
            elif kind == "error":
                emit(error_event(content.get("ename", ""), content.get("evalue", ""),
                                 "\n".join(content.get("traceback", []))))


def result_event(data, main):
    event = {"type": "result", "is_main_result": main}
    extra = {}
    for mime, value in data.items():
        field = MIME_FIELDS.get(mime)
        if field:
            event[field] = value
        else:
            extra[mime] = value
    if extra:
        event["extra"] = extra
    return event


def error_event(name, value, traceback):
    return {"type": "error", "name": name, "value": value, "traceback": traceback}


class Contexts:
    def __init__(self):
        self.lock = threading.Lock()
        self.all = {}
        self.default = self.create("python", DEFAULT_CWD)

    def create(self, language, cwd):
        ctx = Context(str(uuid.uuid4()), language, cwd)
        with self.lock:
            self.all[ctx.id] = ctx
        return ctx

    def get(self, cid):
        with self.lock:
            return self.all.get(cid)

    def remove(self, cid):
        with self.lock:
            ctx = self.all.pop(cid, None)
        if ctx is not None:
            threading.Thread(target=ctx.shutdown, daemon=True).start()
        return ctx is not None

    def list(self):
        with self.lock:
            return [c.json() for c in self.all.values()]


CONTEXTS = None


class Handler(BaseHTTPRequestHandler):
    # HTTP/1.0: an /execute answer streams until the connection closes.
    protocol_version = "HTTP/1.0"
    server_version = "hearth-code-interpreter"

    def log_message(self, fmt, *args):
        log(self.address_string(), fmt % args)

    def _json(self, status, body):
        raw = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def _error(self, status, message):
        self._json(status, {"error": message})

    def _body(self):
        length = int(self.headers.get("content-length") or 0)
        if length > MAX_BODY:
            raise ValueError(f"the body is {length} bytes; at most {MAX_BODY}")
        raw = self.rfile.read(length) if length else b""
        body = json.loads(raw or b"{}")
        if not isinstance(body, dict):
            raise ValueError("the body must be a JSON object")
        return body

    def do_GET(self):
        if self.path == "/health":
            return self._json(200, {"status": "ok"})
        if self.path == "/contexts":
            return self._json(200, CONTEXTS.list())
        self._error(404, f"no route for GET {self.path}")

    def do_DELETE(self):
        parts = self.path.strip("/").split("/")
        if len(parts) == 2 and parts[0] == "contexts":
            if CONTEXTS.remove(parts[1]):
                self.send_response(204)
                self.end_headers()
                return
            return self._error(404, f"no context {parts[1]}")
        self._error(404, f"no route for DELETE {self.path}")

    def do_POST(self):
        try:
            body = self._body()
        except ValueError as e:
            return self._error(400, str(e))
        parts = self.path.strip("/").split("/")
        if self.path == "/execute":
            return self._execute(body)
        if self.path == "/contexts":
            language = body.get("language") or "python"
            if language != "python":
                return self._error(400, f"language {language!r} is not served: python only")
            ctx = CONTEXTS.create(language, body.get("cwd") or DEFAULT_CWD)
            return self._json(200, ctx.json())
        if len(parts) == 3 and parts[0] == "contexts" and parts[2] == "restart":
            ctx = CONTEXTS.get(parts[1])
            if ctx is None:
                return self._error(404, f"no context {parts[1]}")
            try:
                ctx.restart()
            except Exception as e:
                return self._error(500, f"restart failed: {e!r}")
            self.send_response(204)
            self.end_headers()
            return
        self._error(404, f"no route for POST {self.path}")

    def _execute(self, body):
        code = body.get("code")
        if not isinstance(code, str):
            return self._error(400, "code: a string is required")
        cid, language = body.get("context_id"), body.get("language")
        if cid and language:
            return self._error(400, "context_id and language: give one, not both")
        if cid:
            ctx = CONTEXTS.get(cid)
            if ctx is None:
                return self._error(404, f"no context {cid}")
        elif language in (None, "", "python"):
            ctx = CONTEXTS.default
        else:
            return self._error(400, f"language {language!r} is not served: python only")
        env = body.get("env_vars") or {}
        if not isinstance(env, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
            return self._error(400, "env_vars: an object of strings is required")
        try:
            ctx.wait()
        except RuntimeError as e:
            return self._error(503, str(e))
        self.send_response(200)
        self.send_header("content-type", "application/x-ndjson")
        self.end_headers()
        gone = False

        def emit(event):
            nonlocal gone
            if gone:
                return
            try:
                self.wfile.write((json.dumps(event) + "\n").encode())
                self.wfile.flush()
            except OSError:
                # The client left (its timeout, or a kill): stop the code.
                gone = True
                try:
                    ctx.km.interrupt_kernel()
                except Exception as e:
                    log("interrupt:", repr(e))

        ctx.run(code, env, emit)


def main():
    global CONTEXTS
    CONTEXTS = Contexts()
    # Listen once the default kernel runs: the guest agent holds the
    # sandbox's readiness until this port opens (for up to 60 s), so a
    # ready sandbox runs its first code at once. A kernel still starting
    # after LISTEN_WAIT (a loaded host under emulation) or one that failed
    # is waited for, or reported, by the executions: the server listens
    # anyway, before the guest agent stops waiting, so that a ready
    # sandbox always has its server.
    CONTEXTS.default.ready.wait(LISTEN_WAIT)
    server = ThreadingHTTPServer(("0.0.0.0", PORT), Handler)
    server.daemon_threads = True
    log("listening on", PORT)
    server.serve_forever()


if __name__ == "__main__":
    main()
