//! `hearth bench storage`: what the block service (root disks as
//! generations in the store, served over NBD) costs, each number next to
//! its baseline measured in the same run:
//!
//! 1. commit cost against the bytes the guest changed (and against a full
//!    copy of the disk's data), for 2 GiB and 10 GiB disks;
//! 2. a start that resumes saved memory against a cold boot of the same VM;
//! 3. guest disk read throughput against a host keeping qcow2 overlays;
//! 4. a cold start with an empty chunk cache against a warm one;
//! 5. `fsync` latency and throughput in the guest: a durable flush (the
//!    persistent disk's journal in the store) against qcow2 overlays and
//!    against a disk whose flushes promise nothing (a non-persistent one,
//!    what every flush cost before flushes were made durable).
//!
//! Every host lives in its own directory under `<data>/bench-storage/`,
//! sharing the data dir's `artifacts` (so images are not rebuilt), and is
//! removed at the end. Disks are committed only when the bench says so
//! (`commit_interval` zero), so each commit's bytes are the bench's.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use anyhow::Context;
use hearth_guest_proto::ExecRequest;
use hearth_host::{CreateVm, GuestClient, Host, HostConfig, Storage, StoreSettings, Vm};

use hearth_image::ImageName;
use hearth_types::ByteSize;

/// Which parts to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Part {
    Commit,
    Resume,
    Read,
    Cold,
    Fsync,
}

pub struct Options {
    pub parts: Vec<Part>,
    /// Size of the file read for the throughput numbers and of the data a
    /// cold start reads back.
    pub file_size: ByteSize,
    /// The store's URL for every store-backed bench host; `None`: a local
    /// directory in each host's own dir.
    pub store_url: Option<String>,
}

/// The accelerator the bench hosts ran guests under (the first one's).
static ACCEL: OnceLock<String> = OnceLock::new();

fn sh(cmd: &str) -> ExecRequest {
    ExecRequest {
        command: cmd.into(),
        ..Default::default()
    }
}

fn host_err(e: hearth_host::HostError) -> anyhow::Error {
    anyhow::anyhow!(hearth_host::error_chain(&e))
}

fn mib(b: u64) -> String {
    if b < (10 << 20) {
        format!("{:.2} MiB", b as f64 / (1u64 << 20) as f64)
    } else {
        format!("{} MiB", b >> 20)
    }
}

fn kib(b: u64) -> String {
    format!("{:.1} KiB", b as f64 / 1024.0)
}

fn secs(d: Duration) -> String {
    if d < Duration::from_secs(1) {
        format!("{:.0} ms", d.as_secs_f64() * 1000.0)
    } else {
        format!("{:.2} s", d.as_secs_f64())
    }
}

fn mib_s(bytes: u64, d: Duration) -> f64 {
    bytes as f64 / (1u64 << 20) as f64 / d.as_secs_f64()
}

/// Runs a shell command in the guest and fails unless it exits 0.
async fn run(g: &GuestClient, cmd: &str) -> anyhow::Result<Vec<u8>> {
    let out = g
        .run(sh(cmd))
        .await
        .with_context(|| format!("run {cmd:?}"))?;
    anyhow::ensure!(
        out.exit_code == Some(0),
        "{cmd:?} exited {:?}: {}",
        out.exit_code,
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(out.stdout)
}

/// Starts (or resumes) a VM and times it to its first exec.
async fn start_timed(host: &Arc<Host>, vm: &Vm) -> anyhow::Result<Duration> {
    let t = Instant::now();
    let vm = host.start_vm(vm.id).await.map_err(host_err)?;
    run(&vm.guest().context("guest")?, "true").await?;
    Ok(t.elapsed())
}

fn guest(vm: &Vm) -> anyhow::Result<GuestClient> {
    vm.guest().context("the vm has no guest channel")
}

#[derive(Clone, Copy)]
enum Kind {
    Store,
    Qcow,
}

/// A host agent in `<data>/bench-storage/<name>` sharing the artifacts.
struct BenchHost {
    host: Arc<Host>,
    dir: PathBuf,
}

impl BenchHost {
    async fn start(
        data_dir: &Path,
        name: &str,
        kind: Kind,
        opts: &Options,
    ) -> anyhow::Result<Self> {
        let dir = data_dir.join("bench-storage").join(name);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
        std::os::unix::fs::symlink(data_dir.join("artifacts"), dir.join("artifacts"))
            .context("link the artifacts")?;
        let host = Self::open(data_dir, &dir, kind, opts).await?;
        let _ = ACCEL.set(host.accel().to_string());
        Ok(Self { host, dir })
    }

    /// A host agent on `dir`: the store's (commits only when asked) or qcow2 overlays.
    async fn open(
        data_dir: &Path,
        dir: &Path,
        kind: Kind,
        opts: &Options,
    ) -> anyhow::Result<Arc<Host>> {
        let mut cfg = HostConfig::new(dir);
        cfg.accel_cache = data_dir.join("accel.json");
        cfg.storage = match kind {
            Kind::Qcow => Storage::QcowOverlays,
            Kind::Store => {
                let mut s = StoreSettings::local(dir);
                s.commit_interval = Duration::ZERO;
                if let Some(url) = &opts.store_url {
                    s.url = url.clone();
                }
                Storage::Store(s)
            }
        };
        Host::start(cfg, Arc::new(hearth_image::QuietProgress))
            .await
            .map_err(host_err)
            .context("start a bench host agent")
    }

    fn store(&self) -> anyhow::Result<&hearth_host::block::GenerationDisks> {
        self.host
            .generations()
            .map(|g| g.as_ref())
            .context("the bench host keeps no store")
    }

    /// The size of a manifest object, when the store is a local directory.
    fn manifest_bytes(&self, opts: &Options, volume: &str, seq: u64) -> Option<u64> {
        if opts.store_url.is_some() {
            return None;
        }
        let path = self
            .dir
            .join("store/volumes")
            .join(volume)
            .join(format!("{seq:016x}"));
        std::fs::metadata(path).ok().map(|m| m.len())
    }

    async fn create(&self, memory: ByteSize, disk: Option<ByteSize>) -> anyhow::Result<Arc<Vm>> {
        self.host
            .create_vm(CreateVm {
                image: ImageName::Busybox,
                memory,
                disk,
                ..CreateVm::default()
            })
            .await
            .map_err(host_err)
    }

    async fn finish(self) {
        for vm in self.host.list() {
            if let Err(e) = self.host.delete(vm.id).await {
                eprintln!(
                    "[bench] cannot delete vm {}: {}",
                    vm.id,
                    hearth_host::error_chain(&e)
                );
            }
        }
        self.host.shutdown().await;
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Rows of one markdown table.
struct Table {
    title: &'static str,
    head: &'static [&'static str],
    rows: Vec<Vec<String>>,
    notes: Vec<String>,
}

impl Table {
    fn new(title: &'static str, head: &'static [&'static str]) -> Self {
        Self {
            title,
            head,
            rows: Vec::new(),
            notes: Vec::new(),
        }
    }

    fn row(&mut self, cells: Vec<String>) {
        eprintln!("[bench] {}: {}", self.title, cells.join(" | "));
        self.rows.push(cells);
    }

    fn print(&self) {
        println!("\n{}\n", self.title);
        println!("| {} |", self.head.join(" | "));
        println!("|{}", "---|".repeat(self.head.len()));
        for r in &self.rows {
            println!("| {} |", r.join(" | "));
        }
        for n in &self.notes {
            println!("\n{n}");
        }
    }
}

pub async fn storage(data_dir: PathBuf, opts: Options) -> anyhow::Result<()> {
    // Build artifacts once, outside the measurement.
    {
        let images = hearth_image::ImageConfig::new(&data_dir);
        tokio::task::spawn_blocking(move || {
            hearth_image::ensure_all(&images, ImageName::Busybox, &hearth_image::StderrProgress)
        })
        .await??;
    }
    let started = Instant::now();
    let mut tables = Vec::new();
    let mut result = Ok(());
    for part in &opts.parts {
        let t = Instant::now();
        let r = match part {
            Part::Commit => commit_cost(&data_dir, &opts).await,
            Part::Resume => resume(&data_dir, &opts).await,
            Part::Read => read_throughput(&data_dir, &opts).await,
            Part::Cold => cold_cache(&data_dir, &opts).await,
            Part::Fsync => fsync_cost(&data_dir, &opts).await,
        };
        eprintln!("[bench] {part:?} done in {}", secs(t.elapsed()));
        match r {
            Ok(table) => tables.push(table),
            Err(e) => {
                result = Err(e.context(format!("bench part {part:?}")));
                break;
            }
        }
    }
    let _ = std::fs::remove_dir_all(data_dir.join("bench-storage"));
    println!(
        "guests: busybox image under {}; store: {}",
        ACCEL.get().map_or("?", String::as_str),
        opts.store_url
            .as_deref()
            .unwrap_or("a local directory per host")
    );
    for t in &tables {
        t.print();
    }
    println!("\nwhole run: {}", secs(started.elapsed()));
    result
}

/// Syncs the guest and commits until a commit finds nothing dirty: boot,
/// the online ext4 grow and the guest's lazy inode-table init all write.
async fn settle(g: &GuestClient, vol: &hearth_host::block::Volume) -> anyhow::Result<()> {
    for _ in 0..10 {
        run(g, "sync").await?;
        if !vol.uncommitted().await {
            return Ok(());
        }
        vol.commit(BTreeMap::new()).await.context("commit")?;
        tokio::time::sleep(Duration::from_millis(1500)).await;
    }
    eprintln!("[bench] the disk kept being written after 10 commits; measuring anyway");
    Ok(())
}

/// Part 1: bytes uploaded by a commit against the bytes the guest wrote.
async fn commit_cost(data_dir: &Path, opts: &Options) -> anyhow::Result<Table> {
    let mut table = Table::new(
        "Commit cost vs bytes changed (persistent busybox VM, 256 MiB guest; `dd if=/dev/urandom conv=fsync`, `sync`, then `Volume::commit`)",
        &[
            "disk",
            "written in guest",
            "uploaded by the guest's flushes (chunks)",
            "uploaded by the commit (chunks)",
            "manifest",
            "commit time",
            "full copy of the disk's data",
        ],
    );
    let bh = BenchHost::start(data_dir, "commit", Kind::Store, opts).await?;
    let out = async {
        let gens = bh.store()?;
        for disk in [ByteSize::gib(2), ByteSize::gib(10)] {
            let vm = bh.create(ByteSize::mib(256), Some(disk)).await?;
            let g = guest(&vm)?;
            let vol = gens
                .attached_volume(vm.id)
                .context("the vm's volume is not attached")?;
            settle(&g, &vol).await?;
            for (i, n) in [1u64, 64].into_iter().enumerate() {
                let start = gens.store().stats();
                run(
                    &g,
                    &format!("dd if=/dev/urandom of=/f{i} bs=1M count={n} conv=fsync 2>/dev/null && sync"),
                )
                .await?;
                let before = gens.store().stats();
                let t = Instant::now();
                let m = vol.commit(BTreeMap::new()).await.context("commit")?;
                let took = t.elapsed();
                let after = gens.store().stats();
                let manifest = bh
                    .manifest_bytes(opts, vol.target().volume.as_ref(), m.seq)
                    .map_or("n/a".into(), kib);
                let full = m.chunks.len() as u64 * u64::from(m.chunk_size);
                table.row(vec![
                    disk.to_string(),
                    format!("{n} MiB"),
                    format!(
                        "{} ({})",
                        mib(before.bytes_uploaded - start.bytes_uploaded),
                        before.chunks_uploaded - start.chunks_uploaded
                    ),
                    format!(
                        "**{}** ({})",
                        mib(after.bytes_uploaded - before.bytes_uploaded),
                        after.chunks_uploaded - before.chunks_uploaded
                    ),
                    manifest,
                    secs(took),
                    format!("{} ({} chunks)", mib(full), m.chunks.len()),
                ]);
            }
            bh.host.delete(vm.id).await.map_err(host_err)?;
        }
        Ok::<_, anyhow::Error>(())
    }
    .await;
    bh.finish().await;
    out?;
    table.notes.push(
        "Uploaded bytes are object bytes (ciphertext + 45 bytes per chunk); the manifest is the \
         sealed manifest object, one per commit; the last column is what a commit that copied the \
         whole disk's data would upload."
            .into(),
    );
    Ok(table)
}

/// Bytes of data in a (sparse) file.
fn file_data_bytes(path: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).map_or(0, |m| m.blocks() * 512)
}

/// Part 2: start after a stop that saved memory against a cold boot.
async fn resume(data_dir: &Path, opts: &Options) -> anyhow::Result<Table> {
    let mut table = Table::new(
        "Resume from saved memory vs cold boot (same busybox VM, start to first exec)",
        &[
            "guest RAM",
            "stop saving memory",
            "saved (data)",
            "**resume**",
            "cold boot (stop + start)",
            "cold / resume",
        ],
    );
    let bh = BenchHost::start(data_dir, "resume", Kind::Store, opts).await?;
    let out = async {
        for memory in [ByteSize::mib(256), ByteSize::gib(2)] {
            let vm = bh.create(memory, None).await?;
            // Let the guest reach idle, as a sandbox stopped later would.
            tokio::time::sleep(Duration::from_secs(2)).await;
            let t = Instant::now();
            let rec = bh.host.stop_saving_memory(vm.id).await.map_err(host_err)?;
            let save = t.elapsed();
            anyhow::ensure!(
                rec.saved.is_some(),
                "memory was not saved: {:?}",
                rec.reason
            );
            // One stream of RAM and device state (`live`); an older save
            // kept the RAM file's data as `memory`.
            let saved = ["live", "memory", "state"]
                .iter()
                .map(|f| file_data_bytes(&vm.dir.join("saved").join(f)))
                .sum::<u64>();
            let resume = start_timed(&bh.host, &vm).await?;
            anyhow::ensure!(
                vm.record().saved.is_none(),
                "the start did not consume the saved memory"
            );
            bh.host.stop(vm.id).await.map_err(host_err)?;
            let cold = start_timed(&bh.host, &vm).await?;
            table.row(vec![
                memory.to_string(),
                secs(save),
                mib(saved),
                format!("**{}**", secs(resume)),
                secs(cold),
                format!("{:.1}×", cold.as_secs_f64() / resume.as_secs_f64()),
            ]);
            bh.host.delete(vm.id).await.map_err(host_err)?;
        }
        Ok::<_, anyhow::Error>(())
    }
    .await;
    bh.finish().await;
    out?;
    Ok(table)
}

/// Reads `/data` in the guest with its page cache dropped; MiB/s.
async fn timed_read(g: &GuestClient, bytes: u64) -> anyhow::Result<f64> {
    run(g, "sync && echo 3 > /proc/sys/vm/drop_caches").await?;
    let t = Instant::now();
    run(g, "dd if=/data of=/dev/null bs=1M 2>/dev/null").await?;
    Ok(mib_s(bytes, t.elapsed()))
}

/// Part 3: guest read throughput, block service against qcow2 overlays.
async fn read_throughput(data_dir: &Path, opts: &Options) -> anyhow::Result<Table> {
    let size = opts.file_size.bytes();
    let n = size >> 20;
    anyhow::ensure!(n > 0, "--file-size must be at least 1 MiB");
    let mut table = Table::new(
        "Disk read throughput in the guest (`dd` of a file of random data to /dev/null, page cache dropped)",
        &[
            "read",
            "qcow2 overlay (baseline)",
            "block service (store)",
            "store / qcow2",
        ],
    );
    // Per host: [write, read while the data is local, read after a restart].
    let mut res = Vec::new();
    for (name, kind) in [("qcow", Kind::Qcow), ("store", Kind::Store)] {
        let bh = BenchHost::start(data_dir, name, kind, opts).await?;
        let out = async {
            let disk = ByteSize((size + (512 << 20)).div_ceil(1 << 30) * (1 << 30));
            let vm = bh.create(ByteSize::mib(512), Some(disk)).await?;
            let g = guest(&vm)?;
            let t = Instant::now();
            run(
                &g,
                &format!("dd if=/dev/urandom of=/data bs=1M count={n} conv=fsync 2>/dev/null"),
            )
            .await?;
            let write = mib_s(size, t.elapsed());
            let local = timed_read(&g, size).await?;
            bh.host.stop(vm.id).await.map_err(host_err)?;
            bh.host.start_vm(vm.id).await.map_err(host_err)?;
            let restarted = timed_read(&guest(&vm)?, size).await?;
            Ok::<_, anyhow::Error>([write, local, restarted])
        }
        .await;
        bh.finish().await;
        res.push(out?);
    }
    let labels = [
        format!("write {n} MiB (`conv=fsync`)"),
        format!("read {n} MiB, data local (right after writing)"),
        format!("read {n} MiB after stop + start (store: fetched lazily from the chunk cache)"),
    ];
    for (i, label) in labels.into_iter().enumerate() {
        let (q, s) = (res[0][i], res[1][i]);
        table.row(vec![
            label,
            format!("{q:.1} MiB/s"),
            format!("**{s:.1} MiB/s**"),
            format!("{:.0} %", s / q * 100.0),
        ]);
    }
    Ok(table)
}

/// Part 4: a cold start (and a first read of the VM's data) with the
/// store's chunk cache emptied, against the same with the cache warm.
async fn cold_cache(data_dir: &Path, opts: &Options) -> anyhow::Result<Table> {
    let size = opts.file_size.bytes();
    let n = size >> 20;
    let mut table = Table::new(
        "Start of a stopped persistent VM: chunk cache emptied vs warm (busybox, 256 MiB guest)",
        &[
            "chunk cache",
            "start to first exec",
            "fetched from object storage (chunks)",
            "cache hits",
            "first read of the VM's data",
            "fetched by that read",
        ],
    );
    let bh = BenchHost::start(data_dir, "cold", Kind::Store, opts).await?;
    let out = async {
        let gens = bh.store()?;
        let cache_dir = match &bh.host.config().storage {
            Storage::Store(s) => s.cache_dir.clone(),
            Storage::QcowOverlays => anyhow::bail!("not a store host"),
        };
        let disk = ByteSize((size + (512 << 20)).div_ceil(1 << 30) * (1 << 30));
        let vm = bh.create(ByteSize::mib(256), Some(disk)).await?;
        run(
            &guest(&vm)?,
            &format!("dd if=/dev/urandom of=/data bs=1M count={n} conv=fsync 2>/dev/null"),
        )
        .await?;
        // The stop commits the disk; its local file is dropped.
        bh.host.stop(vm.id).await.map_err(host_err)?;
        for empty in [true, false] {
            if empty {
                std::fs::remove_dir_all(&cache_dir)
                    .with_context(|| format!("empty {}", cache_dir.display()))?;
            }
            let s0 = gens.store().stats();
            let boot = start_timed(&bh.host, &vm).await?;
            let s1 = gens.store().stats();
            let t = Instant::now();
            run(&guest(&vm)?, "dd if=/data of=/dev/null bs=1M 2>/dev/null").await?;
            let read = t.elapsed();
            let s2 = gens.store().stats();
            table.row(vec![
                if empty { "empty" } else { "warm" }.into(),
                format!("**{}**", secs(boot)),
                format!(
                    "{} ({})",
                    mib(s1.bytes_fetched - s0.bytes_fetched),
                    s1.chunks_fetched - s0.chunks_fetched
                ),
                (s1.cache_hits - s0.cache_hits).to_string(),
                format!("{n} MiB in {} ({:.1} MiB/s)", secs(read), mib_s(size, read)),
                mib(s2.bytes_fetched - s1.bytes_fetched),
            ]);
            bh.host.stop(vm.id).await.map_err(host_err)?;
        }
        Ok::<_, anyhow::Error>(())
    }
    .await;
    bh.finish().await;
    out?;
    Ok(table)
}

/// One guest loop of `n` 4 KiB writes, each followed by `fsync`
/// (`dd conv=fsync`), in `parallel` loops at once; the whole run's time.
async fn fsync_loop(
    g: &GuestClient,
    n: u32,
    parallel: u32,
    fsync: bool,
) -> anyhow::Result<Duration> {
    let conv = if fsync { "notrunc,fsync" } else { "notrunc" };
    let one = |p: u32| {
        format!(
            "(i=0; while [ $i -lt {n} ]; do dd if=/dev/zero of=/fs{p} bs=4k count=1 seek=$i \
             conv={conv} 2>/dev/null || exit 1; i=$((i+1)); done)"
        )
    };
    let script = (0..parallel)
        .map(|p| format!("{} &", one(p)))
        .collect::<Vec<_>>()
        .join(" ")
        + " wait";
    // Files exist beforehand, so each round is a write and its flush.
    run(
        g,
        &format!(
            "for p in $(seq 0 {}); do : > /fs$p; done; sync",
            parallel - 1
        ),
    )
    .await?;
    let t = Instant::now();
    run(g, &script).await?;
    Ok(t.elapsed())
}

/// Part 5: `fsync` in the guest, durable flushes against qcow2 overlays
/// and against flushes that promise nothing.
async fn fsync_cost(data_dir: &Path, opts: &Options) -> anyhow::Result<Table> {
    const N: u32 = 200;
    let mut table = Table::new(
        "fsync in the guest: 4 KiB write + `fsync` (`dd conv=notrunc,fsync`), 200 per loop (busybox, 256 MiB guest)",
        &[
            "disk",
            "1 loop: per write+fsync",
            "1 loop: fsyncs/s",
            "4 loops: fsyncs/s",
            "same loop without fsync (dd's own cost)",
            "journal records / fsyncs (4 loops)",
        ],
    );
    for (label, kind, persistent) in [
        (
            "qcow2 overlay (baseline: host `fdatasync`)",
            Kind::Qcow,
            true,
        ),
        (
            "store, non-persistent (flush promises nothing: the old behaviour)",
            Kind::Store,
            false,
        ),
        (
            "**store, persistent: flush durable in the store**",
            Kind::Store,
            true,
        ),
    ] {
        let bh = BenchHost::start(data_dir, "fsync", kind, opts).await?;
        let out = async {
            let vm = bh
                .host
                .create_vm(CreateVm {
                    image: ImageName::Busybox,
                    memory: ByteSize::mib(256),
                    persistent,
                    ..CreateVm::default()
                })
                .await
                .map_err(host_err)?;
            let g = guest(&vm)?;
            let bare = fsync_loop(&g, N, 1, false).await?;
            let one = fsync_loop(&g, N, 1, true).await?;
            let journal_before = match bh.store() {
                Ok(gens) => match gens.attached_volume(vm.id) {
                    Some(v) => Some((v.clone(), v.journal_len().await)),
                    None => None,
                },
                Err(_) => None,
            };
            let four = fsync_loop(&g, N, 4, true).await?;
            let records = match journal_before {
                Some((v, before)) if persistent => {
                    format!(
                        "{} / {}",
                        v.journal_len().await.saturating_sub(before),
                        4 * N
                    )
                }
                _ => "n/a".into(),
            };
            table.row(vec![
                label.into(),
                format!("{:.1} ms", one.as_secs_f64() * 1000.0 / f64::from(N)),
                format!("{:.0}", f64::from(N) / one.as_secs_f64()),
                format!("{:.0}", f64::from(4 * N) / four.as_secs_f64()),
                format!(
                    "{:.1} ms per write",
                    bare.as_secs_f64() * 1000.0 / f64::from(N)
                ),
                records,
            ]);
            Ok::<_, anyhow::Error>(())
        }
        .await;
        bh.finish().await;
        out?;
    }
    table.notes.push(
        "Each row is its own host in the same run. A durable flush uploads the chunks written \
         since the previous flush and appends one journal record; concurrent flushes share \
         rounds (the last column). The journal is folded into a generation by the periodic \
         commit (off here) or by the next host to open the disk."
            .into(),
    );
    Ok(table)
}
