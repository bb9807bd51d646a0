//! Preview links: a URL that reaches a port inside a sandbox, carrying a
//! signed, expiring token bound to the sandbox and the port (a token for
//! one port or sandbox opens no other).
//!
//! Where the previews are served decides their origin, which must never be
//! the server's (a preview page is the sandbox's code):
//! - with `server.preview_domain`, each sandbox and port has a host name of
//!   its own, `{label}.{domain}`, so each preview is an origin of its own;
//! - otherwise `server.preview_port` serves them under a path each,
//!   `/{label}/`, an origin apart from the server's (though not from each
//!   other: docs/previews.md says what that means).

use time::OffsetDateTime;
use uuid::Uuid;

use crate::access::signer::{unix_now, LinkSigner, TokenError};

/// The query parameter a link carries its token in (the first request
/// trades it for a cookie of the preview's origin).
pub const TOKEN_PARAM: &str = "mcp_preview_token";
/// The cookie that carries the token afterwards.
pub const COOKIE: &str = "mcp_preview";

/// Where previews are served.
#[derive(Clone, Debug)]
pub enum PreviewBase {
    /// `{scheme}://{label}.{domain}{port}`, `port` empty or `:N`.
    Domain {
        scheme: String,
        domain: String,
        port: String,
    },
    /// `{origin}/{label}/`.
    Port { origin: String },
}

#[derive(Clone)]
pub struct PreviewLinks {
    base: PreviewBase,
    signer: LinkSigner,
    ttl_seconds: u64,
}

/// A link as `expose_port` answers it.
pub struct PreviewLink {
    pub url: String,
    pub expires_at: OffsetDateTime,
}

/// A sandbox's port, as a preview's host name or path names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Target {
    pub sandbox: Uuid,
    pub port: u16,
}

impl Target {
    /// `p{port}-{sandbox}`: one DNS label (at most 43 characters).
    pub fn label(&self) -> String {
        format!("p{}-{}", self.port, self.sandbox)
    }

    /// The target a label names; `None` for anything else.
    pub fn from_label(label: &str) -> Option<Self> {
        let rest = label.strip_prefix('p')?;
        let (port, written) = rest.split_once('-')?;
        if port.starts_with('0') {
            return None;
        }
        let port: u16 = port.parse().ok().filter(|p| *p > 0)?;
        let sandbox = Uuid::parse_str(written).ok()?;
        // One spelling only (lower case, hyphenated), so that one target has
        // one origin.
        (sandbox.to_string() == written).then_some(Self { sandbox, port })
    }

    fn signed_path(&self) -> String {
        format!("preview:{}", self.port)
    }
}

impl PreviewLinks {
    pub fn new(base: PreviewBase, signer: LinkSigner, ttl_seconds: u64) -> Self {
        Self {
            base,
            signer,
            ttl_seconds,
        }
    }

    pub fn base(&self) -> &PreviewBase {
        &self.base
    }

    /// A link to `target`, with a token that expires with artifact links.
    pub fn link(&self, target: Target) -> PreviewLink {
        let now = unix_now();
        let token = self
            .signer
            .sign(&target.sandbox.to_string(), &target.signed_path(), now);
        let url = match &self.base {
            PreviewBase::Domain { scheme, domain, port } => {
                format!("{scheme}://{}.{domain}{port}/?{TOKEN_PARAM}={token}", target.label())
            }
            PreviewBase::Port { origin } => format!("{origin}/{}/?{TOKEN_PARAM}={token}", target.label()),
        };
        let expires =
            OffsetDateTime::from_unix_timestamp((now + self.ttl_seconds) as i64).unwrap_or(OffsetDateTime::UNIX_EPOCH);
        PreviewLink {
            url,
            expires_at: expires,
        }
    }

    /// Checks `token` for `target`; answers when it expires (unix seconds).
    pub fn verify(&self, target: Target, token: &str) -> Result<u64, TokenError> {
        self.signer
            .verify(&target.sandbox.to_string(), &target.signed_path(), token, unix_now())?;
        let expiry = token.split_once('.').and_then(|(e, _)| e.parse().ok());
        expiry.ok_or(TokenError::Malformed)
    }

    /// The target a preview request names, and the path it asks of the
    /// sandbox: from its host name under the preview domain, or from the
    /// first segment of its path on the preview port.
    pub fn target(&self, host: &str, path: &str) -> Option<(Target, String)> {
        match &self.base {
            PreviewBase::Domain { domain, .. } => {
                let name = host.split(':').next().unwrap_or_default();
                let label = name.to_ascii_lowercase();
                let label = label.strip_suffix(&format!(".{domain}"))?;
                Some((Target::from_label(label)?, path.to_string()))
            }
            PreviewBase::Port { .. } => {
                let rest = path.strip_prefix('/')?;
                let (label, rest) = rest.split_once('/').unwrap_or((rest, ""));
                Some((Target::from_label(label)?, format!("/{rest}")))
            }
        }
    }

    /// Whether a request with this `Host` is for a preview (the main
    /// listener serves previews only under the preview domain).
    pub fn is_preview_host(&self, host: &str) -> bool {
        matches!(&self.base, PreviewBase::Domain { .. }) && self.target(host, "/").is_some()
    }

    /// The path the token cookie is scoped to.
    pub fn cookie_path(&self, target: Target) -> String {
        match &self.base {
            PreviewBase::Domain { .. } => "/".into(),
            PreviewBase::Port { .. } => format!("/{}/", target.label()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn links(base: PreviewBase) -> PreviewLinks {
        let dir = tempfile::tempdir().unwrap();
        PreviewLinks::new(
            base,
            LinkSigner::load(Some(&"k".repeat(32)), 60, dir.path()).unwrap(),
            60,
        )
    }

    fn domain() -> PreviewBase {
        PreviewBase::Domain {
            scheme: "https".into(),
            domain: "preview.example".into(),
            port: String::new(),
        }
    }

    #[test]
    fn a_label_names_one_sandbox_and_port_in_one_spelling() {
        let t = Target {
            sandbox: Uuid::new_v4(),
            port: 8501,
        };
        assert_eq!(Target::from_label(&t.label()), Some(t));
        assert!(t.label().len() <= 63);
        assert_eq!(Target::from_label(&t.label().to_uppercase()), None);
        assert_eq!(Target::from_label(&t.label().replace("p8501", "p08501")), None);
        assert_eq!(Target::from_label(&t.label().replace("p8501", "p0")), None);
        assert_eq!(Target::from_label(&t.label().replace("p8501", "p70000")), None);
        assert_eq!(Target::from_label(&t.label().replace('-', "")), None);
    }

    #[test]
    fn a_token_opens_its_own_sandbox_and_port_only() {
        let links = links(domain());
        let t = Target {
            sandbox: Uuid::new_v4(),
            port: 8000,
        };
        let url = links.link(t).url;
        let token = url.split(&format!("{TOKEN_PARAM}=")).nth(1).unwrap();
        assert!(links.verify(t, token).is_ok());
        let other_port = Target { port: 8001, ..t };
        assert_eq!(links.verify(other_port, token), Err(TokenError::BadSignature));
        let other_sandbox = Target {
            sandbox: Uuid::new_v4(),
            ..t
        };
        assert_eq!(links.verify(other_sandbox, token), Err(TokenError::BadSignature));
    }

    #[test]
    fn requests_name_their_target_by_host_or_by_path() {
        let t = Target {
            sandbox: Uuid::new_v4(),
            port: 8000,
        };
        let by_host = links(domain());
        let host = format!("{}.preview.example:443", t.label());
        assert_eq!(by_host.target(&host, "/a?b"), Some((t, "/a?b".into())));
        assert_eq!(by_host.target(&format!("{}.evil.example", t.label()), "/"), None);
        assert!(!by_host.is_preview_host("preview.example"));
        let by_path = links(PreviewBase::Port {
            origin: "http://h:9".into(),
        });
        assert_eq!(
            by_path.target("h:9", &format!("/{}/x/y", t.label())),
            Some((t, "/x/y".into()))
        );
        assert_eq!(by_path.target("h:9", &format!("/{}", t.label())), Some((t, "/".into())));
        assert!(!by_path.is_preview_host(&host));
    }
}
