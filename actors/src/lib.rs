//! The sandbox domain of mcp-sandbox: sandbox actors that own containers,
//! the supervisor that restarts them, the install-task actor, the pool, the
//! records of who owns what, snapshots, forks and usage. Nothing here knows
//! about HTTP or MCP. Below it, crates of their own: `sandbox-runtime` (the
//! container runtime and the agent channel), `sandbox-egress` (the egress
//! policies and proxy) and `sandbox-host` (the Linux host: bridge ports,
//! firewall, capped disks, symlink-proof file access).
//!
//! # Layout
//!
//! - `service/`: [`Sandboxes`], the face the front end calls; it finds a
//!   sandbox's actor and sends it a message (`mod.rs`, through `reach.rs`,
//!   which wakes a dormant sandbox's actor); creations and the
//!   quota (`creation.rs`), the file tools and uploads (`files.rs`),
//!   snapshots (`snapshots.rs`), forks, which make new sandboxes from one
//!   (`fork.rs`), the start-up reconciliation (`reconcile.rs`), and the
//!   usage sampler that walks the supervisor's registry (`sampler.rs`).
//! - `supervisor`: parent of the sandbox actors, keeper of the `registry`
//!   (every sandbox: its owner, whether it sleeps, its actor or, dormant,
//!   what its rested actor kept).
//! - `sandbox/`: the sandbox actor: its state and upkeep (`mod.rs`), the jobs
//!   it queues and the tasks that run them (`jobs.rs`), snapshot work
//!   (`snapshot.rs`), deletion (`deletion.rs`), sleep and wake
//!   (`hibernation.rs`), and the rest of a sleeping one's actor (`rest.rs`).
//! - `snapshots/`: the host side of snapshots: their store and bounds
//!   (`mod.rs`), the symlink-proof copies of a sandbox's folders (`copy.rs`),
//!   and what a fork carries into new sandboxes (`fork.rs`).
//! - `install`: the install-task actor.
//! - `messages`: what the actors send each other; `results`: what they
//!   answer with ([`SandboxInfo`], [`InstallStatus`], [`Uploaded`]).
//! - `agent_connection`: one sandbox's connection to its agent, with recovery.
//! - `pool`: making sandboxes, and keeping some made ahead of demand;
//!   `pool_target`: how many, as demand shows; `pool_yield`: when refills
//!   give way to the first calls of sandboxes just claimed; `pools`: the
//!   sandbox image's pool and one per template.
//! - `records`: the record store; `history`: a sandbox's recent calls.
//! - `usage/`: what each tenant used, by the hour: the meter and this
//!   month's totals (`mod.rs`), their rows in the record store (`store.rs`),
//!   and what one reading of a sandbox's counters adds (`reading.rs`).
//! - `files/`: file tools on `/app/results` (paths and opening in `mod.rs`,
//!   `list.rs`, `read.rs`); `uploads`: what may be uploaded, and its
//!   packing; `packages`: accepted package specs.
//! - `config`: the configuration sections and [`Settings`]; `context`: what
//!   every actor shares.
//! - `templates`: the templates offered and which sandbox is made from
//!   which.
//! - `error`: [`SandboxError`] and the errors it carries; `status`, `scope`,
//!   `resources`: sandbox states, whose sandboxes a call reaches, what the
//!   sandboxes take from the host and the free-disk guard.

mod agent_connection;
mod census;
pub mod config;
mod context;
mod error;
pub mod files;
mod history;
mod install;
mod messages;
pub mod moment;
mod packages;
mod pool;
mod pool_pace;
mod pool_target;
mod pool_yield;
mod pools;
pub mod processes;
mod receipt;
pub mod records;
mod registry;
mod resources;
mod results;
mod sandbox;
mod scope;
mod service;
pub mod snapshots;
mod status;
mod supervisor;
pub mod templates;
pub mod uploads;
pub mod usage;

#[cfg(test)]
mod tests;

pub use agent_connection::Ran;
pub use config::{EgressPolicy, Settings};
pub use error::{AgentFailure, DockerError, Result, SandboxError, StoreError};
pub use history::{CallKind, CallRecord};
pub use pool::PoolStats;
pub use receipt::Receipt;
pub use resources::Resources;
pub use results::{InstallStatus, InstallStatusKind, SandboxInfo, Slept, Uploaded};
pub use sandbox::MAX_INSTALL_RECORDS;
pub use sandbox_host::disk::{DiskUsage, DiskUse};
pub use sandbox_runtime::agent::{Package, Progress, RunOutput, Work};
pub use sandbox_runtime::{RuntimeError, Usage};
pub use scope::Scope;
pub use service::{CreateOptions, Fork, Forked, Held, Quota, Sandboxes, Stats, MAX_FORKS};
pub use status::SandboxStatus;
