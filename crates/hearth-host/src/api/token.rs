//! The standalone host API's bearer token: `hearth host serve` without
//! `--control` has no control plane to sign its commands, so every request
//! but `/healthz` must carry `Authorization: Bearer <token>` instead, the
//! token being the content of `<data>/host-api.token` ([`TOKEN_FILE`]).
//!
//! The file is made on first start (32 random bytes, base64url, behind a
//! `hth_host_` prefix so scanners can spot a leaked one), mode 0600 and
//! owned by the agent's user (root): who can read it is who may drive the
//! host, and any other local user (or a container sharing the network
//! namespace) reaching the loopback port gets a 401. A file group or others
//! can read is refused rather than used, as the signing keys are. The
//! agent keeps only the token's BLAKE3 hash and compares hashes, whose
//! equality is constant-time, so an answer's timing says nothing of how
//! much of a guess was right (nor of the token's length).

use std::path::{Path, PathBuf};

use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use base64::Engine;
use hearth_fence::keyfile::{self, KeyFileError, Size, Zeroizing};

/// The token file's name in the data directory.
pub const TOKEN_FILE: &str = "host-api.token";
/// What a token made here starts with.
const PREFIX: &str = "hth_host_";
/// Bounds on a token read from the file (an operator may write their own).
const MIN_LEN: usize = 32;
const MAX_LEN: usize = 256;

/// Failures of reading or creating the token file.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error(transparent)]
    File(#[from] KeyFileError),
    #[error(
        "host API token file {path} does not hold a token ({MIN_LEN} to {MAX_LEN} visible \
         ASCII characters on one line); delete it to make a new one"
    )]
    Malformed { path: PathBuf },
}

/// The token a standalone host API requires, as the agent holds it: its
/// hash and where it lives (to tell the operator).
#[derive(Clone)]
pub struct ApiToken {
    hash: blake3::Hash,
    path: PathBuf,
}

impl std::fmt::Debug for ApiToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ApiToken({})", self.path.display())
    }
}

impl ApiToken {
    /// The token in `path`, made there first when there is none (see the
    /// module's documentation).
    pub fn load_or_create(path: &Path) -> Result<Self, TokenError> {
        let made = keyfile::load_or_create(WHAT, path, FILE_SIZE, || {
            let mut raw = [0u8; 32];
            getrandom::fill(&mut raw).map_err(|e| std::io::Error::other(e.to_string()))?;
            Ok(Zeroizing::new(
                format!("{PREFIX}{}\n", B64.encode(raw)).into_bytes(),
            ))
        });
        let token = token_of(path, made)?;
        Ok(Self::new(&token, path))
    }

    /// A token held in memory (tests; a token kept elsewhere).
    pub fn new(token: &str, path: &Path) -> Self {
        Self {
            hash: blake3::hash(token.as_bytes()),
            path: path.to_path_buf(),
        }
    }

    /// Whether `given` is the token, in constant time.
    pub fn matches(&self, given: &str) -> bool {
        // `blake3::Hash`'s equality is constant-time.
        blake3::hash(given.as_bytes()) == self.hash
    }

    /// The file the token is in.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// The token in `path`, for a local client of the standalone host API
/// (and the agent itself). The file must be a regular file of mode 0600
/// (or stricter) holding one token.
pub fn read_token(path: &Path) -> Result<String, TokenError> {
    token_of(path, keyfile::read(WHAT, path, FILE_SIZE))
}

/// The token a read of its file found, checked.
fn token_of(
    path: &Path,
    read: Result<Zeroizing<Vec<u8>>, KeyFileError>,
) -> Result<String, TokenError> {
    let malformed = || TokenError::Malformed {
        path: path.to_path_buf(),
    };
    let bytes = match read {
        Ok(b) => b,
        Err(KeyFileError::Length { .. }) => return Err(malformed()),
        Err(e) => return Err(e.into()),
    };
    let text = std::str::from_utf8(&bytes).map_err(|_| malformed())?;
    let token = text.strip_suffix('\n').unwrap_or(text);
    let ok =
        (MIN_LEN..=MAX_LEN).contains(&token.len()) && token.bytes().all(|b| b.is_ascii_graphic());
    if ok {
        Ok(token.to_owned())
    } else {
        Err(malformed())
    }
}

/// What the token's file is called in errors.
const WHAT: &str = "host API token file";

/// The longest token file: the longest token and its newline.
const FILE_SIZE: Size = Size::AtMost(MAX_LEN as u64 + 1);

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn scratch() -> tempfile::TempDir {
        tempfile::tempdir().unwrap()
    }

    #[test]
    fn the_token_file_is_made_0600_and_reloads_to_the_same_token() {
        let dir = scratch();
        let path = dir.path().join(TOKEN_FILE);
        let made = ApiToken::load_or_create(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let token = read_token(&path).unwrap();
        assert!(token.starts_with(PREFIX), "{token}");
        assert!(made.matches(&token));
        assert!(!made.matches(&token[..token.len() - 1]));
        assert!(!made.matches(""));
        let again = ApiToken::load_or_create(&path).unwrap();
        assert!(again.matches(&token));
        // Nothing else was left in the directory.
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(names.len(), 1);
    }

    #[test]
    fn a_token_file_others_can_read_or_that_holds_no_token_is_refused() {
        let dir = scratch();
        let path = dir.path().join(TOKEN_FILE);
        std::fs::write(&path, "x".repeat(40)).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = ApiToken::load_or_create(&path).unwrap_err();
        assert!(
            matches!(e, TokenError::File(KeyFileError::Mode { mode: 0o644, .. })),
            "{e}"
        );
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        // An operator's own token is taken as it is.
        assert!(ApiToken::load_or_create(&path)
            .unwrap()
            .matches(&"x".repeat(40)));
        for bad in [
            "short\n",
            "with space in it, long enough to pass the minimum",
        ] {
            std::fs::write(&path, bad).unwrap();
            let e = ApiToken::load_or_create(&path).unwrap_err();
            assert!(matches!(e, TokenError::Malformed { .. }), "{bad}: {e}");
        }
    }
}
