//! The templates a server offers (built at its start, see
//! [`sandbox_runtime::template`]) and which template each of its sandboxes
//! was made from, for the runtime to make its container from again.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::{Arc, Mutex};

use serde::Serialize;
use tracing::{info, warn};
use uuid::Uuid;

use crate::config::EgressPolicy;
use sandbox_host::SANDBOX_UID;
use sandbox_runtime::template::{read_files, Definition, Template, TemplateConfig, TemplateFile};
use sandbox_runtime::ContainerRuntime;

/// Why a template cannot be used.
#[derive(Debug, Clone, thiserror::Error)]
pub enum TemplateError {
    /// No such template here (or, as the front end refuses it alike, not
    /// one the caller may use).
    #[error("no template named {0:?} here")]
    Unknown(String),
    /// Its build failed at the server's start; `why` is the build's error.
    #[error("template {name:?} could not be built when the server started, so no sandbox can be made from it: {why}")]
    NotBuilt { name: String, why: String },
}

/// A template whose image is built.
#[derive(Debug)]
pub struct Offered {
    pub config: TemplateConfig,
    /// What its sandboxes are made of.
    pub template: Arc<Template>,
    /// What it places in each new sandbox's `/app/results`.
    pub files: Vec<TemplateFile>,
    /// Its image was built by this start (not found built already).
    pub built_now: bool,
}

impl Offered {
    /// The egress policy of its sandboxes for a caller whose key sets
    /// `key`'s: the key's, but never more than a template without network.
    pub fn egress(&self, key: Option<EgressPolicy>) -> Option<EgressPolicy> {
        match self.config.network {
            Some(EgressPolicy::None) => Some(EgressPolicy::None),
            template => key.or(template),
        }
    }
}

/// A template as `list_templates` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct TemplateInfo {
    pub name: String,
    pub description: String,
    pub packages: Vec<String>,
    /// Files it places in `/app/results`.
    pub files: usize,
    /// Its overrides of the server's settings (absent: the server's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub network: Option<EgressPolicy>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_mb: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpus: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runtime: Option<String>,
    /// Whether sandboxes can be made from it; `error`: why not.
    pub available: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Its image, and whether this start built it (for the operator).
    #[serde(skip)]
    pub image: Option<String>,
    #[serde(skip)]
    pub built_now: bool,
}

/// The templates in force, built or with why not, and the template of
/// each sandbox made from one.
#[derive(Default)]
pub struct Templates {
    offered: BTreeMap<String, Result<Arc<Offered>, (TemplateConfig, String)>>,
    of: Mutex<HashMap<Uuid, Arc<Template>>>,
}

impl Templates {
    /// Builds each of `configs` whose image is missing (a line in the log
    /// per build step). A template that cannot be read or built is kept
    /// with its error, and the others are offered all the same.
    pub async fn build(runtime: &dyn ContainerRuntime, configs: &[TemplateConfig]) -> Self {
        let mut offered = BTreeMap::new();
        for config in configs {
            let name = config.name.clone();
            let progress = |line: &str| info!(template = %name, "{line}");
            let built = match build_one(runtime, config, &progress).await {
                Ok(o) => Ok(Arc::new(o)),
                Err(why) => {
                    warn!(template = %name, error = %why, "template not built; the server offers the others");
                    Err((config.clone(), why))
                }
            };
            offered.insert(name, built);
        }
        Self {
            offered,
            of: Mutex::default(),
        }
    }

    /// The built template `name`.
    pub fn get(&self, name: &str) -> Result<Arc<Offered>, TemplateError> {
        match self.offered.get(name) {
            Some(Ok(o)) => Ok(o.clone()),
            Some(Err((_, why))) => Err(TemplateError::NotBuilt {
                name: name.into(),
                why: why.clone(),
            }),
            None => Err(TemplateError::Unknown(name.into())),
        }
    }

    /// The built templates.
    pub fn built(&self) -> impl Iterator<Item = &Arc<Offered>> {
        self.offered.values().filter_map(|o| o.as_ref().ok())
    }

    /// Every template in force, by name, as `list_templates` shows it.
    pub fn list(&self) -> Vec<TemplateInfo> {
        self.offered
            .values()
            .map(|o| {
                let (config, files, error, image, built_now) = match o {
                    Ok(o) => (
                        &o.config,
                        o.files.iter().filter(|f| f.bytes.is_some()).count(),
                        None,
                        Some(o.template.image.clone()),
                        o.built_now,
                    ),
                    Err((config, why)) => (config, 0, Some(why.clone()), None, false),
                };
                TemplateInfo {
                    name: config.name.clone(),
                    description: config.description.clone(),
                    packages: config.packages.clone(),
                    files,
                    network: config.network,
                    memory_mb: config.memory_mb,
                    cpus: config.cpus,
                    runtime: config.runtime.clone(),
                    available: error.is_none(),
                    error,
                    image,
                    built_now,
                }
            })
            .collect()
    }

    /// Notes that sandbox `id` is made from `template`.
    pub fn attach(&self, id: Uuid, template: Option<Arc<Template>>) {
        let mut of = self.of.lock().expect("templates lock");
        match template {
            Some(t) => of.insert(id, t),
            None => of.remove(&id),
        };
    }

    pub fn detach(&self, id: Uuid) {
        self.of.lock().expect("templates lock").remove(&id);
    }

    /// The template sandbox `id` is made from, if any.
    pub fn of(&self, id: Uuid) -> Option<Arc<Template>> {
        self.of.lock().expect("templates lock").get(&id).cloned()
    }

    /// The images of the templates in force and of the sandboxes made from
    /// earlier definitions: what the removal of unused images keeps.
    pub fn images_in_use(&self, recorded: impl IntoIterator<Item = String>) -> HashSet<String> {
        let mut keep: HashSet<String> = self.built().map(|o| o.template.image.clone()).collect();
        keep.extend(recorded);
        keep
    }
}

async fn build_one(
    runtime: &dyn ContainerRuntime,
    config: &TemplateConfig,
    progress: &(dyn for<'l> Fn(&'l str) + Send + Sync),
) -> Result<Offered, String> {
    let files = match &config.files {
        Some(dir) => read_files(dir).map_err(|e| e.to_string())?,
        None => vec![],
    };
    let definition = Definition {
        config: config.clone(),
        files,
    };
    let (image, built) = runtime
        .ensure_template(&definition, progress)
        .await
        .map_err(|e| e.to_string())?;
    info!(template = %config.name, %image, built, "template ready");
    Ok(Offered {
        template: Arc::new(Template {
            name: config.name.clone(),
            image,
            memory_mb: config.memory_mb,
            cpus: config.cpus,
            runtime: config.runtime.clone(),
        }),
        config: definition.config,
        files: definition.files,
        built_now: built,
    })
}

/// Writes `files` into a new sandbox's results folder `dir`, owned by the
/// sandbox user (the folder is the sandbox's own new disk: nothing in it
/// yet, so nothing there can redirect a write).
pub fn place_files(files: &[TemplateFile], dir: &Path) -> std::io::Result<()> {
    for f in files {
        let path = dir.join(&f.path);
        match &f.bytes {
            None => std::fs::create_dir_all(&path)?,
            Some(bytes) => {
                std::fs::write(&path, bytes)?;
                let mode = if f.executable { 0o755 } else { 0o644 };
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))?;
            }
        }
        if let Err(e) = std::os::unix::fs::lchown(&path, Some(SANDBOX_UID), Some(SANDBOX_UID)) {
            if e.kind() != std::io::ErrorKind::PermissionDenied {
                return Err(e);
            }
        }
    }
    Ok(())
}
