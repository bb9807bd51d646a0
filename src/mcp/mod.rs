//! MCP: the tool handlers (`tools`) and the sessions of the Streamable HTTP
//! transport (`sessions`).
//!
//! May import: `ops` (every tool is an operation there), `access`,
//! `metrics`; nothing of `http`.

pub(crate) mod sessions;
pub(crate) mod tools;
