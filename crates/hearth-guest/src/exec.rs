//! Command sessions with LangSmith's semantics.
//!
//! A session outlives the stream that started it: output goes into a bounded
//! per-channel ring with byte offsets, so a client can drop and re-attach
//! (`command_id` + offsets) and get exactly the bytes it missed, as long as
//! they are still retained. While a client is attached the ring applies
//! backpressure (the command blocks on a full pipe) instead of dropping
//! output, so a slow reader still receives everything, in order. With no
//! client attached the command keeps running and the ring keeps the newest
//! bytes.
//!
//! Every attached stream ends with `exit` or `error`: when the command's
//! main process exits, output is still read until the pipes close or stay
//! quiet for [`EXIT_GRACE`], so a background child that keeps stdout open
//! cannot hold the stream hostage.

use std::collections::{HashMap, VecDeque};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use hearth_guest_proto::{
    encode_output, CommandInfo, ExecErrorType, ExecEvent, ExecInput, ExecRequest, Incoming,
    OpError, OpErrorKind, OutputChannel, PtySize, Reply, Stream, StreamSender, MAX_PAYLOAD,
    OUTPUT_HEADER_LEN,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, watch};

use crate::sys::{self, FdIo, SharedFd};
use crate::{reaper, users};

/// Output retained per channel for reconnects.
const RING_CAPACITY: usize = 8 * 1024 * 1024;
/// With a client attached, stop reading the command once this much output
/// is waiting to be sent.
const HIGH_WATER: u64 = 2 * 1024 * 1024;
/// After the main process exits, how long quiet pipes are still read.
const EXIT_GRACE: Duration = Duration::from_millis(250);
/// Expired command ids remembered to tell "expired" from "never existed".
const EXPIRED_MEMORY: usize = 4096;
const CHUNK: usize = MAX_PAYLOAD - OUTPUT_HEADER_LEN;
/// Linux's limit on one argument or environment string, its NUL included
/// (`MAX_ARG_STRLEN`, 32 pages). A `command` this long cannot be passed as
/// `shell -c command`: it runs as a script instead (see `start`).
const MAX_ARG_STRLEN: usize = 128 * 1024;
/// Linux's cap on all of exec's arguments and environment, strings and
/// pointers: three quarters of `_STK_LIM` (8 MiB), whatever the stack limit.
const MAX_ARG_TOTAL: usize = 6 * 1024 * 1024;
/// Up to this much, exec's arguments fit under the default 8 MiB stack
/// limit (which allows a quarter of it, 2 MiB); past it the child's stack
/// limit is raised.
const DEFAULT_ARG_ROOM: usize = 1536 * 1024;
/// Longest error message sent back (it may quote a client's input).
const MAX_ERROR_MESSAGE: usize = 4096;

struct Ring {
    buf: VecDeque<u8>,
    /// Offset of `buf[0]` in the whole output.
    start: u64,
}

impl Ring {
    fn new() -> Self {
        Self {
            buf: VecDeque::new(),
            start: 0,
        }
    }
    fn end(&self) -> u64 {
        self.start + self.buf.len() as u64
    }
    fn push(&mut self, data: &[u8]) {
        self.buf.extend(data);
        let excess = self.buf.len().saturating_sub(RING_CAPACITY);
        if excess > 0 {
            self.buf.drain(..excess);
            self.start += excess as u64;
        }
    }
    /// Up to `max` bytes from offset `from` (which must be within the ring).
    fn read(&self, from: u64, max: usize) -> Vec<u8> {
        let skip = ((from - self.start) as usize).min(self.buf.len());
        let end = skip.saturating_add(max).min(self.buf.len());
        self.buf.range(skip..end).copied().collect()
    }
}

struct State {
    rings: [Ring; 2],
    exit: Option<(i32, Option<i32>)>,
    pumps_left: u8,
    timed_out: Option<Duration>,
    /// Generation of the attached client; bumps on every attach.
    sub_gen: u64,
    attached: bool,
    cursors: [u64; 2],
    detached_at: Instant,
}

impl State {
    fn outputs_done(&self) -> bool {
        self.exit.is_some() && self.pumps_left == 0
    }

    /// What a reader at `cursors` (stdout, stderr) gets next: the output
    /// from there (output the ring dropped before it was read is lost to
    /// a slow reader), the command's last event once all output is out,
    /// or a wait. Changes nothing: the caller keeps its cursors.
    fn next_step(&self, cursors: [u64; 2]) -> Step {
        for (idx, cursor) in cursors.into_iter().enumerate() {
            let ring = &self.rings[idx];
            let from = cursor.max(ring.start);
            if from < ring.end() {
                let ch = if idx == 0 {
                    OutputChannel::Stdout
                } else {
                    OutputChannel::Stderr
                };
                return Step::Send(ch, from, ring.read(from, CHUNK));
            }
        }
        if !self.outputs_done() {
            return Step::Wait;
        }
        let (exit_code, signal) = self.exit.unwrap_or((0, None));
        Step::Finish(match self.timed_out {
            Some(t) => ExecEvent::Error {
                error_type: ExecErrorType::CommandTimeout,
                message: format!("command timed out after {}s", t.as_secs_f64()),
            },
            None => ExecEvent::Exit { exit_code, signal },
        })
    }
}

enum StdinMsg {
    Data(Bytes),
    Close,
}

pub struct Session {
    id: String,
    pid: u32,
    /// What it was started with ([`Request::Commands`](hearth_guest_proto::Request::Commands)).
    started_with: CommandInfo,
    state: Mutex<State>,
    changed: watch::Sender<u64>,
    stdin: mpsc::UnboundedSender<StdinMsg>,
    pty: Option<Arc<FdIo>>,
    kill_on_disconnect: bool,
}

impl Session {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
    fn bump(&self) {
        self.changed.send_modify(|v| *v = v.wrapping_add(1));
    }
    fn kill(&self, signal: i32) {
        sys::kill_group(self.pid, signal);
    }
    fn detach(&self, gen: u64) {
        let mut st = self.lock();
        if st.sub_gen != gen || !st.attached {
            return;
        }
        st.attached = false;
        st.detached_at = Instant::now();
        let running = st.exit.is_none();
        drop(st);
        self.bump();
        if running && self.kill_on_disconnect {
            self.kill(libc::SIGKILL);
        }
    }
}

#[derive(Default)]
struct Registry {
    sessions: HashMap<String, Arc<Session>>,
    expired: VecDeque<String>,
}

fn registry() -> MutexGuard<'static, Registry> {
    static R: OnceLock<Mutex<Registry>> = OnceLock::new();
    R.get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

pub fn running_count() -> u32 {
    registry()
        .sessions
        .values()
        .filter(|s| s.lock().exit.is_none())
        .count() as u32
}

async fn send_error(stream: &Stream, error_type: ExecErrorType, mut message: String) {
    // A message quoting a huge input must still fit its frame.
    if message.len() > MAX_ERROR_MESSAGE {
        let mut cut = MAX_ERROR_MESSAGE;
        while !message.is_char_boundary(cut) {
            cut -= 1;
        }
        message.truncate(cut);
        message.push('…');
    }
    let _ = stream
        .send_ctl(&ExecEvent::Error {
            error_type,
            message,
        })
        .await;
}

/// `exec`: get-or-create the session for the command id, then attach.
pub async fn handle_exec(stream: Stream, req: ExecRequest) {
    let id = req.command_id.clone().unwrap_or_else(new_command_id);
    if id.is_empty() || id.len() > 256 {
        return send_error(
            &stream,
            ExecErrorType::BadRequest,
            "invalid command_id".into(),
        )
        .await;
    }
    let session = {
        let mut reg = registry();
        match reg.sessions.get(&id) {
            Some(s) => Ok(s.clone()),
            None => match start(id.clone(), &req) {
                Ok(s) => {
                    reg.sessions.insert(id, s.clone());
                    Ok(s)
                }
                Err(e) => Err(e),
            },
        }
    };
    match session {
        Ok(s) => attach(s, stream, 0, 0).await,
        Err((t, msg)) => send_error(&stream, t, msg).await,
    }
}

/// `attach`: reconnect to a known command and replay from the offsets.
pub async fn handle_attach(
    stream: Stream,
    command_id: String,
    stdout_offset: u64,
    stderr_offset: u64,
) {
    let found = {
        let reg = registry();
        match reg.sessions.get(&command_id) {
            Some(s) => Ok(s.clone()),
            None if reg.expired.contains(&command_id) => Err(ExecErrorType::SessionExpired),
            None => Err(ExecErrorType::CommandNotFound),
        }
    };
    match found {
        Ok(s) => attach(s, stream, stdout_offset, stderr_offset).await,
        Err(t) => {
            let msg = match t {
                ExecErrorType::SessionExpired => format!("command {command_id} expired"),
                _ => format!("no command with id {command_id}"),
            };
            send_error(&stream, t, msg).await
        }
    }
}

/// `commands`: what runs now.
pub async fn handle_commands(stream: Stream) {
    let commands: Vec<CommandInfo> = registry()
        .sessions
        .values()
        .filter(|s| s.lock().exit.is_none())
        .map(|s| s.started_with.clone())
        .collect();
    reply(&stream, Reply::Commands { commands }).await;
}

/// `stdin`: the bytes the host sends, to the stdin of the running command
/// `pid`, without attaching to it; then its stdin closed when `close`.
pub async fn handle_stdin(mut stream: Stream, pid: u32, close: bool) {
    let session = registry()
        .sessions
        .values()
        .find(|s| s.pid == pid && s.lock().exit.is_none())
        .cloned();
    let Some(session) = session else {
        let e = OpError::new(
            OpErrorKind::NotFound,
            format!("no running command has pid {pid}"),
        );
        return reply(&stream, Reply::Error(e)).await;
    };
    loop {
        match stream.recv().await {
            Some(Incoming::Data(d)) => {
                if session.stdin.send(StdinMsg::Data(d)).is_err() {
                    let e = OpError::new(OpErrorKind::NotFound, format!("command {pid} has ended"));
                    return reply(&stream, Reply::Error(e)).await;
                }
            }
            Some(Incoming::Eof) => break,
            Some(Incoming::Ctl(_)) => {}
            // The host gave up: what arrived was handed on.
            Some(Incoming::Close(_)) | None => return,
        }
    }
    if close {
        // The writer may be gone already (the command ended): nothing to close.
        let _ = session.stdin.send(StdinMsg::Close);
    }
    reply(&stream, Reply::Ok).await;
}

/// `Request::Follow`: a running command's output from now on, to one more
/// reader, without attaching (the attached client keeps its output, its
/// input and its cursors). Ends with the command's exit, or when the host
/// closes the stream.
pub async fn handle_follow(stream: Stream, pid: u32) {
    let session = registry()
        .sessions
        .values()
        .find(|s| s.pid == pid && s.lock().exit.is_none())
        .cloned();
    let Some(session) = session else {
        return send_error(
            &stream,
            ExecErrorType::CommandNotFound,
            format!("no running command has pid {pid}"),
        )
        .await;
    };
    let (tx, mut rx) = stream.split();
    let started = ExecEvent::Started {
        command_id: session.id.clone(),
        pid,
    };
    if tx.send_ctl(&started).await.is_err() {
        return;
    }
    let follow = async {
        let mut changed = session.changed.subscribe();
        let mut cursors = {
            let st = session.lock();
            [st.rings[0].end(), st.rings[1].end()]
        };
        loop {
            let step = session.lock().next_step(cursors);
            match step {
                Step::Send(ch, offset, data) => {
                    if tx
                        .send_chunk(encode_output(ch, offset, &data))
                        .await
                        .is_err()
                    {
                        return;
                    }
                    cursors[channel_index(ch)] = offset + data.len() as u64;
                }
                Step::Finish(event) => {
                    if let Err(e) = tx.send_ctl(&event).await {
                        eprintln!("hearth-guest: a follower's last event lost: {e}");
                    }
                    return;
                }
                Step::Wait | Step::Superseded => {
                    if changed.changed().await.is_err() {
                        return;
                    }
                }
            }
        }
    };
    // Input from a follower goes nowhere; its stream's end ends it.
    let until_closed =
        async { while !matches!(rx.recv().await, Some(Incoming::Close(_)) | None) {} };
    tokio::select! {
        () = follow => {}
        () = until_closed => {}
    }
}

/// `Request::Resize`: the terminal size of a running command by its pid.
pub async fn handle_resize(stream: Stream, pid: u32, size: PtySize) {
    let session = registry()
        .sessions
        .values()
        .find(|s| s.pid == pid && s.lock().exit.is_none())
        .cloned();
    let r = match session {
        None => Reply::Error(OpError::new(
            OpErrorKind::NotFound,
            format!("no running command has pid {pid}"),
        )),
        Some(s) => match &s.pty {
            None => Reply::Error(OpError::new(
                OpErrorKind::Unsupported,
                format!("command {pid} has no terminal"),
            )),
            Some(pty) => match sys::set_winsize(pty.raw(), size.rows.max(1), size.cols.max(1)) {
                Ok(()) => Reply::Ok,
                Err(e) => Reply::Error(OpError::new(
                    OpErrorKind::Io,
                    format!("resize the terminal of {pid}: {e}"),
                )),
            },
        },
    };
    reply(&stream, r).await;
}

async fn reply(stream: &Stream, r: Reply) {
    if let Err(e) = stream.send_ctl(&r).await {
        eprintln!("hearth-guest: reply lost: {e}");
    }
}

fn new_command_id() -> String {
    let mut bytes = [0u8; 16];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        use std::io::Read;
        let _ = f.read_exact(&mut bytes);
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

type StartError = (ExecErrorType, String);

fn start(id: String, req: &ExecRequest) -> Result<Arc<Session>, StartError> {
    let err = |m: String| (ExecErrorType::CommandError, m);
    // What the request got wrong, as opposed to the guest failing.
    let refused = |m: String| (ExecErrorType::BadRequest, m);
    let who = req.user.as_deref().unwrap_or("root");
    let user = users::lookup(who).ok_or_else(|| refused(format!("user {who:?} does not exist")))?;
    let cwd = match req.cwd.as_deref() {
        Some(c) if c.starts_with('/') => c.to_owned(),
        Some(c) => format!("{}/{c}", user.home),
        None if Path::new(&user.home).is_dir() => user.home.clone(),
        None => "/".into(),
    };
    if !Path::new(&cwd).is_dir() {
        return Err(refused(format!("working directory {cwd:?} does not exist")));
    }
    // A command too long for one argument is written to a sealed memfd and
    // run as `shell /proc/self/fd/3` (so `$0` is that path); stdin stays
    // the client's.
    let mut script = None;
    let argv: Vec<String> = match &req.argv {
        Some(argv) if argv.is_empty() => return Err(refused("empty argv".into())),
        Some(argv) => argv.clone(),
        None => {
            let shell = match req.shell.as_deref() {
                Some(s) if !s.is_empty() => s.to_owned(),
                _ if Path::new("/bin/bash").exists() => "/bin/bash".into(),
                _ => "/bin/sh".into(),
            };
            if !Path::new(&shell).exists() {
                return Err((
                    ExecErrorType::CommandNotFound,
                    format!("shell {shell:?} not found"),
                ));
            }
            if req.command.len() < MAX_ARG_STRLEN || req.command.contains('\0') {
                vec![shell, "-c".into(), req.command.clone()]
            } else {
                let fd = sys::memfd_script(req.command.as_bytes())
                    .map_err(|e| err(format!("cannot pass the command to the shell: {e}")))?;
                script = Some(fd);
                vec![shell, format!("/proc/self/fd/{}", sys::SCRIPT_FD)]
            }
        }
    };
    if argv.iter().any(|a| a.contains('\0')) {
        return Err(refused("argument contains a NUL byte".into()));
    }
    // What exec copies: every string with its NUL, a pointer for each, and
    // the program's path once more. Checked here for clear errors (exec
    // itself only says E2BIG).
    let mut arg_bytes = argv[0].len() + 1 + 2 * 8;
    for (i, a) in argv.iter().enumerate() {
        if a.len() >= MAX_ARG_STRLEN {
            return Err(refused(format!(
                "argument {i} is {} bytes; Linux allows at most {} per argument",
                a.len(),
                MAX_ARG_STRLEN - 1
            )));
        }
        arg_bytes += a.len() + 1 + 8;
    }

    let mut cmd = std::process::Command::new(&argv[0]);
    cmd.args(&argv[1..]).current_dir(&cwd).env_clear();
    let term = if req.pty.is_some() {
        "xterm-256color"
    } else {
        "dumb"
    };
    let base = [
        (
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        ),
        ("HOME", user.home.as_str()),
        ("USER", user.name.as_str()),
        ("LOGNAME", user.name.as_str()),
        ("SHELL", user.shell.as_str()),
        ("TERM", term),
        ("LANG", "C.UTF-8"),
    ];
    let mut env: std::collections::BTreeMap<&str, &str> = base.into_iter().collect();
    // The sandbox's configured environment (proxy variables, CA paths),
    // then the command's own.
    let configured = crate::netconf::default_env();
    for (k, v) in configured.iter().chain(&req.env) {
        if k.is_empty() || k.contains('=') || k.contains('\0') || v.contains('\0') {
            return Err(refused(format!("invalid environment variable {k:?}")));
        }
        if k.len() + v.len() + 1 >= MAX_ARG_STRLEN {
            return Err(refused(format!(
                "environment variable {k} is {} bytes; Linux allows at most {} per variable",
                k.len() + v.len() + 1,
                MAX_ARG_STRLEN - 1
            )));
        }
        env.insert(k, v);
    }
    arg_bytes += env
        .iter()
        .map(|(k, v)| k.len() + v.len() + 2 + 8)
        .sum::<usize>();
    if arg_bytes > MAX_ARG_TOTAL {
        return Err(refused(format!(
            "arguments and environment take {arg_bytes} bytes; Linux allows at most {MAX_ARG_TOTAL}"
        )));
    }
    cmd.envs(env);
    if user.uid != 0 {
        cmd.uid(user.uid).gid(user.gid);
    }
    let setup = sys::ChildSetup {
        pty: req.pty.is_some(),
        script: script.as_ref().map(|fd| fd.as_raw_fd()),
        // exec allows arguments a quarter of the stack limit: room to spare.
        min_stack: (arg_bytes > DEFAULT_ARG_ROOM).then(|| arg_bytes as u64 * 4 + (1 << 20)),
    };
    // SAFETY: the closure runs between fork and exec; child_setup only makes
    // async-signal-safe calls and allocates nothing.
    unsafe {
        cmd.pre_exec(move || sys::child_setup(setup));
    }

    let io_err = |e: std::io::Error| err(format!("cannot set up command i/o: {e}"));
    let (outputs, stdin_io, pty_master): (Vec<(OutputChannel, Arc<FdIo>)>, Arc<FdIo>, _) =
        match req.pty {
            Some(PtySize { rows, cols }) => {
                let (master, slave) = sys::openpty(rows.max(1), cols.max(1)).map_err(io_err)?;
                cmd.stdin(Stdio::from(slave.try_clone().map_err(io_err)?))
                    .stdout(Stdio::from(slave.try_clone().map_err(io_err)?))
                    .stderr(Stdio::from(slave));
                let master = Arc::new(FdIo::new(master).map_err(io_err)?);
                (
                    vec![(OutputChannel::Stdout, master.clone())],
                    master.clone(),
                    Some(master),
                )
            }
            None => {
                let (in_r, in_w) = sys::pipe().map_err(io_err)?;
                let (out_r, out_w) = sys::pipe().map_err(io_err)?;
                let (err_r, err_w) = sys::pipe().map_err(io_err)?;
                cmd.stdin(Stdio::from(in_r))
                    .stdout(Stdio::from(out_w))
                    .stderr(Stdio::from(err_w));
                (
                    vec![
                        (
                            OutputChannel::Stdout,
                            Arc::new(FdIo::new(out_r).map_err(io_err)?),
                        ),
                        (
                            OutputChannel::Stderr,
                            Arc::new(FdIo::new(err_r).map_err(io_err)?),
                        ),
                    ],
                    Arc::new(FdIo::new(in_w).map_err(io_err)?),
                    None,
                )
            }
        };

    let (pid, exit_rx) = reaper::spawn(&mut cmd).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => (
            ExecErrorType::CommandNotFound,
            format!("command not found: {}", argv[0]),
        ),
        std::io::ErrorKind::PermissionDenied => refused(format!("permission denied: {}", argv[0])),
        _ if e.raw_os_error() == Some(libc::E2BIG) => refused(format!(
            "cannot start {}: arguments and environment too large ({arg_bytes} bytes): {e}",
            argv[0]
        )),
        _ => err(format!("cannot start {}: {e}", argv[0])),
    })?;
    // Close our copies of the child's ends (held by `cmd`) and the script.
    drop(cmd);
    drop(script);

    let (stdin_tx, stdin_rx) = mpsc::unbounded_channel();
    let (changed, _) = watch::channel(0);
    let session = Arc::new(Session {
        started_with: CommandInfo {
            command_id: id.clone(),
            pid,
            command: if req.argv.is_some() {
                String::new()
            } else {
                req.command.clone()
            },
            argv: req.argv.clone(),
            cwd: req.cwd.clone(),
            env: req.env.clone(),
            pty: req.pty.is_some(),
        },
        id,
        pid,
        state: Mutex::new(State {
            rings: [Ring::new(), Ring::new()],
            exit: None,
            pumps_left: outputs.len() as u8,
            timed_out: None,
            sub_gen: 0,
            attached: false,
            cursors: [0, 0],
            detached_at: Instant::now(),
        }),
        changed,
        stdin: stdin_tx,
        pty: pty_master,
        kill_on_disconnect: req.kill_on_disconnect,
    });

    let (exited_tx, exited_rx) = watch::channel(false);
    for (channel, io) in outputs {
        tokio::spawn(pump(session.clone(), channel, io, exited_rx.clone()));
    }
    tokio::spawn(stdin_writer(stdin_io, stdin_rx, session.pty.is_some()));
    crate::logs::record(
        hearth_guest_proto::LogLevel::Info,
        "process started",
        &[
            ("pid", session.pid.to_string()),
            ("command_id", session.id.clone()),
            ("cmd", describe(&session.started_with)),
        ],
    );
    tokio::spawn(lifecycle(
        session.clone(),
        exit_rx,
        exited_tx,
        millis(req.timeout_ms as i64),
        non_negative(req.idle_timeout_ms),
        non_negative(req.ttl_ms),
    ));
    Ok(session)
}

/// Milliseconds as a duration; negative means "never".
fn non_negative(ms: i64) -> Option<Duration> {
    (ms >= 0).then(|| Duration::from_millis(ms as u64))
}

/// Positive milliseconds as a duration; zero or negative means "none".
fn millis(ms: i64) -> Option<Duration> {
    (ms > 0).then(|| Duration::from_millis(ms as u64))
}

fn channel_index(c: OutputChannel) -> usize {
    match c {
        OutputChannel::Stdout => 0,
        OutputChannel::Stderr => 1,
    }
}

/// Reads one output of the command into its ring.
async fn pump(
    session: Arc<Session>,
    channel: OutputChannel,
    io: Arc<FdIo>,
    mut exited: watch::Receiver<bool>,
) {
    let idx = channel_index(channel);
    let mut reader = SharedFd(io);
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        // Backpressure: an attached client that lags stops the reading.
        loop {
            let mut changed = session.changed.subscribe();
            {
                let st = session.lock();
                if !(st.attached && st.rings[idx].end() - st.cursors[idx] > HIGH_WATER) {
                    break;
                }
            }
            let _ = changed.changed().await;
        }
        let n = if *exited.borrow() {
            match tokio::time::timeout(EXIT_GRACE, reader.read(&mut buf)).await {
                Ok(r) => r,
                Err(_) => break, // quiet since the exit: a child holds the pipe
            }
        } else {
            tokio::select! {
                r = reader.read(&mut buf) => r,
                _ = exited.changed() => continue,
            }
        };
        match n {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                session.lock().rings[idx].push(&buf[..n]);
                session.bump();
            }
        }
    }
    session.lock().pumps_left -= 1;
    session.bump();
}

async fn stdin_writer(io: Arc<FdIo>, mut rx: mpsc::UnboundedReceiver<StdinMsg>, pty: bool) {
    let mut w = SharedFd(io);
    while let Some(msg) = rx.recv().await {
        match msg {
            StdinMsg::Data(d) => {
                if w.write_all(&d).await.is_err() {
                    break;
                }
            }
            // On a terminal, end-of-input is the EOF character, not a close.
            StdinMsg::Close if pty => {
                let _ = w.write_all(&[4]).await;
            }
            StdinMsg::Close => break,
        }
    }
}

/// What a log entry says a command was: its program (the first word of
/// its shell line), not its arguments, which may hold what its caller
/// would not have logged.
/// A shell's `-c` line is described by its own first word.
fn describe(c: &CommandInfo) -> String {
    let first = |line: &str| {
        line.split_whitespace()
            .next()
            .unwrap_or_default()
            .to_owned()
    };
    match &c.argv {
        Some(argv) => match argv.iter().position(|a| a == "-c") {
            Some(i) if i + 1 < argv.len() => first(&argv[i + 1]),
            _ => argv.first().cloned().unwrap_or_default(),
        },
        None => first(&c.command),
    }
}

/// Waits for the exit, enforces the deadlines, and expires the session.
async fn lifecycle(
    session: Arc<Session>,
    exit_rx: tokio::sync::oneshot::Receiver<i32>,
    exited_tx: watch::Sender<bool>,
    timeout: Option<Duration>,
    idle_timeout: Option<Duration>,
    ttl: Option<Duration>,
) {
    let started = Instant::now();
    let mut exit_rx = exit_rx;
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    let status = loop {
        let deadline = timeout.map(|t| tokio::time::Instant::from_std(started + t));
        tokio::select! {
            s = &mut exit_rx => break s.unwrap_or(0),
            _ = async { match deadline { Some(d) => tokio::time::sleep_until(d).await, None => std::future::pending().await } } => {
                let first = {
                    let mut st = session.lock();
                    let first = st.timed_out.is_none();
                    st.timed_out = timeout;
                    first
                };
                if first {
                    session.kill(libc::SIGKILL);
                }
                // Keep waiting for the exit status.
                let s = (&mut exit_rx).await.unwrap_or(0);
                break s;
            }
            _ = tick.tick() => {
                if let Some(idle) = idle_timeout {
                    let idle_now = {
                        let st = session.lock();
                        !st.attached && st.detached_at.elapsed() > idle
                    };
                    if idle_now {
                        session.kill(libc::SIGKILL);
                    }
                }
            }
        }
    };
    let (exit_code, signal) = sys::decode_status(status);
    session.lock().exit = Some((exit_code, signal));
    crate::logs::record(
        hearth_guest_proto::LogLevel::Info,
        "process ended",
        &[
            ("pid", session.pid.to_string()),
            ("command_id", session.id.clone()),
            (
                "exit",
                match signal {
                    Some(s) => format!("signal {s}"),
                    None => exit_code.to_string(),
                },
            ),
        ],
    );
    let _ = exited_tx.send(true);
    session.bump();
    // Expire the finished session after its ttl (counted from the end of output).
    let mut changed = session.changed.subscribe();
    loop {
        let done = session.lock().outputs_done();
        if done || changed.changed().await.is_err() {
            break;
        }
    }
    if let Some(ttl) = ttl {
        tokio::time::sleep(ttl).await;
        let mut reg = registry();
        reg.sessions.remove(&session.id);
        reg.expired.push_back(session.id.clone());
        if reg.expired.len() > EXPIRED_MEMORY {
            reg.expired.pop_front();
        }
    }
}

enum Step {
    Send(OutputChannel, u64, Vec<u8>),
    Finish(ExecEvent),
    Wait,
    Superseded,
}

/// Streams a session to one client until its final event, or until the
/// client goes away or a newer client takes over.
async fn attach(session: Arc<Session>, stream: Stream, stdout_offset: u64, stderr_offset: u64) {
    let (tx, rx) = stream.split();
    let gen = {
        let mut st = session.lock();
        st.sub_gen += 1;
        st.attached = true;
        st.cursors = [
            stdout_offset.clamp(st.rings[0].start, st.rings[0].end()),
            stderr_offset.clamp(st.rings[1].start, st.rings[1].end()),
        ];
        st.sub_gen
    };
    session.bump();
    if tx
        .send_ctl(&ExecEvent::Started {
            command_id: session.id.clone(),
            pid: session.pid,
        })
        .await
        .is_err()
    {
        session.detach(gen);
        return;
    }
    let input = tokio::spawn(read_input(session.clone(), rx, gen));
    forward(&session, &tx, gen).await;
    input.abort();
}

async fn forward(session: &Session, tx: &StreamSender, gen: u64) {
    let mut changed = session.changed.subscribe();
    loop {
        let step = {
            let mut st = session.lock();
            if st.sub_gen != gen {
                Step::Superseded
            } else {
                let step = st.next_step(st.cursors);
                match &step {
                    Step::Send(ch, cursor, _) => st.cursors[channel_index(*ch)] = *cursor,
                    Step::Finish(_) => st.attached = false,
                    _ => {}
                }
                step
            }
        };
        match step {
            Step::Superseded => {
                tx.close(None);
                return;
            }
            Step::Wait => {
                if changed.changed().await.is_err() {
                    return;
                }
            }
            Step::Send(ch, offset, data) => {
                let len = data.len() as u64;
                if tx
                    .send_chunk(encode_output(ch, offset, &data))
                    .await
                    .is_err()
                {
                    session.detach(gen);
                    return;
                }
                {
                    let mut st = session.lock();
                    if st.sub_gen == gen {
                        st.cursors[channel_index(ch)] = offset + len;
                    }
                }
                session.bump();
            }
            Step::Finish(event) => {
                let _ = tx.send_ctl(&event).await;
                session.bump();
                return;
            }
        }
    }
}

async fn read_input(session: Arc<Session>, mut rx: hearth_guest_proto::StreamReceiver, gen: u64) {
    loop {
        match rx.recv().await {
            Some(Incoming::Data(d)) => {
                let _ = session.stdin.send(StdinMsg::Data(d));
            }
            Some(Incoming::Eof) => {
                let _ = session.stdin.send(StdinMsg::Close);
            }
            Some(Incoming::Ctl(c)) => match serde_json::from_slice::<ExecInput>(&c) {
                Ok(ExecInput::Kill { signal }) => {
                    let sig = signal
                        .filter(|s| (1..=64).contains(s))
                        .unwrap_or(libc::SIGKILL);
                    session.kill(sig);
                }
                Ok(ExecInput::Resize(PtySize { rows, cols })) => {
                    if let Some(pty) = &session.pty {
                        let _ = sys::set_winsize(pty.raw(), rows.max(1), cols.max(1));
                    }
                }
                Ok(ExecInput::CloseStdin) => {
                    let _ = session.stdin.send(StdinMsg::Close);
                }
                Err(_) => {}
            },
            Some(Incoming::Close(_)) | None => {
                session.detach(gen);
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_keeps_newest_bytes_with_offsets() {
        let mut r = Ring::new();
        r.push(b"hello");
        assert_eq!((r.start, r.end()), (0, 5));
        assert_eq!(r.read(2, 10), b"llo");
        let big = vec![7u8; RING_CAPACITY];
        r.push(&big);
        assert_eq!(r.start, 5);
        assert_eq!(r.end(), 5 + RING_CAPACITY as u64);
        assert_eq!(r.read(r.start, 3), vec![7, 7, 7]);
    }

    #[test]
    fn millis_sentinels() {
        assert_eq!(millis(0), None);
        assert_eq!(millis(-1), None);
        assert_eq!(millis(1500), Some(Duration::from_millis(1500)));
        assert_eq!(non_negative(0), Some(Duration::ZERO));
        assert_eq!(non_negative(-1), None);
    }
}
