//! The built-in root images, by name: what a snapshot and the host API
//! say an image is. How each is built (its recipe, its filesystem) is
//! `hearth-image`'s.

use std::fmt;
use std::str::FromStr;

/// A built-in root image.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ImageName {
    /// busybox-static and its applets: tiny, quick to build, for tests.
    Busybox,
    /// Debian minbase with bash, python/python3, pip, venv, git, curl, jq,
    /// ripgrep, unzip, iproute2, procps and CA certificates.
    Default,
    /// `default` plus Jupyter's Python kernel, matplotlib, pandas and the
    /// server `e2b-code-interpreter` talks to on port 49999.
    #[serde(rename = "code-interpreter")]
    CodeInterpreter,
}

impl ImageName {
    /// Every image.
    pub const ALL: [ImageName; 3] = [
        ImageName::Busybox,
        ImageName::Default,
        ImageName::CodeInterpreter,
    ];

    /// `"busybox"` or `"default"`.
    pub fn as_str(self) -> &'static str {
        match self {
            ImageName::Busybox => "busybox",
            ImageName::Default => "default",
            ImageName::CodeInterpreter => "code-interpreter",
        }
    }
}

impl fmt::Display for ImageName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for ImageName {
    type Err = UnknownImageName;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ImageName::ALL
            .into_iter()
            .find(|n| n.as_str() == s)
            .ok_or_else(|| UnknownImageName {
                input: s.to_owned(),
            })
    }
}

/// The text did not name an image (`busybox`, `default` or
/// `code-interpreter`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown image name {input:?} (expected \"busybox\", \"default\" or \"code-interpreter\")")]
pub struct UnknownImageName {
    /// The text that was parsed.
    pub input: String,
}
