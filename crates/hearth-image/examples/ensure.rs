//! Builds (or finds) every guest artifact and prints their paths.
//!
//! `cargo run -p hearth-image --example ensure -- <data_dir> [busybox|default]`

use std::process::ExitCode;

use hearth_image::{ensure_all, ImageConfig, ImageName, StderrProgress};

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let Some(data_dir) = args.next() else {
        eprintln!("usage: ensure <data_dir> [busybox|default]");
        return ExitCode::from(2);
    };
    let image = match args
        .next()
        .as_deref()
        .unwrap_or("busybox")
        .parse::<ImageName>()
    {
        Ok(image) => image,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    match ensure_all(&ImageConfig::new(data_dir), image, &StderrProgress) {
        Ok(a) => {
            println!(
                "kernel     {} ({} {})",
                a.kernel.vmlinuz.display(),
                a.kernel.package,
                a.kernel.package_version
            );
            println!(
                "initramfs  {} ({} bytes)",
                a.initramfs.path.display(),
                a.initramfs.size_bytes
            );
            println!(
                "rootfs     {} ({} bytes)",
                a.rootfs.path.display(),
                a.rootfs.size_bytes
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            let mut msg = format!("error: {e}");
            let mut source = std::error::Error::source(&e);
            while let Some(s) = source {
                msg.push_str(&format!(": {s}"));
                source = s.source();
            }
            eprintln!("{msg}");
            ExitCode::FAILURE
        }
    }
}
