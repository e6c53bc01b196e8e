//! Control-plane keys as hosts receive them: only keys a live replica has
//! refreshed recently, never retired ones. Each pod of the chart makes a
//! new `control.key`; before this, every key ever registered stayed
//! trusted by every host forever.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use hearth_control::{Control, ControlConfig, CONTROL_KEY_WINDOW};
use hearth_db::{Db, KeyOwnerKind, NewSigningKey, Timestamp};
use hearth_fence::{KeyPair, KeyRing, Signer, Verifier, VerifierConfig};
use hearth_hostapi::fleet::{Lease, RegisterHost, RenewLease, ENROLLMENT_HEADER};
use hearth_types::{ByteSize, HostId, MilliCpu};
use serde_json::Value;
use tower::ServiceExt;

const TOKEN: &str = "enroll-me";

async fn register_key(db: &Db, key: &KeyPair, kind: KeyOwnerKind, owner: &str, at: Timestamp) {
    db.register_signing_key(&NewSigningKey {
        key_id: key.id().to_string(),
        owner_kind: kind,
        owner_id: owner.into(),
        public_key: key.public().bytes(),
        created_at: at,
    })
    .await
    .unwrap();
}

/// A POST the way a host agent sends it: the enrollment token and a
/// command signed by the host's key.
async fn host_post(
    app: &axum::Router,
    key: &KeyPair,
    path: &str,
    subject: Option<&str>,
    epoch: u64,
    body: Vec<u8>,
) -> (StatusCode, Value) {
    let token = Signer::new(key.clone(), Duration::from_secs(60))
        .sign(
            hearth_hostapi::fleet::CONTROL_AUDIENCE,
            0,
            subject,
            epoch,
            &hearth_fence::action("POST", path),
            &body,
        )
        .unwrap();
    let req = Request::builder()
        .method(Method::POST)
        .uri(path)
        .header("content-type", "application/json")
        .header(ENROLLMENT_HEADER, format!("Bearer {TOKEN}"))
        .header(hearth_fence::HEADER_NAME, token)
        .body(Body::from(body))
        .unwrap();
    crate::harness::oneshot_json(app, req).await
}

fn keys_of(lease: &Value) -> BTreeSet<String> {
    serde_json::from_value::<Lease>(lease.clone())
        .unwrap()
        .control_keys
        .into_iter()
        .collect()
}

fn b64(k: &KeyPair) -> String {
    k.public().to_base64()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hosts_trust_only_live_unretired_control_keys() {
    let url = hearth_db::testing::sqlite_url();
    let db = url.open().await;
    let now = Timestamp::now();
    let hour = Duration::from_secs(3600);
    // A replica gone an hour ago, one alive (refreshed a minute ago), and
    // one whose key an operator retired.
    let gone = KeyPair::generate().unwrap();
    let peer = KeyPair::generate().unwrap();
    let retired = KeyPair::generate().unwrap();
    register_key(
        &db,
        &gone,
        KeyOwnerKind::Control,
        "control",
        now.minus(hour),
    )
    .await;
    register_key(
        &db,
        &peer,
        KeyOwnerKind::Control,
        "control",
        now.minus(hour),
    )
    .await;
    db.touch_signing_key(peer.id().as_str(), now.minus(Duration::from_secs(60)))
        .await
        .unwrap();
    register_key(&db, &retired, KeyOwnerKind::Control, "control", now).await;
    db.retire_signing_key(retired.id().as_str(), now)
        .await
        .unwrap();

    // This replica restarts with a key registered long ago (the same
    // key file): opening refreshes it.
    let me = KeyPair::generate().unwrap();
    register_key(&db, &me, KeyOwnerKind::Control, "control", now.minus(hour)).await;
    let cfg = ControlConfig {
        host_token: Some(TOKEN.into()),
        signer: Some(Arc::new(Signer::new(me.clone(), Duration::from_secs(60)))),
        // Outlives the reaper pass at a later clock below.
        lease: hour,
        ..ControlConfig::default()
    };
    let control = Control::open(db.db.clone(), cfg, Vec::new()).await.unwrap();
    let app = hearth_control::router(control.clone());

    // A host registers: its lease names exactly the live keys.
    let host = KeyPair::generate().unwrap();
    let host_id = HostId::new();
    let reg = RegisterHost {
        id: host_id,
        address: "http://10.0.0.9:7070".into(),
        capacity_cpu: MilliCpu(8_000),
        capacity_mem: ByteSize::gib(16),
        version: "test".into(),
        store_url: String::new(),
        disk_free: ByteSize::gib(100),
        public_key: b64(&host),
    };
    let register = async || {
        host_post(
            &app,
            &host,
            "/internal/v1/hosts/register",
            None,
            0,
            serde_json::to_vec(&reg).unwrap(),
        )
        .await
    };
    let (s, lease) = register().await;
    assert_eq!(s, StatusCode::OK, "{lease}");
    assert_eq!(keys_of(&lease), BTreeSet::from([b64(&me), b64(&peer)]));
    let epoch = lease["epoch"].as_u64().unwrap();

    // The host's verifier holds exactly the lease's keys: commands signed
    // by the gone replica's key or the retired one are refused as unknown.
    let ring = keys_of(&lease).iter().fold(KeyRing::new(), |r, k| {
        r.with(hearth_fence::PublicKey::from_base64(k).unwrap(), None)
    });
    let verifier = Verifier::new(VerifierConfig::new("host-a"), ring);
    verifier.set_epoch(epoch);
    for (signer, trusted) in [
        (&me, true),
        (&peer, true),
        (&gone, false),
        (&retired, false),
    ] {
        let token = Signer::new(signer.clone(), Duration::from_secs(60))
            .sign("host-a", epoch, None, 0, "GET /v1/status", b"")
            .unwrap();
        let got = verifier.verify(&token, "GET /v1/status", b"", hearth_fence::now_ms());
        match (trusted, got) {
            (true, Ok(_)) => {}
            (false, Err(r)) => assert_eq!(r.reason(), "unknown_key"),
            (trusted, got) => panic!("key trusted={trusted}: {got:?}"),
        }
    }

    // Reaper passes keep this replica's key live; nothing refreshes the
    // peer's, which falls out of the window.
    let later = now.plus(CONTROL_KEY_WINDOW);
    control.reap_at(later).await;
    let mine = db.signing_key(me.id().as_str()).await.unwrap().unwrap();
    assert_eq!(mine.seen_at, later);
    assert!(!db
        .signing_key(peer.id().as_str())
        .await
        .unwrap()
        .unwrap()
        .live_since(later.minus(CONTROL_KEY_WINDOW)));

    // An operator retires the peer's key (`hearth keys signing retire`):
    // the host's next renewal no longer carries it.
    db.retire_signing_key(peer.id().as_str(), Timestamp::now())
        .await
        .unwrap();
    let path = format!("/internal/v1/hosts/{host_id}/lease");
    let renew = RenewLease {
        epoch,
        disk_free: ByteSize::gib(100),
        store: Default::default(),
    };
    let renew_lease = async || {
        host_post(
            &app,
            &host,
            &path,
            Some(&host_id.to_string()),
            epoch,
            serde_json::to_vec(&renew).unwrap(),
        )
        .await
    };
    let (s, lease) = renew_lease().await;
    assert_eq!(s, StatusCode::OK, "{lease}");
    assert_eq!(keys_of(&lease), BTreeSet::from([b64(&me)]));

    // A retired host key: its renewals are refused, and it cannot simply
    // register again with the same key.
    // (Retired a second ago: a key is still good in its retirement's own
    // millisecond.)
    db.retire_signing_key(
        host.id().as_str(),
        Timestamp::now().minus(Duration::from_secs(1)),
    )
    .await
    .unwrap();
    let (s, body) = renew_lease().await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{body}");
    let (s, body) = register().await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{body}");
    let message = body["detail"]["message"].as_str().unwrap_or_default();
    assert!(message.starts_with("retired_key"), "{body}");
}

/// `GET /.well-known/jwks.json`, what LangSmith's SDK verifies callback
/// tokens with: every key in use (this replica's, a registered host's), as
/// Ed25519 JWKs named by key id; not a key retired or unused for longer
/// than any token it signed can live.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_jwks_serves_the_keys_in_use() {
    let url = hearth_db::testing::sqlite_url();
    let db = url.open().await;
    let now = Timestamp::now();
    let gone = KeyPair::generate().unwrap();
    let retired = KeyPair::generate().unwrap();
    register_key(
        &db,
        &gone,
        KeyOwnerKind::Control,
        "control",
        now.minus(Duration::from_secs(2 * 3600)),
    )
    .await;
    register_key(&db, &retired, KeyOwnerKind::Host, "h", now).await;
    db.retire_signing_key(retired.id().as_str(), now)
        .await
        .unwrap();
    let me = KeyPair::generate().unwrap();
    let cfg = ControlConfig {
        host_token: Some(TOKEN.into()),
        signer: Some(Arc::new(Signer::new(me.clone(), Duration::from_secs(60)))),
        ..ControlConfig::default()
    };
    let control = Control::open(db.db.clone(), cfg, Vec::new()).await.unwrap();
    let app = hearth_control::router(control.clone());
    let host = KeyPair::generate().unwrap();
    let reg = RegisterHost {
        id: HostId::new(),
        address: "http://10.0.0.9:7070".into(),
        capacity_cpu: MilliCpu(8_000),
        capacity_mem: ByteSize::gib(16),
        version: "test".into(),
        store_url: String::new(),
        disk_free: ByteSize::gib(100),
        public_key: b64(&host),
    };
    let body = serde_json::to_vec(&reg).unwrap();
    let (s, lease) = host_post(&app, &host, "/internal/v1/hosts/register", None, 0, body).await;
    assert_eq!(s, StatusCode::OK, "{lease}");

    let req = Request::get("/.well-known/jwks.json")
        .body(Body::empty())
        .unwrap();
    let resp = app.clone().oneshot(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.headers()["cache-control"], "public, max-age=300");
    let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20)
        .await
        .unwrap();
    let set: Value = serde_json::from_slice(&bytes).unwrap();
    let kids: BTreeSet<String> = set["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| {
            assert_eq!(
                (k["kty"].as_str(), k["crv"].as_str()),
                (Some("OKP"), Some("Ed25519"))
            );
            assert_eq!(k["alg"], "EdDSA");
            k["kid"].as_str().unwrap().to_owned()
        })
        .collect();
    assert_eq!(
        kids,
        BTreeSet::from([me.id().to_string(), host.id().to_string()]),
        "{set}"
    );
}
