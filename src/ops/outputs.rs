//! A run's notebook-style outputs as results carry them: the agent's
//! report ([`sandbox_runtime::outputs`]) with a download link for each image.

use sandbox_runtime::outputs::Output as Reported;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::access::artifact_links::ArtifactLinks;

/// One output of a Python run, in the order the run made them.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Output {
    #[serde(flatten)]
    pub output: Reported,
    /// An image's download link.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link: Option<String>,
}

impl Output {
    pub fn all(reported: Vec<Reported>, links: &ArtifactLinks, sandbox: Uuid) -> Vec<Self> {
        reported
            .into_iter()
            .map(|output| Self {
                link: output.path.as_ref().map(|p| links.artifact(sandbox, p)),
                output,
            })
            .collect()
    }
}
