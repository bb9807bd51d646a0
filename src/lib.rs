//! mcp-sandbox: an MCP server that gives LLM agents isolated Python
//! sandboxes in Docker containers. This crate is the front end (HTTP, MCP
//! tools, authentication and limits, configuration); the sandboxes
//! themselves live in `sandbox-actors`.
//!
//! # Layout
//!
//! Imports run one way, down this list: no module imports one above it.
//!
//! - [`serve`]: starts the HTTP server or MCP over stdio; [`bridge`]: MCP
//!   over stdio carried to a running server; [`report`]: the
//!   `usage` command, a client of a running server's usage report;
//!   [`cluster`]: the `cluster` command, which reads and changes the
//!   cluster's state in etcd.
//! - `http/`: the router, the routes (SSE, artifacts, REST API, web UI) and
//!   what they share.
//! - [`config`]: loads the file and the environment; each section's struct
//!   lives with the module it configures.
//! - `mcp/`: the MCP tool handlers, which route to `ops`, the MCP encoding
//!   of results, tasks, and the Streamable HTTP sessions.
//! - `ops/`: every operation, one file per verb, shared by the MCP tools and
//!   the REST API, and what it answers (results, files, inline images); no
//!   MCP library here.
//! - `access/`: who may call and how much: addresses, callers, API and guest
//!   keys, signed links, rates, session and connection caps.
//! - `metrics`: what is counted; [`telemetry`]: the spans exported as
//!   OpenTelemetry traces.
//!
//! In test builds, `tests/` runs the tools, the REST API and tasks on the
//! domain's in-memory runtime, without a Docker engine.

pub mod access;
pub mod bridge;
pub mod cluster;
pub mod config;
mod http;
mod mcp;
mod metrics;
mod ops;
pub mod report;
pub mod serve;
pub mod telemetry;

#[cfg(test)]
mod tests;
