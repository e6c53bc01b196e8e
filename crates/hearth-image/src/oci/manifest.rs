//! The JSON documents of an image: index (manifest list), manifest, config,
//! and the `manifest.json` of a `docker save` archive. Only the fields
//! Hearth uses are read; unknown fields are ignored.

use serde::Deserialize;
use sha2::{Digest as _, Sha256};

use super::OciError;

pub(crate) const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub(crate) const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub(crate) const DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
pub(crate) const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";

/// Layer media types this importer can unpack (the compression is sniffed
/// from the bytes, so a mislabeled layer still unpacks correctly).
const LAYER_TYPES: &[&str] = &[
    "application/vnd.oci.image.layer.v1.tar",
    "application/vnd.oci.image.layer.v1.tar+gzip",
    "application/vnd.oci.image.layer.v1.tar+zstd",
    "application/vnd.docker.image.rootfs.diff.tar",
    "application/vnd.docker.image.rootfs.diff.tar.gzip",
    "application/vnd.docker.image.rootfs.diff.tar.zstd",
];

/// A content descriptor: what a blob must hash to and how long it is.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Descriptor {
    #[serde(default)]
    pub media_type: String,
    pub digest: String,
    pub size: u64,
    #[serde(default)]
    pub platform: Option<Platform>,
}

#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Platform {
    #[serde(default)]
    pub architecture: String,
    #[serde(default)]
    pub os: String,
}

/// An OCI index or a Docker manifest list.
#[derive(Debug, Deserialize)]
pub(crate) struct Index {
    #[serde(default)]
    pub manifests: Vec<Descriptor>,
}

/// An OCI image manifest or a Docker v2 schema 2 manifest.
#[derive(Debug, Deserialize)]
pub(crate) struct Manifest {
    pub config: Descriptor,
    #[serde(default)]
    pub layers: Vec<Descriptor>,
}

/// The image configuration blob.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct ImageConfigBlob {
    #[serde(default)]
    pub architecture: String,
    #[serde(default)]
    pub os: String,
    #[serde(default)]
    pub config: Option<ContainerConfig>,
    #[serde(default)]
    pub rootfs: Option<RootFs>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(crate) struct ContainerConfig {
    #[serde(default)]
    pub entrypoint: Option<Vec<String>>,
    #[serde(default)]
    pub cmd: Option<Vec<String>>,
    #[serde(default)]
    pub env: Option<Vec<String>>,
    #[serde(default)]
    pub working_dir: Option<String>,
    #[serde(default)]
    pub user: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct RootFs {
    #[serde(default)]
    pub diff_ids: Vec<String>,
}

/// One image of a `docker save` archive's `manifest.json`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(crate) struct DockerSaveEntry {
    pub config: String,
    #[serde(default)]
    pub layers: Vec<String>,
}

/// What a manifest document turned out to be.
pub(crate) enum Document {
    Index(Index),
    Manifest(Manifest),
}

/// Parses a manifest-like document, using the transport's content type
/// when it is one of ours, else the document's own `mediaType`, else its
/// shape (a `manifests` array makes an index).
pub(crate) fn parse_document(
    content_type: Option<&str>,
    body: &[u8],
) -> Result<Document, OciError> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Probe {
        #[serde(default)]
        media_type: Option<String>,
        #[serde(default)]
        schema_version: Option<u32>,
        #[serde(default)]
        manifests: Option<serde_json::Value>,
    }
    let probe: Probe = json("manifest", body)?;
    let declared = content_type
        .map(|c| c.split(';').next().unwrap_or("").trim().to_owned())
        .filter(|c| [OCI_INDEX, OCI_MANIFEST, DOCKER_LIST, DOCKER_MANIFEST].contains(&c.as_str()))
        .or(probe.media_type);
    if probe.schema_version == Some(1) {
        return Err(OciError::UnsupportedMediaType {
            media_type: "Docker image manifest schema 1".to_owned(),
        });
    }
    match declared.as_deref() {
        Some(OCI_INDEX | DOCKER_LIST) => Ok(Document::Index(json("index", body)?)),
        Some(OCI_MANIFEST | DOCKER_MANIFEST) => Ok(Document::Manifest(json("manifest", body)?)),
        Some(other) => Err(OciError::UnsupportedMediaType {
            media_type: other.to_owned(),
        }),
        None if probe.manifests.is_some() => Ok(Document::Index(json("index", body)?)),
        None => Ok(Document::Manifest(json("manifest", body)?)),
    }
}

/// The linux/amd64 entry of an index.
pub(crate) fn pick_platform(index: &Index) -> Result<&Descriptor, OciError> {
    index
        .manifests
        .iter()
        .find(|d| {
            d.platform
                .as_ref()
                .is_some_and(|p| p.os == "linux" && p.architecture == "amd64")
        })
        .ok_or_else(|| OciError::NoPlatform {
            available: index
                .manifests
                .iter()
                .map(|d| match &d.platform {
                    Some(p) => format!("{}/{}", p.os, p.architecture),
                    None => "unspecified".to_owned(),
                })
                .collect(),
        })
}

/// Fails unless `media_type` is a layer this importer can unpack (an empty
/// one, as in `docker save` archives, is accepted and sniffed).
pub(crate) fn check_layer_type(media_type: &str) -> Result<(), OciError> {
    if media_type.is_empty() || LAYER_TYPES.contains(&media_type) {
        Ok(())
    } else {
        Err(OciError::UnsupportedMediaType {
            media_type: media_type.to_owned(),
        })
    }
}

/// Decodes `body` as JSON, naming `what` on failure.
pub(crate) fn json<T: serde::de::DeserializeOwned>(what: &str, body: &[u8]) -> Result<T, OciError> {
    serde_json::from_slice(body).map_err(|e| OciError::BadDocument {
        what: what.to_owned(),
        reason: e.to_string(),
    })
}

/// `sha256:<hex>` of `bytes`.
pub(crate) fn sha256_digest(bytes: &[u8]) -> String {
    format_digest(&Sha256::digest(bytes))
}

pub(crate) fn format_digest(hash: &[u8]) -> String {
    let mut s = String::with_capacity(7 + 64);
    s.push_str("sha256:");
    for b in hash {
        s.push_str(&format!("{b:02x}"));
    }
    s
}

/// The hex part of a `sha256:` digest, checked to be exactly that (it names
/// files, so nothing else may pass).
pub(crate) fn digest_hex(digest: &str) -> Result<&str, OciError> {
    match digest.strip_prefix("sha256:") {
        Some(hex)
            if hex.len() == 64
                && hex
                    .bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) =>
        {
            Ok(hex)
        }
        _ => Err(OciError::BadDocument {
            what: "digest".to_owned(),
            reason: format!("{digest:?} is not a sha256 digest"),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_linux_amd64() {
        let body = br#"{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json",
          "manifests":[
            {"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:aa","size":1,
             "platform":{"architecture":"arm64","os":"linux"}},
            {"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:bb","size":2,
             "platform":{"architecture":"amd64","os":"linux"}}]}"#;
        let Document::Index(index) = parse_document(None, body).unwrap() else {
            panic!("not an index");
        };
        assert_eq!(pick_platform(&index).unwrap().digest, "sha256:bb");
        let only_arm = Index {
            manifests: index.manifests[..1].to_vec(),
        };
        let err = pick_platform(&only_arm).unwrap_err();
        assert!(err.to_string().contains("linux/arm64"), "{err}");
    }

    #[test]
    fn content_type_beats_shape_and_schema1_is_refused() {
        let body = br#"{"schemaVersion":2,"config":{"digest":"sha256:cc","size":3},"layers":[]}"#;
        assert!(matches!(
            parse_document(
                Some("application/vnd.docker.distribution.manifest.v2+json"),
                body
            ),
            Ok(Document::Manifest(_))
        ));
        assert!(matches!(
            parse_document(None, body),
            Ok(Document::Manifest(_))
        ));
        let v1 = br#"{"schemaVersion":1,"fsLayers":[]}"#;
        assert!(matches!(
            parse_document(None, v1),
            Err(OciError::UnsupportedMediaType { .. })
        ));
        let helm = br#"{"mediaType":"application/vnd.cncf.helm.chart.v1"}"#;
        assert!(parse_document(None, helm).is_err());
    }

    #[test]
    fn digests_are_checked_before_naming_files() {
        let d = sha256_digest(b"hello");
        assert_eq!(
            d,
            "sha256:2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"
        );
        assert!(digest_hex(&d).is_ok());
        assert!(digest_hex("sha256:../../etc/passwd").is_err());
        assert!(digest_hex("sha512:00").is_err());
        assert!(check_layer_type("application/vnd.oci.image.layer.v1.tar+gzip").is_ok());
        assert!(check_layer_type("application/vnd.oci.image.layer.v1.tar+encrypted").is_err());
    }
}
