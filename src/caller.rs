//! Who is calling: the tenant whose sandboxes a request may see.
//!
//! The HTTP front end decides it per request and puts it in the request's
//! extensions; rmcp hands the request's parts to tool handlers.

use std::net::IpAddr;

use axum::http::request::Parts;
use rmcp::service::RequestContext;
use rmcp::RoleServer;
use sandbox_actors::Scope;

/// The tenant of calls from this machine when authentication is off.
pub const LOCAL_OWNER: &str = "local";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub owner: String,
    /// An administrator's key (`[auth] admin_keys`) reaches every tenant's sandboxes.
    pub admin: bool,
}

impl Caller {
    pub fn local() -> Self {
        Self {
            owner: LOCAL_OWNER.into(),
            admin: false,
        }
    }

    /// The sandboxes this caller may reach.
    pub fn scope(&self) -> Scope<'_> {
        match self.admin {
            true => Scope::Everyone,
            false => Scope::Owner(&self.owner),
        }
    }

    /// Without authentication the tenant is the client's address; clients on
    /// this machine are one tenant.
    pub fn anonymous(ip: IpAddr) -> Self {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(IpAddr::V6(v6)),
            v4 => v4,
        };
        if ip.is_loopback() {
            Self::local()
        } else {
            Self {
                owner: format!("ip:{ip}"),
                admin: false,
            }
        }
    }

    /// The tenant named by an API key (key names cannot contain ':').
    pub fn tenant(name: &str, admin: bool) -> Self {
        Self {
            owner: name.to_string(),
            admin,
        }
    }

    /// The caller the HTTP front end attached to this MCP request, if any.
    pub fn of_request(ctx: &RequestContext<RoleServer>) -> Option<Self> {
        ctx.extensions.get::<Parts>()?.extensions.get::<Caller>().cloned()
    }
}
