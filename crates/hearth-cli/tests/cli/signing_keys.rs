//! `hearth keys signing list|retire`: an operator sees the fleet's signing
//! keys and ends one at once (rotation: a new key, then the old retired).

use std::process::Command;

use hearth_db::{Db, KeyOwnerKind, NewSigningKey, Timestamp};
use hearth_fence::KeyPair;

const BIN: &str = env!("CARGO_BIN_EXE_hearth");

fn keys(dir: &std::path::Path, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(BIN)
        .args(["keys", "signing"])
        .args(args)
        .env("HEARTH_DATA_DIR", dir)
        .env_remove("HEARTH_DATABASE_URL")
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn list_shows_every_key_and_retire_ends_one() {
    let dir = std::env::temp_dir().join(format!("hearth-signing-{}", uuid::Uuid::now_v7()));
    std::fs::create_dir_all(&dir).unwrap();
    let db = Db::connect(&format!(
        "sqlite://{}?mode=rwc",
        dir.join("hearth.db").display()
    ))
    .await
    .unwrap();
    let now = Timestamp::now();
    let control = KeyPair::generate().unwrap();
    let old = KeyPair::generate().unwrap();
    let host = KeyPair::generate().unwrap();
    for (k, kind, owner, at) in [
        (&control, KeyOwnerKind::Control, "control", now),
        (
            &old,
            KeyOwnerKind::Control,
            "control",
            now.minus(std::time::Duration::from_secs(3600)),
        ),
        (&host, KeyOwnerKind::Host, "host-1", now),
    ] {
        db.register_signing_key(&NewSigningKey {
            key_id: k.id().to_string(),
            owner_kind: kind,
            owner_id: owner.into(),
            public_key: k.public().bytes(),
            created_at: at,
        })
        .await
        .unwrap();
    }
    drop(db);

    let line = |out: &str, k: &KeyPair| {
        out.lines()
            .find(|l| l.starts_with(k.id().as_str()))
            .unwrap_or_else(|| panic!("{} not listed:\n{out}", k.id()))
            .to_owned()
    };
    let (ok, out, err) = keys(&dir, &["list"]);
    assert!(ok, "{err}");
    assert!(line(&out, &control).ends_with("in use"), "{out}");
    assert!(line(&out, &old).contains("stale"), "{out}");
    assert!(line(&out, &host).contains("host host-1"), "{out}");

    let (ok, out, err) = keys(&dir, &["retire", control.id().as_str()]);
    assert!(ok, "{err}");
    assert!(
        out.starts_with(&format!("retired {}", control.id())),
        "{out}"
    );
    let (_, out, _) = keys(&dir, &["list"]);
    assert!(line(&out, &control).contains("retired"), "{out}");
    assert!(line(&out, &host).ends_with("in use"), "{out}");

    // An unknown key is a clear error, not a success.
    let (ok, _, err) = keys(&dir, &["retire", "no-such-key"]);
    assert!(!ok);
    assert!(err.contains("no-such-key"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}
