//! Every way a command can be wrong is refused, each with its own reason.

use std::collections::BTreeSet;
use std::time::Duration;

use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use base64::Engine;
use hearth_fence::{
    action, CommandHeader, KeyPair, KeyRing, Refusal, Signer, Verified, Verifier, VerifierConfig,
    MAX_TOKEN_LEN,
};

const HOST: &str = "host-a";
const EPOCH: u64 = 4;
const VM: &str = "vm-1";
const GEN: u64 = 7;
const BODY: &[u8] = br#"{"signal":"TERM"}"#;
const SKEW_MS: u64 = 30_000;
const TTL: Duration = Duration::from_secs(60);

fn stop() -> String {
    action("POST", "/v1/vms/vm-1/stop")
}

struct World {
    signer: Signer,
    old: Signer,
    verifier: Verifier,
}

fn world() -> World {
    world_with(|_| {})
}

fn world_with(tune: impl FnOnce(&mut VerifierConfig)) -> World {
    let signer = Signer::new(KeyPair::from_seed(&[1; 32]), TTL);
    let old = Signer::new(KeyPair::from_seed(&[2; 32]), TTL);
    let mut config = VerifierConfig::new(HOST);
    config.epoch = EPOCH;
    tune(&mut config);
    let ring = KeyRing::new()
        .with(signer.key().public(), None)
        .with(old.key().public(), None);
    let verifier = Verifier::new(config, ring);
    verifier.hold(VM, GEN);
    World {
        signer,
        old,
        verifier,
    }
}

/// A valid header for the stop command (fresh nonce each call).
fn header(signer: &Signer) -> CommandHeader {
    signer
        .header(HOST, EPOCH, Some(VM), GEN, &stop(), BODY)
        .unwrap()
}

fn verify(w: &World, token: &str, now: u64) -> Result<Verified, Refusal> {
    w.verifier.verify(token, &stop(), BODY, now)
}

fn reason(r: Result<Verified, Refusal>) -> &'static str {
    match r {
        Ok(v) => panic!("accepted: {v:?}"),
        Err(refusal) => {
            // Display: lowercase, no trailing period.
            let text = refusal.to_string();
            assert!(!text.ends_with('.'), "{text}");
            assert!(text.starts_with(|c: char| c.is_ascii_lowercase()), "{text}");
            refusal.reason()
        }
    }
}

#[test]
fn refusal_matrix_every_case_refused_with_its_own_reason() {
    let w = world();
    let h = header(&w.signer);
    let now = h.issued_at_ms;
    let seal = |f: &dyn Fn(&mut CommandHeader)| {
        let mut h = header(&w.signer);
        h.issued_at_ms = now;
        h.expires_at_ms = now + 60_000;
        f(&mut h);
        w.signer.seal(&h)
    };

    let valid = w.signer.seal(&h);
    let (head, sig) = valid.split_once('.').unwrap();

    // Tampering first: none of it may spend the valid command's nonce.
    let mut tampered_header = BTreeSet::new();
    for i in 0..head.len() {
        for replacement in [None, Some(b'A'), Some(b'_'), Some(b'.')] {
            let mut bytes = head.as_bytes().to_vec();
            let new = replacement.unwrap_or(bytes[i] ^ 1);
            if new == bytes[i] {
                continue;
            }
            bytes[i] = new;
            let token = format!("{}.{sig}", String::from_utf8(bytes).unwrap());
            tampered_header.insert(reason(verify(&w, &token, now)));
        }
    }
    // A changed base64 character changes the bytes (strict decoding) or
    // breaks the encoding; a changed header byte breaks the signature,
    // unless it already made the version or key id unknown.
    assert!(tampered_header.is_subset(&BTreeSet::from([
        "malformed",
        "unsupported_version",
        "unknown_key",
        "bad_signature"
    ])));
    assert!(tampered_header.contains("bad_signature"));

    let mut tampered_sig = BTreeSet::new();
    for i in 0..sig.len() {
        let mut bytes = sig.as_bytes().to_vec();
        bytes[i] ^= 1;
        let token = format!("{head}.{}", String::from_utf8(bytes).unwrap());
        tampered_sig.insert(reason(verify(&w, &token, now)));
    }
    assert!(tampered_sig.is_subset(&BTreeSet::from(["malformed", "bad_signature"])));
    assert!(tampered_sig.contains("bad_signature"));

    // The valid command is accepted once.
    let ok = verify(&w, &valid, now).unwrap();
    assert_eq!(ok.subject.as_deref(), Some(VM));
    assert_eq!(ok.generation, GEN);
    assert_eq!(&ok.key_id, w.signer.key_id());

    let unknown = Signer::new(KeyPair::from_seed(&[9; 32]), TTL);
    let mut unknown_header = header(&unknown);
    unknown_header.issued_at_ms = now;
    unknown_header.expires_at_ms = now + 60_000;

    let retired = {
        let mut ring = (*w.verifier.keys()).clone();
        ring.retire(w.old.key_id(), now - 1);
        let v = Verifier::new(
            {
                let mut c = VerifierConfig::new(HOST);
                c.epoch = EPOCH;
                c
            },
            ring,
        );
        let mut h = header(&w.old);
        h.issued_at_ms = now;
        h.expires_at_ms = now + 60_000;
        v.verify(&w.old.seal(&h), &stop(), BODY, now)
    };

    let cases: Vec<(&str, Result<Verified, Refusal>, &str)> = vec![
        ("replayed", verify(&w, &valid, now), "replayed"),
        (
            "tampered signature",
            {
                // Another valid-looking signature: the header signed by
                // someone else.
                let other = unknown.seal(&h);
                let (_, other_sig) = other.split_once('.').unwrap();
                verify(&w, &format!("{head}.{other_sig}"), now)
            },
            "bad_signature",
        ),
        ("malformed", verify(&w, "not a token", now), "malformed"),
        (
            "unsupported version",
            verify(&w, &seal(&|h| h.v = 2), now),
            "unsupported_version",
        ),
        (
            "expired",
            verify(&w, &seal(&|_| {}), now + 60_000 + SKEW_MS + 1),
            "expired",
        ),
        (
            "not yet valid",
            verify(
                &w,
                &seal(&|h| {
                    h.issued_at_ms = now + SKEW_MS + 1;
                    h.expires_at_ms = now + SKEW_MS + 60_000;
                }),
                now,
            ),
            "not_yet_valid",
        ),
        (
            "lifetime too long",
            verify(&w, &seal(&|h| h.expires_at_ms = now + 300_001), now),
            "lifetime_too_long",
        ),
        (
            "wrong host",
            verify(&w, &seal(&|h| h.audience = "host-b".into()), now),
            "wrong_audience",
        ),
        (
            "stale epoch",
            verify(&w, &seal(&|h| h.audience_epoch = EPOCH - 1), now),
            "stale_epoch",
        ),
        (
            "wrong action",
            w.verifier.verify(
                &seal(&|_| {}),
                &action("POST", "/v1/vms/vm-1/delete"),
                BODY,
                now,
            ),
            "wrong_action",
        ),
        (
            "body mismatch",
            w.verifier
                .verify(&seal(&|_| {}), &stop(), br#"{"signal":"KILL"}"#, now),
            "body_mismatch",
        ),
        (
            "unknown key",
            verify(&w, &unknown.seal(&unknown_header), now),
            "unknown_key",
        ),
        ("retired key", retired, "retired_key"),
        (
            "stale generation",
            verify(&w, &seal(&|h| h.generation = GEN - 1), now),
            "stale_generation",
        ),
    ];

    let mut seen = BTreeSet::new();
    for (name, result, expected) in cases {
        let got = reason(result);
        assert_eq!(got, expected, "case {name}");
        assert!(seen.insert(got), "case {name}: reason {got} not distinct");
        assert!(Refusal::REASONS.contains(&got));
    }
    // The refusals changed nothing: a fresh command is still accepted, and
    // only the one valid command's nonce is spent.
    assert_eq!(w.verifier.nonces_held(), 1);
    assert_eq!(w.verifier.held(VM), Some(GEN));
    verify(&w, &seal(&|_| {}), now).unwrap();
}

#[test]
fn reasons_are_distinct() {
    let set: BTreeSet<_> = Refusal::REASONS.iter().collect();
    assert_eq!(set.len(), Refusal::REASONS.len());
}

#[test]
fn generation_equal_accepted_newer_advances_older_refused() {
    let w = world();
    let now = hearth_fence::now_ms();
    let sign = |generation| {
        w.signer
            .sign(HOST, EPOCH, Some(VM), generation, &stop(), BODY)
            .unwrap()
    };
    verify(&w, &sign(GEN), now).unwrap();
    // A newer placement's command advances the held generation...
    verify(&w, &sign(GEN + 2), now).unwrap();
    assert_eq!(w.verifier.held(VM), Some(GEN + 2));
    // ...which fences the older placement's commands from then on.
    assert_eq!(reason(verify(&w, &sign(GEN), now)), "stale_generation");
    // A refused newer command does not advance it.
    let wrong_body = sign(GEN + 5);
    assert_eq!(
        reason(w.verifier.verify(&wrong_body, &stop(), b"other", now)),
        "body_mismatch"
    );
    assert_eq!(w.verifier.held(VM), Some(GEN + 2));
    // hold never lowers; release forgets.
    assert_eq!(w.verifier.hold(VM, 1), GEN + 2);
    assert_eq!(w.verifier.release(VM), Some(GEN + 2));
    assert_eq!(w.verifier.held(VM), None);
    verify(&w, &sign(1), now).unwrap();
    assert_eq!(w.verifier.held(VM), Some(1));
}

#[test]
fn host_wide_commands_and_epoch_changes() {
    let w = world();
    let now = hearth_fence::now_ms();
    let gc = action("POST", "/v1/gc");
    let token = w.signer.sign(HOST, EPOCH, None, 0, &gc, b"").unwrap();
    let ok = w.verifier.verify(&token, &gc, b"", now).unwrap();
    assert_eq!((ok.subject, ok.generation), (None, 0));
    // A host-wide command with a generation is nonsense.
    let odd = w.signer.sign(HOST, EPOCH, None, 3, &gc, b"").unwrap();
    assert_eq!(reason(w.verifier.verify(&odd, &gc, b"", now)), "malformed");

    // The host lost its lease and re-registered: epoch 5. Commands for 4
    // are refused, and so are commands for an epoch it does not know yet.
    let for_old = w.signer.sign(HOST, EPOCH, None, 0, &gc, b"").unwrap();
    let for_next = w.signer.sign(HOST, EPOCH + 1, None, 0, &gc, b"").unwrap();
    let for_later = w.signer.sign(HOST, EPOCH + 2, None, 0, &gc, b"").unwrap();
    w.verifier.set_epoch(EPOCH + 1);
    assert_eq!(w.verifier.epoch(), EPOCH + 1);
    assert_eq!(
        reason(w.verifier.verify(&for_old, &gc, b"", now)),
        "stale_epoch"
    );
    assert_eq!(
        reason(w.verifier.verify(&for_later, &gc, b"", now)),
        "stale_epoch"
    );
    w.verifier.verify(&for_next, &gc, b"", now).unwrap();
}

#[test]
fn rotation_old_and_new_keys_until_the_old_is_retired() {
    let w = world();
    let now = hearth_fence::now_ms();
    let sign = |s: &Signer| s.sign(HOST, EPOCH, Some(VM), GEN, &stop(), BODY).unwrap();
    verify(&w, &sign(&w.old), now).unwrap();
    verify(&w, &sign(&w.signer), now).unwrap();

    // Retire the old key as the control plane's refresh would: a new ring.
    let mut ring = (*w.verifier.keys()).clone();
    assert!(ring.retire(w.old.key_id(), now - 1));
    w.verifier.set_keys(ring);
    let refused = w.verifier.verify(&sign(&w.old), &stop(), BODY, now);
    assert!(
        matches!(&refused, Err(Refusal::RetiredKey { key_id, .. }) if key_id == w.old.key_id())
    );
    assert_eq!(reason(refused), "retired_key");
    verify(&w, &sign(&w.signer), now).unwrap();

    // A key retired in the future is still accepted until then.
    let mut ring = (*w.verifier.keys()).clone();
    ring.retire(w.old.key_id(), now + 1_000);
    w.verifier.set_keys(ring);
    verify(&w, &sign(&w.old), now).unwrap();
    assert_eq!(
        reason(verify(&w, &sign(&w.old), now + 1_001)),
        "retired_key"
    );

    // Removed altogether: unknown.
    let mut ring = (*w.verifier.keys()).clone();
    assert!(ring.remove(w.old.key_id()).is_some());
    w.verifier.set_keys(ring);
    assert_eq!(reason(verify(&w, &sign(&w.old), now)), "unknown_key");
}

#[test]
fn nonce_cache_bound_fails_closed_then_pruning_frees_room() {
    let w = world_with(|c| c.nonce_capacity = 3);
    let at = |issued: u64| {
        let mut h = header(&w.signer);
        h.issued_at_ms = issued;
        h.expires_at_ms = issued + 60_000;
        w.signer.seal(&h)
    };
    let t0 = 1_000_000;
    for _ in 0..3 {
        verify(&w, &at(t0), t0).unwrap();
    }
    assert_eq!(w.verifier.nonces_held(), 3);
    let full = at(t0 + 30_000);
    assert_eq!(reason(verify(&w, &full, t0 + 30_000)), "nonce_cache_full");
    // Once the first three have expired (and the skew passed), pruning
    // frees their room; the refused command was not spent, so it is
    // accepted now, once.
    let later = t0 + 60_000 + SKEW_MS + 1;
    verify(&w, &full, later).unwrap();
    assert_eq!(w.verifier.nonces_held(), 1);
    assert_eq!(reason(verify(&w, &full, later)), "replayed");
    verify(&w, &at(later), later).unwrap();
    verify(&w, &at(later), later).unwrap();
    assert_eq!(reason(verify(&w, &at(later), later)), "nonce_cache_full");
}

#[test]
fn clock_going_back_cannot_resurrect_a_forgotten_nonce() {
    let w = world();
    let t0 = 1_000_000;
    let mut h = header(&w.signer);
    h.issued_at_ms = t0;
    h.expires_at_ms = t0 + 60_000;
    let token = w.signer.seal(&h);
    verify(&w, &token, t0).unwrap();
    // Much later another command prunes the first one's nonce...
    let later = t0 + 60_000 + SKEW_MS + 1;
    let mut h2 = header(&w.signer);
    h2.issued_at_ms = later;
    h2.expires_at_ms = later + 60_000;
    verify(&w, &w.signer.seal(&h2), later).unwrap();
    // ...then the clock jumps back into the first command's window.
    assert_eq!(reason(verify(&w, &token, t0 + 1)), "expired");
}

/// xorshift64*: deterministic, no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn bytes(&mut self, max: usize) -> Vec<u8> {
        let len = self.below(max + 1);
        (0..len).map(|_| self.next() as u8).collect()
    }
}

#[test]
fn random_input_never_panics_and_is_never_accepted() {
    let w = world();
    let now = hearth_fence::now_ms();
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let valid_json = serde_json::to_vec(&header(&w.signer)).unwrap();
    for _ in 0..3_000 {
        // Random bytes.
        let raw = rng.bytes(200);
        let text = String::from_utf8_lossy(&raw);
        assert!(verify(&w, &text, now).is_err());
        // Random base64 pairs.
        let token = format!(
            "{}.{}",
            B64.encode(rng.bytes(600)),
            B64.encode(rng.bytes(80))
        );
        assert!(verify(&w, &token, now).is_err());
        // A real header with random bytes changed, and a 64-byte signature.
        let mut json = valid_json.clone();
        for _ in 0..=rng.below(4) {
            let i = rng.below(json.len());
            json[i] = rng.next() as u8;
        }
        let token = format!("{}.{}", B64.encode(&json), B64.encode([0u8; 64]));
        assert!(verify(&w, &token, now).is_err());
    }
    // Oversized, and edge shapes.
    let big = "A".repeat(MAX_TOKEN_LEN + 1);
    assert_eq!(reason(verify(&w, &big, now)), "malformed");
    for odd in ["", ".", "..", "a.b.c", "=.=", "\u{0}.\u{0}", "é.é"] {
        assert_eq!(reason(verify(&w, odd, now)), "malformed", "{odd:?}");
    }
    assert_eq!(w.verifier.nonces_held(), 0);
}

#[test]
fn signed_but_mutated_headers_never_panic() {
    // Past the signature check: the header is mutated and then properly
    // signed, so every later check sees odd values. Some mutations are
    // still valid commands (a different nonce); only panics matter here.
    let w = world();
    let now = hearth_fence::now_ms();
    let mut rng = Rng(42);
    let valid_json = serde_json::to_vec(&header(&w.signer)).unwrap();
    for _ in 0..2_000 {
        let mut json = valid_json.clone();
        for _ in 0..=rng.below(3) {
            let i = rng.below(json.len());
            json[i] = b"0123456789-{}[]\":,.eE "[rng.below(22)];
        }
        if let Ok(h) = serde_json::from_slice::<CommandHeader>(&json) {
            let _ = verify(&w, &w.signer.seal(&h), now);
        }
    }
    for (issued, expires) in [(0, u64::MAX), (u64::MAX, u64::MAX), (u64::MAX, 0), (5, 4)] {
        let mut h = header(&w.signer);
        h.issued_at_ms = issued;
        h.expires_at_ms = expires;
        assert!(verify(&w, &w.signer.seal(&h), now).is_err());
    }
}

#[test]
fn racing_copies_of_one_command_are_accepted_once() {
    let w = world();
    let now = hearth_fence::now_ms();
    for _ in 0..20 {
        let token = w
            .signer
            .sign(HOST, EPOCH, Some(VM), GEN, &stop(), BODY)
            .unwrap();
        let accepted = std::thread::scope(|s| {
            let racers: Vec<_> = (0..4)
                .map(|_| s.spawn(|| verify(&w, &token, now).is_ok()))
                .collect();
            racers
                .into_iter()
                .map(|r| r.join().unwrap())
                .filter(|ok| *ok)
                .count()
        });
        assert_eq!(accepted, 1);
    }
}
