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
/// How a guest tenant's name starts (key names cannot contain ':').
pub const GUEST_PREFIX: &str = "guest:";

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Caller {
    pub owner: String,
    /// An administrator's key (`[auth] admin_keys`) reaches every tenant's sandboxes.
    pub admin: bool,
    /// When the caller's key stops working (Unix seconds; guest keys).
    pub expires_at: Option<u64>,
}

impl Caller {
    pub fn local() -> Self {
        Self {
            owner: LOCAL_OWNER.into(),
            admin: false,
            expires_at: None,
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
        let ip = crate::access::client_ip::canonical(ip);
        if ip.is_loopback() {
            Self::local()
        } else {
            Self {
                owner: format!("ip:{ip}"),
                admin: false,
                expires_at: None,
            }
        }
    }

    /// The tenant named by an API key (key names cannot contain ':').
    pub fn tenant(name: &str, admin: bool) -> Self {
        Self {
            owner: name.to_string(),
            admin,
            expires_at: None,
        }
    }

    /// A guest key's own tenant, valid until `expires_at` (Unix seconds).
    pub fn guest(owner: String, expires_at: u64) -> Self {
        Self {
            owner,
            admin: false,
            expires_at: Some(expires_at),
        }
    }

    /// Whether this is a guest key's tenant (whose owner names start so).
    pub fn is_guest_owner(owner: &str) -> bool {
        owner.starts_with(GUEST_PREFIX)
    }

    /// The caller the HTTP front end attached to this MCP request, if any.
    pub fn of_request(ctx: &RequestContext<RoleServer>) -> Option<Self> {
        ctx.extensions.get::<Parts>()?.extensions.get::<Caller>().cloned()
    }
}
