//! `hearth-guest`: PID 1 of every Hearth microVM.
//!
//! Boots the guest (pseudo filesystems, virtio modules, root disk,
//! switch_root), reaps zombies, and serves the host agent over one
//! virtio-serial port (`hearth.agent`) with the protocol of
//! `hearth-guest-proto`: exec sessions, files, TCP dial, info, shutdown.
//! It runs unprivileged toward the host: it can only answer requests.

mod clock;
mod exec;
mod files;
mod identity;
mod init;
mod logs;
mod net;
mod netconf;
mod reaper;
mod samples;
mod search;
mod sys;
mod users;
mod watch;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use hearth_guest_proto::{
    guest_handshake_session, FrameCodec, GuestInfo, Mux, Reply, Request, Role, Stream,
    SUPPORTED_VERSIONS,
};
use tokio_util::codec::{FramedRead, FramedWrite};

const PORT_NAME: &str = "hearth.agent";

fn main() {
    let pid1 = std::process::id() == 1;
    if pid1 {
        match init::boot() {
            Ok(args) if !args.no_root => init::start_boot_services(),
            Ok(_) => {}
            Err(e) => {
                eprintln!("hearth-guest: boot failed: {e}");
                sys::power_off();
            }
        }
    }
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("hearth-guest: runtime: {e}");
            if pid1 {
                sys::power_off();
            }
            std::process::exit(1);
        }
    };
    rt.block_on(async {
        reaper::start();
        samples::start();
        logs::follow_kernel();
        let port = std::env::args().nth(1).map(PathBuf::from);
        serve(port).await;
    });
}

/// Finds `/dev/vportNpM` whose sysfs name is ours.
fn find_port() -> Option<PathBuf> {
    let dir = std::fs::read_dir("/sys/class/virtio-ports").ok()?;
    for e in dir.flatten() {
        let name = std::fs::read_to_string(e.path().join("name")).unwrap_or_default();
        if name.trim() == PORT_NAME {
            return Some(PathBuf::from("/dev").join(e.file_name()));
        }
    }
    None
}

async fn open_port(explicit: Option<PathBuf>) -> sys::SharedFd {
    loop {
        let path = explicit.clone().or_else(find_port);
        if let Some(path) = path {
            match std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(&path)
            {
                Ok(f) => match sys::FdIo::new(f.into()) {
                    Ok(io) => return sys::SharedFd(Arc::new(io)),
                    Err(e) => eprintln!("hearth-guest: {}: {e}", path.display()),
                },
                Err(e) => eprintln!("hearth-guest: open {}: {e}", path.display()),
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Serves the host forever. The port is opened once (a second open fails
/// with EBUSY); if the host side goes away, we wait for its next hello.
async fn serve(port: Option<PathBuf>) {
    let io = open_port(port).await;
    loop {
        let mut reader = FramedRead::new(io.clone(), FrameCodec);
        let mut writer = FramedWrite::new(io.clone(), FrameCodec);
        let (version, hello) = match guest_handshake_session(&mut reader, &mut writer).await {
            Ok(v) => v,
            Err(_) => {
                // Host not connected (reads return EOF): poll gently.
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        // A host that speaks `Request::Clock` sets the clock precisely
        // next; the hello's time is only for older hosts (see
        // `Hello::time_ms`).
        if version < hearth_guest_proto::CLOCK_VERSION {
            if let Some(ms) = hello.time_ms {
                clock::from_hello(ms);
            }
        }
        let (mux, accept) = Mux::start(Role::Guest, reader, writer);
        mux.bind_session(hello.nonce);
        let Some(mut accept) = accept else { return };
        loop {
            tokio::select! {
                next = accept.recv() => match next {
                    Some((stream, payload)) => {
                        tokio::spawn(handle(stream, payload, version));
                    }
                    None => break,
                },
                _ = mux.closed() => break,
            }
        }
        mux.shutdown("host went away");
        // Briefly: a host that went away makes the next handshake fail at
        // once (and that path sleeps); a new host session (a VM resumed from
        // saved memory) is waiting for our answer.
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn handle(stream: Stream, payload: bytes::Bytes, version: u16) {
    let req = match serde_json::from_slice::<Request>(&payload) {
        Ok(r) => r,
        Err(e) => {
            let err = hearth_guest_proto::OpError::new(
                hearth_guest_proto::OpErrorKind::BadRequest,
                format!("bad request: {e}"),
            );
            let _ = stream.send_ctl(&Reply::Error(err)).await;
            return;
        }
    };
    match req {
        Request::Exec(e) => exec::handle_exec(stream, e).await,
        Request::Stdin { pid, close } => exec::handle_stdin(stream, pid, close).await,
        Request::Resize { pid, size } => exec::handle_resize(stream, pid, size).await,
        Request::Follow { pid } => exec::handle_follow(stream, pid).await,
        Request::WatchStart {
            path,
            recursive,
            entries,
        } => watch::handle_start(stream, path, recursive, entries).await,
        Request::WatchEvents { id } => watch::handle_events(stream, id).await,
        Request::WatchStop { id } => watch::handle_stop(stream, id).await,
        Request::Commands => exec::handle_commands(stream).await,
        Request::Samples { since_ms } => samples::handle(stream, since_ms).await,
        Request::Logs { since_ms, limit } => logs::handle(stream, since_ms, limit).await,
        Request::Attach {
            command_id,
            stdout_offset,
            stderr_offset,
        } => exec::handle_attach(stream, command_id, stdout_offset, stderr_offset).await,
        Request::ReadFile {
            path,
            offset,
            length,
            user,
        } => files::read_file(stream, path, offset, length, user).await,
        Request::WriteFile {
            path,
            mode,
            user,
            metadata,
        } => files::write_file(stream, path, mode, user, metadata).await,
        Request::Stat { path, user } => files::stat(stream, path, user).await,
        Request::List { path, user } => files::list(stream, path, user).await,
        Request::SetAttrs {
            path,
            uid,
            gid,
            mode,
        } => files::set_attrs(stream, path, uid, gid, mode).await,
        Request::Mkdir {
            path,
            parents,
            user,
        } => files::mkdir(stream, path, parents, user).await,
        Request::Remove {
            path,
            recursive,
            user,
        } => files::remove(stream, path, recursive, user).await,
        Request::Glob {
            path,
            pattern,
            limit,
        } => search::glob(stream, path, pattern, limit).await,
        Request::Grep {
            path,
            pattern,
            glob,
            limit,
        } => search::grep(stream, path, pattern, glob, limit).await,
        Request::TcpDial { port } => net::dial(stream, port).await,
        Request::Clock { step_ns } => {
            if let Err(e) = stream.send_ctl(&clock::handle(step_ns)).await {
                eprintln!("hearth-guest: cannot answer a clock request: {e}");
            }
        }
        Request::Info => {
            let _ = stream.send_ctl(&Reply::Info(info(version))).await;
        }
        Request::Configure(cfg) => {
            // Blocking file and ioctl work, and a short wait for the NIC.
            let done = tokio::task::spawn_blocking(move || netconf::configure(cfg)).await;
            let reply = match done {
                Ok(Ok(())) => Reply::Ok,
                Ok(Err(msg)) => Reply::Error(hearth_guest_proto::OpError::new(
                    hearth_guest_proto::OpErrorKind::Io,
                    msg,
                )),
                Err(e) => Reply::Error(hearth_guest_proto::OpError::new(
                    hearth_guest_proto::OpErrorKind::Io,
                    format!("configure: {e}"),
                )),
            };
            let _ = stream.send_ctl(&reply).await;
        }
        Request::Identity(id) => {
            let done = tokio::task::spawn_blocking(move || identity::apply(&id)).await;
            let reply = match done {
                Ok(Ok(())) => Reply::Ok,
                Ok(Err(msg)) => Reply::Error(hearth_guest_proto::OpError::new(
                    hearth_guest_proto::OpErrorKind::Io,
                    msg,
                )),
                Err(e) => Reply::Error(hearth_guest_proto::OpError::new(
                    hearth_guest_proto::OpErrorKind::Io,
                    format!("identity: {e}"),
                )),
            };
            if let Err(e) = stream.send_ctl(&reply).await {
                eprintln!("hearth-guest: cannot answer an identity request: {e}");
            }
        }
        Request::Shutdown => {
            sys::sync();
            let _ = stream.send_ctl(&Reply::Ok).await;
            if std::process::id() == 1 {
                tokio::time::sleep(Duration::from_millis(50)).await;
                sys::power_off();
            }
        }
    }
}

fn meminfo_kib(text: &str, key: &str) -> u64 {
    text.lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn info(version: u16) -> GuestInfo {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let mem = read("/proc/meminfo");
    let uptime_s: f64 = read("/proc/uptime")
        .split_whitespace()
        .next()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    GuestInfo {
        agent_version: env!("CARGO_PKG_VERSION").into(),
        protocol_version: version.min(*SUPPORTED_VERSIONS.last().unwrap_or(&1)),
        kernel_release: read("/proc/sys/kernel/osrelease").trim().into(),
        hostname: read("/proc/sys/kernel/hostname").trim().into(),
        uptime_ms: (uptime_s * 1000.0) as u64,
        mem_total_bytes: meminfo_kib(&mem, "MemTotal:") * 1024,
        mem_available_bytes: meminfo_kib(&mem, "MemAvailable:") * 1024,
        cpus: std::thread::available_parallelism()
            .map(|n| n.get() as u32)
            .unwrap_or(1),
        running_commands: exec::running_count(),
    }
}
