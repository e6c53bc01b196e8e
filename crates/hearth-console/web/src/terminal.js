// A terminal into a sandbox: xterm.js over the exec WebSocket the SDK uses
// (`/dataplane/{id}/execute/ws`), with a real PTY in the guest. The API key
// travels as a WebSocket subprotocol (`hearth.key.<key>`: a browser cannot
// set headers on a WebSocket); the server answers with `hearth`. A dropped
// connection reconnects to the same command from the last byte received,
// so no output is lost or repeated.

import { Terminal } from "@xterm/xterm";
import { FitAddon } from "@xterm/addon-fit";
import { session } from "./api.js";

const SHELL =
  "if command -v bash >/dev/null 2>&1; then exec bash -l; else exec sh -l; fi";
const utf8 = new TextEncoder();

/**
 * Opens a terminal in `element` for the sandbox whose data plane is at
 * `dataplanePath`; `onState` hears "connecting", "connected",
 * "reconnecting", "exited N" or "error: …". Returns a disposer.
 */
export function openTerminal(element, dataplanePath, onState) {
  const term = new Terminal({
    cursorBlink: true,
    convertEol: false,
    fontFamily: "ui-monospace, SFMono-Regular, Menlo, Consolas, monospace",
    fontSize: 14,
    scrollback: 5000,
    screenReaderMode: false,
    // ANSI colours that keep WCAG AA contrast (4.5:1) on the black
    // background; xterm's defaults (e.g. red #cd3131, blue #2472c8) do not.
    theme: {
      background: "#000000",
      foreground: "#e5e5e5",
      cursor: "#e5e5e5",
      black: "#000000",
      red: "#ff6b6b",
      green: "#4fd66a",
      yellow: "#e5d94b",
      blue: "#78a6ff",
      magenta: "#ee82ee",
      cyan: "#3fd7e0",
      white: "#e5e5e5",
      brightBlack: "#9a9a9a",
      brightRed: "#ff8f8f",
      brightGreen: "#7cf08f",
      brightYellow: "#fff27a",
      brightBlue: "#a3c2ff",
      brightMagenta: "#f5a6f5",
      brightCyan: "#8ef0f5",
      brightWhite: "#ffffff",
    },
  });
  const fit = new FitAddon();
  term.loadAddon(fit);
  term.open(element);
  fit.fit();

  let socket = null;
  let commandId = null;
  let stdoutOffset = 0;
  let stderrOffset = 0;
  let ended = false;
  let disposed = false;
  let retry = null;
  let attempts = 0;

  const url = () => {
    const scheme = location.protocol === "https:" ? "wss:" : "ws:";
    return `${scheme}//${location.host}${dataplanePath}/execute/ws`;
  };

  const send = (frame) => {
    if (socket && socket.readyState === WebSocket.OPEN) socket.send(JSON.stringify(frame));
  };

  const connect = () => {
    onState(commandId ? "reconnecting" : "connecting");
    const ws = new WebSocket(url(), ["hearth", `hearth.key.${session.key() || ""}`]);
    socket = ws;
    ws.onopen = () => {
      if (commandId) {
        ws.send(
          JSON.stringify({
            type: "reconnect",
            command_id: commandId,
            stdout_offset: stdoutOffset,
            stderr_offset: stderrOffset,
          }),
        );
      } else {
        ws.send(
          JSON.stringify({
            type: "execute",
            command: SHELL,
            pty: true,
            timeout_seconds: 0,
            idle_timeout_seconds: 1800,
            kill_on_disconnect: false,
            env: { TERM: "xterm-256color", COLORTERM: "truecolor" },
          }),
        );
      }
    };
    ws.onmessage = (event) => {
      let frame;
      try {
        frame = JSON.parse(event.data);
      } catch (_) {
        return;
      }
      switch (frame.type) {
        case "started":
          commandId = frame.command_id;
          attempts = 0;
          onState("connected");
          send({ type: "resize", rows: term.rows, cols: term.cols });
          break;
        case "stdout":
        case "stderr": {
          const bytes = utf8.encode(frame.data).length;
          if (frame.type === "stdout") stdoutOffset = frame.offset + bytes;
          else stderrOffset = frame.offset + bytes;
          if (commandId) onState("connected");
          attempts = 0;
          term.write(frame.data);
          break;
        }
        case "exit":
          ended = true;
          term.write(`\r\n[the shell exited with status ${frame.exit_code}]\r\n`);
          onState(`exited ${frame.exit_code}`);
          break;
        case "error":
          ended = true;
          term.write(`\r\n[error: ${frame.error}]\r\n`);
          onState(`error: ${frame.error}`);
          break;
        default:
          break;
      }
    };
    ws.onclose = () => {
      if (socket !== ws || disposed || ended) return;
      attempts += 1;
      if (attempts > 20) {
        onState("error: the connection keeps dropping");
        return;
      }
      onState("reconnecting");
      retry = setTimeout(connect, Math.min(250 * attempts, 3000));
    };
  };

  term.onData((data) => send({ type: "input", data }));
  term.onResize(({ rows, cols }) => send({ type: "resize", rows, cols }));
  const observer = new ResizeObserver(() => {
    try {
      fit.fit();
    } catch (_) {
      // hidden element: nothing to fit
    }
  });
  observer.observe(element);
  connect();
  term.focus();

  return {
    terminal: term,
    /** Drops the connection as a network would (the tests use it). */
    drop: () => socket && socket.close(),
    dispose: () => {
      disposed = true;
      clearTimeout(retry);
      observer.disconnect();
      if (socket) socket.close();
      term.dispose();
    },
  };
}
