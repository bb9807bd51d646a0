//! One file per verb, as mini-redis has one file per command: the verb's
//! arguments (one type, which the MCP tool and the REST route both read;
//! the references they share are in `ops::args`), their checks, and the
//! operation on the domain in the caller's scope, as a method of
//! [`Ops`](super::Ops). Files are named for the MCP tools.

pub mod check_package_installation_status;
pub mod create_sandbox;
pub mod delete_sandbox;
pub mod delete_snapshot;
pub mod execute_python_code;
pub mod execute_terminal_command;
pub mod expose_port;
pub mod fork_sandbox;
pub mod hibernate_sandbox;
pub mod install_package_in_sandbox;
pub mod list_files;
pub mod list_processes;
pub mod list_result_files;
pub mod list_sandboxes;
pub mod list_snapshots;
pub mod list_templates;
pub mod read_file;
pub mod read_process_output;
pub mod reset_python;
pub mod restart_sandbox;
pub mod restore_snapshot;
pub mod send_process_input;
pub mod show_sandboxes;
pub mod snapshot_sandbox;
pub mod start_process;
pub mod stop_process;
pub mod unexpose_port;
pub mod upload_file_to_sandbox;
pub mod view_sandbox;
pub mod write_file;
