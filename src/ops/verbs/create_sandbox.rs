//! `create_sandbox`: a new sandbox for the caller, within its quota, its
//! creation rate and its budget.

use sandbox_actors::templates::TemplateError;
use sandbox_actors::{CreateOptions, Quota, SandboxError};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::access::caller::Caller;
use crate::ops::error::OpsError;
use crate::ops::results::CreatedSandbox;
use crate::ops::route::Holder;
use crate::ops::Ops;

#[derive(Debug, Default, Serialize, Deserialize, JsonSchema)]
pub struct CreateSandbox {
    /// A name to recognise the sandbox by (optional).
    #[serde(default)]
    #[schemars(with = "String")]
    pub name: Option<String>,
    /// A prepared environment to start from, by its name in list_templates
    /// (optional; without it, the default environment).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "String")]
    pub template: Option<String>,
}

impl Ops {
    pub async fn create_sandbox(&self, caller: &Caller, args: CreateSandbox) -> Result<CreatedSandbox, OpsError> {
        self.metrics
            .observe("create_sandbox", None, async {
                self.check_budget(caller)?;
                let owner = &caller.owner;
                if let Err(wait) = self.limits.check_creation(owner) {
                    return Err(OpsError::RateLimited {
                        message: format!(
                            "too many sandboxes created in the last minute; wait {} s, or reuse one from list_sandboxes",
                            wait.seconds()
                        ),
                        retry_after: wait.seconds(),
                    });
                }
                // A node that takes no connection (killed, within its
                // lease's time) made nothing: the creation goes elsewhere.
                let mut silent = vec![];
                let created = loop {
                    match self.place(&silent).await? {
                        Holder::Here => break self.create_here(caller, args).await?,
                        Holder::Node { name, url } => {
                            match self.forward((&name, &url), "create_sandbox", caller, &args, None).await {
                                Err(OpsError::Unreachable { sent: false, .. }) => silent.push(name),
                                created => break created?,
                            }
                        }
                    }
                };
                tracing::Span::current().record("sandbox_id", tracing::field::display(&created.sandbox_id));
                Ok(created)
            })
            .await
    }

    /// Creates the sandbox on this node (the one placement chose), within
    /// the quotas counted over the cluster, and enters it in the directory.
    pub(crate) async fn create_here(&self, caller: &Caller, args: CreateSandbox) -> Result<CreatedSandbox, OpsError> {
        // The caller's own list first: a refusal costs the cluster nothing.
        let template = self.template_for(caller, args.template)?;
        self.check_cluster_room(caller, 1).await?;
        let options = CreateOptions {
            template,
            ..self.create_options(caller)
        };
        let info = self
            .sandboxes
            .create(&caller.owner, args.name, self.quota(caller), options)
            .await?;
        self.enter_directory(caller, &[info.sandbox_id]).await?;
        Ok(CreatedSandbox::from(info))
    }

    /// The template the caller asked for, when it may use it; one it may
    /// not is refused as one that does not exist, so that a key learns
    /// nothing of the templates of others.
    fn template_for(&self, caller: &Caller, asked: Option<String>) -> Result<Option<String>, OpsError> {
        let Some(name) = asked.map(|t| t.trim().to_string()).filter(|t| !t.is_empty()) else {
            return Ok(None);
        };
        match self.may_use_template(caller, &name) {
            true => Ok(Some(name)),
            false => Err(SandboxError::from(TemplateError::unknown(&name)).into()),
        }
    }

    /// Whether the caller's key (or the guests' tier) lets it use template
    /// `name`.
    pub(crate) fn may_use_template(&self, caller: &Caller, name: &str) -> bool {
        self.limits
            .may_use_template(&caller.owner, caller.expires_at.is_some(), name)
    }

    /// How many sandboxes the caller may hold, and the server in all.
    pub(crate) fn quota(&self, caller: &Caller) -> Quota {
        Quota {
            per_owner: self.limits.max_sandboxes(&caller.owner),
            total: self.limits.max_sandboxes_total(),
        }
    }

    /// A guest's sandboxes end with its key (or the tier's lifetime) and
    /// take the tier's egress policy; a configured key's, its own policy.
    pub(super) fn create_options(&self, caller: &Caller) -> CreateOptions {
        let Some(expires_at) = caller.expires_at else {
            return CreateOptions {
                egress: self.limits.egress(&caller.owner),
                ..Default::default()
            };
        };
        let key_left = expires_at.saturating_sub(crate::access::signer::unix_now()).max(1);
        let guest = self.limits.guest();
        CreateOptions {
            lifetime: Some(std::time::Duration::from_secs(
                key_left.min(guest.sandbox_lifetime_seconds),
            )),
            egress: guest.network,
            template: None,
        }
    }
}
