//! The NBD server against QEMU's own NBD client (`qemu-io` from
//! qemu-utils, the same client code QEMU's `-blockdev driver=nbd` uses).

use std::sync::{Arc, Mutex};

use hearth_host::block::nbd::{self, BlockDevice};

/// A device in memory: the protocol is what is under test here (the
/// store-backed device is tested with real VMs in `disks.rs`).
struct Memory(Mutex<Vec<u8>>);

impl BlockDevice for Memory {
    fn size(&self) -> u64 {
        self.0.lock().unwrap().len() as u64
    }
    async fn read(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        let m = self.0.lock().unwrap();
        buf.copy_from_slice(&m[offset as usize..offset as usize + buf.len()]);
        Ok(())
    }
    async fn write(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        let mut m = self.0.lock().unwrap();
        m[offset as usize..offset as usize + data.len()].copy_from_slice(data);
        Ok(())
    }
    async fn zero(&self, offset: u64, len: u64) -> std::io::Result<()> {
        let mut m = self.0.lock().unwrap();
        m[offset as usize..(offset + len) as usize].fill(0);
        Ok(())
    }
    async fn flush(&self) -> std::io::Result<()> {
        Ok(())
    }
}

fn qemu_io(socket: &std::path::Path, cmds: &[&str]) -> std::process::Output {
    let mut c = std::process::Command::new("qemu-io");
    c.args(["-f", "raw"]);
    for cmd in cmds {
        c.args(["-c", cmd]);
    }
    c.arg(format!("nbd+unix:///root?socket={}", socket.display()));
    c.output().expect("qemu-io (qemu-utils) is installed")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qemu_reads_writes_and_zeroes_through_the_server() {
    let dir = std::env::temp_dir().join(format!("hearth-nbd-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let socket = dir.join("nbd.sock");
    let _ = std::fs::remove_file(&socket);
    let listener = tokio::net::UnixListener::bind(&socket).unwrap();
    let dev = Arc::new(Memory(Mutex::new(vec![7u8; 8 << 20])));
    let served = dev.clone();
    tokio::spawn(async move {
        loop {
            let (s, _) = listener.accept().await.unwrap();
            let d = served.clone();
            tokio::spawn(async move { nbd::serve(s, "root", d).await });
        }
    });
    let sock = socket.clone();
    let out = tokio::task::spawn_blocking(move || {
        qemu_io(
            &sock,
            &[
                "read -P 7 0 8M",
                "write -P 0xab 4096 1M",
                "write -z 3M 64k",
                "discard 5M 4k",
                "flush",
                "read -P 0xab 4096 1M",
                "read -P 0 3M 64k",
                "read -P 7 4M 64k",
            ],
        )
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!stdout.contains("Pattern verification failed"), "{stdout}");
    let m = dev.0.lock().unwrap();
    assert!(m[4096..4096 + (1 << 20)].iter().all(|&b| b == 0xab));
    assert!(m[3 << 20..(3 << 20) + (64 << 10)].iter().all(|&b| b == 0));
    assert!(m[5 << 20..(5 << 20) + 4096].iter().all(|&b| b == 0));
    assert_eq!(m[0], 7);
    drop(m);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A hostile client: requests past the end are refused with an error
/// reply, an oversized write ends the connection, and the device is
/// untouched.
#[tokio::test]
async fn out_of_bounds_and_oversized_requests_are_refused() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (mut c, s) = tokio::io::duplex(1 << 20);
    let dev = Arc::new(Memory(Mutex::new(vec![1u8; 1 << 20])));
    let server = tokio::spawn(nbd::serve(s, "root", dev.clone()));
    let mut hello = [0u8; 18];
    c.read_exact(&mut hello).await.unwrap();
    assert_eq!(&hello[..8], b"NBDMAGIC");
    c.write_u32(3).await.unwrap(); // fixed newstyle, no zeroes
                                   // OPT_GO for "root" with no info requests.
    c.write_u64(0x4948_4156_454f_5054).await.unwrap();
    c.write_u32(7).await.unwrap();
    c.write_u32(4 + 4 + 2).await.unwrap();
    c.write_u32(4).await.unwrap();
    c.write_all(b"root").await.unwrap();
    c.write_u16(0).await.unwrap();
    // Replies: INFO export, INFO block size, ACK.
    for _ in 0..3 {
        let mut head = [0u8; 20];
        c.read_exact(&mut head).await.unwrap();
        let len = u32::from_be_bytes(head[16..20].try_into().unwrap());
        let mut body = vec![0u8; len as usize];
        c.read_exact(&mut body).await.unwrap();
    }
    let request = |cmd: u16, cookie: u64, offset: u64, len: u32| {
        let mut r = 0x2560_9513u32.to_be_bytes().to_vec();
        r.extend_from_slice(&0u16.to_be_bytes());
        r.extend_from_slice(&cmd.to_be_bytes());
        r.extend_from_slice(&cookie.to_be_bytes());
        r.extend_from_slice(&offset.to_be_bytes());
        r.extend_from_slice(&len.to_be_bytes());
        r
    };
    for (cmd, cookie, offset, len) in [
        (0u16, 1u64, (1 << 20) - 512, 4096u32), // read across the end
        (0, 2, u64::MAX - 10, 4096),            // offset overflow
        (4, 3, 1 << 20, 1),                     // trim past the end
    ] {
        c.write_all(&request(cmd, cookie, offset, len))
            .await
            .unwrap();
        let mut reply = [0u8; 16];
        c.read_exact(&mut reply).await.unwrap();
        assert_eq!(
            u32::from_be_bytes(reply[..4].try_into().unwrap()),
            0x6744_6698
        );
        assert_ne!(
            u32::from_be_bytes(reply[4..8].try_into().unwrap()),
            0,
            "cmd {cmd}"
        );
        assert_eq!(u64::from_be_bytes(reply[8..16].try_into().unwrap()), cookie);
    }
    // A write larger than any payload ends the connection before its data.
    c.write_all(&request(1, 4, 0, u32::MAX)).await.unwrap();
    let err = server.await.unwrap().unwrap_err();
    assert!(err.to_string().contains("write of"), "{err}");
    assert!(dev.0.lock().unwrap().iter().all(|&b| b == 1));
}
