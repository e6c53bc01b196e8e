//! `CommandHook` for real: a shell script written to a temporary directory
//! records every call to a file and answers per mode.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use hearth_fleet::{CommandHook, ScaleBackend, ScaleError};

/// Records `desired|query|args` per call; then acts on its mode (first
/// argument after the log path). Keeps the "deployment" count in
/// `<log>.count`.
const SCRIPT: &str = r#"
log="$1"; mode="$2"; shift 2
printf 'desired=%s query=%s args=%s\n' "${HEARTH_DESIRED_REPLICAS-unset}" "${HEARTH_QUERY_REPLICAS-unset}" "$*" >> "$log"
case "$mode" in
  ok)
    if [ "${HEARTH_QUERY_REPLICAS-}" = 1 ]; then
      if [ -f "$log.count" ]; then printf '  %s\n' "$(cat "$log.count")"; else echo 0; fi
    else
      echo "$HEARTH_DESIRED_REPLICAS" > "$log.count"
    fi ;;
  fail) echo "scaling refused: quota exceeded in region" >&2; exit 3 ;;
  slow)
    echo "waiting for the cloud" >&2
    sleep 30 & echo $! > "$log.child"
    wait ;;
  garbage) echo "three" ;;
  huge) head -c 100000 /dev/zero | tr '\0' 7 ;;
  noisy)
    i=0; while [ $i -lt 2000 ]; do echo "noise line $i" >&2; i=$((i+1)); done
    echo "THE REAL REASON" >&2; exit 1 ;;
esac
"#;

struct Fixture {
    _dir: tempfile::TempDir,
    script: PathBuf,
    log: PathBuf,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("hook.sh");
    std::fs::write(&script, SCRIPT).unwrap();
    let log = dir.path().join("calls.log");
    Fixture {
        script,
        log,
        _dir: dir,
    }
}

/// The hook runs `/bin/sh <script> <log> <mode> extra…` (argv, no shell
/// interpretation of the arguments; sh only reads the script file, which
/// also avoids executing a file another test thread may still hold open).
fn hook(f: &Fixture, mode: &str, extra: &[&str], timeout: Duration) -> CommandHook {
    let mut args = vec![
        f.script.display().to_string(),
        f.log.display().to_string(),
        mode.to_owned(),
    ];
    args.extend(extra.iter().map(|s| (*s).to_owned()));
    CommandHook::new("/bin/sh", args, timeout)
}

fn calls(log: &Path) -> Vec<String> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

#[tokio::test]
async fn scale_and_query_pass_the_count_through_the_environment() {
    let f = fixture();
    let h = hook(&f, "ok", &["a b", "$HOME;echo x"], Duration::from_secs(10));
    assert_eq!(h.replicas().await.unwrap(), 0);
    h.scale(7).await.unwrap();
    assert_eq!(h.replicas().await.unwrap(), 7);
    h.scale(3).await.unwrap();
    assert_eq!(h.replicas().await.unwrap(), 3);
    assert_eq!(
        calls(&f.log),
        [
            "desired=unset query=1 args=a b $HOME;echo x",
            "desired=7 query=unset args=a b $HOME;echo x",
            "desired=unset query=1 args=a b $HOME;echo x",
            "desired=3 query=unset args=a b $HOME;echo x",
            "desired=unset query=1 args=a b $HOME;echo x",
        ]
    );
}

#[tokio::test]
async fn non_zero_exit_is_an_error_with_stderr() {
    let f = fixture();
    let err = hook(&f, "fail", &[], Duration::from_secs(10))
        .scale(4)
        .await
        .unwrap_err();
    match &err {
        ScaleError::HookFailed { status, stderr, .. } => {
            assert_eq!(status.code(), Some(3));
            assert_eq!(stderr, "scaling refused: quota exceeded in region");
        }
        other => panic!("{other:?}"),
    }
    assert!(err.to_string().contains("quota exceeded"), "{err}");
}

#[tokio::test]
async fn stderr_is_kept_as_a_bounded_tail() {
    let f = fixture();
    let err = hook(&f, "noisy", &[], Duration::from_secs(20))
        .scale(1)
        .await
        .unwrap_err();
    let ScaleError::HookFailed { stderr, .. } = err else {
        panic!("{err:?}")
    };
    assert!(stderr.len() <= 2048, "{} bytes", stderr.len());
    assert!(stderr.ends_with("THE REAL REASON"), "{stderr}");
    assert!(!stderr.contains("noise line 0\n"), "the head is dropped");
}

#[tokio::test]
async fn timeout_kills_the_hook_and_its_children() {
    let f = fixture();
    let started = Instant::now();
    let err = hook(&f, "slow", &[], Duration::from_millis(500))
        .scale(2)
        .await
        .unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    match &err {
        ScaleError::HookTimedOut { after, stderr, .. } => {
            assert_eq!(*after, Duration::from_millis(500));
            assert_eq!(stderr, "waiting for the cloud");
        }
        other => panic!("{other:?}"),
    }
    // The script's background `sleep` died with its process group.
    let child = std::fs::read_to_string(f.log.with_extension("log.child")).unwrap();
    let proc = PathBuf::from(format!("/proc/{}", child.trim()));
    let deadline = Instant::now() + Duration::from_secs(5);
    while proc.exists() && !is_zombie(&proc) {
        assert!(Instant::now() < deadline, "{} still runs", proc.display());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn is_zombie(proc: &Path) -> bool {
    std::fs::read_to_string(proc.join("stat"))
        .map(|s| {
            s.rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z')
        })
        .unwrap_or(true)
}

#[tokio::test]
async fn a_query_answer_that_is_not_a_count_is_an_error() {
    let f = fixture();
    let err = hook(&f, "garbage", &[], Duration::from_secs(10))
        .replicas()
        .await
        .unwrap_err();
    match err {
        ScaleError::BadReplicaCount { output, .. } => assert_eq!(output.trim(), "three"),
        other => panic!("{other:?}"),
    }
    // 100 kB of digits: read up to the bound, then refused, not parsed.
    let err = hook(&f, "huge", &[], Duration::from_secs(10))
        .replicas()
        .await
        .unwrap_err();
    match err {
        ScaleError::BadReplicaCount { output, .. } => assert!(output.len() <= 200),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_missing_program_is_a_spawn_error() {
    let h = CommandHook::new(
        "/nonexistent/hearth-scale-hook",
        Vec::<String>::new(),
        Duration::from_secs(1),
    );
    match h.scale(1).await.unwrap_err() {
        ScaleError::Hook { program, source } => {
            assert_eq!(program, PathBuf::from("/nonexistent/hearth-scale-hook"));
            assert_eq!(source.kind(), std::io::ErrorKind::NotFound);
        }
        other => panic!("{other:?}"),
    }
}
