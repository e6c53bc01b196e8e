//! The per-deployment CA, the leaf certificates it signs for intercepted
//! names, and the TLS configurations on both sides.

use std::collections::HashMap;
use std::fmt;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use hearth_fence::keyfile;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

/// Leaf certificates kept in memory; the cache is emptied when full.
const MAX_LEAVES: usize = 4096;
const CA_NAME: &str = "Hearth egress proxy CA";

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("read or write {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("key or certificate in {dir} is unusable: {message}")]
    BadCa { dir: PathBuf, message: String },
    #[error(transparent)]
    KeyFile(#[from] keyfile::KeyFileError),
    #[error("generate certificate: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("no certificate in origin CA file {0}")]
    NoOriginCa(PathBuf),
    #[error("build TLS configuration")]
    Config(#[from] rustls::Error),
}

pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// What the CA's key file is called in errors, and how large it may be.
const CA_KEY_FILE: &str = "proxy CA key file";
const CA_KEY_SIZE: keyfile::Size = keyfile::Size::AtMost(64 * 1024);

/// The CA that signs leaf certificates for intercepted names.
pub struct Ca {
    pem: String,
    issuer: Issuer<'static, KeyPair>,
    leaves: Mutex<HashMap<String, Arc<CertifiedKey>>>,
    provider: Arc<CryptoProvider>,
}

impl fmt::Debug for Ca {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ca").finish_non_exhaustive()
    }
}

fn ca_params(name: &str) -> CertificateParams {
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, name);
    dn.push(DnType::OrganizationName, "Hearth");
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    params.not_before = rcgen::date_time_ymd(2024, 1, 1);
    params.not_after = rcgen::date_time_ymd(2044, 1, 1);
    params
}

impl Ca {
    /// Loads `ca.pem` and `ca.key` from `dir`, or creates them (both 0600:
    /// the certificate is public, guests get it, but like everything Hearth
    /// keeps it is readable only by Hearth's user) so guests keep trusting
    /// the same CA across restarts.
    pub fn load_or_create(dir: &Path) -> Result<Ca, TlsError> {
        Ca::load_or_create_named(dir, CA_NAME)
    }

    /// [`Ca::load_or_create`] of a CA named `name` (its common name).
    pub fn load_or_create_named(dir: &Path, name: &str) -> Result<Ca, TlsError> {
        let cert_path = dir.join("ca.pem");
        let key_path = dir.join("ca.key");
        let io = |path: &Path| {
            let path = path.to_owned();
            move |source| TlsError::Io { path, source }
        };
        let bad = |message: String| TlsError::BadCa {
            dir: dir.to_owned(),
            message,
        };
        let (pem, key) = if key_path.exists() {
            let key_pem = keyfile::read(CA_KEY_FILE, &key_path, CA_KEY_SIZE)?;
            let key_pem =
                std::str::from_utf8(&key_pem).map_err(|_| bad("ca.key is not PEM text".into()))?;
            let pem = fs::read_to_string(&cert_path).map_err(io(&cert_path))?;
            let key = KeyPair::from_pem(key_pem).map_err(|e| bad(e.to_string()))?;
            (pem, key)
        } else {
            fs::create_dir_all(dir).map_err(io(dir))?;
            let key = KeyPair::generate()?;
            let cert = ca_params(name).self_signed(&key)?;
            keyfile::write_new(CA_KEY_FILE, &key_path, key.serialize_pem().as_bytes())?;
            let pem = cert.pem();
            fs::write(&cert_path, &pem).map_err(io(&cert_path))?;
            fs::set_permissions(&cert_path, fs::Permissions::from_mode(0o600))
                .map_err(io(&cert_path))?;
            (pem, key)
        };
        // The issuer is identified by its name and key; rebuilding the same
        // parameters signs leaves that chain to the stored certificate.
        let issuer = Issuer::new(ca_params(name), key);
        Ok(Ca {
            pem,
            issuer,
            leaves: Mutex::new(HashMap::new()),
            provider: provider(),
        })
    }

    pub fn pem(&self) -> &str {
        &self.pem
    }

    /// The (cached) leaf certificate for `name`.
    pub fn leaf(&self, name: &str) -> Result<Arc<CertifiedKey>, TlsError> {
        let name = name.to_ascii_lowercase();
        if let Some(k) = self.lock().get(&name) {
            return Ok(k.clone());
        }
        let key = KeyPair::generate()?;
        let san = match crate::pattern::parse_ip(&name) {
            Some(ip) => SanType::IpAddress(ip),
            None => SanType::DnsName(name.clone().try_into()?),
        };
        let mut params = CertificateParams::default();
        params.subject_alt_names = vec![san];
        params
            .distinguished_name
            .push(DnType::CommonName, name.clone());
        params.not_before = rcgen::date_time_ymd(2024, 1, 1);
        params.not_after = rcgen::date_time_ymd(2044, 1, 1);
        params.use_authority_key_identifier_extension = true;
        let cert = params.signed_by(&key, &self.issuer)?;
        let der_key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let signing = self.provider.key_provider.load_private_key(der_key)?;
        let certified = Arc::new(CertifiedKey::new(vec![cert.der().clone()], signing));
        let mut leaves = self.lock();
        if leaves.len() >= MAX_LEAVES {
            leaves.clear();
        }
        leaves.insert(name, certified.clone());
        Ok(certified)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<CertifiedKey>>> {
        match self.leaves.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }
}

/// Serves the leaf for the client's SNI.
#[derive(Debug)]
struct LeafResolver(Arc<Ca>);

impl ResolvesServerCert for LeafResolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let name = hello.server_name()?;
        match self.0.leaf(name) {
            Ok(k) => Some(k),
            Err(e) => {
                tracing::warn!(error = %e, name, "cannot sign a leaf certificate");
                None
            }
        }
    }
}

/// Guest-facing TLS: leaves signed by the CA, ALPN `http/1.1` only.
pub fn server_config(ca: Arc<Ca>) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(LeafResolver(ca)));
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}

/// Serves the leaf for the client's SNI when `accept` says the name is
/// served here; no certificate (a failed handshake) otherwise.
struct NamedResolver {
    ca: Arc<Ca>,
    accept: Box<dyn Fn(&str) -> bool + Send + Sync>,
}

impl fmt::Debug for NamedResolver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NamedResolver").finish_non_exhaustive()
    }
}

impl ResolvesServerCert for NamedResolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let name = hello.server_name()?;
        if !(self.accept)(name) {
            tracing::debug!(name, "no certificate for a name not served here");
            return None;
        }
        LeafResolver(self.ca.clone()).resolve(hello)
    }
}

/// A server's TLS with leaves `ca` signs for each name the client asks
/// for that `accept` approves (a server whose names are not known
/// beforehand, as `{port}-{id}.{domain}`); ALPN `http/1.1` only.
pub fn named_server_config(
    ca: Arc<Ca>,
    accept: impl Fn(&str) -> bool + Send + Sync + 'static,
) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(NamedResolver {
            ca,
            accept: Box::new(accept),
        }));
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}

/// A server's TLS with the operator's certificate chain and key (PEM
/// files); ALPN `http/1.1` only.
pub fn file_server_config(cert: &Path, key: &Path) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    use rustls::pki_types::pem::PemObject;
    let read = |path: &Path| {
        fs::read(path).map_err(|source| TlsError::Io {
            path: path.to_owned(),
            source,
        })
    };
    let bad = |path: &Path, message: String| TlsError::BadCa {
        dir: path.to_owned(),
        message,
    };
    let chain = CertificateDer::pem_slice_iter(&read(cert)?)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(cert, format!("not PEM certificates: {e}")))?;
    if chain.is_empty() {
        return Err(bad(cert, "no certificate in the file".into()));
    }
    let key_der = PrivateKeyDer::from_pem_slice(&read(key)?)
        .map_err(|e| bad(key, format!("not a PEM private key: {e}")))?;
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(chain, key_der)?;
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}

/// Upstream TLS: the system's roots plus the operator's origin CAs.
pub fn client_config(origin_ca_files: &[PathBuf]) -> Result<Arc<rustls::ClientConfig>, TlsError> {
    let mut roots = rustls::RootCertStore::empty();
    let native = rustls_native_certs::load_native_certs();
    for e in &native.errors {
        tracing::warn!(error = %e, "cannot read some system trust roots");
    }
    roots.add_parsable_certificates(native.certs);
    for path in origin_ca_files {
        let pem = fs::read(path).map_err(|source| TlsError::Io {
            path: path.clone(),
            source,
        })?;
        let certs: Vec<CertificateDer<'static>> =
            rustls::pki_types::pem::PemObject::pem_slice_iter(&pem)
                .filter_map(Result::ok)
                .collect();
        if certs.is_empty() {
            return Err(TlsError::NoOriginCa(path.clone()));
        }
        let (_, ignored) = roots.add_parsable_certificates(certs);
        if ignored > 0 {
            tracing::warn!(path = %path.display(), ignored, "some origin CA certificates were unusable");
        }
    }
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ca_is_created_once_and_reused() {
        let dir = std::env::temp_dir().join(format!("hearth-egress-ca-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let ca = Ca::load_or_create(&dir).unwrap();
        let again = Ca::load_or_create(&dir).unwrap();
        assert_eq!(ca.pem(), again.pem());
        let mode = fs::metadata(dir.join("ca.key"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let a = again.leaf("api.example.com").unwrap();
        let b = again.leaf("API.example.com").unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        again.leaf("10.0.0.1").unwrap();
        fs::remove_dir_all(&dir).unwrap();
    }
}
