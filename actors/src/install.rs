//! The install-task actor: runs one `uv pip install` for a sandbox, holding
//! the sandbox's link meanwhile (so runs queued after it see the package),
//! then reports the outcome and the venv's packages to the sandbox actor.
//!
//! A sandbox whose egress policy reaches the package index (`open`,
//! `packages`, an allow-list holding the index hosts) installs in itself,
//! through the egress proxy when proxied. Any other gets a short-lived
//! installer container instead: the same trusted image on the server's
//! network, the sandbox's package volume mounted, and the image's own
//! interpreter as uv's target, so nothing from the sandbox-writable volume
//! runs while the network is there.

use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef};
use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;

use crate::agent::Work;
use crate::config::PackagesConfig;
use crate::error::Result;
use crate::link::Link;
use crate::records::{InstallRecord, InstallState};
use crate::sandbox::{Finished, SandboxMsg};

/// The image's uv environment, on the read-only root (docker/Dockerfile).
const TRUSTED_PYTHON: &str = "/opt/uv/bin/python";
const VENV: &str = "/app/.venv";

pub struct InstallTask;

pub struct InstallArgs {
    pub link: Link,
    pub package: String,
    pub specs: Vec<String>,
    pub report: ActorRef<SandboxMsg>,
}

/// Where uv installs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// Inside the sandbox, into its venv.
    Sandbox,
    /// From an installer container, into the mounted venv as a prefix.
    Installer,
}

/// The installer's command line: options from the server's configuration
/// only, then `--`, then the caller's (validated) requirements.
pub fn install_argv(packages: &PackagesConfig, specs: &[String], target: Target) -> Vec<String> {
    let mut argv: Vec<String> = match target {
        Target::Sandbox => ["uv", "pip", "install", "--python", "/app/.venv/bin/python"]
            .map(String::from)
            .into(),
        Target::Installer => ["uv", "pip", "install", "--python", TRUSTED_PYTHON, "--prefix", VENV]
            .map(String::from)
            .into(),
    };
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

async fn install_in_sandbox(link: &mut Link, argv: Vec<String>, timeout: Duration) -> Result<Outcome> {
    let ran = link
        .run(&Work::Program(argv), timeout, None, &CancellationToken::new())
        .await?;
    let o = ran.output;
    Ok((o.exit_code, format!("{}{}", o.stderr, o.stdout), o.timed_out))
}

async fn install_with_installer(link: &mut Link, argv: Vec<String>, timeout: Duration) -> Result<Outcome> {
    let ctx = link.ctx().clone();
    let done = ctx
        .runtime
        .run_installer(&link.paths, &link.volume, argv, timeout)
        .await?;
    if done.exit_code == 0 {
        // Scripts were written for the installer's interpreter: point them
        // at the sandbox's own (this runs in the sandbox, as its user).
        let fix =
            format!("sed -i '1s|^#!{TRUSTED_PYTHON}[0-9.]*$|#!{VENV}/bin/python|' {VENV}/bin/* 2>/dev/null; true");
        let argv = vec!["sh".into(), "-c".into(), fix];
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
            package,
            specs,
            report,
        }) = state.take()
        else {
            return Ok(());
        };
        let ctx = link.ctx().clone();
        let started_at = OffsetDateTime::now_utc();
        let timeout = Duration::from_secs(ctx.settings.sandbox.install_timeout_seconds);
        let outcome = match ctx.egress.installs_in_sandbox(link.paths.id) {
            true => {
                install_in_sandbox(
                    &mut link,
                    install_argv(&ctx.settings.packages, &specs, Target::Sandbox),
                    timeout,
                )
                .await
            }
            false => {
                install_with_installer(
                    &mut link,
                    install_argv(&ctx.settings.packages, &specs, Target::Installer),
                    timeout,
                )
                .await
            }
        };
        let (status, message, output) = match outcome {
            Ok((0, _, _)) => (InstallState::Success, format!("Successfully installed {package}"), None),
            Ok((code, text, timed_out)) => {
                let text = text.trim().to_string();
                let why = if timed_out {
                    "timed out".to_string()
                } else {
                    format!("exit code {code}")
                };
                (
                    InstallState::Failed,
                    format!("Failed to install {package} ({why}): {text}"),
                    Some(text),
                )
            }
            Err(e) => (InstallState::Failed, format!("Failed to install {package}: {e}"), None),
        };
        let packages = match status {
            InstallState::Success => Link::packages(&ctx, &link.paths).await.ok(),
            _ => None,
        };
        let record = InstallRecord {
            package,
            status,
            message,
            output,
            started_at,
            finished_at: Some(OffsetDateTime::now_utc()),
        };
        let _ = report.send_message(SandboxMsg::Done(Box::new(Finished::install(link, record, packages))));
        myself.stop(None);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caller_specs_come_after_the_options_end() {
        let packages = PackagesConfig {
            index_url: Some("https://mirror/simple".into()),
            ..Default::default()
        };
        let argv = install_argv(&packages, &["six".into()], Target::Installer);
        let dashdash = argv.iter().position(|a| a == "--").unwrap();
        assert_eq!(&argv[dashdash + 1..], ["six"]);
        assert!(
            argv[..dashdash].contains(&"--prefix".to_string())
                && argv[..dashdash].contains(&TRUSTED_PYTHON.to_string())
        );
        assert!(argv.windows(2).any(|w| w == ["--index-url", "https://mirror/simple"]));
    }
}
