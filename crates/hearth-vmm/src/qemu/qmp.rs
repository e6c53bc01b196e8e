//! A minimal QMP client: line-delimited JSON over a unix socket.
//!
//! One request is in flight at a time (a mutex). Each request carries an
//! `id`; replies with another id (a late answer to a request that timed out)
//! and asynchronous `{"event": …}` messages are skipped while waiting. QEMU
//! is only semi-trusted, so every line is parsed defensively: a malformed
//! line fails the request it arrived during, never the process.
//!
//! [`QmpClient::execute_with_fd`] passes an open file to QEMU with the
//! request (`SCM_RIGHTS`), which is how `getfd` receives the files that
//! `fd:` migration reads and writes.
//!
//! Failures are [`QmpError`]s: they belong to this backend, and reach the
//! generic layer as the source of a [`crate::VmmError::Backend`].

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{json, Map, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Interest};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::UnixStream;
use tokio::sync::Mutex;

/// A failed QMP exchange.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum QmpError {
    #[error("connect to qmp socket {path}")]
    Connect {
        path: PathBuf,
        #[source]
        source: io::Error,
    },

    #[error("qmp {command} on {path}: socket i/o failed")]
    Io {
        path: PathBuf,
        command: String,
        #[source]
        source: io::Error,
    },

    #[error("qmp {command} on {path}: malformed message from qemu: {detail}")]
    Protocol {
        path: PathBuf,
        command: String,
        detail: String,
        #[source]
        source: Option<serde_json::Error>,
    },

    #[error("qmp {command} on {path}: qemu answered {class}: {desc}")]
    Command {
        path: PathBuf,
        command: String,
        class: String,
        desc: String,
    },

    #[error("qmp {command} on {path}: no reply within {timeout:?}")]
    Timeout {
        path: PathBuf,
        command: String,
        timeout: Duration,
    },

    #[error("qmp {command} on {path}: qemu closed the connection")]
    Closed { path: PathBuf, command: String },

    #[error("qmp {command} on {path}: connection unusable: {reason}")]
    Broken {
        path: PathBuf,
        command: String,
        reason: &'static str,
    },
}

/// Longest line accepted from QEMU. Replies to the commands we use are a few
/// hundred bytes; this only bounds memory if QEMU misbehaves.
const MAX_LINE: usize = 1024 * 1024;
/// Default per-request timeout.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

/// A connected QMP session, past the greeting and capability negotiation.
#[derive(Debug)]
pub struct QmpClient {
    path: PathBuf,
    timeout: Duration,
    conn: Mutex<Conn>,
    /// When QEMU last said the vCPUs stopped and ran again (its `STOP`
    /// and `RESUME` events' timestamps, seen while waiting for replies).
    run_events: std::sync::Mutex<RunEvents>,
}

/// Timestamps (QEMU's wall clock, seconds) of the last `STOP` and
/// `RESUME` events.
#[derive(Debug, Default, Clone, Copy)]
struct RunEvents {
    stop: Option<f64>,
    resume: Option<f64>,
}

#[derive(Debug)]
struct Conn {
    reader: BufReader<OwnedReadHalf>,
    writer: OwnedWriteHalf,
    /// Bytes of a line not yet complete; kept across cancelled reads.
    partial: Vec<u8>,
    next_id: u64,
    /// Set when the byte stream can no longer be trusted to be in sync.
    broken: Option<&'static str>,
    /// Set once QEMU has closed its end.
    closed: bool,
}

/// What one line from QEMU turned out to be, relative to the request waited on.
enum Message {
    Reply(Value),
    Error {
        class: String,
        desc: String,
    },
    /// An event or a reply to some other request.
    Skip,
}

impl QmpClient {
    /// Connects to the QMP socket at `path`, reads the greeting and enters
    /// command mode. `timeout` bounds this and every later request.
    pub async fn connect(path: &Path, timeout: Duration) -> Result<Self, QmpError> {
        let stream = tokio::time::timeout(timeout, UnixStream::connect(path))
            .await
            .map_err(|_| QmpError::Timeout {
                path: path.to_owned(),
                command: "connect".to_owned(),
                timeout,
            })?
            .map_err(|source| QmpError::Connect {
                path: path.to_owned(),
                source,
            })?;
        let (r, w) = stream.into_split();
        let client = Self {
            path: path.to_owned(),
            timeout,
            conn: Mutex::new(Conn {
                reader: BufReader::new(r),
                writer: w,
                partial: Vec::new(),
                next_id: 1,
                broken: None,
                closed: false,
            }),
            run_events: Default::default(),
        };
        client.greet().await?;
        Ok(client)
    }

    /// How long the vCPUs were last stopped, by QEMU's own `STOP` and
    /// `RESUME` events, once both were seen (in replies' wake) in that
    /// order.
    pub fn last_stop(&self) -> Option<Duration> {
        let seen = *self.run_events.lock().unwrap_or_else(|p| p.into_inner());
        let (stop, resume) = (seen.stop?, seen.resume?);
        (resume >= stop).then(|| Duration::from_secs_f64(resume - stop))
    }

    /// Replaces the default per-request timeout.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The default per-request timeout.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The socket this client talks to.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Runs `command` with optional `arguments` and returns QEMU's `return`
    /// value, within the client's default timeout.
    pub async fn execute(
        &self,
        command: &str,
        arguments: Option<Value>,
    ) -> Result<Value, QmpError> {
        self.execute_with_timeout(command, arguments, self.timeout)
            .await
    }

    /// Like [`QmpClient::execute`], with its own timeout (waiting for the
    /// connection counts toward it).
    pub async fn execute_with_timeout(
        &self,
        command: &str,
        arguments: Option<Value>,
        timeout: Duration,
    ) -> Result<Value, QmpError> {
        let work = async {
            let mut conn = self.conn.lock().await;
            self.request(&mut conn, command, arguments, None).await
        };
        tokio::time::timeout(timeout, work)
            .await
            .map_err(|_| QmpError::Timeout {
                path: self.path.clone(),
                command: command.to_owned(),
                timeout,
            })?
    }

    /// Like [`QmpClient::execute`], passing `fd` to QEMU with the request
    /// (`SCM_RIGHTS`); QEMU keeps its own duplicate, so the caller may
    /// close `fd` afterwards. Used with `getfd`.
    pub async fn execute_with_fd(
        &self,
        command: &str,
        arguments: Option<Value>,
        fd: BorrowedFd<'_>,
    ) -> Result<Value, QmpError> {
        let timeout = self.timeout;
        let work = async {
            let mut conn = self.conn.lock().await;
            self.request(&mut conn, command, arguments, Some(fd.as_raw_fd()))
                .await
        };
        tokio::time::timeout(timeout, work)
            .await
            .map_err(|_| QmpError::Timeout {
                path: self.path.clone(),
                command: command.to_owned(),
                timeout,
            })?
    }

    async fn greet(&self) -> Result<(), QmpError> {
        let work = async {
            let mut conn = self.conn.lock().await;
            let line = self.read_line(&mut conn, "greeting").await?;
            let greeting = self.parse(&line, "greeting")?;
            if greeting.get("QMP").is_none() {
                return Err(self.protocol("greeting", "first message has no \"QMP\" member", None));
            }
            self.request(&mut conn, "qmp_capabilities", None, None)
                .await
                .map(drop)
        };
        tokio::time::timeout(self.timeout, work)
            .await
            .map_err(|_| QmpError::Timeout {
                path: self.path.clone(),
                command: "greeting".to_owned(),
                timeout: self.timeout,
            })?
    }

    async fn request(
        &self,
        conn: &mut Conn,
        command: &str,
        arguments: Option<Value>,
        fd: Option<RawFd>,
    ) -> Result<Value, QmpError> {
        if conn.closed {
            return Err(self.closed(command));
        }
        if let Some(reason) = conn.broken {
            return Err(QmpError::Broken {
                path: self.path.clone(),
                command: command.to_owned(),
                reason,
            });
        }
        let id = conn.next_id;
        conn.next_id += 1;
        let mut req = json!({ "execute": command, "id": id });
        if let (Some(args), Some(obj)) = (arguments, req.as_object_mut()) {
            obj.insert("arguments".to_owned(), args);
        }
        let mut bytes = req.to_string().into_bytes();
        bytes.push(b'\n');

        // If this future is dropped mid-write, QEMU may hold half a request:
        // the flag stays set and the connection is not used again.
        conn.broken = Some("a request was interrupted while being written");
        let mut start = 0;
        if let Some(fd) = fd {
            // The descriptor travels with the first bytes of the request;
            // QEMU attaches it to the command being read.
            let sock: &UnixStream = conn.writer.as_ref();
            let sent = sock
                .async_io(Interest::WRITABLE, || {
                    send_with_fd(sock.as_raw_fd(), &bytes, fd)
                })
                .await;
            match sent {
                Ok(n) => start = n,
                Err(source) => return Err(self.write_failed(conn, command, source)),
            }
        }
        if let Err(source) = conn.writer.write_all(&bytes[start..]).await {
            return Err(self.write_failed(conn, command, source));
        }
        conn.broken = None;

        loop {
            let line = self.read_line(conn, command).await?;
            match self.classify(&line, command, id)? {
                Message::Reply(v) => return Ok(v),
                Message::Error { class, desc } => {
                    return Err(QmpError::Command {
                        path: self.path.clone(),
                        command: command.to_owned(),
                        class,
                        desc,
                    })
                }
                Message::Skip => continue,
            }
        }
    }

    /// Reads one `\n`-terminated line. Cancel-safe: bytes already taken from
    /// the socket stay in `conn.partial`.
    async fn read_line(&self, conn: &mut Conn, command: &str) -> Result<Vec<u8>, QmpError> {
        loop {
            let buf = conn
                .reader
                .fill_buf()
                .await
                .map_err(|source| self.io(command, source))?;
            if buf.is_empty() {
                conn.closed = true;
                return Err(self.closed(command));
            }
            let (take, done) = match buf.iter().position(|&b| b == b'\n') {
                Some(pos) => (pos + 1, true),
                None => (buf.len(), false),
            };
            conn.partial.extend_from_slice(&buf[..take]);
            conn.reader.consume(take);
            if done {
                return Ok(std::mem::take(&mut conn.partial));
            }
            if conn.partial.len() > MAX_LINE {
                conn.broken = Some("qemu sent an over-long line");
                return Err(self.protocol(
                    command,
                    &format!("line longer than {MAX_LINE} bytes"),
                    None,
                ));
            }
        }
    }

    fn parse(&self, line: &[u8], command: &str) -> Result<Map<String, Value>, QmpError> {
        match serde_json::from_slice::<Value>(line) {
            Ok(Value::Object(map)) => Ok(map),
            Ok(_) => Err(self.protocol(
                command,
                &format!("not a JSON object: {}", excerpt(line)),
                None,
            )),
            Err(e) => Err(self.protocol(
                command,
                &format!("invalid JSON: {}", excerpt(line)),
                Some(e),
            )),
        }
    }

    fn classify(&self, line: &[u8], command: &str, id: u64) -> Result<Message, QmpError> {
        let msg = self.parse(line, command)?;
        if let Some(event) = msg.get("event") {
            tracing::debug!(qmp = %self.path.display(), event = %event, "qmp event");
            let at = msg.get("timestamp").and_then(|t| {
                let secs = t.get("seconds")?.as_f64()?;
                let micros = t.get("microseconds")?.as_f64()?;
                Some(secs + micros / 1e6)
            });
            let mut seen = self.run_events.lock().unwrap_or_else(|p| p.into_inner());
            match event.as_str() {
                Some("STOP") => seen.stop = at,
                Some("RESUME") => seen.resume = at,
                _ => {}
            }
            return Ok(Message::Skip);
        }
        let is_reply = msg.contains_key("return") || msg.contains_key("error");
        match msg.get("id") {
            Some(got) if got.as_u64() == Some(id) => {}
            Some(got) if is_reply => {
                tracing::debug!(qmp = %self.path.display(), %got, want = id, "skipping stale qmp reply");
                return Ok(Message::Skip);
            }
            _ => {
                return Err(self.protocol(
                    command,
                    &format!("unexpected message: {}", excerpt(line)),
                    None,
                ))
            }
        }
        if let Some(ret) = msg.get("return") {
            return Ok(Message::Reply(ret.clone()));
        }
        if let Some(err) = msg.get("error") {
            let field = |k: &str| err.get(k).and_then(Value::as_str).map(str::to_owned);
            return match (field("class"), field("desc")) {
                (Some(class), Some(desc)) => Ok(Message::Error { class, desc }),
                _ => Err(self.protocol(
                    command,
                    &format!("error without class/desc: {}", excerpt(line)),
                    None,
                )),
            };
        }
        Err(self.protocol(
            command,
            &format!("neither return, error nor event: {}", excerpt(line)),
            None,
        ))
    }

    fn write_failed(&self, conn: &mut Conn, command: &str, source: io::Error) -> QmpError {
        use std::io::ErrorKind::{BrokenPipe, ConnectionReset};
        if matches!(source.kind(), BrokenPipe | ConnectionReset) {
            conn.closed = true;
            return self.closed(command);
        }
        self.io(command, source)
    }

    fn closed(&self, command: &str) -> QmpError {
        QmpError::Closed {
            path: self.path.clone(),
            command: command.to_owned(),
        }
    }

    fn io(&self, command: &str, source: std::io::Error) -> QmpError {
        QmpError::Io {
            path: self.path.clone(),
            command: command.to_owned(),
            source,
        }
    }

    fn protocol(&self, command: &str, detail: &str, source: Option<serde_json::Error>) -> QmpError {
        QmpError::Protocol {
            path: self.path.clone(),
            command: command.to_owned(),
            detail: detail.to_owned(),
            source,
        }
    }
}

/// One `sendmsg` of (a prefix of) `bytes` on the non-blocking socket `sock`
/// with `fd` attached as `SCM_RIGHTS`. Returns how many bytes went out; a
/// full socket buffer is `WouldBlock` (nothing was sent, the caller retries).
fn send_with_fd(sock: RawFd, bytes: &[u8], fd: RawFd) -> io::Result<usize> {
    const FD_LEN: u32 = std::mem::size_of::<RawFd>() as u32;
    // Room for one cmsghdr and one descriptor, aligned for cmsghdr.
    let mut control = [0u64; 8];
    // SAFETY: CMSG_SPACE only computes a size from its argument.
    let space = unsafe { libc::CMSG_SPACE(FD_LEN) } as usize;
    if space > std::mem::size_of_val(&control) {
        return Err(io::Error::other("control buffer too small for one fd"));
    }
    let mut iov = libc::iovec {
        iov_base: bytes.as_ptr() as *mut libc::c_void,
        iov_len: bytes.len(),
    };
    // SAFETY: msghdr is a plain C struct for which all-zero is a valid value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: msg_control points at `space` zeroed, suitably aligned bytes
    // that outlive this block, so CMSG_FIRSTHDR returns a pointer into them
    // with room for a header and one int (checked above); CMSG_DATA points
    // inside the same buffer and is written unaligned.
    unsafe {
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        if cmsg.is_null() {
            return Err(io::Error::other("no room for the control message"));
        }
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(FD_LEN) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<RawFd>(), fd);
    }
    // SAFETY: msg and everything it points to (iov, bytes, control) are
    // valid for the call; sendmsg does not keep the pointers.
    let n = unsafe { libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// The start of a line, for error messages (lossy, bounded).
fn excerpt(line: &[u8]) -> String {
    const MAX: usize = 200;
    let text = String::from_utf8_lossy(&line[..line.len().min(MAX)]);
    let text = text.trim_end();
    if line.len() > MAX {
        format!("{text}…")
    } else {
        text.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;
    use std::sync::atomic::{AtomicU32, Ordering};
    use tokio::io::AsyncBufReadExt;
    use tokio::net::UnixListener;

    /// A temp dir removed on drop.
    struct TempDir(PathBuf);
    impl TempDir {
        fn new() -> Self {
            static N: AtomicU32 = AtomicU32::new(0);
            let p = std::env::temp_dir().join(format!(
                "hearth-qmp-test-{}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ));
            std::fs::create_dir_all(&p).expect("create temp dir");
            Self(p)
        }
    }
    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// What the fake server does with each request it reads: the lines to
    /// send back, where `$ID` is replaced by the request's id.
    type Script = Vec<(&'static str, Vec<&'static str>)>;

    /// Serves one connection: sends the greeting, then for each request
    /// checks the command name and answers with the scripted lines.
    async fn fake_qemu(listener: UnixListener, script: Script) {
        let (stream, _) = listener.accept().await.expect("accept");
        let (r, mut w) = stream.into_split();
        let mut lines = BufReader::new(r).lines();
        w.write_all(b"{\"QMP\": {\"version\": {\"qemu\": {\"micro\": 22, \"minor\": 2, \"major\": 7}}, \"capabilities\": []}}\r\n")
            .await
            .expect("greet");
        for (want, replies) in script {
            let line = lines.next_line().await.expect("read").expect("request");
            let req: Value = serde_json::from_str(&line).expect("request is JSON");
            assert_eq!(req["execute"], want, "request {line}");
            let id = req["id"].to_string();
            for r in replies {
                let out = r.replace("$ID", &id);
                w.write_all(out.as_bytes()).await.expect("write");
                w.write_all(b"\r\n").await.expect("write");
            }
        }
        // Hold the connection until the client goes away.
        let _ = lines.next_line().await;
    }

    #[tokio::test]
    async fn talks_to_a_fake_qemu() {
        let dir = TempDir::new();
        let sock = dir.0.join("qmp.sock");
        let listener = UnixListener::bind(&sock).expect("bind");
        let script: Script = vec![
            ("qmp_capabilities", vec![r#"{"return": {}, "id": $ID}"#]),
            (
                "query-status",
                vec![
                    r#"{"timestamp": {"seconds": 1, "microseconds": 2}, "event": "STOP"}"#,
                    r#"{"return": {"status": "stale"}, "id": 999}"#,
                    r#"{"return": {"status": "paused", "running": false}, "id": $ID}"#,
                ],
            ),
            (
                "cont",
                vec![
                    r#"{"timestamp": {"seconds": 1, "microseconds": 500002}, "event": "RESUME"}"#,
                    r#"{"error": {"class": "GenericError", "desc": "nope"}, "id": $ID}"#,
                ],
            ),
            ("stop", vec!["this is not json"]),
            ("stop", vec!["[1,2,3]"]),
            ("stop", vec![r#"{"return": {}}"#]),
            ("stop", vec![r#"{"error": {"class": 5}, "id": $ID}"#]),
            ("stop", vec![r#"{"return": {}, "id": $ID}"#]),
        ];
        let server = tokio::spawn(fake_qemu(listener, script));

        let qmp = QmpClient::connect(&sock, Duration::from_secs(2))
            .await
            .expect("connect");
        let status = qmp
            .execute("query-status", None)
            .await
            .expect("query-status");
        assert_eq!(status["status"], "paused");
        // A STOP was seen, no RESUME yet.
        assert_eq!(qmp.last_stop(), None);

        match qmp.execute("cont", None).await {
            Err(QmpError::Command { class, desc, .. }) => {
                assert_eq!((class.as_str(), desc.as_str()), ("GenericError", "nope"))
            }
            other => panic!("expected a command error, got {other:?}"),
        }
        // QEMU's own timestamps, 1.000002 s and 1.500002 s.
        match qmp.last_stop() {
            Some(d) => assert!((d.as_secs_f64() - 0.5).abs() < 1e-6, "{d:?}"),
            None => panic!("the STOP and RESUME events were not timed"),
        }
        for _ in 0..4 {
            let got = qmp.execute("stop", None).await;
            assert!(matches!(got, Err(QmpError::Protocol { .. })), "{got:?}");
        }
        // The session is still usable after malformed lines.
        assert!(qmp.execute("stop", None).await.is_ok());
        drop(qmp);
        server.await.expect("server");
    }

    #[tokio::test]
    async fn timeout_then_eof() {
        let dir = TempDir::new();
        let sock = dir.0.join("qmp.sock");
        let listener = UnixListener::bind(&sock).expect("bind");
        // Answers the capabilities, ignores the next request, then hangs up.
        let server = tokio::spawn(async move {
            let (stream, _) = listener.accept().await.expect("accept");
            let (r, mut w) = stream.into_split();
            let mut lines = BufReader::new(r).lines();
            w.write_all(b"{\"QMP\": {}}\n").await.expect("greet");
            let _ = lines.next_line().await;
            w.write_all(b"{\"return\": {}, \"id\": 1}\n")
                .await
                .expect("caps");
            let _ = lines.next_line().await;
            tokio::time::sleep(Duration::from_millis(300)).await;
        });
        let qmp = QmpClient::connect(&sock, Duration::from_secs(2))
            .await
            .expect("connect");
        let got = qmp
            .execute_with_timeout("query-status", None, Duration::from_millis(100))
            .await;
        assert!(matches!(got, Err(QmpError::Timeout { .. })), "{got:?}");
        server.await.expect("server");
        let got = qmp.execute("query-status", None).await;
        assert!(matches!(got, Err(QmpError::Closed { .. })), "{got:?}");
    }

    #[tokio::test]
    async fn refuses_a_bad_greeting() {
        let dir = TempDir::new();
        let sock = dir.0.join("qmp.sock");
        let listener = UnixListener::bind(&sock).expect("bind");
        let server = tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.expect("accept");
            stream.write_all(b"{\"hello\": 1}\n").await.expect("write");
            tokio::time::sleep(Duration::from_millis(200)).await;
        });
        let got = QmpClient::connect(&sock, Duration::from_secs(2)).await;
        assert!(matches!(got, Err(QmpError::Protocol { .. })), "{got:?}");
        server.await.expect("server");
    }

    /// Reads one message from `sock` with `recvmsg`, returning its bytes and
    /// the descriptor that came with it, if any.
    fn recv_with_fd(sock: RawFd) -> (Vec<u8>, Option<std::os::fd::OwnedFd>) {
        use std::os::fd::FromRawFd;
        let mut buf = vec![0u8; 4096];
        let mut control = [0u64; 8];
        let mut iov = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        // SAFETY: all-zero is a valid msghdr.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = std::mem::size_of_val(&control) as _;
        // SAFETY: msg points at live buffers of the sizes it states.
        let n = unsafe { libc::recvmsg(sock, &mut msg, 0) };
        assert!(n > 0, "recvmsg: {}", io::Error::last_os_error());
        buf.truncate(n as usize);
        // SAFETY: the kernel filled msg_control; CMSG_FIRSTHDR/CMSG_DATA stay
        // inside it, and an SCM_RIGHTS payload is a received, owned fd.
        let fd = unsafe {
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            (!cmsg.is_null() && (*cmsg).cmsg_type == libc::SCM_RIGHTS).then(|| {
                let raw = std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast::<RawFd>());
                std::os::fd::OwnedFd::from_raw_fd(raw)
            })
        };
        (buf, fd)
    }

    #[tokio::test]
    async fn passes_a_descriptor_with_the_request() {
        use std::io::Write;
        use std::os::unix::fs::MetadataExt;
        let dir = TempDir::new();
        let sock = dir.0.join("qmp.sock");
        let file_path = dir.0.join("state");
        let listener = std::os::unix::net::UnixListener::bind(&sock).expect("bind");
        let server = std::thread::spawn(move || {
            let (mut stream, _) = listener.accept().expect("accept");
            stream.write_all(b"{\"QMP\": {}}\n").expect("greet");
            let (caps, fd) = recv_with_fd(stream.as_raw_fd());
            assert!(fd.is_none());
            assert!(String::from_utf8_lossy(&caps).contains("qmp_capabilities"));
            stream
                .write_all(b"{\"return\": {}, \"id\": 1}\n")
                .expect("caps");
            let (req, fd) = recv_with_fd(stream.as_raw_fd());
            let req: Value = serde_json::from_slice(&req).expect("request is one JSON line");
            assert_eq!(req["execute"], "getfd");
            assert_eq!(req["arguments"]["fdname"], "f");
            let fd = fd.expect("a descriptor came with getfd");
            let ino = std::fs::File::from(fd).metadata().expect("fstat").ino();
            stream
                .write_all(b"{\"return\": {}, \"id\": 2}\n")
                .expect("reply");
            ino
        });
        let qmp = QmpClient::connect(&sock, Duration::from_secs(5))
            .await
            .expect("connect");
        let file = std::fs::File::create(&file_path).expect("create");
        let got = qmp
            .execute_with_fd("getfd", Some(json!({"fdname": "f"})), file.as_fd())
            .await;
        assert!(got.is_ok(), "{got:?}");
        let ino = tokio::task::spawn_blocking(move || server.join().expect("server"))
            .await
            .expect("join");
        assert_eq!(ino, file.metadata().expect("stat").ino());
    }

    #[test]
    fn excerpt_is_bounded() {
        let long = vec![b'x'; 1000];
        assert_eq!(excerpt(&long).chars().count(), 201);
        assert_eq!(excerpt(b"ab\r\n"), "ab");
    }
}
