//! The sandbox domain of mcp-sandbox: sandbox actors that own Docker
//! containers, the supervisor that restarts them, the install-task actor, the
//! records of who owns what, and the container runtime. Nothing here knows
//! about HTTP or MCP.
//!
//! # Layout
//!
//! - `service/`: [`Sandboxes`], the face the front end calls; it finds a
//!   sandbox's actor and sends it a message (`mod.rs`); creations and the
//!   quota (`creation.rs`), the file tools and uploads (`files.rs`),
//!   snapshots (`snapshots.rs`), forks, which make new sandboxes from one
//!   (`fork.rs`), and the start-up reconciliation (`reconcile.rs`).
//! - `supervisor`: parent and registry of the sandbox actors.
//! - `sandbox/`: the sandbox actor: its state and upkeep (`mod.rs`), the jobs
//!   it queues and the tasks that run them (`jobs.rs`), snapshot work
//!   (`snapshot.rs`), deletion (`deletion.rs`).
//! - `snapshots/`: the host side of snapshots: their store and bounds
//!   (`mod.rs`), the link-proof copies of a sandbox's folders (`copy.rs`),
//!   and what a fork carries into new sandboxes (`fork.rs`).
//! - `install`: the install-task actor.
//! - `messages`: what the actors send each other; `results`: what they
//!   answer with ([`SandboxInfo`], [`InstallStatus`], [`Uploaded`]).
//! - `link`: one sandbox's connection to its agent, with recovery; `agent`:
//!   the channel to the in-container agent; `spans`: the trace spans of
//!   agent exchanges and engine calls within a call's job.
//! - `pool`: making sandboxes, and keeping some made ahead of demand;
//!   `pool_target`: how many, as demand shows; `pool_yield`: when refills
//!   give way to the first calls of sandboxes just claimed.
//! - `runtime/`: the [`ContainerRuntime`](runtime::ContainerRuntime) trait and
//!   its Docker implementation, with the image build, the disk quotas and
//!   the host firewall; in test builds, an in-memory one (`runtime/fake.rs`)
//!   with a scripted agent, which the engine-free tests in `tests/` use.
//! - `egress/`: the egress proxy; `egress_rules`: allow-lists and the
//!   addresses never reached, read by the configuration check, the proxy and
//!   the firewall.
//! - `records`: the record store; `history`: a sandbox's recent calls.
//! - `usage/`: what each tenant used, by the hour: the meter and this
//!   month's totals (`mod.rs`), their rows in the record store (`store.rs`),
//!   and the sampler that reads every sandbox's counters (`sampler.rs`).
//! - `files/`: file tools on `/app/results` (paths and opening in `mod.rs`,
//!   `list.rs`, `read.rs`); `uploads`: what may be uploaded,
//!   and its packing; `nofollow`: the link-proof lookups both use;
//!   `packages`: accepted package specs.
//! - `config`: the configuration sections and [`Settings`]; `context`: what
//!   every actor shares.
//! - `error`: [`SandboxError`] and the errors it carries; `status`, `scope`,
//!   `labels`, `host`: sandbox states, whose sandboxes a call reaches, Docker
//!   labels, figures about the host.

pub mod agent;
pub mod config;
mod context;
pub mod egress;
mod egress_rules;
mod error;
pub mod files;
mod history;
pub mod host;
mod install;
pub mod labels;
mod link;
mod messages;
mod nofollow;
mod packages;
mod pool;
mod pool_target;
mod pool_yield;
pub mod records;
mod results;
pub mod runtime;
mod sandbox;
mod scope;
mod service;
pub mod snapshots;
mod spans;
mod status;
mod supervisor;
pub mod uploads;
pub mod usage;

#[cfg(test)]
mod tests;

pub use agent::{Package, Progress, RunOutput, Work};
pub use config::{EgressPolicy, Settings};
pub use egress_rules::RuleError;
pub use error::{AgentFailure, DiskError, DockerError, ImageError, Result, SandboxError, StoreError};
pub use history::{CallKind, CallRecord};
pub use host::Resources;
pub use link::Ran;
pub use pool::PoolStats;
pub use results::{InstallStatus, InstallStatusKind, SandboxInfo, Uploaded};
pub use runtime::disk::{DiskUsage, DiskUse};
pub use runtime::Usage;
pub use sandbox::MAX_INSTALL_RECORDS;
pub use scope::Scope;
pub use service::{CreateOptions, Fork, Forked, Quota, Sandboxes, Stats, MAX_FORKS};
pub use status::SandboxStatus;
