//! The JSON messages carried in `Hello`, `Open`, `Ctl` and `Close` frames,
//! and the binary layout of exec output in `Data` frames.

use std::collections::BTreeMap;

use bytes::{BufMut, Bytes, BytesMut};
use serde::{Deserialize, Serialize};

/// Protocol versions this build speaks, newest last. Version 2 adds
/// requests larger than one frame (`OpenLarge`, up to
/// [`crate::mux::MAX_REQUEST`]); version 1 peers get single-frame requests.
/// Version 3 adds [`Request::Clock`], version 4 [`Request::Identity`],
/// version 5 [`Request::Stdin`] and [`Request::Commands`], version 6
/// [`Request::Resize`], version 7 [`Request::Follow`], version 8 the
/// watchers ([`Request::WatchStart`] and friends), version 9 file
/// operations as a user (`user` on the file requests) and owners in
/// [`FileStat`], version 10 the guest's samples of its own use
/// ([`Request::Samples`]) and its log ([`Request::Logs`]).
pub const SUPPORTED_VERSIONS: &[u16] = &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11];

/// The first protocol version with `OpenLarge` (requests over one frame).
pub const LARGE_REQUEST_VERSION: u16 = 2;

/// The first protocol version with [`Request::Clock`]: the host measures
/// the guest's clock over the stream and steps it after every handshake,
/// and such a guest ignores [`Hello::time_ms`].
pub const CLOCK_VERSION: u16 = 3;

/// The first protocol version with [`Request::Identity`].
pub const IDENTITY_VERSION: u16 = 4;

/// The first protocol version with [`Request::Stdin`] and
/// [`Request::Commands`].
pub const COMMANDS_VERSION: u16 = 5;

/// The first protocol version with [`Request::Resize`].
pub const RESIZE_VERSION: u16 = 6;

/// The first protocol version with [`Request::Follow`] and
/// [`CommandInfo::pty`].
pub const FOLLOW_VERSION: u16 = 7;

/// The first protocol version with directory watchers.
pub const WATCH_VERSION: u16 = 8;

/// The first protocol version whose file requests take a `user` (the
/// kernel checks that user's permissions, and what the request creates is
/// theirs), whose writes take metadata, and whose [`FileStat`] names the
/// owner and group and carries the metadata.
pub const FILE_USER_VERSION: u16 = 9;

/// The first protocol version whose guest samples its own use every
/// [`SAMPLE_INTERVAL_MS`] and answers [`Request::Samples`], and keeps a
/// log it answers to [`Request::Logs`].
pub const SAMPLES_VERSION: u16 = 10;

/// The first protocol version with [`Request::SetAttrs`], and whose
/// [`FileStat`] carries the owner's and group's ids, the access and change
/// times and a link's target.
pub const ATTRS_VERSION: u16 = 11;

/// How many log entries a guest keeps (the newest).
pub const MAX_LOG_ENTRIES: usize = 2000;
/// The longest message of one log entry, in bytes (longer is cut).
pub const MAX_LOG_MESSAGE: usize = 1024;

/// How often a guest samples its use.
pub const SAMPLE_INTERVAL_MS: u64 = 5_000;
/// How many samples a guest keeps: the last hour.
pub const MAX_SAMPLES: usize = 720;
/// Samples per [`Reply::Samples`] batch (one frame holds it).
pub const SAMPLES_PER_REPLY: usize = 128;

/// Most metadata entries one file may carry.
pub const MAX_METADATA_ENTRIES: usize = 64;
/// Longest metadata key (without the `user.e2b.` of its attribute name).
pub const MAX_METADATA_KEY: usize = 200;
/// Most bytes of all of one file's metadata, keys and values (ext4 keeps
/// a file's extended attributes in its inode and one 4 KiB block).
pub const MAX_METADATA_BYTES: usize = 3072;

/// The rule for a file's metadata, held by the host and the guest alike:
/// keys are HTTP tokens (letters, digits and ``!#$%&'*+-.^_`|~``), stored
/// lowercased; values printable US-ASCII; within the bounds above.
pub fn check_metadata(m: &BTreeMap<String, String>) -> Result<(), String> {
    if m.len() > MAX_METADATA_ENTRIES {
        return Err(format!(
            "metadata: {} entries, at most {MAX_METADATA_ENTRIES}",
            m.len()
        ));
    }
    let mut bytes = 0usize;
    for (k, v) in m {
        let token = |c: u8| c.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&c);
        if k.is_empty() || k.len() > MAX_METADATA_KEY || !k.bytes().all(token) {
            return Err(format!(
                "metadata key {k:?}: 1 to {MAX_METADATA_KEY} HTTP token characters"
            ));
        }
        if k.bytes().any(|c| c.is_ascii_uppercase()) {
            return Err(format!("metadata key {k:?}: keys are lowercase"));
        }
        if !v.bytes().all(|c| (0x20..0x7f).contains(&c)) {
            return Err(format!("metadata value of {k:?}: printable US-ASCII only"));
        }
        bytes += k.len() + v.len();
    }
    if bytes > MAX_METADATA_BYTES {
        return Err(format!(
            "metadata: {bytes} bytes of keys and values, at most {MAX_METADATA_BYTES}"
        ));
    }
    Ok(())
}

/// Host → guest, first frame on a fresh connection.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Hello {
    pub versions: Vec<u16>,
    /// Echoed in the ack so the host can tell a fresh ack from a stale one.
    pub nonce: u64,
    /// The host's wall clock (Unix ms) when this hello was sent, for
    /// guests older than [`CLOCK_VERSION`], which set their clock from it
    /// when it is more than a second off (a guest resumed from saved memory
    /// is as old as the save). It cannot be more precise than that: a
    /// booting guest reads hellos queued since the VM started, so the one
    /// it answers can be seconds old. From [`CLOCK_VERSION`] on the guest
    /// ignores it and the host sets the clock with [`Request::Clock`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_ms: Option<u64>,
}

/// Guest → host answer to [`Hello`].
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct HelloAck {
    /// The version chosen, or `None` when no offered version is supported.
    pub version: Option<u16>,
    pub nonce: u64,
    pub agent_version: String,
}

/// Picks the newest version both sides speak.
pub fn negotiate(offered: &[u16]) -> Option<u16> {
    SUPPORTED_VERSIONS
        .iter()
        .rev()
        .find(|v| offered.contains(v))
        .copied()
}

/// The operation a stream is opened for (payload of an `Open` frame).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    /// Start a command, or attach to the running one with the same `command_id`.
    Exec(ExecRequest),
    /// Re-attach to an existing command and replay its output from the offsets.
    Attach {
        command_id: String,
        stdout_offset: u64,
        stderr_offset: u64,
    },
    /// Read a file; the guest answers `FileInfo` then `Data` frames then `Eof`.
    ReadFile {
        path: String,
        #[serde(default)]
        offset: u64,
        #[serde(default)]
        length: Option<u64>,
        /// Act as this user (name or uid; see [`FILE_USER_VERSION`]);
        /// none: as root. A relative path resolves against their home.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        user: Option<String>,
    },
    /// Create or replace a file with the `Data` the host sends until `Eof`.
    WriteFile {
        path: String,
        #[serde(default)]
        mode: Option<u32>,
        /// Act as this user (name or uid; see [`FILE_USER_VERSION`]);
        /// none: as root. A relative path resolves against their home.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        user: Option<String>,
        /// The new file's metadata, kept as its extended attributes
        /// `user.e2b.<key>` (as envd) (see [`check_metadata`]; [`FILE_USER_VERSION`]). A
        /// write replaces the file, so metadata not given again is gone;
        /// a rename keeps it.
        #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
        metadata: BTreeMap<String, String>,
    },
    Stat {
        path: String,
        /// Act as this user (name or uid; see [`FILE_USER_VERSION`]);
        /// none: as root. A relative path resolves against their home.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        user: Option<String>,
    },
    List {
        path: String,
        /// Act as this user (name or uid; see [`FILE_USER_VERSION`]);
        /// none: as root. A relative path resolves against their home.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        user: Option<String>,
    },
    Mkdir {
        path: String,
        #[serde(default)]
        parents: bool,
        /// Act as this user (name or uid; see [`FILE_USER_VERSION`]);
        /// none: as root. A relative path resolves against their home.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        user: Option<String>,
    },
    Remove {
        path: String,
        #[serde(default)]
        recursive: bool,
        /// Act as this user (name or uid; see [`FILE_USER_VERSION`]);
        /// none: as root. A relative path resolves against their home.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        user: Option<String>,
    },
    /// Change the owner, group or permission bits of `path` (as root, not
    /// following a final symbolic link for the owner); the guest answers
    /// its `Stat`. Protocol [`ATTRS_VERSION`].
    SetAttrs {
        path: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        uid: Option<u32>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        gid: Option<u32>,
        /// Permission bits (`0o7777` at most).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        mode: Option<u32>,
    },
    /// Entries under the directory `path` whose path relative to it matches
    /// the glob `pattern` (`**` spans directories; `*`, `?`, `[…]` stay in
    /// one segment). The guest answers `GlobMatches` batches, then
    /// `Searched`.
    Glob {
        path: String,
        pattern: String,
        /// At most this many matches (more → `truncated`).
        limit: u32,
    },
    /// Lines holding the literal `pattern` in the files under `path` (or in
    /// the file `path`), optionally only files matching `glob` (a pattern
    /// without `/` or `**` matches the base name at any depth). Binary
    /// files are skipped. The guest answers `GrepMatches` batches, then
    /// `Searched`.
    Grep {
        path: String,
        pattern: String,
        #[serde(default)]
        glob: Option<String>,
        limit: u32,
    },
    /// Connect to a TCP port inside the guest; then `Data` flows both ways.
    TcpDial {
        port: u16,
    },
    Info,
    /// Sync filesystems and power the guest off.
    Shutdown,
    /// Step the guest's wall clock (`CLOCK_REALTIME`) by `step_ns`
    /// nanoseconds (0: leave it), then answer [`Reply::Clock`] with its
    /// reading. The host reads the clock between two readings of its own
    /// to measure the offset, then steps it by the opposite (protocol
    /// version [`CLOCK_VERSION`]; only the host agent may send it).
    Clock {
        #[serde(default)]
        step_ns: i64,
    },
    /// The sandbox's settings from the host: its network and the
    /// environment every later command starts with. Sent after every
    /// handshake (a boot or a resume from saved memory) and whenever they
    /// change; idempotent. Answered `Ok`, or `Error` naming what failed.
    Configure(GuestConfig),
    /// Make this guest a machine of its own: a VM restored from memory
    /// other VMs share (a pool member claimed by a sandbox) would otherwise
    /// carry their CRNG state, ids and name. Answered `Ok` once all of it
    /// is applied, or `Error` naming what failed (protocol version
    /// [`IDENTITY_VERSION`]; only the host agent may send it).
    Identity(GuestIdentity),
    /// Write to the stdin of the running command whose process (group
    /// leader) is `pid`, as `ExecEvent::Started` reported it, without
    /// attaching to it: the host sends the bytes as `Data`, then `Eof`;
    /// `close` closes the command's stdin after them. Answered `Ok` once
    /// handed to the command, or `Error` (`NotFound`: no running command
    /// has that pid). Protocol [`COMMANDS_VERSION`].
    Stdin {
        pid: u32,
        #[serde(default)]
        close: bool,
    },
    /// The commands running now: answered [`Reply::Commands`]. Protocol
    /// [`COMMANDS_VERSION`].
    Commands,
    /// Set the terminal size of the running command whose process (group
    /// leader) is `pid`, without attaching to it. Answered `Ok`, or `Error`
    /// (`NotFound`: no running command has that pid; `Unsupported`: it has
    /// no terminal). Protocol [`RESIZE_VERSION`].
    Resize {
        pid: u32,
        size: PtySize,
    },
    /// Follow the running command whose process (group leader) is `pid`:
    /// the guest answers as to an `Exec` (`Started`, then its output from
    /// now on, then `Exit`), without attaching to it, so the stream that
    /// started it keeps its output and its input; any number may follow
    /// one command, and one that stops following (closes the stream)
    /// changes nothing for it. `Error` `CommandNotFound` when no running
    /// command has that pid. Protocol [`FOLLOW_VERSION`].
    Follow {
        pid: u32,
    },
    /// Start watching the directory `path` (and, `recursive`, every
    /// directory under it, those made later included) for changes: the
    /// guest keeps what happens until it is asked ([`Request::WatchEvents`])
    /// and answers [`Reply::Watcher`] with the watcher's id, or `Error`
    /// (`NotFound`, `NotADirectory`, `BadRequest` past the guest's limits).
    /// A watcher not asked for its events for ten minutes is dropped.
    /// Protocol [`WATCH_VERSION`].
    WatchStart {
        path: String,
        recursive: bool,
        /// Each event but a removal or a rename away carries the entry's
        /// stat as it was when the event was read ([`FILE_USER_VERSION`]).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        entries: bool,
    },
    /// What a watcher saw since it was last asked: [`Reply::WatchEvents`],
    /// or `Error` `NotFound` for an unknown (or dropped) watcher.
    WatchEvents {
        id: String,
    },
    /// Stop a watcher: `Ok`, or `Error` `NotFound`.
    WatchStop {
        id: String,
    },
    /// The guest's samples of its own use taken at or after `since_ms`
    /// (Unix milliseconds, its clock), oldest first: [`Reply::Samples`]
    /// batches, the last with `more: false`. Protocol [`SAMPLES_VERSION`].
    Samples {
        since_ms: i64,
    },
    /// The guest's log entries from `since_ms` (Unix milliseconds) on,
    /// oldest first, at most `limit`: [`Reply::Logs`] batches, the last
    /// with `more: false`. Protocol [`SAMPLES_VERSION`].
    Logs {
        since_ms: i64,
        limit: u32,
    },
}

/// How much a log entry matters.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum LogLevel {
    Debug,
    Info,
    Warn,
    Error,
}

/// One entry of a guest's log: the kernel's messages, the guest agent's
/// own, and what it did (commands started and ended, boot services).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct LogEntry {
    pub unix_ms: i64,
    pub level: LogLevel,
    pub message: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub fields: BTreeMap<String, String>,
}

/// What a guest used at one moment, as it sees it: cumulative CPU time
/// (busy and all, in clock ticks, over every CPU: use is the difference
/// between two samples), memory and the root filesystem.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct GuestSample {
    /// When, Unix milliseconds on the guest's clock.
    pub unix_ms: i64,
    pub cpu_busy: u64,
    pub cpu_total: u64,
    pub mem_total: u64,
    pub mem_available: u64,
    /// The page cache (`Cached`).
    pub mem_cached: u64,
    pub disk_total: u64,
    /// Free to anyone but root's reserve.
    pub disk_available: u64,
    pub disk_used: u64,
}

/// What happened to an entry under a watched directory.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum WatchKind {
    Create,
    Write,
    Remove,
    Rename,
    Chmod,
}

/// One change seen by a watcher.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct WatchEvent {
    /// Path relative to the watched directory.
    pub name: String,
    pub kind: WatchKind,
    /// The entry, for a watcher started with `entries` (none when it was
    /// gone by then).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entry: Option<Box<FileStat>>,
}

/// A running command ([`Reply::Commands`]): what it was started with.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct CommandInfo {
    pub command_id: String,
    pub pid: u32,
    /// The shell command line (empty when `argv` was given).
    pub command: String,
    #[serde(default)]
    pub argv: Option<Vec<String>>,
    #[serde(default)]
    pub cwd: Option<String>,
    /// The request's own environment (not the sandbox's defaults).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Whether it runs on a terminal (from [`FOLLOW_VERSION`]; older
    /// guests say nothing, read as `false`).
    #[serde(default)]
    pub pty: bool,
}

/// What [`Request::Identity`] sets, in this order, before the guest runs
/// anything else for its sandbox.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct GuestIdentity {
    /// Host entropy mixed into the kernel's pool (`RNDADDENTROPY`), after
    /// which the CRNG is reseeded at once (`RNDRESEEDCRNG`): what the
    /// guest reads from `/dev/urandom` or `getrandom` from then on differs
    /// from every other guest restored from the same memory. At least
    /// [`MIN_IDENTITY_ENTROPY`] bytes.
    pub entropy: Vec<u8>,
    /// The kernel's host name (`sethostname`) and `/etc/hostname`.
    pub hostname: String,
    /// `/etc/machine-id`: 32 lowercase hex digits.
    pub machine_id: String,
    /// What `/proc/sys/kernel/random/boot_id` reads from now on (a UUID,
    /// lowercase, hyphenated).
    pub boot_id: String,
}

/// Fewest entropy bytes a [`GuestIdentity`] carries (the CRNG's key size
/// is 32; twice that).
pub const MIN_IDENTITY_ENTROPY: usize = 64;

impl GuestIdentity {
    /// Checks the shape of each field (a guest applies nothing it would
    /// refuse halfway).
    pub fn validate(&self) -> Result<(), String> {
        if self.entropy.len() < MIN_IDENTITY_ENTROPY || self.entropy.len() > 4096 {
            return Err(format!(
                "entropy: {} bytes, wanted {MIN_IDENTITY_ENTROPY} to 4096",
                self.entropy.len()
            ));
        }
        let h = &self.hostname;
        if h.is_empty()
            || h.len() > 63
            || !h
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
        {
            return Err(format!("hostname {h:?}: 1 to 63 of [A-Za-z0-9.-]"));
        }
        let m = &self.machine_id;
        if m.len() != 32 || !m.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            return Err(format!("machine_id {m:?}: 32 lowercase hex digits"));
        }
        let b = &self.boot_id;
        let shape = b.len() == 36
            && b.bytes().enumerate().all(|(i, c)| match i {
                8 | 13 | 18 | 23 => c == b'-',
                _ => matches!(c, b'0'..=b'9' | b'a'..=b'f'),
            });
        if !shape {
            return Err(format!("boot_id {b:?}: a lowercase hyphenated UUID"));
        }
        Ok(())
    }
}

/// What [`Request::Configure`] sets.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct GuestConfig {
    /// Bring up this interface (absent: the VM has no network).
    #[serde(default)]
    pub network: Option<GuestNetwork>,
    /// Environment under every command's own (the command's wins per key):
    /// proxy variables, CA bundle paths, a proxy rule's dummy credentials.
    /// Replaces the previous configuration's.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
}

/// The guest's one NIC, configured by the agent (the kernel has no `ip=`).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct GuestNetwork {
    /// Interface name, e.g. `eth0`.
    pub interface: String,
    /// IPv4 address and prefix length.
    pub address: std::net::Ipv4Addr,
    pub prefix: u8,
    /// Default route and the only DNS server.
    pub gateway: std::net::Ipv4Addr,
    pub dns: std::net::Ipv4Addr,
    /// PEM certificate the guest must trust (the egress proxy's CA): added
    /// to the system bundle.
    #[serde(default)]
    pub ca_pem: Option<String>,
}

/// How to start a command. Durations are in milliseconds; see field docs for
/// the sentinel values, which follow LangSmith's API.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ExecRequest {
    /// A shell command line, run as `shell -c command`.
    #[serde(default)]
    pub command: String,
    /// When set, run this argv directly, without a shell (`command` is ignored).
    #[serde(default)]
    pub argv: Option<Vec<String>>,
    /// Default `/bin/bash`, falling back to `/bin/sh` when bash is absent.
    #[serde(default)]
    pub shell: Option<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub cwd: Option<String>,
    /// User name or numeric uid; default root.
    #[serde(default)]
    pub user: Option<String>,
    /// Kill the process group after this long; 0 = no deadline.
    #[serde(default)]
    pub timeout_ms: u64,
    /// Kill when no client has been attached this long; negative = never.
    /// (LangSmith's `-1`; 0 kills as soon as the client goes away.)
    #[serde(default = "default_idle_timeout")]
    pub idle_timeout_ms: i64,
    /// Keep a finished command for reconnects this long; negative = forever,
    /// 0 = forget it as soon as it has finished.
    #[serde(default = "default_ttl")]
    pub ttl_ms: i64,
    #[serde(default)]
    pub kill_on_disconnect: bool,
    /// Run under a pseudo-terminal of this size (stderr merges into stdout).
    #[serde(default)]
    pub pty: Option<PtySize>,
    /// Client-chosen id; a second exec with the same id attaches instead.
    #[serde(default)]
    pub command_id: Option<String>,
}

impl Default for ExecRequest {
    fn default() -> Self {
        Self {
            command: String::new(),
            argv: None,
            shell: None,
            env: BTreeMap::new(),
            cwd: None,
            user: None,
            timeout_ms: 0,
            idle_timeout_ms: default_idle_timeout(),
            ttl_ms: default_ttl(),
            kill_on_disconnect: false,
            pty: None,
            command_id: None,
        }
    }
}

fn default_idle_timeout() -> i64 {
    300_000
}
fn default_ttl() -> i64 {
    600_000
}

#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct PtySize {
    pub rows: u16,
    pub cols: u16,
}

/// Control messages on an exec stream, host → guest.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ExecInput {
    /// Send a signal to the process group (default SIGKILL).
    Kill {
        #[serde(default)]
        signal: Option<i32>,
    },
    Resize(PtySize),
    /// Close the command's stdin.
    CloseStdin,
}

/// Control messages on an exec stream, guest → host.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ExecEvent {
    Started {
        command_id: String,
        pid: u32,
    },
    /// The command ended; `signal` is set when a signal ended it, and then
    /// `exit_code` is 128 + signal, as a shell reports it.
    Exit {
        exit_code: i32,
        #[serde(default)]
        signal: Option<i32>,
    },
    Error {
        error_type: ExecErrorType,
        message: String,
    },
}

/// LangSmith's exec error types.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub enum ExecErrorType {
    CommandTimeout,
    CommandNotFound,
    SessionExpired,
    CommandError,
    /// The request cannot start a command (no such working directory or
    /// user, a NUL byte, an invalid environment name, a program that may
    /// not be executed): the caller's mistake. Not one of LangSmith's
    /// types: hosts send it to clients as `CommandError`, and answer 400.
    BadRequest,
}

/// Which output of a command a chunk belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutputChannel {
    Stdout = 1,
    Stderr = 2,
}

/// Exec output travels in `Data` frames as `[channel u8][offset u64 LE][bytes]`.
pub const OUTPUT_HEADER_LEN: usize = 9;

pub fn encode_output(channel: OutputChannel, offset: u64, data: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(OUTPUT_HEADER_LEN + data.len());
    b.put_u8(channel as u8);
    b.put_u64_le(offset);
    b.extend_from_slice(data);
    b.freeze()
}

/// Parses an exec output chunk; `None` when malformed.
pub fn decode_output(payload: &Bytes) -> Option<(OutputChannel, u64, Bytes)> {
    if payload.len() < OUTPUT_HEADER_LEN {
        return None;
    }
    let channel = match payload[0] {
        1 => OutputChannel::Stdout,
        2 => OutputChannel::Stderr,
        _ => return None,
    };
    let mut off = [0u8; 8];
    off.copy_from_slice(&payload[1..9]);
    Some((
        channel,
        u64::from_le_bytes(off),
        payload.slice(OUTPUT_HEADER_LEN..),
    ))
}

/// Kinds of failure of a file or network operation.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum OpErrorKind {
    NotFound,
    PermissionDenied,
    IsADirectory,
    NotADirectory,
    /// The path exists but is not a regular file (a FIFO, device or
    /// socket): the file API reads and writes only regular files.
    NotAFile,
    AlreadyExists,
    DirectoryNotEmpty,
    InvalidPath,
    ConnectionRefused,
    BadRequest,
    Unsupported,
    Io,
}

/// A failed operation, as sent in a `Ctl` or `Close` frame.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq, thiserror::Error)]
#[error("{kind:?}: {message}")]
pub struct OpError {
    pub kind: OpErrorKind,
    pub message: String,
}

impl OpError {
    pub fn new(kind: OpErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }

    pub fn from_io(e: &std::io::Error, what: &str) -> Self {
        use std::io::ErrorKind as K;
        let kind = match e.kind() {
            K::NotFound => OpErrorKind::NotFound,
            K::PermissionDenied => OpErrorKind::PermissionDenied,
            K::AlreadyExists => OpErrorKind::AlreadyExists,
            K::ConnectionRefused => OpErrorKind::ConnectionRefused,
            K::IsADirectory => OpErrorKind::IsADirectory,
            K::NotADirectory => OpErrorKind::NotADirectory,
            K::DirectoryNotEmpty => OpErrorKind::DirectoryNotEmpty,
            K::InvalidInput | K::InvalidFilename => OpErrorKind::InvalidPath,
            _ => OpErrorKind::Io,
        };
        Self::new(kind, format!("{what}: {e}"))
    }
}

/// Replies on file, dial and info streams, guest → host.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Reply {
    Ok,
    /// First reply to `ReadFile`: the bytes that will follow, and the
    /// version of the file they come from (of the open file, so it cannot
    /// race a rename).
    FileInfo {
        size: u64,
        length: u64,
        #[serde(default)]
        mtime_ns: i64,
        #[serde(default)]
        ino: u64,
    },
    Written {
        bytes: u64,
    },
    /// Boxed: the largest reply, kept off every other reply's size.
    Stat(Box<FileStat>),
    List {
        entries: Vec<FileStat>,
    },
    Connected,
    Info(GuestInfo),
    Error(OpError),
    /// Some results of a `Glob`; more batches may follow.
    GlobMatches {
        matches: Vec<GlobMatch>,
    },
    /// Some results of a `Grep`; more batches may follow.
    GrepMatches {
        matches: Vec<GrepMatch>,
    },
    /// The last reply to `Glob` or `Grep`. `truncated`: the limit, the
    /// guest's deadline or its walk budget cut the search short.
    Searched {
        truncated: bool,
    },
    /// Answer to [`Request::Clock`]: the guest's `CLOCK_REALTIME` (Unix
    /// nanoseconds) after the step, read just before answering.
    Clock {
        realtime_ns: u64,
    },
    /// Answer to [`Request::Commands`].
    Commands {
        commands: Vec<CommandInfo>,
    },
    /// Answer to [`Request::WatchStart`].
    Watcher {
        id: String,
    },
    /// Answer to [`Request::WatchEvents`], oldest first; `lost` when the
    /// guest dropped events it could not keep (too many unasked).
    WatchEvents {
        events: Vec<WatchEvent>,
        lost: bool,
    },
    /// Some of the samples asked for ([`Request::Samples`]), oldest first;
    /// `more`: another batch follows.
    Samples {
        samples: Vec<GuestSample>,
        more: bool,
    },
    /// Some of the log entries asked for ([`Request::Logs`]), oldest
    /// first; `more`: another batch follows.
    Logs {
        entries: Vec<LogEntry>,
        more: bool,
    },
}

/// One entry found by `Glob`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct GlobMatch {
    /// Absolute path.
    pub path: String,
    pub is_dir: bool,
    pub size: u64,
    /// Modification time, unix seconds.
    pub mtime: i64,
}

/// One line found by `Grep`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct GrepMatch {
    /// Absolute path of the file.
    pub path: String,
    /// 1-based line number.
    pub line: u64,
    /// The line without its newline, lossily UTF-8, cut at
    /// [`GREP_MAX_LINE`] bytes.
    pub text: String,
}

/// Longest line text a `GrepMatch` carries.
pub const GREP_MAX_LINE: usize = 1024;
/// Largest `limit` a `Glob` or `Grep` may ask for.
pub const SEARCH_MAX_LIMIT: u32 = 10_000;

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct FileStat {
    pub name: String,
    pub path: String,
    pub kind: FileKind,
    pub size: u64,
    pub mode: u32,
    pub mtime: i64,
    /// Modification time in nanoseconds and inode number: with `size`, the
    /// file's version (the host derives HTTP validators from them).
    #[serde(default)]
    pub mtime_ns: i64,
    #[serde(default)]
    pub ino: u64,
    /// Owner and group, by name where the guest's `/etc/passwd` and
    /// `/etc/group` have one, else the number (from [`FILE_USER_VERSION`];
    /// older guests say nothing, read as empty).
    #[serde(default)]
    pub owner: String,
    #[serde(default)]
    pub group: String,
    /// Its metadata (its `user.e2b.*` extended attributes; from
    /// [`FILE_USER_VERSION`]).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
    /// Owner and group ids, access and change times (unix seconds), and
    /// a symbolic link's target (from [`ATTRS_VERSION`]; older guests say
    /// nothing, read as zero and none).
    #[serde(default)]
    pub uid: u32,
    #[serde(default)]
    pub gid: u32,
    #[serde(default)]
    pub atime: i64,
    #[serde(default)]
    pub ctime: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
}

#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum FileKind {
    File,
    Dir,
    Symlink,
    Other,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct GuestInfo {
    pub agent_version: String,
    pub protocol_version: u16,
    pub kernel_release: String,
    pub hostname: String,
    pub uptime_ms: u64,
    pub mem_total_bytes: u64,
    pub mem_available_bytes: u64,
    pub cpus: u32,
    pub running_commands: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity() -> GuestIdentity {
        GuestIdentity {
            entropy: vec![7; 64],
            hostname: "sandbox-0123abcd".into(),
            machine_id: "0123456789abcdef0123456789abcdef".into(),
            boot_id: "01234567-89ab-cdef-0123-456789abcdef".into(),
        }
    }

    #[test]
    fn an_identity_is_checked_field_by_field() {
        identity().validate().unwrap();
        type Spoil = fn(&mut GuestIdentity);
        let bad: [(&str, Spoil); 6] = [
            ("entropy", |i| i.entropy.truncate(63)),
            ("hostname", |i| i.hostname = "a b".into()),
            ("hostname", |i| i.hostname = "x".repeat(64)),
            ("machine_id", |i| {
                i.machine_id = "0123456789ABCDEF0123456789ABCDEF".into()
            }),
            ("boot_id", |i| {
                i.boot_id = "0123456789abcdef0123456789abcdef".into()
            }),
            ("boot_id", |i| {
                i.boot_id = "01234567-89ab-cdef-0123_456789abcdef".into()
            }),
        ];
        for (field, spoil) in bad {
            let mut i = identity();
            spoil(&mut i);
            let e = i.validate().unwrap_err();
            assert!(e.starts_with(field), "{field}: {e}");
        }
    }

    #[test]
    fn requests_are_tagged_json() {
        let r = Request::Exec(ExecRequest {
            command: "echo hi".into(),
            ..Default::default()
        });
        let s = serde_json::to_string(&r).unwrap();
        assert!(s.starts_with(r#"{"op":"exec","command":"echo hi""#), "{s}");
        let back: Request = serde_json::from_str(&s).unwrap();
        assert_eq!(back, r);
        let exec: Request = serde_json::from_str(r#"{"op":"exec","command":"x"}"#).unwrap();
        let Request::Exec(e) = exec else { panic!() };
        assert_eq!(e.idle_timeout_ms, 300_000);
        assert_eq!(e.ttl_ms, 600_000);
        assert!(serde_json::from_str::<Request>(r#"{"op":"exec","bogus":1}"#).is_err());
        assert!(serde_json::from_str::<Request>(r#"{"op":"format_disk"}"#).is_err());
    }

    #[test]
    fn clock_requests_and_replies_are_tagged_json() {
        let r: Request = serde_json::from_str(r#"{"op":"clock","step_ns":-5000000000}"#).unwrap();
        assert_eq!(
            r,
            Request::Clock {
                step_ns: -5_000_000_000
            }
        );
        let read: Request = serde_json::from_str(r#"{"op":"clock"}"#).unwrap();
        assert_eq!(read, Request::Clock { step_ns: 0 });
        let reply = Reply::Clock {
            realtime_ns: 1_790_000_000_123_456_789,
        };
        let s = serde_json::to_string(&reply).unwrap();
        assert_eq!(s, r#"{"type":"clock","realtime_ns":1790000000123456789}"#);
        assert_eq!(serde_json::from_str::<Reply>(&s).unwrap(), reply);
    }

    #[test]
    fn output_chunks_round_trip_and_reject_garbage() {
        let b = encode_output(OutputChannel::Stderr, 1 << 40, b"abc");
        let (c, off, data) = decode_output(&b).unwrap();
        assert_eq!(
            (c, off, &data[..]),
            (OutputChannel::Stderr, 1 << 40, &b"abc"[..])
        );
        assert!(decode_output(&Bytes::from_static(&[1, 2, 3])).is_none());
        assert!(decode_output(&Bytes::from_static(&[9; 12])).is_none());
    }

    #[test]
    fn metadata_keys_are_lowercase_tokens_and_values_printable() {
        let m = |k: &str, v: &str| BTreeMap::from([(k.to_owned(), v.to_owned())]);
        assert!(check_metadata(&m("owner-team", "data science")).is_ok());
        assert!(check_metadata(&BTreeMap::new()).is_ok());
        for (k, v) in [
            ("", "x"),
            ("a b", "x"),
            ("Upper", "x"),
            ("k", "tab\t"),
            ("k", "é"),
        ] {
            assert!(check_metadata(&m(k, v)).is_err(), "{k:?} {v:?}");
        }
        assert!(check_metadata(&m(&"k".repeat(201), "x")).is_err());
        assert!(check_metadata(&m("k", &"v".repeat(3072))).is_err());
        let many: BTreeMap<_, _> = (0..65).map(|i| (format!("k{i}"), String::new())).collect();
        assert!(check_metadata(&many).is_err());
    }

    #[test]
    fn version_negotiation_picks_common_newest() {
        assert_eq!(
            negotiate(&[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]),
            Some(11)
        );
        assert_eq!(negotiate(&[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]), Some(10));
        assert_eq!(negotiate(&[1, 2, 3, 4, 5, 6, 7, 8, 9]), Some(9));
        assert_eq!(negotiate(&[1, 2, 3, 4, 5, 6, 7, 8]), Some(8));
        assert_eq!(negotiate(&[1, 2, 3, 4, 5, 6]), Some(6));
        assert_eq!(negotiate(&[1, 2, 3, 4]), Some(4));
        assert_eq!(negotiate(&[1, 2, 3]), Some(3));
        assert_eq!(negotiate(&[1, 2]), Some(2));
        assert_eq!(negotiate(&[1]), Some(1));
        assert_eq!(negotiate(&[12]), None);
        assert_eq!(negotiate(&[]), None);
    }
}
