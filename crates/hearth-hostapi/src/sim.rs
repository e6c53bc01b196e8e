//! [`SimHost`]: a host agent simulated in memory, for fast control-plane
//! tests and benchmarks (Oxide's simulated sled agent is the model).
//!
//! It keeps the rules of a real host where the control plane can see them:
//!
//! - **The VM state machine**: a create boots to `ready`; stop → `stopped`
//!   (again: no-op); start of a stopped or failed VM → `ready` (of a ready
//!   one: no-op); delete and forget → gone. A command in a state that does
//!   not allow it is [`ErrorKind::WrongState`], one about an unknown VM
//!   [`ErrorKind::NotFound`], a second create of the same id
//!   [`ErrorKind::Conflict`].
//! - **Fences**, as a remote host checks them (`hearth-fence`'s verifier):
//!   per VM it holds the highest placement generation any command carried,
//!   also after the VM is gone; a command at an older one is
//!   [`ErrorKind::Refused`] with a message starting `stale_generation`, and
//!   does nothing.
//! - **Knobs**: a latency every command waits before acting
//!   ([`SimHost::set_latency`]), how long a boot stays `provisioning`
//!   ([`SimHost::set_boot_time`]), a failure switch that makes every
//!   command [`ErrorKind::Unavailable`] ([`SimHost::set_unavailable`]), the
//!   free disk [`HostApi::status`] reports, and a crash of one VM
//!   ([`SimHost::crash`]). All default to a host that answers at once.
//! - **The guest**: [`HostApi::guest`] of a ready VM connects a
//!   [`GuestClient`] over an in-memory pipe to a tiny fake guest agent
//!   (the real handshake and mux) that answers `Info`, and an `Exec` of
//!   anything with exit code 0 and the command line echoed on stdout;
//!   any other request is refused as unsupported.
//!
//! There are no disks, store or network: captures and imports answer
//! plausible records and remember the volumes they name
//! ([`SimHost::has_volume`]), and [`HostApi::delete_snapshot_data`]
//! forgets them.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use hearth_guest_proto::{
    encode_output, guest_handshake, ExecEvent, FrameCodec, GuestInfo, Incoming, Mux, OpError,
    OpErrorKind, OutputChannel, Reply, Request, Role, Stream,
};
use hearth_types::image::ImageName;
use hearth_types::{ByteSize, VmId};
use tokio_util::codec::{FramedRead, FramedWrite};

use crate::api::{
    ErrorKind, HostApi, HostApiError, HostResult, HostStatus, ImportImage, ImportedImage, StopVm,
    StoreGc, VmUsage,
};
use crate::guest::GuestClient;
use crate::types::{
    Captured, ClaimVm, CopyVolume, CreateVm, MemoryVolumes, Resize, SandboxNet, VmRecord, VmState,
};

/// A host agent in memory. Share it as `Arc<SimHost>`: the knobs and the
/// inspection methods take `&self`, so a test keeps a handle on the host
/// it gave the control plane.
pub struct SimHost {
    state: Mutex<State>,
    knobs: Mutex<Knobs>,
    /// Fake process ids of booted VMs.
    next_pid: AtomicU32,
    /// Garbage collections asked of it.
    gc_runs: AtomicU32,
    /// Its change feed, as a real host keeps one.
    changes: crate::ChangeJournal,
}

#[derive(Default)]
struct State {
    vms: HashMap<VmId, VmRecord>,
    /// Per VM, the highest generation a command carried; kept after the
    /// VM is gone, as a remote host's verifier keeps it.
    fences: HashMap<VmId, u64>,
    /// Connected fake guests of ready VMs (shut down when the VM stops).
    guests: HashMap<VmId, GuestClient>,
    /// Store volumes captures, imports and saved memory named.
    volumes: BTreeSet<String>,
    /// The egress settings each VM was last given (at create or by
    /// `set_network`), as a real host's proxy would enforce them.
    networks: HashMap<VmId, SandboxNet>,
    /// Every image import asked of it, in order (credentials included, as
    /// a real host would pull with them).
    imports: Vec<ImportImage>,
    /// Every create asked of it, in order.
    creates: Vec<CreateVm>,
}

#[derive(Clone, Copy)]
struct Knobs {
    latency: Duration,
    boot_time: Duration,
    unavailable: bool,
    disk_available: ByteSize,
    list_delay: Duration,
}

impl Drop for SimHost {
    fn drop(&mut self) {
        // Each guest's mux tasks would otherwise wait on its pipe forever.
        for g in self.state().guests.values() {
            g.mux().shutdown("the simulated host went away");
        }
    }
}

impl Default for SimHost {
    fn default() -> Self {
        Self::new()
    }
}

impl SimHost {
    /// A host that answers at once, with 1 TiB of free disk.
    pub fn new() -> Self {
        Self {
            state: Mutex::new(State::default()),
            knobs: Mutex::new(Knobs {
                latency: Duration::ZERO,
                boot_time: Duration::ZERO,
                unavailable: false,
                disk_available: ByteSize::gib(1024),
                list_delay: Duration::ZERO,
            }),
            next_pid: AtomicU32::new(1000),
            gc_runs: AtomicU32::new(0),
            changes: crate::ChangeJournal::new(),
        }
    }

    /// How many garbage collections it was asked for
    /// ([`HostApi::collect_garbage`]; it has no store: each frees nothing).
    pub fn gc_runs(&self) -> u32 {
        self.gc_runs.load(Ordering::Relaxed)
    }

    /// Every command waits this long before it acts (a network round trip
    /// and the host's own work).
    pub fn set_latency(&self, latency: Duration) {
        self.knobs().latency = latency;
    }

    /// How long a create or start stays `provisioning` before the VM is
    /// `ready` (on top of the command's latency). Other commands about the
    /// VM may come in meanwhile: a stop or delete interrupts the boot.
    pub fn set_boot_time(&self, boot_time: Duration) {
        self.knobs().boot_time = boot_time;
    }

    /// While set, every command fails with [`ErrorKind::Unavailable`] (an
    /// unreachable, fenced or draining host); the VMs are kept.
    pub fn set_unavailable(&self, unavailable: bool) {
        self.knobs().unavailable = unavailable;
    }

    /// A listing of the VMs is taken at once but answered this much later
    /// (a loaded host, a slow network): its states are that old when the
    /// caller reads them.
    pub fn set_list_delay(&self, delay: Duration) {
        self.knobs().list_delay = delay;
    }

    /// The free disk [`HostApi::status`] reports.
    pub fn set_disk_available(&self, free: ByteSize) {
        self.knobs().disk_available = free;
    }

    /// The egress settings the VM was last given, read directly.
    pub fn network(&self, id: VmId) -> Option<SandboxNet> {
        self.state().networks.get(&id).cloned()
    }

    /// The image imports asked of it so far, in order.
    pub fn imports(&self) -> Vec<ImportImage> {
        self.state().imports.clone()
    }

    /// The last create asked of it for `id`, as it was asked.
    pub fn created(&self, id: VmId) -> Option<CreateVm> {
        let st = self.state();
        st.creates.iter().rev().find(|c| c.id == Some(id)).cloned()
    }

    /// The VM's record, read directly (no latency, no fence).
    pub fn vm(&self, id: VmId) -> Option<VmRecord> {
        self.state().vms.get(&id).cloned()
    }

    /// How many VMs the host holds, in any state.
    pub fn vm_count(&self) -> usize {
        self.state().vms.len()
    }

    /// The generation held for the VM (see the module's docs).
    pub fn held_fence(&self, id: VmId) -> Option<u64> {
        self.state().fences.get(&id).copied()
    }

    /// Whether a capture, import or saved memory named this volume and no
    /// delete removed it.
    /// Every volume the simulated store holds, sorted.
    pub fn volumes(&self) -> Vec<String> {
        let mut v: Vec<String> = self.state().volumes.iter().cloned().collect();
        v.sort();
        v
    }

    pub fn has_volume(&self, volume: &str) -> bool {
        self.state().volumes.contains(volume)
    }

    /// The VM's process died: it is `failed` with `reason` (a boot in
    /// progress fails too), and its guest is gone. False for an unknown VM.
    pub fn crash(&self, id: VmId, reason: &str) -> bool {
        let mut st = self.state();
        let Some(rec) = st.vms.get_mut(&id) else {
            return false;
        };
        rec.state = VmState::Failed;
        rec.reason = Some(reason.to_owned());
        rec.pid = None;
        drop_guest(&mut st, id, "the vm crashed");
        true
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // No code panics while holding it, and each update leaves it whole.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn knobs(&self) -> MutexGuard<'_, Knobs> {
        self.knobs.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// What every command goes through first: the latency, then the
    /// failure switch.
    async fn enter(&self) -> HostResult<()> {
        let latency = self.knobs().latency;
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
        if self.knobs().unavailable {
            return Err(HostApiError::unavailable(
                "the simulated host is unavailable",
            ));
        }
        Ok(())
    }

    /// Ends a boot begun by create or start: `ready`, unless a stop,
    /// crash or delete came in meanwhile.
    async fn boot(&self, id: VmId) -> HostResult<VmRecord> {
        let started = Instant::now();
        let boot_time = self.knobs().boot_time;
        if !boot_time.is_zero() {
            tokio::time::sleep(boot_time).await;
        }
        let mut st = self.state();
        let rec = st.vms.get_mut(&id).ok_or_else(|| {
            HostApiError::new(
                ErrorKind::NotFound,
                format!("vm {id} was removed while it booted"),
            )
        })?;
        if rec.state != VmState::Provisioning {
            return Err(HostApiError::new(
                ErrorKind::WrongState,
                format!("vm {id} is {:?}: its boot was interrupted", rec.state),
            ));
        }
        // A pool member waits paused for its claim.
        rec.state = if rec.pooled {
            VmState::Paused
        } else {
            VmState::Ready
        };
        rec.reason = None;
        rec.pid = Some(self.next_pid.fetch_add(1, Ordering::Relaxed));
        rec.boot_ms = Some(started.elapsed().as_millis() as u64);
        Ok(rec.clone())
    }
}

/// Checks a command's generation against the one held for the VM and
/// holds the newer one.
fn check_fence(st: &mut State, id: VmId, fence: u64) -> HostResult<()> {
    let held = st.fences.entry(id).or_insert(0);
    if fence < *held {
        return Err(HostApiError::new(
            ErrorKind::Refused,
            format!(
                "stale_generation: command for vm {id} is at generation {fence}, older than the held {held}"
            ),
        ));
    }
    *held = fence;
    Ok(())
}

const MEMORY_NEEDS_A_RUNNING_VM: &str = "memory can only be captured from a running sandbox";

fn vm_mut(st: &mut State, id: VmId) -> HostResult<&mut VmRecord> {
    st.vms
        .get_mut(&id)
        .ok_or_else(|| HostApiError::not_found(id))
}

fn wrong_state(id: VmId, state: VmState, wanted: &str) -> HostApiError {
    HostApiError::new(
        ErrorKind::WrongState,
        format!("vm {id} is {state:?}, not {wanted}"),
    )
}

fn drop_guest(st: &mut State, id: VmId, why: &str) {
    if let Some(g) = st.guests.remove(&id) {
        g.mux().shutdown(why);
    }
}

/// The disk of a VM that asked for none: its image's (as the built-in
/// snapshots record them).
fn image_disk(image: ImageName) -> ByteSize {
    match image {
        ImageName::Busybox => ByteSize::mib(64),
        ImageName::Default => ByteSize::gib(2),
        ImageName::CodeInterpreter => ByteSize::gib(4),
    }
}

/// A stable, well-formed (not cryptographic) `sha256:` digest of `s`.
fn fake_digest(s: &str) -> String {
    use std::hash::{Hash, Hasher};
    let mut out = String::from("sha256:");
    for round in 0u8..4 {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (round, s).hash(&mut h);
        out.push_str(&format!("{:016x}", h.finish()));
    }
    out
}

#[async_trait]
impl HostApi for SimHost {
    async fn create_vm(&self, req: CreateVm) -> HostResult<VmRecord> {
        self.enter().await?;
        let id = req.id.unwrap_or_default();
        {
            let mut st = self.state();
            st.creates.push(CreateVm {
                id: Some(id),
                ..req.clone()
            });
            check_fence(&mut st, id, req.fence)?;
            if req.memory.bytes() == 0 || req.cpu.0 == 0 {
                return Err(HostApiError::new(
                    ErrorKind::Invalid,
                    "a vm needs memory and cpu",
                ));
            }
            if st.vms.contains_key(&id) {
                return Err(HostApiError::new(
                    ErrorKind::Conflict,
                    format!("vm {id} already exists"),
                ));
            }
            st.vms.insert(
                id,
                VmRecord {
                    // The simulation resumes no memory.
                    saved: None,
                    ..VmRecord::provisioning(id, &req, "sim".into())
                },
            );
            let net = req.network.clone().unwrap_or_default();
            // A workspace volume is made in the store at its first attach.
            for m in &net.mounts {
                if let Some(v) = m.volume() {
                    st.volumes.insert(format!("volume-{}", v.volume));
                }
            }
            st.networks.insert(id, net);
        }
        self.boot(id).await
    }

    async fn start_vm(&self, id: VmId, fence: u64, resize: Resize) -> HostResult<VmRecord> {
        self.enter().await?;
        {
            let mut st = self.state();
            check_fence(&mut st, id, fence)?;
            let rec = vm_mut(&mut st, id)?;
            match rec.state {
                VmState::Ready => return Ok(rec.clone()),
                VmState::Stopped | VmState::Failed => {}
                state => return Err(wrong_state(id, state, "stopped")),
            }
            rec.memory = resize.memory.unwrap_or(rec.memory);
            rec.cpu = resize.cpu.unwrap_or(rec.cpu);
            // A disk never shrinks.
            rec.disk = rec.disk.max(resize.disk);
            rec.fence = rec.fence.max(fence).max(resize.fence.unwrap_or(0));
            rec.state = VmState::Provisioning;
            rec.reason = Some("starting".into());
            // The saved memory is resumed (or not): either way it is spent.
            rec.saved = None;
        }
        self.boot(id).await
    }

    async fn stop_vm(&self, id: VmId, fence: u64, how: StopVm) -> HostResult<VmRecord> {
        self.enter().await?;
        let mut st = self.state();
        check_fence(&mut st, id, fence)?;
        let rec = vm_mut(&mut st, id)?;
        if rec.state.is_terminal() {
            return Ok(rec.clone());
        }
        if how.save_memory && rec.state == VmState::Ready {
            rec.saved = Some(MemoryVolumes {
                memory: format!("{id}-saved-mem"),
                state: format!("{id}-saved-state"),
                memory_size: rec.memory,
            });
        }
        rec.state = VmState::Stopped;
        rec.reason = None;
        rec.pid = None;
        let rec = rec.clone();
        if let Some(m) = &rec.saved {
            st.volumes.insert(m.memory.clone());
            st.volumes.insert(m.state.clone());
        }
        drop_guest(&mut st, id, "the vm stopped");
        Ok(rec)
    }

    async fn delete_vm(&self, id: VmId, fence: u64) -> HostResult<()> {
        self.enter().await?;
        let mut st = self.state();
        check_fence(&mut st, id, fence)?;
        let rec = st
            .vms
            .remove(&id)
            .ok_or_else(|| HostApiError::not_found(id))?;
        drop_guest(&mut st, id, "the vm was deleted");
        st.networks.remove(&id);
        // Its saved memory goes with it (a forget keeps it in the store).
        if let Some(m) = rec.saved {
            st.volumes.remove(&m.memory);
            st.volumes.remove(&m.state);
        }
        Ok(())
    }

    async fn forget_vm(&self, id: VmId, fence: u64) -> HostResult<()> {
        self.enter().await?;
        let mut st = self.state();
        check_fence(&mut st, id, fence)?;
        st.vms
            .remove(&id)
            .ok_or_else(|| HostApiError::not_found(id))?;
        drop_guest(&mut st, id, "the vm was forgotten");
        st.networks.remove(&id);
        Ok(())
    }

    async fn claim_vm(&self, id: VmId, fence: u64, claim: ClaimVm) -> HostResult<VmRecord> {
        self.enter().await?;
        let mut st = self.state();
        check_fence(&mut st, id, fence)?;
        let rec = vm_mut(&mut st, id)?;
        if !rec.pooled || rec.state != VmState::Paused {
            return Err(wrong_state(id, rec.state, "an unclaimed pool member"));
        }
        rec.pooled = false;
        rec.state = VmState::Ready;
        rec.fence = rec.fence.max(fence);
        let rec = rec.clone();
        st.networks.insert(id, claim.network);
        Ok(rec)
    }

    async fn set_network(&self, id: VmId, fence: u64, net: SandboxNet) -> HostResult<()> {
        self.enter().await?;
        let mut st = self.state();
        check_fence(&mut st, id, fence)?;
        vm_mut(&mut st, id)?;
        st.networks.insert(id, net);
        Ok(())
    }

    async fn get_vm(&self, id: VmId, fence: u64) -> HostResult<VmRecord> {
        self.enter().await?;
        let mut st = self.state();
        check_fence(&mut st, id, fence)?;
        vm_mut(&mut st, id).map(|r| r.clone())
    }

    async fn list_vms(&self) -> HostResult<Vec<VmRecord>> {
        self.enter().await?;
        let mut all: Vec<VmRecord> = self.state().vms.values().cloned().collect();
        all.sort_by_key(|r| (r.created_at_ms, r.id));
        let delay = self.knobs().list_delay;
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        Ok(all)
    }

    async fn vm_changes(&self, since: Option<crate::ChangeCursor>) -> HostResult<crate::VmChanges> {
        let all = self.list_vms().await?;
        Ok(self.changes.changes(all, since))
    }

    async fn capture(
        &self,
        id: VmId,
        fence: u64,
        volume: &str,
        include_memory: bool,
    ) -> HostResult<Captured> {
        self.enter().await?;
        if volume.is_empty() {
            return Err(HostApiError::new(ErrorKind::Invalid, "no volume name"));
        }
        let mut st = self.state();
        check_fence(&mut st, id, fence)?;
        let rec = vm_mut(&mut st, id)?.clone();
        match rec.state {
            VmState::Ready => {}
            VmState::Stopped if include_memory => {
                return Err(HostApiError::new(
                    ErrorKind::Invalid,
                    format!("vm {id} is not running: {MEMORY_NEEDS_A_RUNNING_VM}"),
                ));
            }
            VmState::Stopped if rec.persistent => {}
            state => {
                return Err(wrong_state(
                    id,
                    state,
                    "ready, or stopped with a persistent disk",
                ))
            }
        }
        let memory = include_memory.then(|| MemoryVolumes {
            memory: format!("{volume}-mem"),
            state: format!("{volume}-state"),
            memory_size: rec.memory,
        });
        st.volumes.insert(volume.to_owned());
        if let Some(m) = &memory {
            st.volumes.insert(m.memory.clone());
            st.volumes.insert(m.state.clone());
        }
        Ok(Captured {
            disk: volume.to_owned(),
            disk_size: rec.disk.unwrap_or_else(|| image_disk(rec.image)),
            paused_ms: memory.as_ref().map(|_| 0),
            memory,
        })
    }

    async fn import_image(&self, req: ImportImage) -> HostResult<ImportedImage> {
        self.enter().await?;
        if req.reference.trim().is_empty() || req.volume.is_empty() {
            return Err(HostApiError::new(
                ErrorKind::Invalid,
                "an import needs an image reference and a volume",
            ));
        }
        if let Some(a) = &req.from_vm {
            // The archive is read from the VM's guest: it must be running.
            let mut st = self.state();
            let rec = vm_mut(&mut st, a.vm)?;
            if rec.state != VmState::Ready {
                return Err(wrong_state(a.vm, rec.state, "ready"));
            }
        }
        self.state().volumes.insert(req.volume.clone());
        self.state().imports.push(req.clone());
        Ok(ImportedImage {
            captured: Captured {
                disk: req.volume,
                disk_size: req.capacity,
                memory: None,
                paused_ms: None,
            },
            digest: fake_digest(&req.reference),
            user: None,
            working_dir: Some("/".into()),
            env: vec![(
                "PATH".into(),
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
            )],
        })
    }

    async fn delete_snapshot_data(&self, captured: &Captured) -> HostResult<()> {
        self.enter().await?;
        let mut st = self.state();
        st.volumes.remove(&captured.disk);
        if let Some(m) = &captured.memory {
            st.volumes.remove(&m.memory);
            st.volumes.remove(&m.state);
        }
        Ok(())
    }

    async fn copy_volume_data(&self, copy: &CopyVolume) -> HostResult<()> {
        self.enter().await?;
        let mut st = self.state();
        if st.volumes.contains(&copy.to) {
            return Err(HostApiError::new(
                ErrorKind::Conflict,
                format!("volume {} exists", copy.to),
            ));
        }
        if st.volumes.contains(&copy.from) {
            st.volumes.insert(copy.to.clone());
        }
        Ok(())
    }

    async fn disk_available(&self) -> HostResult<ByteSize> {
        self.enter().await?;
        Ok(self.knobs().disk_available)
    }

    async fn status(&self) -> HostResult<HostStatus> {
        self.enter().await?;
        // Each ready VM reports one CPU-second per boot order and a
        // quarter of its memory: fixed figures a test can expect.
        let usage = self
            .state()
            .vms
            .values()
            .filter(|r| r.state == VmState::Ready)
            .map(|r| {
                let usage = VmUsage {
                    cpu_ns: u64::from(r.pid.unwrap_or(0)) * 1_000_000_000,
                    memory_bytes: r.memory.bytes() / 4,
                };
                (r.id.to_string(), usage)
            })
            .collect();
        Ok(HostStatus {
            disk_available: self.knobs().disk_available,
            egress: Vec::new(),
            usage,
            store: Default::default(),
            templates: Default::default(),
        })
    }

    async fn collect_garbage(&self) -> HostResult<StoreGc> {
        self.enter().await?;
        self.gc_runs.fetch_add(1, Ordering::Relaxed);
        Ok(StoreGc::default())
    }

    async fn guest(&self, id: VmId, fence: u64) -> HostResult<GuestClient> {
        self.enter().await?;
        let info = {
            let mut st = self.state();
            check_fence(&mut st, id, fence)?;
            let rec = vm_mut(&mut st, id)?;
            if rec.state != VmState::Ready {
                return Err(wrong_state(id, rec.state, "ready"));
            }
            let info = guest_info(rec);
            match st.guests.get(&id) {
                Some(g) if !g.mux().is_closed() => return Ok(g.clone()),
                _ => info,
            }
        };
        let client = connect_fake_guest(info).await?;
        let mut st = self.state();
        if st.vms.get(&id).map(|r| r.state) != Some(VmState::Ready) {
            client.mux().shutdown("the vm is no longer ready");
            return Err(HostApiError::new(
                ErrorKind::WrongState,
                format!("vm {id} stopped while its guest connected"),
            ));
        }
        match st.guests.get(&id) {
            // Another caller connected meanwhile: keep one guest.
            Some(g) if !g.mux().is_closed() => {
                client.mux().shutdown("the vm's guest is connected already");
                Ok(g.clone())
            }
            _ => {
                st.guests.insert(id, client.clone());
                Ok(client)
            }
        }
    }
}

fn guest_info(rec: &VmRecord) -> GuestInfo {
    GuestInfo {
        agent_version: "sim".into(),
        protocol_version: hearth_guest_proto::LARGE_REQUEST_VERSION,
        kernel_release: "sim".into(),
        hostname: format!("vm-{}", &rec.id.as_uuid().simple().to_string()[..12]),
        uptime_ms: 0,
        mem_total_bytes: rec.memory.bytes(),
        mem_available_bytes: rec.memory.bytes() / 4 * 3,
        cpus: rec.cpu.whole_vcpus().max(1),
        running_commands: 0,
    }
}

/// A guest client over an in-memory pipe to [`fake_guest`].
async fn connect_fake_guest(info: GuestInfo) -> HostResult<GuestClient> {
    let (host_end, guest_end) = tokio::io::duplex(256 * 1024);
    tokio::spawn(fake_guest(guest_end, info));
    let (r, w) = tokio::io::split(host_end);
    GuestClient::handshake(r, w, Duration::from_secs(5))
        .await
        .map_err(|e| HostApiError::new(ErrorKind::Internal, format!("simulated guest: {e}")))
}

/// The guest agent's side: the real handshake and mux, then an answer per
/// stream, until the host's side goes away.
/// The port a simulated guest serves HTTP on (see `answer`).
pub const SIM_HTTP_PORT: u16 = 8000;

async fn fake_guest(io: tokio::io::DuplexStream, info: GuestInfo) {
    let (r, w) = tokio::io::split(io);
    let mut reader = FramedRead::new(r, FrameCodec);
    let mut writer = FramedWrite::new(w, FrameCodec);
    let Ok(version) = guest_handshake(&mut reader, &mut writer).await else {
        return;
    };
    let (mux, acceptor) = Mux::start_versioned(Role::Guest, version, reader, writer);
    let Some(mut acceptor) = acceptor else {
        return;
    };
    let booted = Instant::now();
    let mut pid = 100u32;
    loop {
        let (stream, request) = tokio::select! {
            next = acceptor.recv() => match next {
                Some(next) => next,
                None => return,
            },
            // The acceptor outlives the connection while `mux` is held.
            _ = mux.closed() => return,
        };
        pid = pid.wrapping_add(1);
        let mut info = info.clone();
        info.uptime_ms = booted.elapsed().as_millis() as u64;
        tokio::spawn(answer(stream, serde_json::from_slice(&request), info, pid));
    }
}

async fn answer(
    mut stream: Stream,
    request: Result<Request, serde_json::Error>,
    info: GuestInfo,
    pid: u32,
) {
    match request {
        Ok(Request::Info) => {
            let _ = stream.send_ctl(&Reply::Info(info)).await;
        }
        Ok(Request::Exec(req)) => {
            let line = match &req.argv {
                Some(argv) => argv.join(" "),
                None => req.command.clone(),
            };
            let command_id = req.command_id.unwrap_or_else(|| format!("sim-{pid}"));
            let out = format!("{line}\n");
            let sent = async {
                stream
                    .send_ctl(&ExecEvent::Started { command_id, pid })
                    .await?;
                stream
                    .send_data(encode_output(OutputChannel::Stdout, 0, out.as_bytes()))
                    .await?;
                stream
                    .send_ctl(&ExecEvent::Exit {
                        exit_code: 0,
                        signal: None,
                    })
                    .await
            };
            if sent.await.is_err() {
                return;
            }
            // Hold the stream until the host lets go of it (stdin, a
            // close-stdin or a kill may still come), as a real guest does.
            let _ = tokio::time::timeout(Duration::from_secs(10), async {
                while let Some(msg) = stream.recv().await {
                    if matches!(msg, Incoming::Close(_)) {
                        break;
                    }
                }
            })
            .await;
        }
        // Its samples: one every five seconds for the last hour, whenever
        // it booted, a quarter of its CPU busy between each, a quarter of
        // its memory and a tenth of its disk used.
        Ok(Request::Samples { since_ms }) => {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as i64);
            let step = hearth_guest_proto::SAMPLE_INTERVAL_MS as i64;
            let first = now - step * (hearth_guest_proto::MAX_SAMPLES as i64 - 1);
            let samples: Vec<_> = (0..hearth_guest_proto::MAX_SAMPLES as u64)
                .map(|k| hearth_guest_proto::GuestSample {
                    unix_ms: first + k as i64 * step,
                    cpu_busy: k * 125,
                    cpu_total: k * 500,
                    mem_total: 1 << 30,
                    mem_available: 3 << 28,
                    mem_cached: 1 << 26,
                    disk_total: 10 << 30,
                    disk_available: 9 << 30,
                    disk_used: 1 << 30,
                })
                .filter(|s| s.unix_ms >= since_ms)
                .collect();
            let mut batches = samples
                .chunks(hearth_guest_proto::SAMPLES_PER_REPLY)
                .peekable();
            if batches.peek().is_none() {
                let _ = stream
                    .send_ctl(&Reply::Samples {
                        samples: Vec::new(),
                        more: false,
                    })
                    .await;
            }
            while let Some(b) = batches.next() {
                let more = batches.peek().is_some();
                if stream
                    .send_ctl(&Reply::Samples {
                        samples: b.to_vec(),
                        more,
                    })
                    .await
                    .is_err()
                {
                    return;
                }
            }
        }
        // Its log: the kernel's boot, a command started and ended, and a
        // warning now, milliseconds apart (just now, whenever it booted).
        Ok(Request::Logs { since_ms, limit }) => {
            use hearth_guest_proto::{LogEntry, LogLevel};
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as i64);
            let entry = |ago: i64, level, message: &str, fields: &[(&str, &str)]| LogEntry {
                unix_ms: now - ago,
                level,
                message: message.to_owned(),
                fields: fields
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
            };
            let entries: Vec<LogEntry> = [
                entry(
                    3,
                    LogLevel::Info,
                    "Linux version sim",
                    &[("source", "kernel")],
                ),
                entry(
                    2,
                    LogLevel::Info,
                    "process started",
                    &[("pid", "101"), ("cmd", "echo")],
                ),
                entry(
                    1,
                    LogLevel::Info,
                    "process ended",
                    &[("pid", "101"), ("exit", "0")],
                ),
                entry(0, LogLevel::Warn, "the disk is nearly full", &[]),
            ]
            .into_iter()
            .filter(|e| e.unix_ms >= since_ms)
            .take(limit as usize)
            .collect();
            let _ = stream
                .send_ctl(&Reply::Logs {
                    entries,
                    more: false,
                })
                .await;
        }
        // Its commands end at once: none is ever running.
        Ok(Request::Commands) => {
            let _ = stream
                .send_ctl(&Reply::Commands {
                    commands: Vec::new(),
                })
                .await;
        }
        // Port SIM_HTTP_PORT serves HTTP: each answer describes the
        // request it got (so a test sees what a proxy forwarded) and sets
        // a cookie of the host's own and one for a domain. Nothing else
        // listens.
        Ok(Request::TcpDial { port }) if port == SIM_HTTP_PORT => {
            if stream.send_ctl(&Reply::Connected).await.is_err() {
                return;
            }
            let mut head = Vec::new();
            while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 64 * 1024 {
                match stream.recv().await {
                    Some(Incoming::Data(d)) => head.extend_from_slice(&d),
                    _ => return,
                }
            }
            let head = String::from_utf8_lossy(&head);
            let mut lines = head.split("\r\n");
            let request_line = lines.next().unwrap_or_default();
            // Names lowercased, values as sent (a token's case matters).
            let headers: Vec<String> = lines
                .take_while(|l| !l.is_empty())
                .map(|l| match l.split_once(':') {
                    Some((name, value)) => format!("{}:{value}", name.to_ascii_lowercase()),
                    None => l.to_owned(),
                })
                .collect();
            let body = serde_json::json!({"request": request_line, "headers": headers}).to_string();
            let answer = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nset-cookie: own=1; Path=/\r\nset-cookie: wide=1; Domain=sim.example\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = stream.send_data(answer.into_bytes().into()).await;
            let _ = stream.send_eof();
        }
        Ok(Request::TcpDial { port }) => {
            let e = OpError::new(
                OpErrorKind::ConnectionRefused,
                format!("nothing listens on port {port}"),
            );
            let _ = stream.send_ctl(&Reply::Error(e)).await;
        }
        // Every path is an empty directory of `user`'s (1000), unchanged
        // by `SetAttrs`: enough for the control plane's paths to a file.
        Ok(Request::Stat { path, .. } | Request::SetAttrs { path, .. }) => {
            let stat = hearth_guest_proto::FileStat {
                name: path.rsplit('/').next().unwrap_or_default().to_owned(),
                path,
                kind: hearth_guest_proto::FileKind::Dir,
                size: 4096,
                mode: 0o755,
                mtime: 0,
                mtime_ns: 0,
                ino: 2,
                owner: "user".into(),
                group: "user".into(),
                metadata: Default::default(),
                uid: 1000,
                gid: 1000,
                atime: 0,
                ctime: 0,
                target: None,
            };
            let _ = stream.send_ctl(&Reply::Stat(Box::new(stat))).await;
        }
        Ok(Request::Stdin { pid, .. }) => {
            let e = OpError::new(
                OpErrorKind::NotFound,
                format!("no running command has pid {pid}"),
            );
            let _ = stream.send_ctl(&Reply::Error(e)).await;
        }
        Ok(other) => {
            let op = serde_json::to_value(&other)
                .ok()
                .and_then(|v| v.get("op").and_then(|o| o.as_str()).map(str::to_owned))
                .unwrap_or_default();
            stream.sender.close(Some(&OpError::new(
                OpErrorKind::Unsupported,
                format!("the simulated guest does not answer {op}"),
            )));
        }
        Err(e) => stream.sender.close(Some(&OpError::new(
            OpErrorKind::BadRequest,
            format!("bad request: {e}"),
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn create(id: VmId, fence: u64) -> CreateVm {
        CreateVm {
            id: Some(id),
            fence,
            ..CreateVm::default()
        }
    }

    fn kind<T>(r: HostResult<T>) -> ErrorKind {
        match r {
            Ok(_) => panic!("expected an error, got a success"),
            Err(e) => e.kind,
        }
    }

    #[tokio::test]
    async fn the_state_machine_follows_the_real_host() {
        let h = SimHost::new();
        let id = VmId::new();
        let rec = h.create_vm(create(id, 1)).await.unwrap();
        assert_eq!((rec.state, rec.fence), (VmState::Ready, 1));
        assert!(rec.pid.is_some());
        assert_eq!(kind(h.create_vm(create(id, 1)).await), ErrorKind::Conflict);

        let stopped = h.stop_vm(id, 1, StopVm::default()).await.unwrap();
        assert_eq!(stopped.state, VmState::Stopped);
        assert_eq!(stopped.pid, None);
        // A second stop is a no-op, as on a real host.
        let again = h.stop_vm(id, 1, StopVm::default()).await.unwrap();
        assert_eq!(again.state, VmState::Stopped);
        assert_eq!(kind(h.guest(id, 1).await), ErrorKind::WrongState);

        let resize = Resize {
            memory: Some(ByteSize::gib(2)),
            disk: Some(ByteSize::gib(8)),
            ..Resize::default()
        };
        let started = h.start_vm(id, 2, resize).await.unwrap();
        assert_eq!(started.state, VmState::Ready);
        assert_eq!(started.memory, ByteSize::gib(2));
        assert_eq!(started.disk, Some(ByteSize::gib(8)));
        assert_eq!(started.fence, 2);
        // Starting a ready VM is a no-op too.
        let ready = h.start_vm(id, 2, Resize::default()).await.unwrap();
        assert_eq!(ready.state, VmState::Ready);

        assert_eq!(h.list_vms().await.unwrap().len(), 1);
        h.delete_vm(id, 2).await.unwrap();
        assert_eq!(kind(h.get_vm(id, 2).await), ErrorKind::NotFound);
        assert_eq!(kind(h.delete_vm(id, 2).await), ErrorKind::NotFound);
        assert_eq!(
            kind(h.start_vm(id, 2, Resize::default()).await),
            ErrorKind::NotFound
        );
        assert_eq!(h.vm_count(), 0);

        let other = VmId::new();
        h.create_vm(create(other, 1)).await.unwrap();
        h.forget_vm(other, 1).await.unwrap();
        assert_eq!(kind(h.get_vm(other, 1).await), ErrorKind::NotFound);
        assert_eq!(kind(h.forget_vm(other, 1).await), ErrorKind::NotFound);
        assert!(h.list_vms().await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn commands_during_a_boot_see_provisioning() {
        let h = Arc::new(SimHost::new());
        h.set_boot_time(Duration::from_millis(200));
        let id = VmId::new();
        let booting = tokio::spawn({
            let h = h.clone();
            async move { h.create_vm(create(id, 1)).await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(h.vm(id).map(|r| r.state), Some(VmState::Provisioning));
        assert_eq!(
            kind(h.start_vm(id, 1, Resize::default()).await),
            ErrorKind::WrongState
        );
        assert_eq!(kind(h.guest(id, 1).await), ErrorKind::WrongState);
        // A delete interrupts the boot, which then fails.
        h.delete_vm(id, 1).await.unwrap();
        let booted = booting.await.unwrap();
        assert_eq!(kind(booted), ErrorKind::NotFound);
        assert_eq!(h.vm_count(), 0);

        // So does a stop: the VM stays stopped.
        let id = VmId::new();
        let booting = tokio::spawn({
            let h = h.clone();
            async move { h.create_vm(create(id, 1)).await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        h.stop_vm(id, 1, StopVm::default()).await.unwrap();
        assert_eq!(kind(booting.await.unwrap()), ErrorKind::WrongState);
        assert_eq!(h.vm(id).map(|r| r.state), Some(VmState::Stopped));
    }

    #[tokio::test]
    async fn a_crashed_vm_is_failed_and_starts_again() {
        let h = SimHost::new();
        let id = VmId::new();
        h.create_vm(create(id, 1)).await.unwrap();
        assert!(h.crash(id, "qemu exited with signal 9"));
        let rec = h.get_vm(id, 1).await.unwrap();
        assert_eq!(rec.state, VmState::Failed);
        assert_eq!(rec.reason.as_deref(), Some("qemu exited with signal 9"));
        let rec = h.start_vm(id, 2, Resize::default()).await.unwrap();
        assert_eq!((rec.state, rec.reason), (VmState::Ready, None));
        assert!(!h.crash(VmId::new(), "no such vm"));
    }

    #[tokio::test]
    async fn commands_older_than_the_held_generation_are_refused() {
        let h = SimHost::new();
        let id = VmId::new();
        h.create_vm(create(id, 3)).await.unwrap();
        assert_eq!(h.held_fence(id), Some(3));

        let stale = h.get_vm(id, 2).await.unwrap_err();
        assert_eq!(stale.kind, ErrorKind::Refused);
        assert!(stale.message.starts_with("stale_generation"), "{stale}");
        // The same generation and newer ones pass; a newer one is held.
        h.get_vm(id, 3).await.unwrap();
        let rec = h.start_vm(id, 5, Resize::default()).await.unwrap();
        assert_eq!(rec.state, VmState::Ready);
        assert_eq!(h.held_fence(id), Some(5));

        // A refused command does nothing.
        let stop = h.stop_vm(id, 4, StopVm::default()).await.unwrap_err();
        assert_eq!(stop.kind, ErrorKind::Refused);
        assert_eq!(h.vm(id).map(|r| r.state), Some(VmState::Ready));
        for refused in [
            h.delete_vm(id, 4).await.map(drop),
            h.forget_vm(id, 4).await.map(drop),
            h.set_network(id, 4, SandboxNet::default()).await,
            h.capture(id, 4, "vol", false).await.map(drop),
            h.guest(id, 4).await.map(drop),
        ] {
            assert_eq!(kind(refused), ErrorKind::Refused);
        }
        assert_eq!(h.vm_count(), 1);

        // The generation outlives the VM: a replayed create of an older
        // placement is refused, a newer one boots.
        h.delete_vm(id, 5).await.unwrap();
        let replay = h.create_vm(create(id, 4)).await.unwrap_err();
        assert_eq!(replay.kind, ErrorKind::Refused);
        assert!(replay.message.starts_with("stale_generation"));
        assert_eq!(h.vm_count(), 0);
        assert_eq!(
            h.create_vm(create(id, 6)).await.unwrap().state,
            VmState::Ready
        );

        // A command about an unknown VM is checked (and held) first.
        let unknown = VmId::new();
        assert_eq!(kind(h.get_vm(unknown, 7).await), ErrorKind::NotFound);
        assert_eq!(kind(h.get_vm(unknown, 6).await), ErrorKind::Refused);
    }

    #[tokio::test]
    async fn the_switch_and_the_latency_apply_to_every_command() {
        let h = SimHost::new();
        let id = VmId::new();
        h.create_vm(create(id, 1)).await.unwrap();
        h.set_unavailable(true);
        let captured = Captured {
            disk: "v".into(),
            disk_size: ByteSize::mib(1),
            memory: None,
            paused_ms: None,
        };
        let import = ImportImage {
            from_vm: None,
            reference: "alpine".into(),
            insecure_http: false,
            capacity: ByteSize::gib(1),
            volume: "v".into(),
            auth: None,
        };
        for down in [
            h.create_vm(create(VmId::new(), 1)).await.map(drop),
            h.start_vm(id, 1, Resize::default()).await.map(drop),
            h.stop_vm(id, 1, StopVm::default()).await.map(drop),
            h.delete_vm(id, 1).await,
            h.forget_vm(id, 1).await,
            h.set_network(id, 1, SandboxNet::default()).await,
            h.get_vm(id, 1).await.map(drop),
            h.list_vms().await.map(drop),
            h.capture(id, 1, "v", false).await.map(drop),
            h.import_image(import).await.map(drop),
            h.delete_snapshot_data(&captured).await,
            h.status().await.map(drop),
            h.guest(id, 1).await.map(drop),
        ] {
            assert_eq!(kind(down), ErrorKind::Unavailable);
        }
        h.set_unavailable(false);
        assert_eq!(h.get_vm(id, 1).await.unwrap().state, VmState::Ready);

        h.set_latency(Duration::from_millis(30));
        let t = Instant::now();
        h.status().await.unwrap();
        h.get_vm(id, 1).await.unwrap();
        assert!(
            t.elapsed() >= Duration::from_millis(60),
            "{:?}",
            t.elapsed()
        );
    }

    #[tokio::test]
    async fn captures_imports_and_status_answer_plausible_records() {
        let h = SimHost::new();
        h.set_disk_available(ByteSize::gib(10));
        assert_eq!(h.status().await.unwrap().disk_available, ByteSize::gib(10));

        let id = VmId::new();
        h.create_vm(CreateVm {
            disk: Some(ByteSize::gib(4)),
            memory: ByteSize::gib(1),
            ..create(id, 1)
        })
        .await
        .unwrap();
        let snap = h.capture(id, 1, "snap-1", true).await.unwrap();
        assert_eq!(
            (snap.disk.as_str(), snap.disk_size),
            ("snap-1", ByteSize::gib(4))
        );
        let mem = snap.memory.clone().unwrap();
        assert_eq!(mem.memory_size, ByteSize::gib(1));
        assert!(h.has_volume("snap-1") && h.has_volume(&mem.memory));

        // Stopped: the disk only, and only when it persists.
        h.stop_vm(id, 1, StopVm { save_memory: true })
            .await
            .unwrap();
        let saved = h.vm(id).and_then(|r| r.saved).unwrap();
        assert!(h.has_volume(&saved.memory));
        assert_eq!(
            kind(h.capture(id, 1, "snap-2", true).await),
            ErrorKind::Invalid
        );
        assert!(h.capture(id, 1, "snap-2", false).await.is_ok());
        let ephemeral = VmId::new();
        h.create_vm(CreateVm {
            persistent: false,
            ..create(ephemeral, 1)
        })
        .await
        .unwrap();
        h.stop_vm(ephemeral, 1, StopVm::default()).await.unwrap();
        assert_eq!(
            kind(h.capture(ephemeral, 1, "snap-3", false).await),
            ErrorKind::WrongState
        );

        h.delete_snapshot_data(&snap).await.unwrap();
        assert!(!h.has_volume("snap-1") && !h.has_volume(&mem.memory));
        // Deleting the VM drops the memory its stop saved.
        h.delete_vm(id, 1).await.unwrap();
        assert!(!h.has_volume(&saved.memory));

        let imported = h
            .import_image(ImportImage {
                from_vm: None,
                reference: "docker.io/library/alpine:3".into(),
                insecure_http: false,
                capacity: ByteSize::gib(1),
                volume: "img-1".into(),
                auth: None,
            })
            .await
            .unwrap();
        assert_eq!(imported.captured.disk_size, ByteSize::gib(1));
        assert!(imported.digest.starts_with("sha256:") && imported.digest.len() == 7 + 64);
        assert!(h.has_volume("img-1"));
    }

    #[tokio::test]
    async fn the_guest_answers_info_and_echoes_commands() {
        let h = SimHost::new();
        let id = VmId::new();
        h.create_vm(CreateVm {
            memory: ByteSize::gib(2),
            ..create(id, 1)
        })
        .await
        .unwrap();
        let g = h.guest(id, 1).await.unwrap();
        let info = g.info().await.unwrap();
        assert_eq!(info.mem_total_bytes, ByteSize::gib(2).bytes());
        let out = g
            .run(hearth_guest_proto::ExecRequest {
                command: "echo hello; exit 3".into(),
                ..Default::default()
            })
            .await
            .unwrap();
        assert_eq!(out.exit_code, Some(0));
        assert_eq!(out.stdout, b"echo hello; exit 3\n");
        // One guest per VM; every path is a directory; other requests
        // are refused, not hung.
        let again = h.guest(id, 1).await.unwrap();
        assert_eq!(
            again.stat("/x").await.unwrap().kind,
            hearth_guest_proto::FileKind::Dir
        );
        assert!(again.list("/").await.is_err());
        assert_eq!(again.info().await.unwrap().hostname, info.hostname);

        // Stopping the VM tears its guest down.
        h.stop_vm(id, 1, StopVm::default()).await.unwrap();
        tokio::time::timeout(Duration::from_secs(5), g.closed())
            .await
            .unwrap();
        assert!(g.info().await.is_err());
    }
}
