//! Who is calling: the tenant whose sandboxes a request may see.
//!
//! The HTTP front end decides it per request and puts it in the request's
//! extensions; rmcp hands the request's parts to tool handlers.

use axum::http::request::Parts;
use rmcp::service::RequestContext;
use rmcp::RoleServer;

/// The tenant of calls when authentication is off.
pub const LOCAL_OWNER: &str = "local";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub owner: String,
}

impl Caller {
    pub fn local() -> Self {
        Self {
            owner: LOCAL_OWNER.into(),
        }
    }

    /// The caller the HTTP front end attached to this MCP request, if any.
    pub fn of_request(ctx: &RequestContext<RoleServer>) -> Option<Self> {
        ctx.extensions
            .get::<Parts>()?
            .extensions
            .get::<Caller>()
            .cloned()
    }
}
