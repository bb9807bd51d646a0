//! MCP: the tool handlers (`tools`), the sandbox view offered to hosts of
//! MCP Apps (`app`, with its page `view.html`) and the sessions of the
//! Streamable HTTP transport (`sessions`).
//!
//! May import: `ops` (every tool is an operation there), `access`,
//! `metrics`, `telemetry`; nothing of `http`.

pub(crate) mod app;
pub(crate) mod sessions;
pub(crate) mod tools;
