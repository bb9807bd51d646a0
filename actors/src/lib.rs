//! The sandbox domain of mcp-sandbox: sandbox actors that own Docker
//! containers, the supervisor that restarts them, the install-task actor, the
//! records of who owns what, and the container runtime. Nothing here knows
//! about HTTP or MCP.

pub mod agent;
pub mod config;
pub mod context;
pub mod egress;
mod egress_rules;
pub mod error;
pub mod files;
pub mod history;
pub mod host;
mod install;
pub mod labels;
mod link;
mod messages;
pub mod packages;
mod pool;
pub mod records;
mod results;
pub mod runtime;
mod sandbox;
pub mod scope;
mod service;
pub mod status;
mod supervisor;
pub mod uploads;

pub use agent::{Package, Progress, RunOutput, Work};
pub use config::EgressPolicy;
pub use config::Settings;
pub use error::{Result, SandboxError};
pub use history::{CallKind, CallRecord};
pub use host::Resources;
pub use link::Ran;
pub use results::{InstallStatus, InstallStatusKind, SandboxInfo, Uploaded};
pub use runtime::disk::{DiskUsage, DiskUse};
pub use runtime::Usage;
pub use sandbox::MAX_INSTALL_RECORDS;
pub use scope::Scope;
pub use service::{CreateOptions, Quota, Sandboxes, Stats};
pub use status::SandboxStatus;
