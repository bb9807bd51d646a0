//! Artifact links: `{public_url}/results/{sandbox_id}/{relative path}`, each
//! path segment percent-encoded so names with spaces, `#`, `?` or non-ASCII
//! characters survive any client. With authentication on, a link carries a
//! signed, expiring token instead of any API key.

use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use sandbox_runtime::agent::RESULTS_IN_CONTAINER;
use uuid::Uuid;

use crate::access::signer::{unix_now, LinkSigner};

/// Everything but RFC 3986 unreserved characters is encoded.
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_').remove(b'~');

#[derive(Clone)]
pub struct ArtifactLinks {
    base: String,
    signer: Option<LinkSigner>,
}

impl ArtifactLinks {
    pub fn new(public_url: &str, signer: Option<LinkSigner>) -> Self {
        Self {
            base: public_url.trim_end_matches('/').to_string(),
            signer,
        }
    }

    /// Link to `path`, an absolute path under `/app/results` in the sandbox.
    pub fn artifact(&self, sandbox: Uuid, path: &str) -> String {
        let relative = path
            .strip_prefix(RESULTS_IN_CONTAINER)
            .unwrap_or(path)
            .trim_start_matches('/');
        let encoded: Vec<String> = relative
            .split('/')
            .map(|s| utf8_percent_encode(s, SEGMENT).to_string())
            .collect();
        let link = format!("{}/results/{sandbox}/{}", self.base, encoded.join("/"));
        match &self.signer {
            Some(s) => format!("{link}?token={}", s.sign(&sandbox.to_string(), relative, unix_now())),
            None => link,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_are_encoded_and_slashes_kept() {
        let id = Uuid::nil();
        let links = ArtifactLinks::new("http://h:1/", None);
        assert_eq!(
            links.artifact(id, "/app/results/my plot#1?.png"),
            format!("http://h:1/results/{id}/my%20plot%231%3F.png")
        );
        assert_eq!(
            links.artifact(id, "/app/results/d/图.png"),
            format!("http://h:1/results/{id}/d/%E5%9B%BE.png")
        );
    }
}
