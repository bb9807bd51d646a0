//! mcp-sandbox: an MCP server that gives LLM agents isolated Python
//! sandboxes in Docker containers. This crate is the front end (HTTP, MCP
//! tools, authentication and limits, configuration); the sandboxes
//! themselves live in `sandbox-actors`.
//!
//! # Layout
//!
//! Imports run one way: no module imports one that imports it, directly or
//! through others.
//!
//! - Identity and limits: `client_ip` (the client's address behind trusted
//!   proxies), `caller` (who asks), `signer` (signed tokens and the clock),
//!   `guest` (guest keys), [`auth`] (API keys), `limits` (rates and caps),
//!   `metrics` (what is counted).
//! - Configuration: [`config`] loads the file and the environment; each
//!   section's struct lives with the module it configures.
//! - Operations: `links` (artifact URLs), `inline_images`, `results` and
//!   `files` (the neutral result types), `ops` (every operation, shared by
//!   the MCP tools and the REST API).
//! - MCP: `mcp_results` (how a result goes over MCP), `tasks` (long calls as
//!   tasks), `tools` (the tool handlers).
//! - HTTP: `http_error` (JSON error answers), `bodies` (request bodies
//!   under a cap and a deadline), `health` (the engine check),
//!   `sessions` (the session caps), `mcp_sessions` and `sse_sessions` (the
//!   sessions of each transport), `http_state` (what every route shares),
//!   the routes `sse`, `artifacts`, `api` and `ui`, then `http` (the router
//!   and the request guard) and `connections` (the accept loop under caps).
//! - Running: [`serve`] starts the HTTP server or MCP over stdio.

mod api;
mod artifacts;
pub mod auth;
mod bodies;
mod caller;
mod client_ip;
pub mod config;
mod connections;
mod files;
mod guest;
mod health;
mod http;
mod http_error;
mod http_state;
mod inline_images;
mod limits;
mod links;
mod mcp_results;
mod mcp_sessions;
mod metrics;
mod ops;
mod results;
pub mod serve;
mod sessions;
mod signer;
mod sse;
mod sse_sessions;
mod tasks;
mod tools;
mod ui;
