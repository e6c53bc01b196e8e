//! Private image registries (`/api/v2/sandboxes/registries`, the SDK's
//! `client.registries`): a name, the registry's address and the
//! credentials a snapshot built from an OCI image (`registry_id` on
//! `POST /snapshots`) pulls with. The password is write-only: no answer
//! carries it. Unknown fields are refused (422 naming them), as everywhere.

use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use uuid::Uuid;

use crate::boxes::{
    check_offset_and_cursor, check_query_value, parse_offset, parse_page_size, unknown_query,
};
use crate::error::ApiError;

/// Longest registry name.
pub const MAX_REGISTRY_NAME: usize = 128;
/// Longest user name, and longest password or token.
pub const MAX_USERNAME: usize = 256;
pub const MAX_PASSWORD: usize = 16 * 1024;
/// Longest URL.
pub const MAX_URL: usize = 512;

/// How Hearth authenticates to the registry.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum RegistryAuthType {
    /// A user name and a password or token (Docker's `config.json`
    /// credentials): basic auth, or exchanged for a bearer token.
    #[default]
    DockerConfig,
    /// Pulling from ECR as an IAM role: not supported (a 422).
    AwsRole,
}

impl RegistryAuthType {
    pub fn as_str(self) -> &'static str {
        match self {
            RegistryAuthType::DockerConfig => "DOCKER_CONFIG",
            RegistryAuthType::AwsRole => "AWS_ROLE",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "DOCKER_CONFIG" => Some(RegistryAuthType::DockerConfig),
            "AWS_ROLE" => Some(RegistryAuthType::AwsRole),
            _ => None,
        }
    }
}

/// Body of `POST /registries`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateRegistryRequest {
    /// Unique in the workspace: letters, digits and `._-`, up to 128.
    pub name: String,
    /// The registry: `host[:port]`, optionally with `https://` (the
    /// default) or `http://` (loopback only) and a path (such as `/v2/`),
    /// which does not narrow it: as with `docker login`, its credentials
    /// go with every image on this host, and only there.
    pub url: String,
    /// `DOCKER_CONFIG` (the default); `AWS_ROLE` is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth_type: Option<RegistryAuthType>,
    /// Refused: pulling as an IAM role is not supported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aws_role_arn: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    /// Write-only: sealed at rest, never returned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password: Option<String>,
}

/// Body of `PATCH /registries/{name}`: the fields to change.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateRegistryRequest {
    /// A new name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// A new address. Moving to another host needs the password again:
    /// credentials never follow a registry to another host by themselves.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth_type: Option<RegistryAuthType>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aws_role_arn: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password: Option<String>,
}

/// Who hosts a registry, from its host name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum RegistryProvider {
    DockerRegistry,
    Ghcr,
    Ecr,
    Gar,
    DockerHub,
}

/// A registry as the API shows it: never its password.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct RegistryResponse {
    pub id: Uuid,
    pub name: String,
    pub url: String,
    pub auth_type: RegistryAuthType,
    pub provider: RegistryProvider,
    pub username: Option<String>,
    /// Whether a password is stored (it is never shown).
    pub has_password: bool,
    /// The API key that created it, and the one that last changed it.
    pub created_by: Option<String>,
    pub updated_by: Option<String>,
    /// RFC 3339.
    pub created_at: String,
    /// RFC 3339.
    pub updated_at: String,
}

/// Answer of `GET /registries`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ListRegistriesResponse {
    pub items: Vec<RegistryResponse>,
    pub next_cursor: Option<String>,
    /// The offset of the next page, when paging by `offset`.
    pub offset: Option<u64>,
    /// Copy of `items` (older SDKs read it).
    pub registries: Vec<RegistryResponse>,
}

/// Query of `GET /registries`.
#[derive(Debug, Clone, Default, PartialEq, Eq, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListRegistriesQuery {
    /// Case-insensitive substring of the name.
    pub name_contains: Option<String>,
    /// 1..=500; absent (and no cursor): every registry in one page.
    pub page_size: Option<u32>,
    pub cursor: Option<String>,
    /// Offset pagination: 1..=500.
    pub limit: Option<u32>,
    pub offset: Option<u64>,
}

impl ListRegistriesQuery {
    /// Builds the query from decoded `key=value` pairs; an unknown key is
    /// a 422.
    pub fn from_pairs<'a>(
        pairs: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<Self, ApiError> {
        let mut q = Self::default();
        for (k, v) in pairs {
            check_query_value(k, v)?;
            match k {
                "name_contains" => q.name_contains = Some(v.to_owned()),
                "page_size" => q.page_size = Some(parse_page_size(k, v)?),
                "cursor" => q.cursor = Some(v.to_owned()),
                "limit" => q.limit = Some(parse_page_size(k, v)?),
                "offset" => q.offset = Some(parse_offset(k, v)?),
                _ => return Err(unknown_query(k)),
            }
        }
        check_offset_and_cursor(q.offset, q.cursor.as_deref())?;
        Ok(q)
    }
}

/// A registry's address, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegistryUrl {
    /// `host[:port]`, lowercase; Docker Hub's names are all
    /// `registry-1.docker.io` (where its API is), as image references
    /// resolve them.
    pub host: String,
    /// Plain HTTP: asked for with `http://`, or a loopback host without
    /// a scheme (as image references on loopback are pulled).
    pub plain_http: bool,
}

impl RegistryUrl {
    /// Who hosts it.
    pub fn provider(&self) -> RegistryProvider {
        let name = self.host.rsplit_once(':').map_or(&*self.host, |(h, _)| h);
        if name == "ghcr.io" {
            RegistryProvider::Ghcr
        } else if name.ends_with(".amazonaws.com") && name.contains(".dkr.ecr.") {
            RegistryProvider::Ecr
        } else if name.ends_with("-docker.pkg.dev") || name == "gcr.io" || name.ends_with(".gcr.io")
        {
            RegistryProvider::Gar
        } else if name == DOCKER_HUB_API {
            RegistryProvider::DockerHub
        } else {
            RegistryProvider::DockerRegistry
        }
    }
}

const DOCKER_HUB_API: &str = "registry-1.docker.io";

/// Whether `host` (without its port) is a loopback name or address.
pub fn is_loopback_host(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(""),
        None => host.rsplit_once(':').map_or(host, |(h, _)| h),
    };
    name == "localhost"
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Checks a registry's `url` (`field` names it in the 422).
pub fn parse_registry_url(field: &str, url: &str) -> Result<RegistryUrl, ApiError> {
    let bad = |why: &str| ApiError::validation(field, format!("{field}: {why}"));
    if url.is_empty() || url.len() > MAX_URL {
        return Err(bad(&format!("must be 1 to {MAX_URL} bytes")));
    }
    let lower = url.to_ascii_lowercase();
    let (scheme, rest) = match lower.split_once("://") {
        Some((s @ ("http" | "https"), rest)) => (Some(s), rest),
        Some(_) => return Err(bad("the scheme must be https:// or http://")),
        None => (None, &*lower),
    };
    let host = rest.split('/').next().unwrap_or("");
    let (name, port) = match host.strip_prefix('[') {
        Some(v6) => match v6.split_once(']') {
            Some((addr, after)) if addr.parse::<std::net::Ipv6Addr>().is_ok() => {
                (host, after.strip_prefix(':'))
            }
            _ => return Err(bad("a bracketed host must be an IPv6 address")),
        },
        None => match host.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (host, None),
        },
    };
    let name_ok = !name.is_empty()
        && (name.starts_with('[')
            || name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-'));
    if !name_ok {
        return Err(bad(
            "must be host[:port], optionally after https:// or http://",
        ));
    }
    if let Some(p) = port {
        if !p.parse::<u16>().is_ok_and(|p| p > 0) {
            return Err(bad("the port must be a number from 1 to 65535"));
        }
    }
    if rest.contains(['?', '#', '@', ' ']) {
        return Err(bad("must not hold credentials, a query or a fragment"));
    }
    let loopback = is_loopback_host(host);
    if scheme == Some("http") && !loopback {
        return Err(bad(
            "http:// would send the password in clear text; only a loopback registry may use it",
        ));
    }
    let host = match host {
        "docker.io" | "index.docker.io" => DOCKER_HUB_API.to_owned(),
        h => h.to_owned(),
    };
    Ok(RegistryUrl {
        host,
        plain_http: scheme == Some("http") || (scheme.is_none() && loopback),
    })
}

/// Checks a registry name (`field` names it in the 422).
pub fn check_registry_name(field: &str, name: &str) -> Result<(), ApiError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_REGISTRY_NAME
        && name.as_bytes()[0].is_ascii_alphanumeric()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(ApiError::validation(
            field,
            format!(
                "{field} must be 1 to {MAX_REGISTRY_NAME} letters, digits, '.', '_' or '-', \
                 starting with a letter or digit"
            ),
        ))
    }
}

/// Checks a user name and password: bounded, and what HTTP basic auth
/// can carry (no control characters; no ':' in the user name).
pub fn check_credentials(username: Option<&str>, password: Option<&str>) -> Result<(), ApiError> {
    if let Some(u) = username {
        if u.is_empty()
            || u.len() > MAX_USERNAME
            || u.contains(':')
            || u.chars().any(char::is_control)
        {
            return Err(ApiError::validation(
                "username",
                format!(
                    "username must be 1 to {MAX_USERNAME} bytes without ':' or control characters"
                ),
            ));
        }
    }
    if let Some(p) = password {
        if p.is_empty() || p.len() > MAX_PASSWORD || p.chars().any(char::is_control) {
            return Err(ApiError::validation(
                "password",
                format!("password must be 1 to {MAX_PASSWORD} bytes without control characters"),
            ));
        }
    }
    Ok(())
}

/// `AWS_ROLE` and `aws_role_arn` are refused, naming what was given.
pub fn refuse_aws_role(
    auth_type: Option<RegistryAuthType>,
    aws_role_arn: Option<&str>,
) -> Result<(), ApiError> {
    let why = "pulling as an IAM role (ECR) is not supported by Hearth; use auth_type \
               DOCKER_CONFIG with a username and password (for ECR: AWS and a token from \
               `aws ecr get-login-password`)";
    if aws_role_arn.is_some() {
        return Err(ApiError::validation(
            "aws_role_arn",
            format!("aws_role_arn: {why}"),
        ));
    }
    if auth_type == Some(RegistryAuthType::AwsRole) {
        return Err(ApiError::validation(
            "auth_type",
            format!("auth_type AWS_ROLE: {why}"),
        ));
    }
    Ok(())
}

impl CreateRegistryRequest {
    /// The checked address. Both credentials or neither: a registry with a
    /// user and no password (or the reverse) could only fail later.
    pub fn validate(&self) -> Result<RegistryUrl, ApiError> {
        check_registry_name("name", &self.name)?;
        let url = parse_registry_url("url", &self.url)?;
        refuse_aws_role(self.auth_type, self.aws_role_arn.as_deref())?;
        check_credentials(self.username.as_deref(), self.password.as_deref())?;
        match (&self.username, &self.password) {
            (Some(_), None) => Err(ApiError::validation(
                "password",
                "password: field required with a username",
            )),
            (None, Some(_)) => Err(ApiError::validation(
                "username",
                "username: field required with a password",
            )),
            _ => Ok(url),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(s: &str) -> Result<RegistryUrl, Option<String>> {
        parse_registry_url("url", s).map_err(|e| e.field().map(str::to_owned))
    }

    #[test]
    fn registry_urls_name_one_host_and_plain_http_only_on_loopback() {
        let https = |host: &str| {
            Ok(RegistryUrl {
                host: host.into(),
                plain_http: false,
            })
        };
        assert_eq!(url("registry.example.com"), https("registry.example.com"));
        assert_eq!(
            url("HTTPS://Reg.Example:5000/v2/"),
            https("reg.example:5000")
        );
        assert_eq!(url("docker.io"), https("registry-1.docker.io"));
        assert_eq!(
            url("https://index.docker.io/v1/"),
            https("registry-1.docker.io")
        );
        assert_eq!(url("https://127.0.0.1:5000"), https("127.0.0.1:5000"));
        let plain = |host: &str| {
            Ok(RegistryUrl {
                host: host.into(),
                plain_http: true,
            })
        };
        assert_eq!(url("127.0.0.1:5000"), plain("127.0.0.1:5000"));
        assert_eq!(url("http://localhost:5000"), plain("localhost:5000"));
        assert_eq!(url("http://[::1]:5000"), plain("[::1]:5000"));
        for bad in [
            "",
            "http://registry.example",
            "ftp://registry.example",
            "user:pw@registry.example",
            "https://user@registry.example",
            "registry.example:0",
            "registry.example:99999",
            "reg_istry.example",
            "[zz]:5000",
            "registry.example/?q",
        ] {
            assert_eq!(url(bad), Err(Some("url".into())), "{bad}");
        }
    }

    #[test]
    fn providers_follow_the_host() {
        let p = |s: &str| url(s).unwrap().provider();
        assert_eq!(p("ghcr.io"), RegistryProvider::Ghcr);
        assert_eq!(
            p("123456789012.dkr.ecr.eu-west-1.amazonaws.com"),
            RegistryProvider::Ecr
        );
        assert_eq!(p("europe-docker.pkg.dev"), RegistryProvider::Gar);
        assert_eq!(p("docker.io"), RegistryProvider::DockerHub);
        assert_eq!(p("harbor.internal:8443"), RegistryProvider::DockerRegistry);
    }

    #[test]
    fn creates_need_both_credentials_and_refuse_roles() {
        let ok = CreateRegistryRequest {
            name: "internal".into(),
            url: "registry.example".into(),
            username: Some("robot".into()),
            password: Some("s3cret".into()),
            ..Default::default()
        };
        assert!(ok.validate().is_ok());
        let field = |r: CreateRegistryRequest| r.validate().unwrap_err().field().map(str::to_owned);
        let no_password = CreateRegistryRequest {
            password: None,
            ..ok.clone()
        };
        assert_eq!(field(no_password), Some("password".into()));
        let role = CreateRegistryRequest {
            auth_type: Some(RegistryAuthType::AwsRole),
            ..ok.clone()
        };
        assert_eq!(field(role), Some("auth_type".into()));
        let arn = CreateRegistryRequest {
            aws_role_arn: Some("arn:aws:iam::1:role/r".into()),
            ..ok.clone()
        };
        assert_eq!(field(arn), Some("aws_role_arn".into()));
        let colon = CreateRegistryRequest {
            username: Some("a:b".into()),
            ..ok.clone()
        };
        assert_eq!(field(colon), Some("username".into()));
        let name = CreateRegistryRequest {
            name: "-x".into(),
            ..ok
        };
        assert_eq!(field(name), Some("name".into()));
    }
}
