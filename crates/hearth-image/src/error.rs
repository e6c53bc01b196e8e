//! The crate's error type.

use std::io;
use std::path::PathBuf;

/// Everything that can go wrong while building or finding a guest artifact.
///
/// Variants carry the context needed to act on them (the path, the command
/// line, the tail of a tool's stderr); the underlying I/O or JSON error is the
/// [`source`](std::error::Error::source).
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// A filesystem operation failed.
    #[error("{op} {}", path.display())]
    Io {
        /// What was being done, as a verb phrase ("create directory", "read").
        op: &'static str,
        /// The path it was done to.
        path: PathBuf,
        #[source]
        source: io::Error,
    },

    /// An external tool could not be started (usually: not installed).
    #[error("cannot run `{command}` (is it installed?)")]
    Spawn {
        /// The command line.
        command: String,
        #[source]
        source: io::Error,
    },

    /// An external tool ran and failed.
    #[error("`{command}` failed ({status}); stderr ends with:\n{stderr_tail}")]
    CommandFailed {
        /// The command line.
        command: String,
        /// How it ended ("exit status: 100", "signal: 9").
        status: String,
        /// The last lines of its stderr (or stdout when stderr was empty).
        stderr_tail: String,
    },

    /// An external tool succeeded but printed something this crate cannot use.
    #[error("unexpected output from `{command}`: {reason}")]
    UnexpectedOutput {
        /// The command line.
        command: String,
        /// What was wrong with it.
        reason: String,
    },

    /// Building this artifact needs root (debootstrap, file ownership).
    #[error("building {what} needs root (current effective uid {euid})")]
    NotRoot {
        /// The artifact being built.
        what: String,
        /// The effective uid this process runs as.
        euid: u32,
    },

    /// A binary that must be statically linked asks for a dynamic loader.
    #[error(
        "{} is dynamically linked (interpreter {interpreter}); it must be a static binary",
        path.display()
    )]
    NotStatic {
        /// The binary.
        path: PathBuf,
        /// Its `PT_INTERP`, e.g. `/lib64/ld-linux-x86-64.so.2`.
        interpreter: String,
    },

    /// A file is not an ELF64 x86-64 executable this crate can use.
    #[error("{} is not a usable ELF executable: {reason}", path.display())]
    BadElf {
        /// The file.
        path: PathBuf,
        /// What was wrong.
        reason: String,
    },

    /// A required host tool or file is missing.
    #[error("{what} not found at {}: {hint}", path.display())]
    MissingHostFile {
        /// What was looked for ("busybox-static").
        what: &'static str,
        /// Where.
        path: PathBuf,
        /// How to fix it.
        hint: &'static str,
    },

    /// Neither the pinned kernel package nor a fallback is available from apt.
    #[error("no usable kernel package: {package} is not available from apt and {detail}")]
    KernelPackageUnavailable {
        /// The package that was asked for.
        package: String,
        /// Why no fallback was found.
        detail: String,
    },

    /// The kernel package does not look as expected.
    #[error("kernel package {package}: {reason}")]
    BadKernelPackage {
        /// The package.
        package: String,
        /// What was wrong.
        reason: String,
    },

    /// A module the guest cannot work without is neither a `.ko` nor built in.
    #[error(
        "kernel {release} has no module {module} (neither {module}.ko nor in modules.builtin)"
    )]
    MissingModule {
        /// The kernel release.
        release: String,
        /// The module name.
        module: &'static str,
    },

    /// The guest agent binary cannot be located or built.
    #[error("guest agent binary unavailable: {reason}; set HEARTH_GUEST_BIN to a static hearth-guest binary")]
    GuestAgentUnavailable {
        /// Why.
        reason: String,
    },

    /// A manifest could not be encoded or decoded.
    #[error("manifest {}", path.display())]
    Manifest {
        /// The manifest file.
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },

    /// A file cannot be put into a newc cpio archive.
    #[error("cpio entry {name}: {reason}")]
    Cpio {
        /// The archive member name.
        name: String,
        /// What was wrong.
        reason: String,
    },
}

impl ImageError {
    /// Shorthand for [`ImageError::Io`].
    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Self {
        ImageError::Io {
            op,
            path: path.into(),
            source,
        }
    }
}
