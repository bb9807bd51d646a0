//! Signed tokens under the server's link secret: artifact link tokens
//! (`{expiry}.{HMAC}`), the CSRF tokens of browser sessions, and the MAC
//! that guest keys carry. Nothing signed is stored: a token proves itself.

use std::path::Path;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use hmac::{Hmac, KeyInit, Mac};
use rand::RngCore;
use sha2::Sha256;

/// Signs and checks artifact link tokens: `{expiry}.{HMAC(sandbox, path, expiry)}`.
#[derive(Clone)]
pub struct LinkSigner {
    secret: Vec<u8>,
    ttl_seconds: u64,
}

#[derive(Debug, PartialEq, Eq)]
pub enum TokenError {
    Malformed,
    Expired,
    BadSignature,
}

impl LinkSigner {
    /// The configured secret, or one generated once and kept (0600) in the
    /// state folder so that links survive a restart.
    pub fn load(link_secret: Option<&str>, ttl_seconds: u64, state_dir: &Path) -> std::io::Result<Self> {
        let secret = match link_secret {
            Some(s) => s.as_bytes().to_vec(),
            None => {
                let path = state_dir.join("link-secret");
                match std::fs::read(&path) {
                    Ok(s) if s.len() >= 32 => s,
                    _ => {
                        std::fs::create_dir_all(state_dir)?;
                        let mut s = vec![0u8; 32];
                        rand::rng().fill_bytes(&mut s);
                        let hex: String = s.iter().map(|b| format!("{b:02x}")).collect();
                        write_private(&path, hex.as_bytes())?;
                        hex.into_bytes()
                    }
                }
            }
        };
        Ok(Self {
            secret,
            ttl_seconds: ttl_seconds.max(1),
        })
    }

    /// A signer of another kind of token, under a key derived from this
    /// one's for `purpose`: no token of one kind is one of the other (an
    /// artifact path that reads like a preview's signed path, say).
    pub fn derived(&self, purpose: &str) -> Self {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.secret).expect("HMAC takes any key length");
        mac.update(purpose.as_bytes());
        Self {
            secret: mac.finalize().into_bytes().to_vec(),
            ttl_seconds: self.ttl_seconds,
        }
    }

    pub(crate) fn mac(&self, sandbox: &str, path: &str, expiry: u64) -> Hmac<Sha256> {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.secret).expect("HMAC takes any key length");
        mac.update(format!("{sandbox}\n{path}\n{expiry}").as_bytes());
        mac
    }

    pub fn sign(&self, sandbox: &str, path: &str, now: u64) -> String {
        let expiry = now + self.ttl_seconds;
        let sig = self.mac(sandbox, path, expiry).finalize().into_bytes();
        format!("{expiry}.{}", URL_SAFE_NO_PAD.encode(sig))
    }

    pub fn verify(&self, sandbox: &str, path: &str, token: &str, now: u64) -> Result<(), TokenError> {
        let (expiry, sig) = token.split_once('.').ok_or(TokenError::Malformed)?;
        let expiry: u64 = expiry.parse().map_err(|_| TokenError::Malformed)?;
        let sig = URL_SAFE_NO_PAD.decode(sig).map_err(|_| TokenError::Malformed)?;
        self.mac(sandbox, path, expiry)
            .verify_slice(&sig)
            .map_err(|_| TokenError::BadSignature)?;
        if now > expiry {
            return Err(TokenError::Expired);
        }
        Ok(())
    }

    /// The CSRF token of a browser session signed in with `key`: requests
    /// that the session cookie authenticates must send it back, which a page
    /// of another site cannot (it never sees the token).
    pub fn csrf_token(&self, key: &str) -> String {
        // "csrf" is never a sandbox id, so these never collide with link tokens.
        URL_SAFE_NO_PAD.encode(self.mac("csrf", key, 0).finalize().into_bytes())
    }

    pub fn verify_csrf(&self, key: &str, token: &str) -> bool {
        URL_SAFE_NO_PAD
            .decode(token.trim())
            .is_ok_and(|sig| self.mac("csrf", key, 0).verify_slice(&sig).is_ok())
    }
}

fn write_private(path: &Path, data: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(data)
}

pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csrf_tokens_bind_their_session() {
        let dir = tempfile::tempdir().unwrap();
        let signer = LinkSigner::load(None, 60, dir.path()).unwrap();
        let token = signer.csrf_token("key-a-0123456789");
        assert!(signer.verify_csrf("key-a-0123456789", &token));
        assert!(!signer.verify_csrf("key-b-0123456789", &token));
        assert!(!signer.verify_csrf("key-a-0123456789", ""));
        assert!(!signer.verify_csrf("key-a-0123456789", "not base64!"));
    }

    #[test]
    fn link_tokens_expire_and_bind_their_path() {
        let dir = tempfile::tempdir().unwrap();
        let signer = LinkSigner::load(None, 60, dir.path()).unwrap();
        let token = signer.sign("sb", "a.png", 1000);
        assert_eq!(signer.verify("sb", "a.png", &token, 1030), Ok(()));
        assert_eq!(signer.verify("sb", "a.png", &token, 1061), Err(TokenError::Expired));
        assert_eq!(
            signer.verify("sb", "b.png", &token, 1030),
            Err(TokenError::BadSignature)
        );
        assert_eq!(
            signer.verify("other", "a.png", &token, 1030),
            Err(TokenError::BadSignature)
        );
        let (exp, sig) = token.split_once('.').unwrap();
        let extended = format!("{}.{sig}", exp.parse::<u64>().unwrap() + 1000);
        assert_eq!(
            signer.verify("sb", "a.png", &extended, 1030),
            Err(TokenError::BadSignature)
        );
        assert_eq!(
            signer.verify("sb", "a.png", "garbage", 1030),
            Err(TokenError::Malformed)
        );
        // The generated secret is kept: a restarted server accepts old links.
        let again = LinkSigner::load(None, 60, dir.path()).unwrap();
        assert_eq!(again.verify("sb", "a.png", &token, 1030), Ok(()));
    }
}
