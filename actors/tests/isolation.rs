//! What the container runtime enforces, under runc (Docker's default): the
//! checks of `checks/mod.rs`, which `crun.rs` runs under crun.

mod common;
#[macro_use]
mod checks;

runtime_checks!("runc");
