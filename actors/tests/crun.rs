//! The checks of `checks/mod.rs` (hardening, limits, network isolation,
//! pause, restarts) with every sandbox under crun, a runc-compatible runtime
//! written in C. Skipped where crun is not registered with Docker, unless
//! `SANDBOX_TEST_REQUIRE_CRUN` is set (scripts/test sets it).

mod common;
#[macro_use]
mod checks;

runtime_checks!("crun" if common::runtime_available("crun"));
