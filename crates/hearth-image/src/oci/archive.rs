//! Image tarballs: `docker save` (`manifest.json`) and OCI image layouts
//! (`oci-layout` + `index.json`, as `skopeo copy … oci-archive:` writes).
//!
//! The archive is indexed once (member name → offset and length) and blobs
//! are read in place, never copied out. Every blob named by a digest is
//! hashed before it is used; `docker save` names layers by path only, so
//! its layers are checked against the config's `diff_ids` while unpacking.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::path::{Component, Path, PathBuf};

use sha2::{Digest as _, Sha256};

use super::manifest::{
    self, digest_hex, format_digest, parse_document, pick_platform, Descriptor, DockerSaveEntry,
    Document, Manifest,
};
use super::registry::{verify, DOC_LIMIT};
use super::{LayerBlob, LayerData, OciError, Pulled};
use crate::ImageError;

/// Symlinks followed to find a member (`docker save` links shared layers).
const MAX_MEMBER_HOPS: usize = 8;

struct Member {
    offset: u64,
    size: u64,
}

/// The members of an archive, by normalized name.
pub(crate) struct ArchiveIndex {
    path: PathBuf,
    files: HashMap<String, Member>,
    links: HashMap<String, String>,
}

impl ArchiveIndex {
    pub(crate) fn open(path: &Path) -> Result<Self, OciError> {
        let file = File::open(path).map_err(|e| ImageError::io("open", path, e))?;
        let mut archive = tar::Archive::new(io::BufReader::new(file));
        let mut files = HashMap::new();
        let mut links = HashMap::new();
        let bad = |e: io::Error| OciError::Archive {
            path: path.to_path_buf(),
            reason: e.to_string(),
        };
        for entry in archive.entries().map_err(bad)? {
            let entry = entry.map_err(bad)?;
            let Some(name) = entry.path().ok().and_then(|p| normalize(&p)) else {
                continue;
            };
            match entry.header().entry_type() {
                tar::EntryType::Regular | tar::EntryType::Continuous => {
                    files.insert(
                        name,
                        Member {
                            offset: entry.raw_file_position(),
                            size: entry.size(),
                        },
                    );
                }
                tar::EntryType::Symlink | tar::EntryType::Link => {
                    let target = entry.link_name().ok().flatten().map(|t| {
                        let is_hard = entry.header().entry_type() == tar::EntryType::Link;
                        let base = if is_hard {
                            PathBuf::new()
                        } else {
                            Path::new(&name)
                                .parent()
                                .map(Path::to_path_buf)
                                .unwrap_or_default()
                        };
                        base.join(t)
                    });
                    if let Some(t) = target.as_deref().and_then(normalize) {
                        links.insert(name, t);
                    }
                }
                _ => {}
            }
        }
        Ok(ArchiveIndex {
            path: path.to_path_buf(),
            files,
            links,
        })
    }

    fn has(&self, name: &str) -> bool {
        self.member(name).is_some()
    }

    fn member(&self, name: &str) -> Option<&Member> {
        let mut name = normalize(Path::new(name))?;
        for _ in 0..MAX_MEMBER_HOPS {
            if let Some(m) = self.files.get(&name) {
                return Some(m);
            }
            name = self.links.get(&name)?.clone();
        }
        None
    }

    fn missing(&self, name: &str) -> OciError {
        OciError::Archive {
            path: self.path.clone(),
            reason: format!("no member {name:?}"),
        }
    }

    fn slice(&self, name: &str) -> Result<(u64, u64), OciError> {
        let m = self.member(name).ok_or_else(|| self.missing(name))?;
        Ok((m.offset, m.size))
    }

    /// A member read whole, at most `limit` bytes.
    fn read_small(&self, name: &str, limit: u64) -> Result<Vec<u8>, OciError> {
        let (offset, size) = self.slice(name)?;
        if size > limit {
            return Err(OciError::TooLarge {
                what: format!("archive member {name}"),
                limit,
            });
        }
        let mut buf = Vec::new();
        open_slice(&self.path, offset, size)?
            .read_to_end(&mut buf)
            .map_err(|e| ImageError::io("read", &self.path, e))?;
        Ok(buf)
    }

    /// The blob `desc` of an OCI layout, verified.
    fn blob(&self, desc: &Descriptor, limit: u64) -> Result<Vec<u8>, OciError> {
        let name = format!("blobs/sha256/{}", digest_hex(&desc.digest)?);
        if desc.size > limit {
            return Err(OciError::TooLarge {
                what: format!("blob {}", desc.digest),
                limit,
            });
        }
        let body = self.read_small(&name, limit)?;
        verify(
            &desc.digest,
            desc.size,
            &manifest::sha256_digest(&body),
            body.len() as u64,
            "blob",
        )?;
        Ok(body)
    }

    /// Hashes a large member in place and compares it with `desc`.
    fn verify_in_place(&self, name: &str, desc: &Descriptor) -> Result<(u64, u64), OciError> {
        let (offset, size) = self.slice(name)?;
        let mut hash = Sha256::new();
        let mut reader = open_slice(&self.path, offset, size)?;
        let mut buf = vec![0u8; 256 * 1024];
        loop {
            let n = reader
                .read(&mut buf)
                .map_err(|e| ImageError::io("read", &self.path, e))?;
            if n == 0 {
                break;
            }
            hash.update(&buf[..n]);
        }
        verify(
            &desc.digest,
            desc.size,
            &format_digest(&hash.finalize()),
            size,
            "blob",
        )?;
        Ok((offset, size))
    }
}

/// Reads an image archive: an OCI layout when it has `oci-layout` and
/// `index.json` (newer `docker save` writes both formats; the layout has
/// the compressed digests), else a `docker save` `manifest.json`.
pub(crate) fn load(path: &Path, max_layers: usize) -> Result<Pulled, OciError> {
    let index = ArchiveIndex::open(path)?;
    if index.has("oci-layout") && index.has("index.json") {
        load_layout(&index, max_layers)
    } else if index.has("manifest.json") {
        load_docker_save(&index, max_layers)
    } else {
        Err(OciError::Archive {
            path: path.to_path_buf(),
            reason: "neither an OCI image layout (oci-layout, index.json) nor a `docker save` \
                     archive (manifest.json)"
                .to_owned(),
        })
    }
}

fn load_layout(index: &ArchiveIndex, max_layers: usize) -> Result<Pulled, OciError> {
    let top = index.read_small("index.json", DOC_LIMIT)?;
    let mut doc = parse_document(None, &top)?;
    let mut digest = None;
    // index.json → (maybe a nested index, as Docker writes) → manifest.
    for _ in 0..3 {
        match doc {
            Document::Manifest(m) => {
                let digest = digest.ok_or_else(|| OciError::BadDocument {
                    what: "index.json".to_owned(),
                    reason: "it is a manifest, not an index".to_owned(),
                })?;
                return layout_image(index, m, digest, max_layers);
            }
            Document::Index(ix) => {
                let desc = match ix.manifests.as_slice() {
                    [only] if only.platform.is_none() => only.clone(),
                    _ => pick_platform(&ix)?.clone(),
                };
                let body = index.blob(&desc, DOC_LIMIT)?;
                let ct = (!desc.media_type.is_empty()).then_some(desc.media_type.as_str());
                doc = parse_document(ct, &body)?;
                digest = Some(desc.digest);
            }
        }
    }
    Err(OciError::BadDocument {
        what: "index.json".to_owned(),
        reason: "indexes nested too deep".to_owned(),
    })
}

fn layout_image(
    index: &ArchiveIndex,
    m: Manifest,
    digest: String,
    max_layers: usize,
) -> Result<Pulled, OciError> {
    super::check_layers(m.layers.len(), max_layers)?;
    let config = index.blob(&m.config, DOC_LIMIT)?;
    let mut layers = Vec::with_capacity(m.layers.len());
    for desc in &m.layers {
        manifest::check_layer_type(&desc.media_type)?;
        let name = format!("blobs/sha256/{}", digest_hex(&desc.digest)?);
        let (offset, size) = index.verify_in_place(&name, desc)?;
        layers.push(LayerBlob {
            data: LayerData::Slice {
                archive: index.path.clone(),
                offset,
                size,
            },
        });
    }
    Ok(Pulled {
        digest,
        config,
        layers,
    })
}

fn load_docker_save(index: &ArchiveIndex, max_layers: usize) -> Result<Pulled, OciError> {
    let body = index.read_small("manifest.json", DOC_LIMIT)?;
    let entries: Vec<DockerSaveEntry> = manifest::json("manifest.json", &body)?;
    let entry = match entries.as_slice() {
        [one] => one,
        [] => {
            return Err(OciError::BadDocument {
                what: "manifest.json".to_owned(),
                reason: "no image".to_owned(),
            })
        }
        _ => {
            return Err(OciError::BadDocument {
                what: "manifest.json".to_owned(),
                reason: format!("{} images; expected one", entries.len()),
            })
        }
    };
    super::check_layers(entry.layers.len(), max_layers)?;
    let config = index.read_small(&entry.config, DOC_LIMIT)?;
    let digest = manifest::sha256_digest(&config);
    // The config is named by its digest (`<hex>.json` or `blobs/sha256/<hex>`);
    // when it is, the name must match.
    let stem = Path::new(&entry.config)
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("");
    if stem.len() == 64 && stem.bytes().all(|b| b.is_ascii_hexdigit()) && digest[7..] != *stem {
        return Err(OciError::DigestMismatch {
            what: format!("config {}", entry.config),
            expected: format!("sha256:{stem}"),
            actual: digest,
        });
    }
    let mut layers = Vec::with_capacity(entry.layers.len());
    for name in &entry.layers {
        let (offset, size) = index.slice(name)?;
        layers.push(LayerBlob {
            data: LayerData::Slice {
                archive: index.path.clone(),
                offset,
                size,
            },
        });
    }
    Ok(Pulled {
        digest,
        config,
        layers,
    })
}

/// `size` bytes of `archive` from `offset`.
pub(crate) fn open_slice(archive: &Path, offset: u64, size: u64) -> Result<impl Read, OciError> {
    let mut file = File::open(archive).map_err(|e| ImageError::io("open", archive, e))?;
    file.seek(SeekFrom::Start(offset))
        .map_err(|e| ImageError::io("seek in", archive, e))?;
    Ok(file.take(size))
}

/// A member name without `./`; `None` for names that leave the archive.
fn normalize(path: &Path) -> Option<String> {
    let mut parts: Vec<&str> = Vec::new();
    for c in path.components() {
        match c {
            Component::Normal(n) => parts.push(n.to_str()?),
            Component::CurDir => {}
            Component::ParentDir => {
                parts.pop()?;
            }
            Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    (!parts.is_empty()).then(|| parts.join("/"))
}
