//! A userspace NBD server (fixed newstyle handshake, simple replies) that
//! serves one [`BlockDevice`] to QEMU's built-in NBD client over a unix
//! socket. Only the parts QEMU uses are implemented: `OPT_GO`/`OPT_INFO`/
//! `OPT_EXPORT_NAME`/`OPT_LIST`/`OPT_ABORT` while haggling, and `READ`,
//! `WRITE`, `FLUSH`, `TRIM`, `WRITE_ZEROES`, `CACHE` and `DISC` in
//! transmission; structured replies and metadata contexts are declined,
//! which QEMU accepts. A flush is answered out of order when it is done,
//! so a flush waiting on object storage does not stall the disk.
//!
//! The client is not trusted: QEMU runs guest-influenced code, so every
//! length and offset is checked against the export before any buffer is
//! sized from it.
//!
//! Protocol facts from the NBD protocol document
//! (`doc/proto.md` of the NBD project).

use std::future::Future;
use std::io;
use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader, BufWriter};

const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
const REPLY_MAGIC_OPT: u64 = 0x0003_e889_0455_65a9;
const REQUEST_MAGIC: u32 = 0x2560_9513;
const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;

const FLAG_FIXED_NEWSTYLE: u16 = 1;
const FLAG_NO_ZEROES: u16 = 2;
const C_FLAG_NO_ZEROES: u32 = 2;

const OPT_EXPORT_NAME: u32 = 1;
const OPT_ABORT: u32 = 2;
const OPT_LIST: u32 = 3;
const OPT_INFO: u32 = 6;
const OPT_GO: u32 = 7;

const REP_ACK: u32 = 1;
const REP_SERVER: u32 = 2;
const REP_INFO: u32 = 3;
const REP_ERR_UNSUP: u32 = (1 << 31) | 1;
const REP_ERR_INVALID: u32 = (1 << 31) | 3;
const REP_ERR_UNKNOWN: u32 = (1 << 31) | 6;

const INFO_EXPORT: u16 = 0;
const INFO_BLOCK_SIZE: u16 = 3;

const TF_HAS_FLAGS: u16 = 1;
const TF_READ_ONLY: u16 = 2;
const TF_SEND_FLUSH: u16 = 4;
const TF_SEND_TRIM: u16 = 32;
const TF_SEND_WRITE_ZEROES: u16 = 64;
const TF_SEND_CACHE: u16 = 1024;

const CMD_READ: u16 = 0;
const CMD_WRITE: u16 = 1;
const CMD_DISC: u16 = 2;
const CMD_FLUSH: u16 = 3;
const CMD_TRIM: u16 = 4;
const CMD_CACHE: u16 = 5;
const CMD_WRITE_ZEROES: u16 = 6;

const EPERM: u32 = 1;
const EIO: u32 = 5;
const EINVAL: u32 = 22;
const ENOSPC: u32 = 28;
const ENOTSUP: u32 = 95;

/// Largest READ/WRITE payload accepted (QEMU sends at most 32 MiB).
pub const MAX_PAYLOAD: u32 = 32 << 20;
/// Largest option payload accepted while haggling.
const MAX_OPTION: u32 = 4096;
/// Options a client may send before it must choose an export.
const MAX_OPTIONS: usize = 32;

/// A block device as the NBD server sees it.
pub trait BlockDevice: Send + Sync + 'static {
    /// Size in bytes.
    fn size(&self) -> u64;
    /// Fills `buf` from `offset` (in bounds: checked by the server).
    fn read(&self, offset: u64, buf: &mut [u8]) -> impl Future<Output = io::Result<()>> + Send;
    fn write(&self, offset: u64, data: &[u8]) -> impl Future<Output = io::Result<()>> + Send;
    /// Makes `len` bytes from `offset` read as zeros (TRIM and WRITE_ZEROES).
    fn zero(&self, offset: u64, len: u64) -> impl Future<Output = io::Result<()>> + Send;
    fn flush(&self) -> impl Future<Output = io::Result<()>> + Send;
    /// Refuse writes.
    fn read_only(&self) -> bool {
        false
    }
}

/// Why a connection ended badly (the client's mistakes included).
#[derive(Debug, thiserror::Error)]
pub enum NbdError {
    #[error("nbd i/o: {0}")]
    Io(#[from] io::Error),
    #[error("nbd protocol: {0}")]
    Protocol(String),
}

fn proto(msg: impl Into<String>) -> NbdError {
    NbdError::Protocol(msg.into())
}

/// Serves `dev` as the export `name` on one connection until the client
/// disconnects. Requests are answered in order, but for flushes (see
/// `transmission`).
pub async fn serve<S, D>(stream: S, name: &str, dev: Arc<D>) -> Result<(), NbdError>
where
    S: AsyncRead + AsyncWrite + Unpin,
    D: BlockDevice,
{
    let (r, w) = tokio::io::split(stream);
    let mut r = BufReader::with_capacity(256 << 10, r);
    let mut w = BufWriter::with_capacity(256 << 10, w);
    if !handshake(&mut r, &mut w, name, &*dev).await? {
        return Ok(());
    }
    transmission(&mut r, &mut w, &dev).await
}

fn transmission_flags<D: BlockDevice>(dev: &D) -> u16 {
    let mut f = TF_HAS_FLAGS | TF_SEND_FLUSH | TF_SEND_CACHE;
    if dev.read_only() {
        f |= TF_READ_ONLY;
    } else {
        f |= TF_SEND_TRIM | TF_SEND_WRITE_ZEROES;
    }
    f
}

/// Option haggling; true when the client chose our export and transmission
/// begins, false when it aborted.
async fn handshake<R, W, D>(r: &mut R, w: &mut W, name: &str, dev: &D) -> Result<bool, NbdError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
    D: BlockDevice,
{
    w.write_u64(NBDMAGIC).await?;
    w.write_u64(IHAVEOPT).await?;
    w.write_u16(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).await?;
    w.flush().await?;
    let client_flags = r.read_u32().await?;
    let no_zeroes = client_flags & C_FLAG_NO_ZEROES != 0;
    for _ in 0..MAX_OPTIONS {
        if r.read_u64().await? != IHAVEOPT {
            return Err(proto("bad option magic"));
        }
        let opt = r.read_u32().await?;
        let len = r.read_u32().await?;
        if len > MAX_OPTION {
            return Err(proto(format!("option {opt} of {len} bytes")));
        }
        let mut data = vec![0u8; len as usize];
        r.read_exact(&mut data).await?;
        match opt {
            OPT_EXPORT_NAME => {
                if data != name.as_bytes() {
                    // This option has no error reply: hang up.
                    return Err(proto("unknown export"));
                }
                w.write_u64(dev.size()).await?;
                w.write_u16(transmission_flags(dev)).await?;
                if !no_zeroes {
                    w.write_all(&[0u8; 124]).await?;
                }
                w.flush().await?;
                return Ok(true);
            }
            OPT_ABORT => {
                reply(w, opt, REP_ACK, &[]).await?;
                w.flush().await?;
                return Ok(false);
            }
            OPT_LIST => {
                let mut p = (name.len() as u32).to_be_bytes().to_vec();
                p.extend_from_slice(name.as_bytes());
                reply(w, opt, REP_SERVER, &p).await?;
                reply(w, opt, REP_ACK, &[]).await?;
            }
            OPT_INFO | OPT_GO => {
                let Some(requested) = parse_info_request(&data) else {
                    reply(w, opt, REP_ERR_INVALID, b"malformed request").await?;
                    w.flush().await?;
                    continue;
                };
                // An empty name is the default export.
                if !requested.is_empty() && requested != name.as_bytes() {
                    reply(w, opt, REP_ERR_UNKNOWN, b"no such export").await?;
                    w.flush().await?;
                    continue;
                }
                let mut p = INFO_EXPORT.to_be_bytes().to_vec();
                p.extend_from_slice(&dev.size().to_be_bytes());
                p.extend_from_slice(&transmission_flags(dev).to_be_bytes());
                reply(w, opt, REP_INFO, &p).await?;
                let mut p = INFO_BLOCK_SIZE.to_be_bytes().to_vec();
                for v in [1u32, 4096, MAX_PAYLOAD] {
                    p.extend_from_slice(&v.to_be_bytes());
                }
                reply(w, opt, REP_INFO, &p).await?;
                reply(w, opt, REP_ACK, &[]).await?;
                w.flush().await?;
                if opt == OPT_GO {
                    return Ok(true);
                }
            }
            _ => {
                reply(w, opt, REP_ERR_UNSUP, &[]).await?;
                w.flush().await?;
            }
        }
    }
    Err(proto("too many options"))
}

/// The export name of an `OPT_INFO`/`OPT_GO` payload, checking its lengths.
fn parse_info_request(data: &[u8]) -> Option<&[u8]> {
    let n = u32::from_be_bytes(data.get(..4)?.try_into().ok()?) as usize;
    let name = data.get(4..4usize.checked_add(n)?)?;
    let rest = data.get(4 + n..)?;
    let count = u16::from_be_bytes(rest.get(..2)?.try_into().ok()?) as usize;
    (rest.len() == 2 + 2 * count).then_some(name)
}

async fn reply<W: AsyncWrite + Unpin>(
    w: &mut W,
    opt: u32,
    kind: u32,
    data: &[u8],
) -> Result<(), NbdError> {
    w.write_u64(REPLY_MAGIC_OPT).await?;
    w.write_u32(opt).await?;
    w.write_u32(kind).await?;
    w.write_u32(data.len() as u32).await?;
    w.write_all(data).await?;
    Ok(())
}

/// One request off the wire, its payload read.
struct Request {
    cmd: u16,
    cookie: u64,
    offset: u64,
    len: u32,
    /// A WRITE's payload.
    data: Vec<u8>,
}

/// Requests read ahead of the one being served.
const READ_AHEAD: usize = 4;

/// Reads requests (a WRITE's payload with it) into `tx` until DISC or EOF.
async fn read_requests<R: AsyncRead + Unpin>(
    r: &mut BufReader<R>,
    tx: tokio::sync::mpsc::Sender<Request>,
) -> Result<(), NbdError> {
    loop {
        let magic = match r.read_u32().await {
            Ok(m) => m,
            // A client that hangs up without DISC (QEMU killed) is normal.
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e.into()),
        };
        if magic != REQUEST_MAGIC {
            return Err(proto("bad request magic"));
        }
        let _flags = r.read_u16().await?;
        let cmd = r.read_u16().await?;
        let cookie = r.read_u64().await?;
        let offset = r.read_u64().await?;
        let len = r.read_u32().await?;
        let mut data = Vec::new();
        if cmd == CMD_WRITE {
            // The payload follows whatever we answer; read it first.
            if len > MAX_PAYLOAD {
                return Err(proto(format!("write of {len} bytes")));
            }
            data.resize(len as usize, 0);
            r.read_exact(&mut data).await?;
        }
        let disc = cmd == CMD_DISC;
        if tx
            .send(Request {
                cmd,
                cookie,
                offset,
                len,
                data,
            })
            .await
            .is_err()
            || disc
        {
            return Ok(());
        }
    }
}

/// Serves requests until DISC or EOF. Reads, writes and zeroes are served
/// in order; a FLUSH runs in its own task while later requests go on (it
/// may wait on object storage: see `volume`), and is answered when done
/// (NBD replies may come in any order: the cookie names the request). A
/// flush covers every write answered before it was read, as the protocol
/// asks, since those are served in order before it.
async fn transmission<R, W, D>(
    r: &mut BufReader<R>,
    w: &mut W,
    dev: &Arc<D>,
) -> Result<(), NbdError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
    D: BlockDevice,
{
    use futures_util::stream::{FuturesUnordered, StreamExt};
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Request>(READ_AHEAD);
    let reader = read_requests(r, tx);
    tokio::pin!(reader);
    let mut reader_done = false;
    let mut flushes = FuturesUnordered::new();
    let mut buf = Vec::new();
    loop {
        let req = tokio::select! {
            done = &mut reader, if !reader_done => {
                done?;
                reader_done = true;
                continue;
            }
            Some(done) = flushes.next(), if !flushes.is_empty() => {
                let (cookie, err) = match done {
                    Ok(answer) => answer,
                    Err(e) => return Err(NbdError::Io(io::Error::other(format!("flush task: {e}")))),
                };
                simple(w, err, cookie, &[]).await?;
                w.flush().await?;
                continue;
            }
            req = rx.recv() => match req {
                Some(req) => req,
                // The reader ended (EOF or DISC); answer flushes in flight.
                None if flushes.is_empty() => return Ok(()),
                None => {
                    while let Some(done) = flushes.next().await {
                        if let Ok((cookie, err)) = done {
                            simple(w, err, cookie, &[]).await?;
                        }
                    }
                    w.flush().await?;
                    return Ok(());
                }
            },
        };
        let Request {
            cmd,
            cookie,
            offset,
            len,
            data,
        } = req;
        let in_bounds = offset
            .checked_add(u64::from(len))
            .is_some_and(|end| end <= dev.size());
        match cmd {
            CMD_DISC => {}
            CMD_WRITE => {
                let err = if dev.read_only() {
                    EPERM
                } else if !in_bounds {
                    ENOSPC
                } else {
                    errno(dev.write(offset, &data).await)
                };
                simple(w, err, cookie, &[]).await?;
            }
            CMD_READ => {
                if len > MAX_PAYLOAD || !in_bounds {
                    simple(w, EINVAL, cookie, &[]).await?;
                } else {
                    buf.resize(len as usize, 0);
                    match dev.read(offset, &mut buf).await {
                        Ok(()) => simple(w, 0, cookie, &buf).await?,
                        Err(e) => {
                            tracing::warn!(error = %e, offset, len, "nbd read failed");
                            simple(w, EIO, cookie, &[]).await?
                        }
                    }
                }
            }
            CMD_FLUSH => {
                // Its own task: it runs to the end even if the client goes.
                let dev = dev.clone();
                flushes.push(tokio::spawn(
                    async move { (cookie, errno(dev.flush().await)) },
                ));
            }
            CMD_TRIM | CMD_WRITE_ZEROES => {
                let err = if dev.read_only() {
                    EPERM
                } else if !in_bounds {
                    ENOSPC
                } else {
                    errno(dev.zero(offset, u64::from(len)).await)
                };
                simple(w, err, cookie, &[]).await?;
            }
            // A hint; the device fetches on read anyway.
            CMD_CACHE => simple(w, if in_bounds { 0 } else { EINVAL }, cookie, &[]).await?,
            _ => simple(w, ENOTSUP, cookie, &[]).await?,
        }
        // Answer at once unless more requests are already waiting (QEMU
        // pipelines them; batching replies saves syscalls).
        if rx.is_empty() {
            w.flush().await?;
        }
    }
}

fn errno(r: io::Result<()>) -> u32 {
    match r {
        Ok(()) => 0,
        Err(e) => {
            tracing::warn!(error = %e, "nbd request failed");
            match e.raw_os_error() {
                Some(libc::ENOSPC) => ENOSPC,
                _ => EIO,
            }
        }
    }
}

async fn simple<W: AsyncWrite + Unpin>(
    w: &mut W,
    err: u32,
    cookie: u64,
    data: &[u8],
) -> Result<(), NbdError> {
    w.write_u32(SIMPLE_REPLY_MAGIC).await?;
    w.write_u32(err).await?;
    w.write_u64(cookie).await?;
    if err == 0 {
        w.write_all(data).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn info_requests_are_length_checked() {
        let mut ok = 4u32.to_be_bytes().to_vec();
        ok.extend_from_slice(b"root");
        ok.extend_from_slice(&1u16.to_be_bytes());
        ok.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
        assert_eq!(parse_info_request(&ok), Some(&b"root"[..]));
        for bad in [
            &ok[..3],
            &ok[..7],
            &ok[..ok.len() - 1],
            &[0xff, 0xff, 0xff, 0xff, 0, 0][..],
        ] {
            assert_eq!(parse_info_request(bad), None, "{bad:?}");
        }
    }
}
