//! `hearth run`: one VM, one command, the command's exit code.

use std::path::PathBuf;

use anyhow::Context;
use hearth_guest_proto::{ExecErrorType, ExecRequest, OutputChannel};
use hearth_host::{CreateVm, ExecUpdate};
use hearth_image::ImageName;
use hearth_types::{ByteSize, MilliCpu};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

pub async fn run(
    data_dir: PathBuf,
    image: ImageName,
    memory: ByteSize,
    cpus: u32,
    shell: bool,
    command: Vec<String>,
) -> anyhow::Result<u8> {
    let host = crate::start_host(data_dir).await?;
    // Build the image first (with progress): the first run of the default
    // image runs debootstrap.
    host.artifacts(image, crate::progress::reporter())
        .await
        .map_err(|e| anyhow::anyhow!(hearth_host::error_chain(&e)))
        .with_context(|| format!("build the {image} image"))?;
    let vm = host
        .create_vm(CreateVm {
            image,
            memory,
            cpu: MilliCpu::vcpus(cpus),
            ..CreateVm::default()
        })
        .await
        .map_err(|e| anyhow::anyhow!(hearth_host::error_chain(&e)))
        .context("boot the VM")?;
    let result = exec(&vm, shell, command).await;
    if let Err(e) = host.delete(vm.id).await {
        eprintln!(
            "hearth: tear down vm {}: {}",
            vm.id,
            hearth_host::error_chain(&e)
        );
    }
    result
}

async fn exec(vm: &hearth_host::Vm, shell: bool, command: Vec<String>) -> anyhow::Result<u8> {
    let guest = vm.guest().context("the VM has no guest channel")?;
    let req = if shell {
        ExecRequest {
            command: command.join(" "),
            shell: Some("/bin/bash".into()),
            timeout_ms: 0,
            ..Default::default()
        }
    } else {
        ExecRequest {
            argv: Some(command),
            timeout_ms: 0,
            ..Default::default()
        }
    };
    let mut handle = guest.exec(req).await.context("start the command")?;
    // Forward our stdin; at its end, close the command's.
    let control = handle.control.clone();
    let stdin_task = tokio::spawn(async move {
        let mut stdin = tokio::io::stdin();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match stdin.read(&mut buf).await {
                Ok(0) | Err(_) => {
                    let _ = control.close_stdin().await;
                    break;
                }
                Ok(n) => {
                    if control
                        .stdin(bytes::Bytes::copy_from_slice(&buf[..n]))
                        .await
                        .is_err()
                    {
                        break;
                    }
                }
            }
        }
    });
    let mut stdout = tokio::io::stdout();
    let mut stderr = tokio::io::stderr();
    let mut code = 1u8;
    while let Some(ev) = handle.next().await.context("read the command's output")? {
        match ev {
            ExecUpdate::Output {
                channel: OutputChannel::Stdout,
                data,
                ..
            } => {
                stdout.write_all(&data).await?;
                stdout.flush().await?;
            }
            ExecUpdate::Output {
                channel: OutputChannel::Stderr,
                data,
                ..
            } => {
                stderr.write_all(&data).await?;
                stderr.flush().await?;
            }
            ExecUpdate::Exit { exit_code, .. } => code = exit_code.clamp(0, 255) as u8,
            ExecUpdate::Error {
                error_type,
                message,
            } => {
                eprintln!("hearth: {message}");
                code = match error_type {
                    ExecErrorType::CommandNotFound => 127,
                    ExecErrorType::CommandTimeout => 124,
                    _ => 126,
                };
            }
            ExecUpdate::Started { .. } => {}
        }
    }
    stdin_task.abort();
    Ok(code)
}
