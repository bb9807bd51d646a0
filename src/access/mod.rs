//! Who may call, and how much: the client's address behind trusted proxies
//! (`client_ip`), who asks (`caller`), signed tokens and the clock
//! (`signer`), artifact links (`artifact_links`), guest keys (`guest`), API keys
//! ([`auth`]), rates and caps (`limits`), monthly budgets (`budgets`), the session caps (`sessions`) and
//! the accept loop under its caps (`connections`).
//!
//! May import: `config` in tests, `metrics` (what is counted), and one
//! another; nothing of `ops`, `mcp` or `http`.

pub(crate) mod artifact_links;
pub mod auth;
pub(crate) mod budgets;
pub(crate) mod caller;
pub(crate) mod client_ip;
pub(crate) mod connections;
pub(crate) mod guest;
pub(crate) mod limits;
pub(crate) mod preview_links;
pub(crate) mod sessions;
pub(crate) mod signer;
