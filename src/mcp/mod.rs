//! MCP: the tool handlers (`tools`), how a result goes over MCP (`results`),
//! long calls as MCP tasks (`tasks`), the sandbox view offered to hosts of
//! MCP Apps (`app`, with its page `view.html`), the sessions of the
//! Streamable HTTP transport (`sessions`) and tool schemas every client
//! takes (`schemas`).
//!
//! May import: `ops` (every tool is an operation there), `access`,
//! `metrics`, `telemetry`; nothing of `http` or `config`.

pub(crate) mod app;
pub(crate) mod process_tools;
pub(crate) mod results;
pub(crate) mod schemas;
pub(crate) mod sessions;
pub(crate) mod tasks;
pub(crate) mod tools;
