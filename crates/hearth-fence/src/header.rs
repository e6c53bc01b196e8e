//! The signed command header and its wire form,
//! `base64url(header JSON) "." base64url(signature)`.

use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use base64::Engine;

use crate::key::{KeyId, KeyPair};
use crate::refusal::Refusal;

/// The only header version this crate writes and accepts.
pub const VERSION: u32 = 1;

/// The longest token [`Verifier::verify`](crate::Verifier::verify) reads;
/// a longer one is refused `malformed` before any decoding. A real header
/// is a few hundred bytes.
pub const MAX_TOKEN_LEN: usize = 4096;

/// Prepended to the header bytes before signing, so a signature over a
/// command can never be taken for a signature over anything else the same
/// key might sign (and the reverse).
pub const SIGNING_DOMAIN: &[u8] = b"hearth-command-v1\0";

/// Bytes of randomness in a nonce.
pub const NONCE_LEN: usize = 16;

/// Everything a command's signature covers. The verifier checks each field
/// against what it knows (its own identity and epoch, the request actually
/// received, its clock, the nonces and generations it has seen).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CommandHeader {
    /// Header version, [`VERSION`].
    pub v: u32,
    /// The key that signed it.
    pub key_id: KeyId,
    /// Who must accept it: a host id, or [`CONTROL_AUDIENCE`](crate::CONTROL_AUDIENCE).
    pub audience: String,
    /// The audience's lease epoch when the command was minted; a host that
    /// re-registered has a new epoch and refuses commands for its old one.
    pub audience_epoch: u64,
    /// The VM the command acts on; `None` for host-wide commands.
    pub subject: Option<String>,
    /// The subject's placement generation (0 when there is no subject).
    pub generation: u64,
    /// Method and path of the request, see [`action`](crate::action).
    pub action: String,
    /// BLAKE3 (hex) of the request body, see [`body_hash`](crate::body_hash).
    pub body: String,
    /// 16 random bytes, base64url: what makes the command single-use.
    pub nonce: String,
    /// When the signer minted it (ms since the Unix epoch).
    pub issued_at_ms: u64,
    /// When it stops being valid (ms since the Unix epoch).
    pub expires_at_ms: u64,
}

impl CommandHeader {
    /// Serializes and signs the header: the `Hearth-Command` header value.
    /// The signature covers [`SIGNING_DOMAIN`] followed by exactly the JSON bytes
    /// that travel, so the verifier never re-serializes anything.
    pub fn seal(&self, key: &KeyPair) -> String {
        let json = serde_json::to_vec(self).unwrap_or_else(|_| {
            // Strings and integers only: serde_json cannot fail on it.
            unreachable!("a CommandHeader always serializes")
        });
        let signature = key.sign(&signed_message(&json));
        let mut out = B64.encode(&json);
        out.push('.');
        B64.encode_string(signature, &mut out);
        out
    }
}

pub(crate) fn signed_message(json: &[u8]) -> Vec<u8> {
    let mut msg = Vec::with_capacity(SIGNING_DOMAIN.len() + json.len());
    msg.extend_from_slice(SIGNING_DOMAIN);
    msg.extend_from_slice(json);
    msg
}

/// A token split and decoded, its signature not yet checked.
pub(crate) struct Decoded {
    pub header: CommandHeader,
    pub json: Vec<u8>,
    pub signature: [u8; 64],
    pub nonce: [u8; NONCE_LEN],
}

/// Just the version, to tell a header of another version (refused
/// `unsupported_version`) from a broken one (`malformed`).
#[derive(serde::Deserialize)]
struct Probe {
    v: u64,
}

/// Splits and decodes a token, bounding everything; never panics.
pub(crate) fn decode(token: &str) -> Result<Decoded, Refusal> {
    let malformed = |what| Refusal::Malformed { what };
    if token.len() > MAX_TOKEN_LEN {
        return Err(malformed("token longer than 4 KiB"));
    }
    let (head, sig) = token
        .split_once('.')
        .ok_or(malformed("not two dot-separated parts"))?;
    // Strict: no padding, no non-canonical trailing bits, so one header
    // has exactly one encoding.
    let json = B64
        .decode(head)
        .map_err(|_| malformed("header is not base64url"))?;
    let sig = B64
        .decode(sig)
        .map_err(|_| malformed("signature is not base64url"))?;
    let signature: [u8; 64] = sig
        .as_slice()
        .try_into()
        .map_err(|_| malformed("signature is not 64 bytes"))?;
    let header: CommandHeader = match serde_json::from_slice(&json) {
        Ok(h) => h,
        Err(_) => {
            return Err(match serde_json::from_slice::<Probe>(&json) {
                Ok(p) if p.v != u64::from(VERSION) => Refusal::UnsupportedVersion { version: p.v },
                _ => malformed("header is not a v1 command header"),
            })
        }
    };
    if header.v != VERSION {
        return Err(Refusal::UnsupportedVersion {
            version: header.v.into(),
        });
    }
    let nonce = B64
        .decode(&header.nonce)
        .ok()
        .and_then(|n| <[u8; NONCE_LEN]>::try_from(n.as_slice()).ok())
        .ok_or(malformed("nonce is not 16 bytes of base64url"))?;
    Ok(Decoded {
        header,
        json,
        signature,
        nonce,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(key: &KeyPair) -> CommandHeader {
        CommandHeader {
            v: VERSION,
            key_id: key.id().clone(),
            audience: "host-a".into(),
            audience_epoch: 1,
            subject: Some("vm-1".into()),
            generation: 2,
            action: "POST /v1/vms/vm-1/stop".into(),
            body: crate::body_hash(b""),
            nonce: B64.encode([3u8; NONCE_LEN]),
            issued_at_ms: 10,
            expires_at_ms: 20,
        }
    }

    fn token_of(json: &str, key: &KeyPair) -> String {
        let sig = key.sign(&signed_message(json.as_bytes()));
        format!("{}.{}", B64.encode(json), B64.encode(sig))
    }

    #[test]
    fn seal_and_decode_round_trip_over_the_exact_bytes() {
        let key = KeyPair::from_seed(&[1; 32]);
        let h = header(&key);
        let token = h.seal(&key);
        let d = decode(&token).unwrap();
        assert_eq!(d.header, h);
        assert_eq!(d.nonce, [3u8; NONCE_LEN]);
        assert_eq!(d.json, serde_json::to_vec(&h).unwrap());
        // The signature is over the domain-separated bytes, not the bare JSON.
        let vk = key.public();
        let sig = ed25519_dalek::Signature::from_bytes(&d.signature);
        assert!(vk.verifying_key().verify_strict(&d.json, &sig).is_err());
        assert!(vk
            .verifying_key()
            .verify_strict(&signed_message(&d.json), &sig)
            .is_ok());
    }

    #[test]
    fn other_versions_are_unsupported_not_malformed() {
        let key = KeyPair::from_seed(&[1; 32]);
        // A future version with fields v1 does not know.
        let v2 = r#"{"v":2,"key_id":"0123456789abcdef","scope":["x"]}"#;
        assert_eq!(
            decode(&token_of(v2, &key)).err(),
            Some(Refusal::UnsupportedVersion { version: 2 })
        );
        // v1 with an unknown field, a duplicate field, or a missing one.
        let json = serde_json::to_string(&header(&key)).unwrap();
        for bad in [
            json.replacen('{', r#"{"extra":1,"#, 1),
            json.replacen('{', r#"{"v":1,"#, 1),
            json.replacen(r#""generation":2,"#, "", 1),
        ] {
            assert!(
                matches!(
                    decode(&token_of(&bad, &key)),
                    Err(Refusal::Malformed { .. })
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn bad_nonces_and_signature_lengths_are_malformed() {
        let key = KeyPair::from_seed(&[1; 32]);
        for nonce in ["", "AAAA", "not base64!", &B64.encode([0u8; 17])] {
            let mut h = header(&key);
            h.nonce = nonce.to_string();
            assert!(matches!(
                decode(&h.seal(&key)),
                Err(Refusal::Malformed { .. })
            ));
        }
        let token = header(&key).seal(&key);
        let (head, _) = token.split_once('.').unwrap();
        for sig in [B64.encode([0u8; 63]), B64.encode([0u8; 65]), "AA==".into()] {
            assert!(matches!(
                decode(&format!("{head}.{sig}")),
                Err(Refusal::Malformed { .. })
            ));
        }
    }
}
