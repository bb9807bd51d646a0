//! The install-task actor: runs one `uv pip install` for a sandbox, holding
//! the sandbox's link meanwhile (so runs queued after it see the package),
//! then reports the outcome and the venv's packages to the sandbox actor.
//!
//! A sandbox whose egress policy reaches the package index (`open`,
//! `packages`, an allow-list holding the index hosts) installs in itself,
//! through the egress proxy when proxied. Any other gets a short-lived
//! installer container instead: the same trusted image on the server's
//! network (under its firewall rules), the sandbox's package volume
//! mounted, and the image's own uv and interpreter, by absolute path and
//! with an environment set by the server alone, so nothing from the
//! sandbox-writable volume runs while the network is there. Such installs
//! take wheels only (no build code runs), unless
//! `packages.allow_source_builds` says otherwise.

use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::agent_connection::AgentConnection;
use crate::config::PackagesConfig;
use crate::error::Result;
use crate::messages::{Finished, SandboxMsg};
use crate::moment;
use crate::records::{InstallRecord, InstallState};
use crate::usage::Totals;
use sandbox_runtime::agent::Work;

/// The image's uv environment, on the read-only root (docker/Dockerfile).
pub const TRUSTED_UV: &str = "/opt/uv/bin/uv";
pub const TRUSTED_PYTHON: &str = "/opt/uv/bin/python";
const VENV: &str = "/app/.venv";
/// Bytes of the installer's output kept (its end, where the error is).
const MAX_OUTPUT: usize = 16 * 1024;
/// What an offline install prints when a package has no wheel.
const NO_WHEEL_SIGNS: [&str; 3] = ["no-build", "has no usable wheels", "no binary distribution"];

pub struct InstallTask;

pub struct InstallArgs {
    pub link: AgentConnection,
    /// The sandbox's tenant, billed for an installer container's use.
    pub owner: String,
    pub package: String,
    pub specs: Vec<String>,
    pub report: ActorRef<SandboxMsg>,
    /// The install's job span, in the trace of the call that asked for it.
    pub span: tracing::Span,
}

/// Where uv installs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InstallTarget {
    /// Inside the sandbox, into its venv.
    Sandbox,
    /// From an installer container, into the mounted venv as a prefix.
    Installer,
}

/// The installer's command line: options from the server's configuration
/// only, then `--`, then the caller's (validated) requirements.
pub fn install_argv(packages: &PackagesConfig, specs: &[String], target: InstallTarget) -> Vec<String> {
    let mut argv: Vec<String> = match target {
        InstallTarget::Sandbox => [TRUSTED_UV, "pip", "install", "--python", "/app/.venv/bin/python"]
            .map(String::from)
            .into(),
        InstallTarget::Installer => [
            TRUSTED_UV,
            "pip",
            "install",
            "--python",
            TRUSTED_PYTHON,
            "--prefix",
            VENV,
        ]
        .map(String::from)
        .into(),
    };
    if target == InstallTarget::Installer && !packages.allow_source_builds {
        argv.push("--no-build".into());
    }
    if let Some(url) = &packages.index_url {
        argv.extend(["--index-url".into(), url.clone()]);
    }
    if let Some(url) = &packages.extra_index_url {
        argv.extend(["--extra-index-url".into(), url.clone()]);
    }
    argv.push("--".into());
    argv.extend(specs.iter().cloned());
    argv
}

/// (exit code, installer output, timed out)
type Outcome = (i64, String, bool);

async fn install_in_sandbox(link: &mut AgentConnection, argv: Vec<String>, timeout: Duration) -> Result<Outcome> {
    let ran = link
        .run(&Work::Program(argv), timeout, None, &CancellationToken::new())
        .await?;
    let o = ran.output;
    Ok((o.exit_code, format!("{}{}", o.stderr, o.stdout), o.timed_out))
}

/// Installs through an installer container, whose CPU and bytes are billed
/// to `owner` as its sandbox's would be.
async fn install_with_installer(
    link: &mut AgentConnection,
    owner: &str,
    argv: Vec<String>,
    timeout: Duration,
) -> Result<Outcome> {
    let ctx = link.ctx().clone();
    let done = ctx
        .runtime
        .run_installer(&link.paths, &link.volume, argv, timeout)
        .await?;
    let used = Totals {
        cpu_seconds: done.usage.cpu_seconds,
        egress_bytes: done.usage.network_bytes.unwrap_or(0),
        ..Totals::default()
    };
    if used != Totals::default() {
        ctx.meter.add(owner, moment::now(), &used);
    }
    if done.exit_code == 0 {
        // Scripts were written for the installer's interpreter: point them
        // at the sandbox's own (this runs in the sandbox, as its user).
        let fix =
            format!("/bin/sed -i '1s|^#!{TRUSTED_PYTHON}[0-9.]*$|#!{VENV}/bin/python|' {VENV}/bin/* 2>/dev/null; true");
        let argv = vec!["/bin/sh".into(), "-c".into(), fix];
        link.run(
            &Work::Program(argv),
            Duration::from_secs(60),
            None,
            &CancellationToken::new(),
        )
        .await?;
    }
    Ok((done.exit_code, done.output, done.timed_out))
}

impl Actor for InstallTask {
    type Msg = ();
    type State = Option<InstallArgs>;
    type Arguments = InstallArgs;

    async fn pre_start(&self, myself: ActorRef<()>, args: InstallArgs) -> Result<Self::State, ActorProcessingErr> {
        myself.cast(())?;
        Ok(Some(args))
    }

    async fn handle(&self, myself: ActorRef<()>, _: (), state: &mut Self::State) -> Result<(), ActorProcessingErr> {
        let Some(InstallArgs {
            mut link,
            owner,
            package,
            specs,
            report,
            span,
        }) = state.take()
        else {
            return Ok(());
        };
        let ctx = link.ctx().clone();
        let started_at = moment::now();
        let timeout = Duration::from_secs(ctx.settings.sandbox.install_timeout_seconds);
        let in_sandbox = ctx.egress.installs_in_sandbox(link.paths.id);
        let outcome = match in_sandbox {
            true => {
                let argv = install_argv(&ctx.settings.packages, &specs, InstallTarget::Sandbox);
                install_in_sandbox(&mut link, argv, timeout).instrument(span).await
            }
            false => {
                let argv = install_argv(&ctx.settings.packages, &specs, InstallTarget::Installer);
                install_with_installer(&mut link, &owner, argv, timeout)
                    .instrument(span)
                    .await
            }
        };
        let offline = !in_sandbox;
        let (status, message, output) = match outcome {
            Ok((0, _, _)) => (InstallState::Success, format!("Successfully installed {package}"), None),
            Ok((code, text, timed_out)) => {
                let text = tail(text.trim(), MAX_OUTPUT);
                let why = if timed_out {
                    "timed out".to_string()
                } else {
                    format!("exit code {code}")
                };
                let mut message =
                    format!("Failed to install {package} ({why}); the installer's output is in `output`.");
                if offline
                    && !ctx.settings.packages.allow_source_builds
                    && NO_WHEEL_SIGNS.iter().any(|s| text.contains(s))
                {
                    message.push_str(
                        " This server installs only wheels into sandboxes without network, and a package here has no wheel \
                         for this platform: install a version that has one, or ask the operator to set \
                         packages.allow_source_builds = true.",
                    );
                }
                (InstallState::Failed, message, Some(text))
            }
            Err(e) => (InstallState::Failed, format!("Failed to install {package}: {e}"), None),
        };
        let packages = match status {
            InstallState::Success => match AgentConnection::packages(&ctx, link.paths.id).await {
                Ok(list) => Some(list),
                Err(e) => {
                    if let crate::error::SandboxError::Unresponsive { .. } = e {
                        let _ = report.cast(SandboxMsg::Unhealthy);
                    }
                    None
                }
            },
            _ => None,
        };
        let record = InstallRecord {
            package,
            status,
            message,
            output,
            started_at,
            finished_at: Some(moment::now()),
        };
        let _ = report.send_message(SandboxMsg::Done(Box::new(Finished::install(link, record, packages))));
        myself.stop(None);
        Ok(())
    }
}

/// The last `max` bytes of `text` (on a character boundary).
fn tail(text: &str, max: usize) -> String {
    let mut start = text.len().saturating_sub(max);
    while !text.is_char_boundary(start) {
        start += 1;
    }
    text[start..].to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_is_cut_to_its_end_on_a_character_boundary() {
        let text = format!("{}é-the error", "x".repeat(100));
        let cut = tail(&text, 11);
        assert_eq!(cut, "-the error");
        assert_eq!(tail("short", 100), "short");
    }

    #[test]
    fn caller_specs_come_after_the_options_end() {
        let packages = PackagesConfig {
            index_url: Some("https://mirror/simple".into()),
            ..Default::default()
        };
        let argv = install_argv(&packages, &["six".into()], InstallTarget::Installer);
        assert_eq!(
            argv[0], TRUSTED_UV,
            "the image's own uv, never one found on a search path"
        );
        assert!(
            argv.contains(&"--no-build".to_string()),
            "offline installs take wheels only"
        );
        let sandbox = install_argv(&packages, &["six".into()], InstallTarget::Sandbox);
        assert_eq!(sandbox[0], TRUSTED_UV);
        assert!(!sandbox.contains(&"--no-build".to_string()));
        let builds = PackagesConfig {
            allow_source_builds: true,
            ..Default::default()
        };
        assert!(!install_argv(&builds, &["six".into()], InstallTarget::Installer).contains(&"--no-build".to_string()));
        let dashdash = argv.iter().position(|a| a == "--").unwrap();
        assert_eq!(&argv[dashdash + 1..], ["six"]);
        assert!(
            argv[..dashdash].contains(&"--prefix".to_string())
                && argv[..dashdash].contains(&TRUSTED_PYTHON.to_string())
        );
        assert!(argv.windows(2).any(|w| w == ["--index-url", "https://mirror/simple"]));
    }
}
