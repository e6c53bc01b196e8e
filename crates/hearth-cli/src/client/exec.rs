//! `hearth exec` and `hearth console`: LangSmith's exec WebSocket
//! (`{dataplane_url}/execute/ws`).
//!
//! The client sends `execute` (with a fresh `command_id`, which makes it
//! idempotent), then `input`/`close_stdin`/`kill`, and Hearth's `resize`
//! for a PTY. Output arrives as `stdout`/`stderr` frames with byte offsets;
//! if the socket drops, the client reattaches with `reconnect` from the
//! offsets it has and skips what it already wrote.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use clap::Args;
use futures_util::{SinkExt, StreamExt};
use hearth_api::exec::{ClientFrame, ExecErrorType, ExecuteFrame, ServerFrame};
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message;

use super::http::{Api, Target};
use super::term;
use super::ws::{self, Ws};

/// Exit code for a command that hit its `--timeout` (as coreutils' timeout).
pub const TIMEOUT_EXIT: u8 = 124;
/// Consecutive reattach attempts before giving up.
const MAX_RETRIES: u32 = 5;
/// Bytes of stdin per `input` frame.
const STDIN_CHUNK: usize = 32 * 1024;

#[derive(Args, Debug)]
pub struct ExecArgs {
    /// Sandbox name.
    pub name: String,
    /// Working directory of the command.
    #[arg(long)]
    pub cwd: Option<String>,
    /// Environment variable for the command (repeatable).
    #[arg(long = "env", value_name = "K=V", value_parser = parse_env)]
    pub env: Vec<(String, String)>,
    /// Kill the command after this many seconds (0 = no limit); exit code 124.
    #[arg(long, value_name = "S", default_value_t = 0)]
    pub timeout: u64,
    /// Shell that runs the command (default: the server's, bash or sh).
    #[arg(long)]
    pub shell: Option<String>,
    /// Do not forward stdin (the command reads EOF).
    #[arg(short = 'n', long)]
    pub no_stdin: bool,
    /// The command. One argument is a shell command line (`'echo hi; exit 3'`);
    /// several are quoted and joined.
    #[arg(trailing_var_arg = true, required = true, num_args = 1.., value_name = "CMD")]
    pub command: Vec<String>,
}

#[derive(Args, Debug)]
pub struct ConsoleArgs {
    /// Sandbox name.
    pub name: String,
    /// Shell to start (default: /bin/bash if the sandbox has it, else /bin/sh).
    #[arg(long)]
    pub shell: Option<String>,
}

fn parse_env(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_owned(), v.to_owned())),
        _ => Err(format!("{s:?} is not K=V")),
    }
}

/// Quotes a word for a POSIX shell unless it needs none.
pub fn shell_quote(s: &str) -> String {
    let plain = !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./=:,+@%^".contains(&b));
    if plain {
        s.to_owned()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// One argument is a command line as is; several are an argv to quote.
pub fn command_line(args: &[String]) -> String {
    if args.len() == 1 {
        args[0].clone()
    } else {
        args.iter()
            .map(|a| shell_quote(a))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// How a command ended.
enum Outcome {
    Exit(i32),
    Timeout(String),
    Interrupted,
}

/// A shell exit status as a process exit code.
fn exit_byte(code: i32) -> u8 {
    u8::try_from(code).unwrap_or(1)
}

pub async fn exec(api: &Api, a: ExecArgs) -> anyhow::Result<u8> {
    let dp = api.dataplane(&a.name).await?;
    let forward_stdin = !a.no_stdin && !term::is_tty(0);
    let mut frame = ExecuteFrame::new(command_line(&a.command));
    frame.timeout_seconds = i64::try_from(a.timeout).context("--timeout is too large")?;
    frame.cwd = a.cwd;
    if !a.env.is_empty() {
        frame.env = Some(a.env.into_iter().collect::<BTreeMap<_, _>>());
    }
    frame.close_stdin = !forward_stdin;
    let frame = execute_json(frame, a.shell)?;
    let stdin = forward_stdin.then(stdin_reader);
    let outcome = session(api, &dp, frame, stdin, false)
        .await
        .with_context(|| format!("exec in {:?}", a.name))?;
    Ok(match outcome {
        Outcome::Exit(code) => exit_byte(code),
        Outcome::Timeout(msg) => {
            eprintln!("hearth: {msg}");
            TIMEOUT_EXIT
        }
        Outcome::Interrupted => 130,
    })
}

pub async fn console(api: &Api, a: ConsoleArgs) -> anyhow::Result<u8> {
    if !term::is_tty(0) || !term::is_tty(1) {
        bail!(
            "console needs a terminal on stdin and stdout; \
             for non-interactive use: hearth exec {} -- CMD",
            a.name
        );
    }
    let dp = api.dataplane(&a.name).await?;
    let command = match &a.shell {
        Some(sh) => format!("exec {} -l", shell_quote(sh)),
        None => "if [ -x /bin/bash ]; then exec /bin/bash -l; else exec /bin/sh -l; fi".into(),
    };
    let mut frame = ExecuteFrame::new(command);
    frame.timeout_seconds = 0;
    frame.pty = true;
    frame.kill_on_disconnect = true;
    let term_name = std::env::var("TERM")
        .ok()
        .filter(|t| !t.is_empty())
        .unwrap_or_else(|| "xterm-256color".into());
    frame.env = Some(BTreeMap::from([("TERM".to_owned(), term_name)]));
    let frame = execute_json(frame, Some("/bin/sh".into()))?;
    let raw = term::RawMode::enable(0).context("put the terminal in raw mode")?;
    let outcome = session(api, &dp, frame, Some(stdin_reader()), true).await;
    drop(raw);
    match outcome.with_context(|| format!("console of {:?}", a.name))? {
        Outcome::Exit(code) => Ok(exit_byte(code)),
        Outcome::Timeout(msg) => bail!("{msg}"),
        Outcome::Interrupted => Ok(130),
    }
}

/// The `execute` frame as JSON, with `shell` left out unless chosen (the
/// server then picks bash, or sh where there is no bash).
fn execute_json(mut frame: ExecuteFrame, shell: Option<String>) -> anyhow::Result<Value> {
    frame.command_id = Some(uuid::Uuid::now_v7().simple().to_string());
    let chosen = shell.is_some();
    if let Some(sh) = shell {
        frame.shell = sh;
    }
    let mut v = serde_json::to_value(ClientFrame::Execute(frame))?;
    if !chosen {
        if let Some(o) = v.as_object_mut() {
            o.remove("shell");
        }
    }
    Ok(v)
}

/// Reads our stdin on a plain thread (a blocked read must not keep the
/// process from exiting); the channel closes at EOF.
fn stdin_reader() -> mpsc::Receiver<Vec<u8>> {
    let (tx, rx) = mpsc::channel(8);
    std::thread::spawn(move || {
        let mut stdin = std::io::stdin().lock();
        let mut buf = vec![0u8; STDIN_CHUNK];
        loop {
            match stdin.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    if tx.blocking_send(buf[..n].to_vec()).is_err() {
                        break;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => break,
            }
        }
    });
    rx
}

/// Turns stdin bytes into frames: `input` text while they are UTF-8 (a
/// character split across reads waits for its end), Hearth's raw binary
/// frame for anything else.
#[derive(Default)]
struct InputEncoder {
    pending: Vec<u8>,
}

impl InputEncoder {
    fn push(&mut self, data: &[u8]) -> Option<Message> {
        let mut buf = std::mem::take(&mut self.pending);
        buf.extend_from_slice(data);
        match std::str::from_utf8(&buf) {
            Ok(_) => {}
            Err(e) if e.error_len().is_none() => {
                // An incomplete character at the end: keep it for later.
                self.pending = buf.split_off(e.valid_up_to());
            }
            Err(_) => return Some(Message::binary(buf)),
        }
        if buf.is_empty() {
            return None;
        }
        let data = String::from_utf8(buf).ok()?;
        Some(client_frame(&ClientFrame::Input { data }))
    }

    fn finish(&mut self) -> Option<Message> {
        (!self.pending.is_empty()).then(|| Message::binary(std::mem::take(&mut self.pending)))
    }
}

fn client_frame(f: &ClientFrame) -> Message {
    Message::text(serde_json::to_string(f).unwrap_or_default())
}

fn resize_frame() -> Option<Message> {
    let (rows, cols) = term::window_size(0).or_else(|| term::window_size(1))?;
    Some(Message::text(
        json!({"type": "resize", "rows": rows, "cols": cols}).to_string(),
    ))
}

/// A server frame, read leniently (other servers may omit `pid` or send
/// error types Hearth does not know).
enum Frame {
    Started,
    Output {
        stream: usize,
        offset: u64,
        data: String,
    },
    Exit(i32),
    Error {
        timeout: bool,
        message: String,
    },
    Other,
}

fn parse_frame(text: &str) -> Frame {
    match serde_json::from_str::<ServerFrame>(text) {
        Ok(ServerFrame::Started { .. }) => return Frame::Started,
        Ok(ServerFrame::Stdout(o)) => {
            return Frame::Output {
                stream: 0,
                offset: o.offset,
                data: o.data,
            }
        }
        Ok(ServerFrame::Stderr(o)) => {
            return Frame::Output {
                stream: 1,
                offset: o.offset,
                data: o.data,
            }
        }
        Ok(ServerFrame::Exit { exit_code }) => return Frame::Exit(exit_code),
        Ok(ServerFrame::Error { error_type, error }) => {
            return Frame::Error {
                timeout: error_type == ExecErrorType::CommandTimeout,
                message: error,
            }
        }
        Err(_) => {}
    }
    let Ok(v) = serde_json::from_str::<Value>(text) else {
        return Frame::Other;
    };
    let s = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or_default();
    match s("type") {
        "started" => Frame::Started,
        t @ ("stdout" | "stderr") => Frame::Output {
            stream: usize::from(t == "stderr"),
            offset: v.get("offset").and_then(Value::as_u64).unwrap_or(0),
            data: s("data").to_owned(),
        },
        "exit" => Frame::Exit(
            v.get("exit_code")
                .and_then(Value::as_i64)
                .and_then(|c| i32::try_from(c).ok())
                .unwrap_or(-1),
        ),
        "error" => Frame::Error {
            timeout: s("error_type") == "CommandTimeout",
            message: s("error").to_owned(),
        },
        _ => Frame::Other,
    }
}

/// The part of a chunk not written yet (a replay after a reattach may
/// repeat bytes we have), advancing the stream's cursor.
fn fresh<'a>(offset: u64, bytes: &'a [u8], have: &mut u64) -> &'a [u8] {
    let skip = have.saturating_sub(offset).min(bytes.len() as u64) as usize;
    *have = (*have).max(offset + bytes.len() as u64);
    &bytes[skip..]
}

fn write_output(stream: usize, offset: u64, data: &str, have: &mut [u64; 2]) -> anyhow::Result<()> {
    let out = fresh(offset, data.as_bytes(), &mut have[stream]);
    if out.is_empty() {
        return Ok(());
    }
    if stream == 0 {
        let mut w = std::io::stdout().lock();
        w.write_all(out)
            .and_then(|()| w.flush())
            .context("write stdout")
    } else {
        let mut w = std::io::stderr().lock();
        w.write_all(out)
            .and_then(|()| w.flush())
            .context("write stderr")
    }
}

/// Runs one command to its end over the exec WebSocket.
async fn session(
    api: &Api,
    dp: &Target,
    execute: Value,
    mut stdin: Option<mpsc::Receiver<Vec<u8>>>,
    pty: bool,
) -> anyhow::Result<Outcome> {
    let command_id = execute["command_id"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let mut ws = open(api, dp, Message::text(execute.to_string()), pty).await?;
    let mut started = false;
    let mut have = [0u64; 2];
    let mut retries = 0u32;
    let mut encoder = InputEncoder::default();
    let mut winch = if pty {
        Some(
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::window_change())
                .context("watch window size changes")?,
        )
    } else {
        None
    };
    let mut sigint = if pty {
        None
    } else {
        Some(
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
                .context("watch Ctrl-C")?,
        )
    };
    let mut interrupts = 0u32;
    loop {
        tokio::select! {
            msg = ws.next() => {
                let text = match msg {
                    Some(Ok(Message::Text(t))) => t.as_str().to_owned(),
                    Some(Ok(Message::Binary(b))) => String::from_utf8_lossy(&b).into_owned(),
                    Some(Ok(_)) => continue,
                    Some(Err(_)) | None => {
                        // The socket ended before the command did: reattach.
                        retries += 1;
                        if retries > MAX_RETRIES {
                            bail!("the connection to the sandbox keeps dropping");
                        }
                        tokio::time::sleep(Duration::from_millis(500 << (retries - 1))).await;
                        let first = if started {
                            json!({"type": "reconnect", "command_id": command_id,
                                   "stdout_offset": have[0], "stderr_offset": have[1]})
                        } else {
                            execute.clone()
                        };
                        ws = open(api, dp, Message::text(first.to_string()), pty).await?;
                        continue;
                    }
                };
                match parse_frame(&text) {
                    Frame::Started => {
                        started = true;
                        retries = 0;
                    }
                    Frame::Output { stream, offset, data } => {
                        retries = 0;
                        write_output(stream, offset, &data, &mut have)?;
                    }
                    Frame::Exit(code) => {
                        close(&mut ws).await;
                        return Ok(Outcome::Exit(code));
                    }
                    Frame::Error { timeout: true, message } => {
                        close(&mut ws).await;
                        return Ok(Outcome::Timeout(if message.is_empty() {
                            "the command timed out".into()
                        } else {
                            message
                        }));
                    }
                    Frame::Error { message, .. } => {
                        close(&mut ws).await;
                        return Err(anyhow!(if message.is_empty() {
                            "the command failed".to_owned()
                        } else {
                            message
                        }));
                    }
                    Frame::Other => {}
                }
            }
            chunk = recv(&mut stdin) => {
                let frame = match chunk {
                    Some(data) => encoder.push(&data),
                    None => {
                        stdin = None;
                        if let Some(rest) = encoder.finish() {
                            let _ = ws.send(rest).await;
                        }
                        Some(client_frame(&ClientFrame::CloseStdin))
                    }
                };
                if let Some(f) = frame {
                    // A failed send shows up as the socket ending.
                    let _ = ws.send(f).await;
                }
            }
            _ = next_signal(&mut winch) => {
                if let Some(f) = resize_frame() {
                    let _ = ws.send(f).await;
                }
            }
            _ = next_signal(&mut sigint) => {
                interrupts += 1;
                if interrupts > 1 {
                    return Ok(Outcome::Interrupted);
                }
                eprintln!("hearth: killing the command (Ctrl-C again to leave it)");
                let _ = ws.send(client_frame(&ClientFrame::Kill)).await;
            }
        }
    }
}

/// Opens the socket and sends the first frame (plus the window size).
async fn open(api: &Api, dp: &Target, first: Message, pty: bool) -> anyhow::Result<Ws> {
    let mut ws = ws::connect(api, dp, "/execute/ws").await?;
    ws.send(first).await.context("send the command")?;
    if pty {
        if let Some(f) = resize_frame() {
            ws.send(f).await.context("send the window size")?;
        }
    }
    Ok(ws)
}

async fn close(ws: &mut Ws) {
    let _ = tokio::time::timeout(Duration::from_millis(200), ws.close(None)).await;
}

async fn recv(rx: &mut Option<mpsc::Receiver<Vec<u8>>>) -> Option<Vec<u8>> {
    match rx {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

async fn next_signal(s: &mut Option<tokio::signal::unix::Signal>) {
    match s {
        Some(s) => {
            s.recv().await;
        }
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_lines() {
        assert_eq!(command_line(&["echo hi; exit 3".into()]), "echo hi; exit 3");
        assert_eq!(
            command_line(&["sh".into(), "-c".into(), "nc -l &".into(), "it's".into()]),
            r"sh -c 'nc -l &' 'it'\''s'"
        );
        assert_eq!(command_line(&["a".into(), "".into()]), "a ''");
    }

    #[test]
    fn stdin_frames_keep_characters_whole() {
        let mut e = InputEncoder::default();
        let euro = "€".as_bytes();
        assert!(e.push(&euro[..1]).is_none());
        let m = e.push(&euro[1..]).unwrap();
        assert_eq!(m.to_text().unwrap(), r#"{"type":"input","data":"€"}"#);
        assert!(matches!(e.push(&[0xff, b'a']), Some(Message::Binary(_))));
        assert!(e.finish().is_none());
    }

    #[test]
    fn replayed_output_is_written_once() {
        let mut have = 0;
        assert_eq!(fresh(0, b"hello", &mut have), b"hello");
        assert_eq!(fresh(3, b"lo world", &mut have), b" world");
        assert_eq!(fresh(0, b"hello", &mut have), b"");
        assert_eq!(have, 11);
        // A gap (output the server no longer holds) is written as is.
        assert_eq!(fresh(20, b"x", &mut have), b"x");
        assert_eq!(have, 21);
    }

    #[test]
    fn frames_parse_leniently() {
        assert!(matches!(
            parse_frame(r#"{"type":"started","command_id":"x"}"#),
            Frame::Started
        ));
        assert!(matches!(
            parse_frame(r#"{"type":"error","error_type":"CommandTimeout","error":"t"}"#),
            Frame::Error { timeout: true, .. }
        ));
        assert!(matches!(
            parse_frame(r#"{"type":"error","error_type":"Weird","error":"t"}"#),
            Frame::Error { timeout: false, .. }
        ));
        assert!(matches!(
            parse_frame(r#"{"type":"exit","exit_code":3}"#),
            Frame::Exit(3)
        ));
        assert!(matches!(parse_frame(r#"{"type":"ping"}"#), Frame::Other));
    }
}
