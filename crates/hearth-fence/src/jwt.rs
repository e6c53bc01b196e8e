//! Signed tokens for others to verify: EdDSA (Ed25519) JSON Web Tokens
//! (RFC 7519, RFC 8037) signed with a [`KeyPair`], and the public keys as a
//! JSON Web Key Set that verifiers fetch (`/.well-known/jwks.json`).
//!
//! LangSmith's SDK verifies what its sandboxes sign this way (its
//! `SandboxTokenVerifier`: proxy callbacks carry `X-LangSmith-Signature-JWT`),
//! so Hearth signs the same form. Only signing lives here: Hearth never has
//! to accept one of these tokens itself, except its own delegation tokens
//! ([`verify`]: a host vouching for a sandbox's request to the API).
//!
//! A JWT is signed with the same key that signs commands. The two cannot be
//! confused: a JWT's signing input is `base64url(header) "." base64url(claims)`,
//! printable ASCII, while a command's starts with
//! [`SIGNING_DOMAIN`](crate::SIGNING_DOMAIN), which holds a NUL byte.

use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use base64::Engine;
use serde::Serialize;

use crate::{KeyPair, PublicKey};

/// A compact JWS of `claims`: `{"alg":"EdDSA","typ":"JWT","kid":<key id>}`,
/// signed by `key`. `claims` must serialize to a JSON object.
pub fn sign<C: Serialize>(key: &KeyPair, claims: &C) -> Result<String, serde_json::Error> {
    let header = serde_json::json!({"alg": "EdDSA", "typ": "JWT", "kid": key.id().as_str()});
    let mut out = B64.encode(serde_json::to_vec(&header)?);
    out.push('.');
    B64.encode_string(serde_json::to_vec(claims)?, &mut out);
    let signature = key.sign(out.as_bytes());
    out.push('.');
    B64.encode_string(signature, &mut out);
    Ok(out)
}

/// Why a token was not accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JwtError {
    #[error("the token is not a compact JWS")]
    Malformed,
    #[error("the token is not signed with EdDSA")]
    Algorithm,
    #[error("the token's signature does not verify")]
    Signature,
    #[error("the token's claims are not JSON")]
    Claims,
}

/// A token's `kid` (to pick the key), read before anything is checked.
pub fn key_id(token: &str) -> Result<String, JwtError> {
    let header = token.split('.').next().ok_or(JwtError::Malformed)?;
    let header: serde_json::Value = B64
        .decode(header)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .ok_or(JwtError::Malformed)?;
    if header["alg"] != "EdDSA" {
        return Err(JwtError::Algorithm);
    }
    header["kid"]
        .as_str()
        .map(str::to_owned)
        .ok_or(JwtError::Malformed)
}

/// The claims of `token` once its EdDSA signature verifies (strictly) with
/// `key`. The caller checks what they say (audience, expiry, subject).
pub fn verify<C: serde::de::DeserializeOwned>(token: &str, key: &PublicKey) -> Result<C, JwtError> {
    if token.len() > 8192 {
        return Err(JwtError::Malformed);
    }
    let mut parts = token.split('.');
    let (Some(header), Some(claims), Some(signature), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(JwtError::Malformed);
    };
    key_id(token)?;
    let signature: [u8; 64] = B64
        .decode(signature)
        .ok()
        .and_then(|s| s.try_into().ok())
        .ok_or(JwtError::Malformed)?;
    let input = &token[..header.len() + 1 + claims.len()];
    key.verifying_key()
        .verify_strict(
            input.as_bytes(),
            &ed25519_dalek::Signature::from_bytes(&signature),
        )
        .map_err(|_| JwtError::Signature)?;
    let claims = B64.decode(claims).map_err(|_| JwtError::Malformed)?;
    serde_json::from_slice(&claims).map_err(|_| JwtError::Claims)
}

/// One public key as a JWK (RFC 8037 §2): an `OKP` key on `Ed25519`, for
/// signatures (`use: sig`, `alg: EdDSA`), named by its key id.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Jwk {
    pub kty: &'static str,
    pub crv: &'static str,
    pub x: String,
    pub kid: String,
    #[serde(rename = "use")]
    pub use_: &'static str,
    pub alg: &'static str,
}

impl Jwk {
    pub fn of(key: &PublicKey) -> Self {
        Self {
            kty: "OKP",
            crv: "Ed25519",
            x: B64.encode(key.bytes()),
            kid: key.id().to_string(),
            use_: "sig",
            alg: "EdDSA",
        }
    }
}

/// A JWK Set (RFC 7517 §5).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct JwkSet {
    pub keys: Vec<Jwk>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use ed25519_dalek::{Signature, Verifier as _, VerifyingKey};

    #[test]
    fn a_token_verifies_with_the_key_its_kid_names_and_nothing_else() {
        let key = KeyPair::from_seed(&[7; 32]);
        let token = sign(&key, &serde_json::json!({"sub": "s", "exp": 10})).unwrap();
        let parts: Vec<&str> = token.split('.').collect();
        assert_eq!(parts.len(), 3);
        let header: serde_json::Value =
            serde_json::from_slice(&B64.decode(parts[0]).unwrap()).unwrap();
        assert_eq!(header["alg"], "EdDSA");
        assert_eq!(header["kid"], key.id().as_str());
        let claims: serde_json::Value =
            serde_json::from_slice(&B64.decode(parts[1]).unwrap()).unwrap();
        assert_eq!(claims, serde_json::json!({"sub": "s", "exp": 10}));

        let jwk = Jwk::of(&key.public());
        assert_eq!(jwk.kid, header["kid"]);
        let x: [u8; 32] = B64.decode(&jwk.x).unwrap().try_into().unwrap();
        let vk = VerifyingKey::from_bytes(&x).unwrap();
        let sig = Signature::from_slice(&B64.decode(parts[2]).unwrap()).unwrap();
        let input = format!("{}.{}", parts[0], parts[1]);
        vk.verify(input.as_bytes(), &sig).unwrap();
        // Any change to what was signed fails.
        let tampered = format!("{}.{}", parts[0], B64.encode(br#"{"sub":"t","exp":10}"#));
        assert!(vk.verify(tampered.as_bytes(), &sig).is_err());
        // Another key does not verify it.
        let other = Jwk::of(&KeyPair::from_seed(&[8; 32]).public());
        let x: [u8; 32] = B64.decode(&other.x).unwrap().try_into().unwrap();
        let vk = VerifyingKey::from_bytes(&x).unwrap();
        assert!(vk.verify(input.as_bytes(), &sig).is_err());
    }

    #[test]
    fn verify_accepts_its_own_tokens_and_nothing_else() {
        let key = KeyPair::from_seed(&[7; 32]);
        let token = sign(&key, &serde_json::json!({"sub": "s"})).unwrap();
        assert_eq!(key_id(&token).unwrap(), key.id().as_str());
        let claims: serde_json::Value = verify(&token, &key.public()).unwrap();
        assert_eq!(claims["sub"], "s");
        let other = KeyPair::from_seed(&[8; 32]).public();
        assert_eq!(
            verify::<serde_json::Value>(&token, &other),
            Err(JwtError::Signature)
        );
        let parts: Vec<&str> = token.split('.').collect();
        let forged = format!(
            "{}.{}.{}",
            parts[0],
            B64.encode(br#"{"sub":"t"}"#),
            parts[2]
        );
        assert_eq!(
            verify::<serde_json::Value>(&forged, &key.public()),
            Err(JwtError::Signature)
        );
        let none = format!("{}.{}.", B64.encode(br#"{"alg":"none"}"#), parts[1]);
        assert_eq!(
            verify::<serde_json::Value>(&none, &key.public()),
            Err(JwtError::Algorithm)
        );
        let hs = format!(
            "{}.{}.{}",
            B64.encode(br#"{"alg":"HS256","kid":"x"}"#),
            parts[1],
            parts[2]
        );
        assert_eq!(
            verify::<serde_json::Value>(&hs, &key.public()),
            Err(JwtError::Algorithm)
        );
        assert!(verify::<serde_json::Value>("a.b", &key.public()).is_err());
        assert!(verify::<serde_json::Value>(&format!("{token}.x"), &key.public()).is_err());
    }

    #[test]
    fn a_jwk_set_has_the_rfc_8037_form() {
        let key = KeyPair::from_seed(&[1; 32]);
        let set = JwkSet {
            keys: vec![Jwk::of(&key.public())],
        };
        let v = serde_json::to_value(&set).unwrap();
        let k = &v["keys"][0];
        assert_eq!(k["kty"], "OKP");
        assert_eq!(k["crv"], "Ed25519");
        assert_eq!(k["use"], "sig");
        assert_eq!(k["alg"], "EdDSA");
        assert_eq!(k["kid"], key.id().as_str());
        assert_eq!(k["x"].as_str().unwrap().len(), 43);
    }
}
