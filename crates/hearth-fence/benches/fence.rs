//! What a signed, fenced command costs next to an unsigned JSON header.
//!
//! `cargo bench -p hearth-fence` prints, per operation (median of rounds):
//! - unsigned: the same header serialized to JSON and base64url, and
//!   decoded and parsed back with its audience and action compared: what
//!   any JSON command header costs, without crypto;
//! - sign: `Signer::sign` (nonce from the OS, BLAKE3 of the body, JSON,
//!   Ed25519 signature, base64url);
//! - verify: `Verifier::verify` of a fresh command (decode, key lookup,
//!   strict Ed25519 verification, every check, nonce recorded);
//! - sign + verify: both, one after the other;
//!
//! and the ratio of each to its unsigned counterpart.

use std::hint::black_box;
use std::time::{Duration, Instant};

use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use base64::Engine;
use hearth_fence::{action, CommandHeader, KeyPair, KeyRing, Signer, Verifier, VerifierConfig};

const OPS: usize = 10_000;
const ROUNDS: usize = 7;
const HOST: &str = "host-0190f0c2";
const VM: &str = "0190f0c2-7a3e-7c4b-9d3e-2f6a1b8c9d0e";
const BODY: &[u8] = br#"{"signal":"TERM","grace_seconds":10}"#;

/// Median per-op time of `ROUNDS` rounds of `f`, which does `OPS` ops.
fn per_op(mut f: impl FnMut()) -> Duration {
    let mut times: Vec<Duration> = (0..ROUNDS)
        .map(|_| {
            let start = Instant::now();
            f();
            start.elapsed() / OPS as u32
        })
        .collect();
    times.sort();
    times[ROUNDS / 2]
}

fn verifier(key: &KeyPair) -> Verifier {
    let mut config = VerifierConfig::new(HOST);
    config.epoch = 3;
    config.nonce_capacity = OPS;
    Verifier::new(config, KeyRing::new().with(key.public(), None))
}

fn us(d: Duration) -> String {
    format!("{:8.2} µs", d.as_secs_f64() * 1e6)
}

fn main() {
    let key = KeyPair::from_seed(&[7; 32]);
    let signer = Signer::new(key.clone(), Duration::from_secs(60));
    let stop = action("POST", &format!("/v1/vms/{VM}/stop"));
    let sign = || {
        signer
            .sign(HOST, 3, Some(VM), 12, &stop, BODY)
            .expect("random nonce")
    };
    let header: CommandHeader = signer
        .header(HOST, 3, Some(VM), 12, &stop, BODY)
        .expect("random nonce");
    let token_len = sign().len();

    // Unsigned baseline: the same header as JSON in base64url, and back.
    let encode = |h: &CommandHeader| B64.encode(serde_json::to_vec(h).expect("serializes"));
    let decode = |t: &str| {
        let json = B64.decode(t).expect("base64url");
        let h: CommandHeader = serde_json::from_slice(&json).expect("json");
        assert!(h.audience == HOST && h.action == stop);
        h
    };
    let unsigned_encode = per_op(|| {
        for _ in 0..OPS {
            black_box(encode(black_box(&header)));
        }
    });
    let plain = encode(&header);
    let unsigned_decode = per_op(|| {
        for _ in 0..OPS {
            black_box(decode(black_box(&plain)));
        }
    });
    let unsigned_both = per_op(|| {
        for _ in 0..OPS {
            black_box(decode(&encode(black_box(&header))));
        }
    });

    let signed_sign = per_op(|| {
        for _ in 0..OPS {
            black_box(sign());
        }
    });
    // Each verification needs a fresh command: sign a round's worth first.
    let mut verify_times = Vec::new();
    for _ in 0..ROUNDS {
        let tokens: Vec<String> = (0..OPS).map(|_| sign()).collect();
        let v = verifier(&key);
        let now = hearth_fence::now_ms();
        let start = Instant::now();
        for t in &tokens {
            black_box(v.verify(t, &stop, BODY, now).expect("accepted"));
        }
        verify_times.push(start.elapsed() / OPS as u32);
    }
    verify_times.sort();
    let signed_verify = verify_times[ROUNDS / 2];
    let signed_both = {
        let mut v = verifier(&key);
        per_op(|| {
            v = verifier(&key);
            let now = hearth_fence::now_ms();
            for _ in 0..OPS {
                black_box(v.verify(&sign(), &stop, BODY, now).expect("accepted"));
            }
        })
    };

    println!(
        "hearth-fence: {token_len}-byte Hearth-Command header, {}-byte body; \
         median of {ROUNDS} rounds of {OPS} ops",
        BODY.len()
    );
    println!(
        "{:<16} {:>11} {:>11} {:>8}",
        "", "signed", "unsigned", "ratio"
    );
    for (name, signed, unsigned) in [
        ("sign / encode", signed_sign, unsigned_encode),
        ("verify / decode", signed_verify, unsigned_decode),
        ("round trip", signed_both, unsigned_both),
    ] {
        println!(
            "{name:<16} {} {} {:>7.1}x",
            us(signed),
            us(unsigned),
            signed.as_secs_f64() / unsigned.as_secs_f64()
        );
    }
    println!(
        "per core: {:.0} signs/s, {:.0} verifies/s",
        1.0 / signed_sign.as_secs_f64(),
        1.0 / signed_verify.as_secs_f64()
    );
}
