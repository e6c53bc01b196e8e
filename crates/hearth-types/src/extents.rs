//! Where a sparse file holds data: the filesystem's map of holes
//! (`SEEK_DATA`/`SEEK_HOLE`), read once for every caller that copies or
//! uploads only what a file holds (the store's chunk upload, the memory
//! template's copy).

use std::io;
use std::ops::Range;
use std::os::fd::AsFd;

use nix::errno::Errno;
use nix::unistd::{lseek, Whence};

/// The byte ranges of the first `len` bytes of `file` that hold data, in
/// order (a range may hold zeros the filesystem did not punch out). An
/// error when the filesystem cannot tell (no `SEEK_DATA`): a caller then
/// treats the whole file as data.
pub fn data_extents(file: &impl AsFd, len: u64) -> io::Result<Vec<Range<u64>>> {
    let end = i64::try_from(len).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    let mut out = Vec::new();
    let mut pos: i64 = 0;
    while pos < end {
        let data = match lseek(file.as_fd(), pos, Whence::SeekData) {
            Ok(data) => data,
            // Only a hole is left.
            Err(Errno::ENXIO) => break,
            Err(e) => return Err(e.into()),
        };
        let hole = lseek(file.as_fd(), data, Whence::SeekHole)?.min(end);
        if data >= hole {
            break;
        }
        out.push(data as u64..hole as u64);
        pos = hole;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::FileExt;

    use super::*;

    #[test]
    fn a_sparse_file_answers_its_data_and_an_empty_one_none() {
        let dir = std::env::temp_dir().join(format!("hearth-extents-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("sparse");
        let f = std::fs::File::create(&path).unwrap();
        let mib = 1u64 << 20;
        f.set_len(8 * mib).unwrap();
        assert!(data_extents(&f, 8 * mib).unwrap().is_empty());
        f.write_all_at(&[1; 4096], 2 * mib).unwrap();
        f.write_all_at(&[2; 4096], 6 * mib).unwrap();
        f.sync_all().unwrap();
        let extents = data_extents(&f, 8 * mib).unwrap();
        // Filesystems round extents to their blocks: each write lies in
        // one range, and no range reaches the untouched middle.
        assert_eq!(extents.len(), 2, "{extents:?}");
        assert!(extents[0].contains(&(2 * mib)) && extents[0].end <= 3 * mib);
        assert!(extents[1].contains(&(6 * mib)) && extents[1].end <= 8 * mib);
        // Clipped to `len`.
        let clipped = data_extents(&f, 2 * mib + 100).unwrap();
        assert_eq!(clipped.len(), 1);
        assert_eq!(clipped[0].end, 2 * mib + 100);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
