//! What re-signing an AWS request in the egress proxy costs (issue 17: the
//! SDK's `aws_auth` rule), against what the proxy does to every request
//! anyway, in the same run.
//!
//! cargo bench -p hearth-egress --bench sigv4
//!
//! - **Signing**: `sigv4::resign` of an S3 `GetObject` as boto3 sends it
//!   (6 signed headers), per request; the baseline is copying its header
//!   map, which forwarding does for every request.
//! - **Body hashing**: a body the guest did not hash itself
//!   (`x-amz-content-sha256` absent) is hashed before signing
//!   (`sigv4::payload_hash`, bodies up to 8 MiB); the baseline is one copy
//!   of the same bytes.

use std::hint::black_box;
use std::time::{Duration, Instant};

use hearth_egress::policy::AwsKeys;
use hearth_egress::sigv4;
use http::{HeaderMap, HeaderValue};

/// Runs `f` until `budget` has passed (at least `min` times); the mean.
fn per_call(budget: Duration, min: u32, mut f: impl FnMut()) -> Duration {
    for _ in 0..min.min(100) {
        f();
    }
    let start = Instant::now();
    let mut n = 0u32;
    while n < min || start.elapsed() < budget {
        f();
        n += 1;
    }
    start.elapsed() / n
}

fn s3_get() -> (HeaderMap, sigv4::GuestSignature) {
    let mut h = HeaderMap::new();
    for (k, v) in [
        ("host", "bucket.s3.us-east-1.amazonaws.com"),
        ("user-agent", "Boto3/1.35.0 md/Botocore#1.35.0 ua/2.0 os/linux"),
        ("accept-encoding", "identity"),
        ("x-amz-date", "20261202T080000Z"),
        ("x-amz-content-sha256", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"),
        ("x-amz-security-token", "guest-placeholder"),
        ("amz-sdk-invocation-id", "0b0f2a51-7c7e-4a0e-9d52-61a4a3b0a5a1"),
        ("amz-sdk-request", "attempt=1; max=3"),
        ("authorization", "AWS4-HMAC-SHA256 Credential=PLACEHOLDER/20261202/us-east-1/s3/aws4_request, SignedHeaders=amz-sdk-invocation-id;amz-sdk-request;host;x-amz-content-sha256;x-amz-date;x-amz-security-token, Signature=00"),
    ] {
        h.insert(k, HeaderValue::from_static(v));
    }
    let guest = h
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(sigv4::parse_authorization)
        .expect("a SigV4 Authorization");
    (h, guest)
}

fn main() {
    let keys = AwsKeys {
        access_key_id: "AKIAIOSFODNN7EXAMPLE".into(),
        secret_access_key: "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY".into(),
        session_token: None,
    };
    let (headers, guest) = s3_get();
    let path = "/reports/2026/12/summary.csv?versionId=3HL4kqtJlcpXroDTDmJ.rmSpXd3dIbrHY";
    let empty = sigv4::payload_hash(b"");
    let budget = Duration::from_millis(800);

    let copy = per_call(budget, 10_000, || {
        black_box(headers.clone());
    });
    let sign = per_call(budget, 10_000, || {
        let mut h = headers.clone();
        sigv4::resign("GET", path, &mut h, &guest, &empty, &keys).expect("signed");
        black_box(h);
    });
    println!("Signing an S3 GetObject (6 signed headers), per request:");
    println!("  copy of its headers (baseline)  {:>8.2} µs", us(copy));
    println!("  copy + sigv4::resign            {:>8.2} µs", us(sign));
    println!(
        "  resign alone                    {:>8.2} µs  ({:.1}x the copy; {:.0} requests/s on one core)",
        us(sign.saturating_sub(copy)),
        sign.as_secs_f64() / copy.as_secs_f64(),
        1.0 / sign.as_secs_f64()
    );
    println!();
    println!("Hashing a body the guest did not hash (x-amz-content-sha256 absent):");
    println!(
        "  {:>8} {:>14} {:>14} {:>8}",
        "body", "copy MiB/s", "SHA-256 MiB/s", "ratio"
    );
    for size in [64 << 10, 1 << 20, 8 << 20] {
        let body = vec![0x5au8; size];
        let copy = per_call(budget, 20, || {
            black_box(body.clone());
        });
        let hash = per_call(budget, 20, || {
            black_box(sigv4::payload_hash(&body));
        });
        let mib_s = |d: Duration| size as f64 / (1 << 20) as f64 / d.as_secs_f64();
        println!(
            "  {:>8} {:>14.0} {:>14.0} {:>7.1}x",
            format!("{} KiB", size >> 10),
            mib_s(copy),
            mib_s(hash),
            hash.as_secs_f64() / copy.as_secs_f64()
        );
    }
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}
