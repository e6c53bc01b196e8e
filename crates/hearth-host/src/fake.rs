//! A fake VMM, so that host logic is tested in milliseconds, without
//! QEMU, a kernel or root (feature `fake`; the host's own tests enable it).
//!
//! [`FakeVmm`] is a [`hearth_vmm::Vmm`]: give it to [`crate::Host::start_with`]
//! with [`guest_images`] as [`crate::HostConfig::images`], no network and
//! no jail, and the host runs its whole lifecycle against it (disks in the
//! store included). A fake VM is no process: it is a task on the host that
//! listens on the VM's agent socket and answers as the guest agent does,
//! with `hearth-guest-proto`'s own handshake and multiplexer
//! ([`hearth_guest_proto::guest_handshake_session`], [`Mux`]). It knows
//! enough of the protocol for a host: ping, clock, configure, info,
//! shutdown (the VMM then exits), and exec of a few built-in commands
//! (`true`, `false`, `sync`, `echo …`; anything else exits 127). Requests
//! wait while the VM is paused, as a frozen guest's would.
//!
//! The VMM side models what the host relies on: pause and resume, stop
//! (a quit the VMM may ignore, then a kill), kill, an exit reported once
//! to every waiter, save (a small state file; the RAM stays in the memory
//! file, which the fake creates and sizes as QEMU does) and restore (from
//! such a file), and [`hearth_vmm::Vmm::reap_stale`] of a VM whose "VMM"
//! outlived the host that started it (its task died with that host's
//! runtime; the fake still counts it as running until reaped).
//!
//! Faults are injected on the [`FakeVmm`] handle (it is a cheap clone of
//! the one the host holds): boots that fail ([`BootFault`]), a VMM that
//! dies ([`FakeVmm::crash`]), a guest agent that stops ([`FakeVmm::wedge`]),
//! saves that fail, VMMs that ignore a quit.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use hearth_guest_proto::{
    encode_output, guest_handshake_session, ExecEvent, ExecRequest, FrameCodec, GuestInfo, Mux,
    OpError, OpErrorKind, OutputChannel, Reply, Request, Role, Stream,
};
use hearth_image::{GuestArtifacts, ImageName, InitramfsArtifact, KernelArtifact, RootfsArtifact};
use hearth_types::{ByteSize, VmId};
use hearth_vmm::{
    Accel, ExitInfo, LiveSaved, RestoreFrom, RestoreMemory, SavedState, VmInstance, VmSpec, Vmm,
    VmmError,
};
use serde::{Deserialize, Serialize};
use tokio::net::UnixListener;
use tokio::sync::watch;
use tokio_util::codec::{FramedRead, FramedWrite};

use crate::host::GuestImages;

/// Fake PIDs start here, above any kernel's `pid_max` (at most 2^22): a
/// fake PID is never a real process's.
const FIRST_PID: u32 = 1 << 30;
/// How long a fake guest takes to power off after answering a shutdown.
const POWER_OFF_DELAY: Duration = Duration::from_millis(20);

/// How a boot (or restore) of the fake fails; see [`FakeVmm::fail_next_boot`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BootFault {
    /// The VMM does not start: the boot returns an error.
    VmmFails,
    /// The VMM starts and dies at once (as QEMU does when the guest
    /// crashes it during boot).
    VmmDies,
    /// The VMM runs but its guest never answers the host's hello (a
    /// kernel that hangs): the host's boot timeout ends it.
    GuestSilent,
}

/// A fake VMM; cheap to clone, every clone is the same VMM.
#[derive(Clone)]
pub struct FakeVmm {
    shared: Arc<Shared>,
}

struct Shared {
    accel: Accel,
    next_pid: AtomicU32,
    state: Mutex<FakeState>,
}

#[derive(Default)]
struct FakeState {
    boot_faults: VecDeque<BootFault>,
    fail_saves: bool,
    ignore_quit: bool,
    /// VMs whose "VMM" is running, by id.
    running: HashMap<VmId, Arc<Machine>>,
    boots: u32,
    restores: u32,
    /// Restores left stopped ([`Vmm::restore_frozen`]), counted in
    /// `restores` too.
    frozen_restores: u32,
    reaped: Vec<VmId>,
    /// How long a cold-booted guest takes to answer the host's hello.
    boot_time: Duration,
    /// Cold boots whose guest has not answered yet, and the most at once.
    booting: u32,
    max_booting: u32,
}

impl Default for FakeVmm {
    fn default() -> Self {
        Self::new()
    }
}

impl FakeVmm {
    /// A fake whose VMs report TCG.
    pub fn new() -> Self {
        Self {
            shared: Arc::new(Shared {
                accel: Accel::Tcg,
                next_pid: AtomicU32::new(FIRST_PID),
                state: Mutex::new(FakeState::default()),
            }),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, FakeState> {
        self.shared.state()
    }

    /// The next boot or restore fails as `fault` says (faults queue up:
    /// one per boot, in order).
    pub fn fail_next_boot(&self, fault: BootFault) {
        self.state().boot_faults.push_back(fault);
    }

    /// Whether saves fail (the VM then runs on, as the trait promises).
    pub fn fail_saves(&self, fail: bool) {
        self.state().fail_saves = fail;
    }

    /// Whether VMMs booted from now on ignore a request to quit and their
    /// guests a shutdown, so that only a kill ends them.
    pub fn ignore_quit(&self, ignore: bool) {
        self.state().ignore_quit = ignore;
    }

    /// The VMM of `id` dies now (as if SIGKILLed from outside); `false`
    /// when it is not running.
    pub fn crash(&self, id: VmId) -> bool {
        let m = self.state().running.get(&id).cloned();
        match m {
            Some(m) => {
                m.end(ExitInfo {
                    code: None,
                    signal: Some(libc::SIGKILL),
                });
                true
            }
            None => false,
        }
    }

    /// The guest agent of `id` stops for good, as one stopped under
    /// ptrace: it reads nothing more from its connection, so it answers no
    /// ping and no request, while its VMM runs on and the connection stays
    /// open; only the VMM's end (a stop's kill, a crash) ends it. False if
    /// the VM is not running.
    pub fn wedge(&self, id: VmId) -> bool {
        let Some(m) = self.state().running.get(&id).cloned() else {
            return false;
        };
        m.wedged.send_replace(true);
        true
    }

    /// The identity the host last gave the running VM `id`
    /// (`Request::Identity`), if any.
    pub fn identity(&self, id: VmId) -> Option<hearth_guest_proto::GuestIdentity> {
        let m = self.state().running.get(&id).cloned()?;
        let identity = m.identity.lock().unwrap_or_else(|p| p.into_inner()).clone();
        identity
    }

    /// The guest clock of the running VM `id` minus the host's, in ns: 0
    /// at boot, behind by as long as the VM was paused, and as the host's
    /// steps left it.
    pub fn clock_offset_ns(&self, id: VmId) -> Option<i64> {
        let m = self.state().running.get(&id).cloned()?;
        let offset = m.clock().now_ns() as i128 - i128::from(wall_ns());
        Some(offset.clamp(i64::MIN.into(), i64::MAX.into()) as i64)
    }

    /// The next `answers` clock requests of the VM `id` are answered
    /// `by` late (the guest reads its clock half way), as a guest does
    /// that has just resumed on a loaded host; false if it is not running.
    pub fn slow_clock(&self, id: VmId, answers: u32, by: Duration) -> bool {
        let Some(m) = self.state().running.get(&id).cloned() else {
            return false;
        };
        let mut c = m.clock();
        (c.slow, c.slow_by) = (answers, by);
        true
    }

    /// From now on the guest clock of `id` drifts by `rate` of the
    /// host's time (-0.2: 20 % slow), as a TCG guest's was seen to on a
    /// loaded host; false if it is not running.
    pub fn drift_clock(&self, id: VmId, rate: f64) -> bool {
        let Some(m) = self.state().running.get(&id).cloned() else {
            return false;
        };
        m.clock().drift = Some((std::time::Instant::now(), rate));
        true
    }

    /// Whether the VMM of `id` is running (paused counts).
    pub fn is_running(&self, id: VmId) -> bool {
        self.state().running.contains_key(&id)
    }

    /// Whether the VM `id` is paused.
    pub fn is_paused(&self, id: VmId) -> bool {
        self.state()
            .running
            .get(&id)
            .is_some_and(|m| *m.paused.borrow())
    }

    /// Cold boots so far (failed ones included).
    pub fn boots(&self) -> u32 {
        self.state().boots
    }

    /// Restores so far (failed ones included).
    pub fn restores(&self) -> u32 {
        self.state().restores
    }

    /// How many of [`FakeVmm::restores`] were left stopped.
    pub fn frozen_restores(&self) -> u32 {
        self.state().frozen_restores
    }

    /// VMs whose VMM [`Vmm::reap_stale`] found running and ended.
    pub fn reaped(&self) -> Vec<VmId> {
        self.state().reaped.clone()
    }

    /// Cold-booted guests answer the host's hello only after `time` (as a
    /// kernel boots); restored ones at once.
    pub fn boot_time(&self, time: Duration) {
        self.state().boot_time = time;
    }

    /// The most cold boots that were under way at once (VMM started, the
    /// guest not yet answered).
    pub fn max_booting(&self) -> u32 {
        self.state().max_booting
    }

    /// Starts a VM: files in the run directory, a guest task on its
    /// socket; `restored`: from a saved state (the memory file is the
    /// restore's, not replaced).
    async fn start(&self, spec: &VmSpec, restored: bool) -> Result<FakeInstance, VmmError> {
        let (fault, boot_time) = {
            let mut st = self.state();
            if restored {
                st.restores += 1;
            } else {
                st.boots += 1;
            }
            (st.boot_faults.pop_front(), st.boot_time)
        };
        if fault == Some(BootFault::VmmFails) {
            return Err(VmmError::backend(
                spec.id,
                "boot",
                "the fake vmm failed to start (injected)",
            ));
        }
        if !spec.memory.bytes().is_multiple_of(ByteSize::MIB) || spec.memory.bytes() == 0 {
            return Err(VmmError::InvalidSpec {
                vm: spec.id,
                reason: format!("memory {} is not a positive whole MiB", spec.memory),
            });
        }
        let run_err = |path: &Path| {
            let (vm, path) = (spec.id, path.to_owned());
            move |source| VmmError::RunDir { vm, path, source }
        };
        let channel = spec.run_dir.join("fake-agent.sock");
        let console = spec.run_dir.join("console.log");
        match std::fs::remove_file(&channel) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(run_err(&channel)(e)),
        }
        let what = if restored { "restored" } else { "booted" };
        std::fs::write(&console, format!("fake guest {what}\n")).map_err(run_err(&console))?;
        if !restored {
            write_memory(&spec.mem_path, spec.id, spec.memory).map_err(run_err(&spec.mem_path))?;
        }
        let listener = UnixListener::bind(&channel).map_err(run_err(&channel))?;
        let ignore_quit = self.state().ignore_quit;
        let (exit, _) = watch::channel(None);
        let (paused, _) = watch::channel(false);
        let (wedged, _) = watch::channel(false);
        let machine = Arc::new(Machine {
            id: spec.id,
            pid: self.shared.next_pid.fetch_add(1, Ordering::Relaxed),
            exit,
            paused,
            wedged,
            identity: Mutex::new(None),
            clock: Mutex::new(FakeClock::default()),
            ignore_quit,
            booting: AtomicBool::new(!restored),
            vmm: Arc::downgrade(&self.shared),
        });
        {
            let mut st = self.state();
            st.running.insert(spec.id, machine.clone());
            if !restored {
                st.booting += 1;
                st.max_booting = st.max_booting.max(st.booting);
            }
        }
        let silent = fault == Some(BootFault::GuestSilent);
        let boot_time = if restored { Duration::ZERO } else { boot_time };
        tokio::spawn(serve_guest(listener, machine.clone(), silent, boot_time));
        if fault == Some(BootFault::VmmDies) {
            machine.end(ExitInfo {
                code: Some(1),
                signal: None,
            });
        }
        Ok(FakeInstance {
            accel: self.shared.accel,
            channel,
            console,
            mem_path: spec.mem_path.clone(),
            memory: spec.memory,
            devices: devices(spec),
            m: machine,
        })
    }
}

impl Shared {
    fn state(&self) -> std::sync::MutexGuard<'_, FakeState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The state file a fake save writes.
#[derive(Debug, Serialize, Deserialize)]
struct SavedFake {
    fake_vm: VmId,
    memory_bytes: u64,
    /// The devices the VM had ([`devices`]): as QEMU, a restore must have
    /// the same ones.
    #[serde(default)]
    devices: Vec<String>,
}

/// The devices a spec gives a VM besides its disks and channel (whose
/// absence or presence changes what a saved state holds).
fn devices(spec: &VmSpec) -> Vec<String> {
    let mut d = Vec::new();
    if spec.free_page_reporting {
        d.push("virtio-balloon".to_owned());
    }
    if spec.net.is_some() {
        d.push("virtio-net".to_owned());
    }
    d
}

/// Creates (replacing) the VM's RAM file, sparse and `memory` long, with
/// the VM's id in its first bytes: a save has data to keep.
fn write_memory(path: &Path, id: VmId, memory: ByteSize) -> io::Result<()> {
    use std::io::Write;
    let mut f = std::fs::File::create(path)?;
    f.write_all(id.to_string().as_bytes())?;
    f.set_len(memory.bytes())
}

impl Vmm for FakeVmm {
    type Instance = FakeInstance;

    async fn boot(&self, spec: &VmSpec) -> Result<FakeInstance, VmmError> {
        self.start(spec, false).await
    }

    async fn restore(&self, spec: &VmSpec, from: &RestoreFrom) -> Result<FakeInstance, VmmError> {
        let invalid = |reason: String| VmmError::InvalidSpec {
            vm: spec.id,
            reason,
        };
        let text = std::fs::read(&from.state).map_err(|source| VmmError::RunDir {
            vm: spec.id,
            path: from.state.clone(),
            source,
        })?;
        let saved: SavedFake = serde_json::from_slice(&text)
            .map_err(|e| invalid(format!("not a fake vm's state: {e}")))?;
        if saved.memory_bytes != spec.memory.bytes() {
            return Err(invalid(format!(
                "saved with {} bytes of memory, restored with {}",
                saved.memory_bytes,
                spec.memory.bytes()
            )));
        }
        if saved.devices != devices(spec) {
            return Err(invalid(format!(
                "saved with devices {:?}, restored with {:?} (QEMU: unknown savevm section; make sure your current VM setup matches your saved VM setup)",
                saved.devices,
                devices(spec)
            )));
        }
        let memory = match &from.memory {
            RestoreMemory::File(path) | RestoreMemory::Private(path) => path,
            // The state holds the RAM (a live save), or a sealed template
            // is mapped: a fresh memory file stands for it.
            RestoreMemory::InState | RestoreMemory::Template(_) | RestoreMemory::Unpack(_) => {
                if let RestoreMemory::Template(t) = &from.memory {
                    if t.size() != spec.memory {
                        return Err(invalid(format!(
                            "the template holds {} bytes, the vm has {}",
                            t.size().bytes(),
                            spec.memory.bytes()
                        )));
                    }
                }
                let vm = self.start(spec, true).await?;
                write_memory(&spec.mem_path, saved.fake_vm, spec.memory).map_err(|source| {
                    VmmError::RunDir {
                        vm: spec.id,
                        path: spec.mem_path.clone(),
                        source,
                    }
                })?;
                return Ok(vm);
            }
        };
        if !from.memory.is_private() && *memory != spec.mem_path {
            return Err(invalid(
                "a restore that takes the memory over must name the spec's memory file".into(),
            ));
        }
        let len = std::fs::metadata(memory)
            .map_err(|source| VmmError::RunDir {
                vm: spec.id,
                path: memory.clone(),
                source,
            })?
            .len();
        if len != spec.memory.bytes() {
            return Err(invalid(format!(
                "memory file holds {len} bytes, the vm has {}",
                spec.memory.bytes()
            )));
        }
        let mut vm = self.start(spec, true).await?;
        vm.mem_path = memory.clone();
        Ok(vm)
    }

    async fn restore_frozen(
        &self,
        spec: &VmSpec,
        from: &RestoreFrom,
    ) -> Result<FakeInstance, VmmError> {
        let vm = Vmm::restore(self, spec, from).await?;
        // Stopped before its guest runs: it answers nothing until resumed.
        vm.m.clock().pause();
        vm.m.paused.send_replace(true);
        self.state().frozen_restores += 1;
        Ok(vm)
    }

    fn accel(&self) -> Accel {
        self.shared.accel
    }

    async fn reap_stale(&self, id: VmId, pid: Option<u32>) -> Result<bool, VmmError> {
        let m = {
            let st = self.state();
            st.running.get(&id).filter(|m| Some(m.pid) == pid).cloned()
        };
        let Some(m) = m else { return Ok(false) };
        m.end(ExitInfo {
            code: None,
            signal: Some(libc::SIGKILL),
        });
        self.state().reaped.push(id);
        Ok(true)
    }
}

/// The host's `CLOCK_REALTIME` in Unix ns.
fn wall_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// A fake guest's wall clock: the host's plus an offset, standing still
/// while the VM is paused (as a guest's does under TCG), stepped by the
/// host's `Request::Clock`.
#[derive(Default)]
struct FakeClock {
    offset_ns: i64,
    /// When the VM was paused, while it is.
    stopped_at: Option<std::time::Instant>,
    /// This many answers to come are slow, by `slow_by` each.
    slow: u32,
    slow_by: Duration,
    /// Since when, and how fast (its error per ns of the host's: -0.1 is
    /// 10 % slow), the clock drifts.
    drift: Option<(std::time::Instant, f64)>,
}

impl FakeClock {
    fn now_ns(&self) -> u64 {
        let host = i128::from(wall_ns());
        let stood = self
            .stopped_at
            .map_or(0, |t| t.elapsed().as_nanos() as i128);
        let drift = self.drift.map_or(0, |(since, rate)| {
            (since.elapsed().as_nanos() as f64 * rate) as i128
        });
        (host + i128::from(self.offset_ns) - stood + drift).clamp(0, u64::MAX.into()) as u64
    }

    fn pause(&mut self) {
        self.stopped_at.get_or_insert_with(std::time::Instant::now);
    }

    fn resume(&mut self) {
        if let Some(t) = self.stopped_at.take() {
            let stood = i64::try_from(t.elapsed().as_nanos()).unwrap_or(i64::MAX);
            self.offset_ns = self.offset_ns.saturating_sub(stood);
        }
    }
}

/// A fake VM's "VMM process".
struct Machine {
    id: VmId,
    pid: u32,
    /// `Some` once it has ended.
    exit: watch::Sender<Option<ExitInfo>>,
    paused: watch::Sender<bool>,
    /// Set by [`FakeVmm::wedge`]; never cleared.
    wedged: watch::Sender<bool>,
    /// The last identity the host gave it (see [`FakeVmm::identity`]).
    identity: Mutex<Option<hearth_guest_proto::GuestIdentity>>,
    clock: Mutex<FakeClock>,
    ignore_quit: bool,
    /// A cold boot whose guest has not answered the hello yet.
    booting: AtomicBool,
    vmm: Weak<Shared>,
}

impl Machine {
    /// The VMM ends (once; later calls change nothing): its guest's
    /// connection closes and every waiter learns `info`.
    ///
    /// The VMM's state is locked throughout, so that whoever learns of the
    /// exit finds the VM no longer running ([`FakeVmm::is_running`]).
    fn end(&self, info: ExitInfo) {
        let vmm = self.vmm.upgrade();
        let mut st = vmm.as_deref().map(Shared::state);
        let ended = self.exit.send_if_modified(|e| {
            if e.is_some() {
                return false;
            }
            *e = Some(info);
            true
        });
        if let (true, Some(st)) = (ended, st.as_mut()) {
            if st.running.get(&self.id).is_some_and(|m| m.pid == self.pid) {
                st.running.remove(&self.id);
            }
            if self.booting.swap(false, Ordering::Relaxed) {
                st.booting -= 1;
            }
        }
    }

    /// The guest answered its hello: a cold boot is over.
    fn booted(&self) {
        if let Some(vmm) = self.vmm.upgrade() {
            let mut st = vmm.state();
            if self.booting.swap(false, Ordering::Relaxed) {
                st.booting -= 1;
            }
        }
    }

    fn clock(&self) -> std::sync::MutexGuard<'_, FakeClock> {
        self.clock.lock().unwrap_or_else(|p| p.into_inner())
    }

    async fn exited(&self) -> ExitInfo {
        let mut rx = self.exit.subscribe();
        // The sender lives as long as `self`: never an error.
        let exit = match rx.wait_for(Option::is_some).await {
            Ok(e) => e.unwrap_or_default(),
            Err(_) => ExitInfo::default(),
        };
        exit
    }

    async fn running(&self) {
        let mut rx = self.paused.subscribe();
        // The sender lives as long as `self`: never an error.
        if rx.wait_for(|p| !p).await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// A VM of the [`FakeVmm`].
pub struct FakeInstance {
    accel: Accel,
    channel: PathBuf,
    console: PathBuf,
    mem_path: PathBuf,
    memory: ByteSize,
    devices: Vec<String>,
    m: Arc<Machine>,
}

impl VmInstance for FakeInstance {
    fn id(&self) -> VmId {
        self.m.id
    }

    fn pid(&self) -> u32 {
        self.m.pid
    }

    fn accel(&self) -> Accel {
        self.accel
    }

    fn channel_path(&self) -> &Path {
        &self.channel
    }

    fn console_log(&self) -> &Path {
        &self.console
    }

    async fn pause(&self) -> Result<(), VmmError> {
        self.alive("pause")?;
        self.m.clock().pause();
        self.m.paused.send_replace(true);
        Ok(())
    }

    async fn resume(&self) -> Result<(), VmmError> {
        self.alive("resume")?;
        self.m.clock().resume();
        self.m.paused.send_replace(false);
        Ok(())
    }

    async fn stop(&self, grace: Duration) -> Result<(), VmmError> {
        if self.m.ignore_quit {
            // The quit goes unheeded; the kill after the grace does not.
            if tokio::time::timeout(grace, self.m.exited()).await.is_err() {
                self.m.end(ExitInfo {
                    code: None,
                    signal: Some(libc::SIGKILL),
                });
            }
        } else {
            self.m.end(ExitInfo {
                code: Some(0),
                signal: None,
            });
        }
        Ok(())
    }

    async fn kill(&self) -> Result<(), VmmError> {
        self.m.end(ExitInfo {
            code: None,
            signal: Some(libc::SIGKILL),
        });
        Ok(())
    }

    async fn wait_exit(&self) -> ExitInfo {
        self.m.exited().await
    }

    async fn save(&self, state_path: &Path) -> Result<SavedState, VmmError> {
        let saved = self.freeze_saving(state_path).await?;
        self.m.end(ExitInfo {
            code: Some(0),
            signal: None,
        });
        Ok(saved)
    }

    async fn save_live(&self, state_path: &Path) -> Result<LiveSaved, VmmError> {
        let saved = self.freeze_saving(state_path).await?;
        Ok(LiveSaved {
            state: saved.state,
            state_size: saved.state_size,
            frozen: Duration::ZERO,
        })
    }
}

impl FakeInstance {
    /// Writes the state a restore checks and freezes the VM, as QEMU after
    /// a migration: the guest answers nothing until it is resumed.
    async fn freeze_saving(&self, state_path: &Path) -> Result<SavedState, VmmError> {
        self.alive("save")?;
        let fail = self.m.vmm.upgrade().is_some_and(|v| v.state().fail_saves);
        if fail {
            return Err(VmmError::backend(
                self.m.id,
                "save",
                "the fake vmm failed to save (injected)",
            ));
        }
        let io_err = |path: &Path| {
            let (vm, path) = (self.m.id, path.to_owned());
            move |source| VmmError::RunDir { vm, path, source }
        };
        let state = serde_json::to_vec(&SavedFake {
            fake_vm: self.m.id,
            memory_bytes: self.memory.bytes(),
            devices: self.devices.clone(),
        })
        .map_err(|e| VmmError::backend(self.m.id, "save", e))?;
        std::fs::write(state_path, &state).map_err(io_err(state_path))?;
        let allocated = {
            use std::os::unix::fs::MetadataExt;
            let meta = std::fs::metadata(&self.mem_path).map_err(io_err(&self.mem_path))?;
            meta.blocks() * 512
        };
        // Frozen, as QEMU after a migration: the guest answers nothing
        // until it is resumed.
        self.m.clock().pause();
        self.m.paused.send_replace(true);
        Ok(SavedState {
            state: state_path.to_owned(),
            state_size: ByteSize(state.len() as u64),
            memory: Some(self.mem_path.clone()),
            memory_size: self.memory,
            memory_allocated: ByteSize(allocated.min(self.memory.bytes())),
        })
    }

    fn alive(&self, op: &'static str) -> Result<(), VmmError> {
        match *self.m.exit.borrow() {
            None => Ok(()),
            Some(exit) => Err(VmmError::backend(
                self.m.id,
                op,
                format!("the fake vmm has exited ({exit})"),
            )),
        }
    }
}

/// The guest end of a fake VM: accepts the host's one connection on the
/// agent socket and serves it until the VMM ends.
async fn serve_guest(listener: UnixListener, m: Arc<Machine>, silent: bool, boot_time: Duration) {
    let conn = tokio::select! {
        c = listener.accept() => c,
        _ = m.exited() => return,
    };
    let conn = match conn {
        Ok((conn, _)) => conn,
        Err(e) => {
            tracing::warn!(vm = %m.id, error = %e, "fake guest: accept failed");
            return;
        }
    };
    if silent {
        // Holds the connection and says nothing until the VMM ends.
        m.exited().await;
        return;
    }
    if !boot_time.is_zero() {
        tokio::select! {
            _ = tokio::time::sleep(boot_time) => {}
            _ = m.exited() => return,
        }
    }
    let (r, w) = conn.into_split();
    let r = Wedgeable {
        inner: r,
        wedged: m.wedged.subscribe(),
    };
    let mut reader = FramedRead::new(r, FrameCodec);
    let mut writer = FramedWrite::new(w, FrameCodec);
    let hello = tokio::select! {
        h = guest_handshake_session(&mut reader, &mut writer) => h,
        _ = m.exited() => return,
    };
    let (version, hello) = match hello {
        Ok(h) => {
            m.booted();
            h
        }
        Err(e) => {
            tracing::debug!(vm = %m.id, error = %e, "fake guest: no handshake");
            return;
        }
    };
    let (mux, accept) = Mux::start(Role::Guest, reader, writer);
    mux.bind_session(hello.nonce);
    let Some(mut accept) = accept else { return };
    loop {
        tokio::select! {
            next = accept.recv() => match next {
                Some((stream, payload)) => {
                    tokio::spawn(handle(stream, payload, m.clone(), version));
                }
                None => break,
            },
            _ = mux.closed() => break,
            _ = m.exited() => break,
        }
    }
    mux.shutdown("the fake vmm ended");
}

/// The guest's end of its connection, read until the agent is wedged
/// ([`FakeVmm::wedge`]); from then on, never again: what the host sends
/// stays unread, as with an agent stopped under ptrace.
struct Wedgeable<R> {
    inner: R,
    wedged: watch::Receiver<bool>,
}

impl<R: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for Wedgeable<R> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        if *self.wedged.borrow() {
            // Pending for good: a stopped agent is never woken.
            return std::task::Poll::Pending;
        }
        std::pin::Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

/// Answers one request as the guest agent would (see the module's list).
async fn handle(stream: Stream, payload: bytes::Bytes, m: Arc<Machine>, version: u16) {
    // A paused guest answers nothing until it runs again.
    m.running().await;
    let req = match serde_json::from_slice::<Request>(&payload) {
        Ok(r) => r,
        Err(e) => {
            reply(
                &stream,
                &m,
                Reply::Error(OpError::new(
                    OpErrorKind::BadRequest,
                    format!("bad request: {e}"),
                )),
            )
            .await;
            return;
        }
    };
    match req {
        Request::Exec(e) => exec(&stream, &m, e).await,
        // A slow answer reads the clock half way through its delay.
        Request::Clock { step_ns } => {
            let slow_by = {
                let mut c = m.clock();
                c.offset_ns = c.offset_ns.saturating_add(step_ns);
                if c.slow > 0 {
                    c.slow -= 1;
                    c.slow_by
                } else {
                    Duration::ZERO
                }
            };
            tokio::time::sleep(slow_by / 2).await;
            let realtime_ns = m.clock().now_ns();
            tokio::time::sleep(slow_by / 2).await;
            reply(&stream, &m, Reply::Clock { realtime_ns }).await;
        }
        Request::Configure(_) => reply(&stream, &m, Reply::Ok).await,
        Request::Identity(id) => {
            let answer = match id.validate() {
                Ok(()) => {
                    *m.identity.lock().unwrap_or_else(|p| p.into_inner()) = Some(id);
                    Reply::Ok
                }
                Err(e) => Reply::Error(OpError::new(OpErrorKind::BadRequest, e)),
            };
            reply(&stream, &m, answer).await;
        }
        Request::Info => {
            let info = GuestInfo {
                agent_version: "fake".into(),
                protocol_version: version,
                kernel_release: "fake".into(),
                hostname: m
                    .identity
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .as_ref()
                    .map_or_else(|| "fake".into(), |i| i.hostname.clone()),
                uptime_ms: 0,
                mem_total_bytes: 0,
                mem_available_bytes: 0,
                cpus: 1,
                running_commands: 0,
            };
            reply(&stream, &m, Reply::Info(info)).await;
        }
        Request::Shutdown => {
            reply(&stream, &m, Reply::Ok).await;
            if !m.ignore_quit {
                tokio::time::sleep(POWER_OFF_DELAY).await;
                m.end(ExitInfo {
                    code: Some(0),
                    signal: None,
                });
            }
        }
        _ => {
            let msg = "the fake guest serves only exec, clock, configure, info and shutdown";
            reply(
                &stream,
                &m,
                Reply::Error(OpError::new(OpErrorKind::Unsupported, msg)),
            )
            .await;
        }
    }
}

async fn reply(stream: &Stream, m: &Machine, reply: Reply) {
    if let Err(e) = stream.send_ctl(&reply).await {
        tracing::debug!(vm = %m.id, error = %e, "fake guest: cannot answer");
    }
}

/// Runs a built-in command: `true`, `sync`, `false`, `echo ARGS`; any
/// other exits 127 with "command not found" on stderr.
async fn exec(stream: &Stream, m: &Machine, req: ExecRequest) {
    let argv: Vec<String> = match req.argv {
        Some(argv) => argv,
        None => req.command.split_whitespace().map(str::to_owned).collect(),
    };
    let command_id = req
        .command_id
        .unwrap_or_else(|| uuid::Uuid::now_v7().simple().to_string());
    let started = ExecEvent::Started {
        command_id,
        pid: 100,
    };
    if let Err(e) = stream.send_ctl(&started).await {
        tracing::debug!(vm = %m.id, error = %e, "fake guest: exec stream gone");
        return;
    }
    let words: Vec<&str> = argv.iter().map(String::as_str).collect();
    let (code, stdout, stderr) = match words.as_slice() {
        [] | ["true"] | ["sync"] => (0, String::new(), String::new()),
        ["false"] => (1, String::new(), String::new()),
        ["echo", rest @ ..] => (0, format!("{}\n", rest.join(" ")), String::new()),
        [cmd, ..] => (
            127,
            String::new(),
            format!("fake guest: {cmd}: command not found\n"),
        ),
    };
    for (channel, text) in [
        (OutputChannel::Stdout, stdout),
        (OutputChannel::Stderr, stderr),
    ] {
        if text.is_empty() {
            continue;
        }
        if let Err(e) = stream
            .send_data(encode_output(channel, 0, text.as_bytes()))
            .await
        {
            tracing::debug!(vm = %m.id, error = %e, "fake guest: exec stream gone");
            return;
        }
    }
    let exit = ExecEvent::Exit {
        exit_code: code,
        signal: None,
    };
    if let Err(e) = stream.send_ctl(&exit).await {
        tracing::debug!(vm = %m.id, error = %e, "fake guest: exec stream gone");
    }
}

/// Guest artifacts for a host on the fake VMM ([`GuestImages::Fixed`]),
/// written under `dir`: empty kernel and initramfs files (nothing boots
/// them) and a sparse 16 MiB root image of zeros for disks to start from.
pub fn guest_images(dir: &Path) -> io::Result<GuestImages> {
    std::fs::create_dir_all(dir)?;
    let kernel = dir.join("fake-vmlinuz");
    let initramfs = dir.join("fake-initramfs.cpio");
    let rootfs = dir.join("fake-rootfs.ext4");
    std::fs::write(&kernel, b"")?;
    std::fs::write(&initramfs, b"")?;
    let size = ByteSize::mib(16).bytes();
    if std::fs::metadata(&rootfs).map(|m| m.len()).ok() != Some(size) {
        std::fs::File::create(&rootfs)?.set_len(size)?;
    }
    Ok(GuestImages::Fixed(Arc::new(GuestArtifacts {
        kernel: KernelArtifact {
            boot_image: kernel.clone(),
            vmlinuz: kernel,
            release: "fake".into(),
            package: "fake".into(),
            package_version: "0".into(),
            modules_dir: dir.to_owned(),
            modules: Vec::new(),
            builtin_modules: Vec::new(),
            blake3: String::new(),
        },
        initramfs: InitramfsArtifact {
            path: initramfs,
            blake3: String::new(),
            size_bytes: 0,
        },
        rootfs: RootfsArtifact {
            name: ImageName::Busybox,
            path: rootfs,
            size_bytes: size,
            blake3: String::new(),
            recipe_version: 0,
        },
    })))
}
