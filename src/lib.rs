//! mcp-sandbox: an MCP server that gives LLM agents isolated Python
//! sandboxes in Docker containers. This crate is the front end (HTTP, MCP
//! tools, authentication and limits, configuration); the sandboxes
//! themselves live in `sandbox-actors`.

pub mod api;
pub mod artifacts;
pub mod auth;
pub mod caller;
pub mod client_ip;
pub mod config;
pub mod connections;
pub mod files;
pub mod guest;
pub mod health;
pub mod http;
pub mod http_error;
pub mod http_state;
pub mod inline_images;
pub mod limits;
pub mod links;
pub mod mcp_results;
pub mod mcp_sessions;
pub mod metrics;
pub mod ops;
pub mod results;
pub mod serve;
pub mod sessions;
pub mod signer;
pub mod sse;
pub mod sse_sessions;
pub mod tasks;
pub mod tools;
pub mod ui;
