//! The templates a server offers (built at its start, see
//! [`sandbox_runtime::template`]) and which template each of its sandboxes
//! was made from, for the runtime to make its container from again.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;
use tracing::{info, warn};
use uuid::Uuid;

use crate::config::EgressPolicy;
use sandbox_host::disk::Sizes;
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
    /// Its build failed at the server's start. Why is the operator's to
    /// read (the log, `template build`): the build's output may name hosts
    /// and steps a tenant has no business seeing.
    #[error("template {name:?} could not be built when the server started, so no sandbox can be made from it; the server's operator finds why in its log")]
    NotBuilt { name: String },
}

impl TemplateError {
    /// The refusal of template `asked`, which echoes at most the length a
    /// template's name can have: the caller chose the rest.
    pub fn unknown(asked: &str) -> Self {
        const ECHOED: usize = 40;
        match asked.char_indices().nth(ECHOED) {
            Some((cut, _)) => Self::Unknown(format!("{}…", &asked[..cut])),
            None => Self::Unknown(asked.to_string()),
        }
    }
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
    /// `key`'s (see [`Template::egress`]).
    pub fn egress(&self, key: Option<EgressPolicy>) -> Option<EgressPolicy> {
        Template::egress(self.config.network, key)
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
    #[serde(skip_serializing_if = "Option::is_none")]
    pub results_mb: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub packages_mb: Option<u64>,
    /// Whether sandboxes can be made from it; `error`: why not, as a
    /// tenant is told, and `detail`, as the operator is.
    pub available: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(skip)]
    pub detail: Option<String>,
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
    /// per build step), each within [`BUILD_DEADLINE`], for sandboxes
    /// whose `/app/results` holds `results_mb` MiB (0: not capped) unless
    /// the template sizes it. A template that cannot be read or built is
    /// kept with its error, and the others are offered all the same.
    pub async fn build(runtime: &dyn ContainerRuntime, configs: &[TemplateConfig], results_mb: u64) -> Self {
        let mut offered = BTreeMap::new();
        // Asked of the engine once, and only when a template names a runtime.
        let registered = match configs.iter().any(|c| c.runtime.is_some()) {
            true => runtime.oci_runtimes().await.map_err(|e| e.to_string()),
            false => Ok(Vec::new()),
        };
        for config in configs {
            let name = config.name.clone();
            let progress = |line: &str| info!(template = %name, "{line}");
            let results_mb = config.results_mb.filter(|_| results_mb > 0).unwrap_or(results_mb);
            let built = tokio::time::timeout(
                BUILD_DEADLINE,
                build_one(runtime, config, results_mb, &registered, &progress),
            )
            .await
            .unwrap_or_else(|_| {
                Err(format!(
                    "its build did not end within {} minutes",
                    BUILD_DEADLINE.as_secs() / 60
                ))
            });
            let built = match built {
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
            Some(Err(_)) => Err(TemplateError::NotBuilt { name: name.into() }),
            None => Err(TemplateError::unknown(name)),
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
                let (config, files, detail, image, built_now) = match o {
                    Ok(o) => (
                        &o.config,
                        o.files.iter().filter(|f| f.bytes.is_some()).count(),
                        None,
                        Some(o.template.image.clone()),
                        o.built_now,
                    ),
                    Err((config, why)) => (config, 0, Some(why.clone()), None, false),
                };
                let error = detail
                    .as_ref()
                    .map(|_| "its build failed when the server started".to_string());
                TemplateInfo {
                    name: config.name.clone(),
                    description: config.description.clone(),
                    packages: config.packages.clone(),
                    files,
                    network: config.network,
                    memory_mb: config.memory_mb,
                    cpus: config.cpus,
                    runtime: config.runtime.clone(),
                    results_mb: config.results_mb,
                    packages_mb: config.packages_mb,
                    available: error.is_none(),
                    error,
                    detail,
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
    /// earlier definitions: what the removal of unused images keeps. None
    /// when a template in force could not be built this time: its image of
    /// before may be what the next start finds built again.
    pub fn images_in_use(&self, recorded: impl IntoIterator<Item = String>) -> Option<HashSet<String>> {
        if self.offered.values().any(Result::is_err) {
            return None;
        }
        let mut keep: HashSet<String> = self.built().map(|o| o.template.image.clone()).collect();
        keep.extend(recorded);
        Some(keep)
    }

    /// What a sandbox made from `recorded` is made from again (a revival, a
    /// wake, a restart): the template of that name as it is built now, so
    /// that it runs the current agent and definition, or what it was made
    /// from when the template is no longer offered.
    pub fn current(&self, recorded: &Template) -> Arc<Template> {
        match self.offered.get(&recorded.name) {
            Some(Ok(o)) => o.template.clone(),
            _ => Arc::new(recorded.clone()),
        }
    }
}

/// How long one template's build may take (a step that hangs must not
/// hold the server's start for ever).
pub const BUILD_DEADLINE: Duration = Duration::from_secs(20 * 60);

async fn build_one(
    runtime: &dyn ContainerRuntime,
    config: &TemplateConfig,
    results_mb: u64,
    registered: &Result<Vec<String>, String>,
    progress: &(dyn for<'l> Fn(&'l str) + Send + Sync),
) -> Result<Offered, String> {
    // Up to 64 MiB read from the disk: off the async threads.
    let files = match config.files.clone() {
        Some(dir) => tokio::task::spawn_blocking(move || read_files(&dir))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?,
        None => vec![],
    };
    // Files that do not fit would fail every creation of the template.
    let bytes: u64 = files
        .iter()
        .filter_map(|f| f.bytes.as_ref())
        .map(|b| b.len() as u64)
        .sum();
    if results_mb > 0 && bytes > (results_mb << 20) / 2 {
        return Err(format!(
            "its files ({} MiB) take more than half of /app/results ({results_mb} MiB)",
            bytes.div_ceil(1 << 20)
        ));
    }
    // Every creation would fail on a runtime the engine does not know.
    if let Some(wanted) = &config.runtime {
        let registered = registered.as_ref().map_err(Clone::clone)?;
        if !registered.contains(wanted) {
            return Err(format!(
                "its runtime \"{wanted}\" is not registered with the Docker engine (registered: {}); \
                 register it (scripts/lib-docker.sh does so for runsc and crun) or remove `runtime`",
                registered.join(", ")
            ));
        }
    }
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
            results_mb: config.results_mb,
            packages_mb: config.packages_mb,
            network: config.network,
        }),
        config: definition.config,
        files: definition.files,
        built_now: built,
    })
}

/// The sizes of the disks of a sandbox made from `template`.
pub fn disk_sizes(template: Option<&Template>) -> Sizes {
    Sizes {
        results_mb: template.and_then(|t| t.results_mb),
        packages_mb: template.and_then(|t| t.packages_mb),
    }
}

/// Writes the files of `offered` into a new sandbox's results folder `dir`,
/// owned by the sandbox user (the folder is the sandbox's own new disk:
/// nothing in it yet, so nothing there can redirect a write), on a
/// blocking thread: a template's files are up to 64 MiB, and every
/// creation and refill of the template writes them.
pub async fn place_files(offered: Arc<Offered>, dir: PathBuf) -> std::io::Result<()> {
    tokio::task::spawn_blocking(move || write_files(&offered.files, &dir))
        .await
        .map_err(std::io::Error::other)?
}

fn write_files(files: &[TemplateFile], dir: &Path) -> std::io::Result<()> {
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
