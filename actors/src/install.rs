//! The install-task actor: runs one `uv pip install` in a sandbox, holding
//! the sandbox's link meanwhile (so runs queued after it see the package),
//! then reports the outcome and the venv's packages to the sandbox actor.

use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef};
use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;

use crate::agent::Work;
use crate::config::PackagesConfig;
use crate::link::Link;
use crate::records::{InstallRecord, InstallState};
use crate::sandbox::{Finished, SandboxMsg};

pub struct InstallTask;

pub struct InstallArgs {
    pub link: Link,
    pub package: String,
    pub specs: Vec<String>,
    pub report: ActorRef<SandboxMsg>,
}

/// The installer's command line: options from the server's configuration
/// only, then `--`, then the caller's (validated) requirements.
pub fn install_argv(packages: &PackagesConfig, specs: &[String]) -> Vec<String> {
    let mut argv: Vec<String> = ["uv", "pip", "install", "--python", "/app/.venv/bin/python"]
        .map(String::from)
        .into();
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
        let argv = install_argv(&ctx.settings.packages, &specs);
        let timeout = Duration::from_secs(ctx.settings.sandbox.install_timeout_seconds);
        let ran = link
            .run(&Work::Program(argv), timeout, None, &CancellationToken::new())
            .await;
        let (status, message, output) = match ran {
            Ok(ran) if ran.output.exit_code == 0 => {
                (InstallState::Success, format!("Successfully installed {package}"), None)
            }
            Ok(ran) => {
                let out = ran.output;
                let text = format!("{}{}", out.stderr, out.stdout).trim().to_string();
                let why = if out.timed_out {
                    "timed out".to_string()
                } else {
                    format!("exit code {}", out.exit_code)
                };
                (
                    InstallState::Failed,
                    format!("Failed to install {package} ({why}): {text}"),
                    Some(text),
                )
            }
            Err(e) => (InstallState::Failed, format!("Failed to install {package}: {e}"), None),
        };
        let packages = if status == InstallState::Success {
            Link::packages(&ctx, &link.paths).await.ok()
        } else {
            None
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
