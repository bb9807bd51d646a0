//! Configuration: `config.toml` (every key optional), then environment
//! variables `MCP_SANDBOX_<SECTION>_<KEY>`, then command-line flags. A bad
//! value stops the server with a message naming the key.

use std::net::IpAddr;
use std::path::{Component, Path, PathBuf};

use sandbox_actors::config::{
    PackagesConfig, PoolConfig, ProcessesConfig, SandboxConfig, TemplateConfig, UploadsConfig, UsageConfig,
};
use sandbox_actors::Settings;
use serde::Deserialize;

use crate::access::auth::{AuthConfig, Keys, KeysError};
use crate::access::client_ip::{ClientAddresses, ForwardedHeader, NotANetwork};
use crate::access::guest::{GuestConfig, GuestError};
use crate::access::limits::{LimitsConfig, LimitsError};
use crate::mcp::tasks::{TasksConfig, TasksConfigError};
use crate::ops::inline_images::Budgets;
use crate::telemetry::{TelemetryConfig, TelemetryError};
use sandbox_cluster::ClusterConfig;

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub server: ServerConfig,
    pub sandbox: SandboxConfig,
    pub packages: PackagesConfig,
    pub uploads: UploadsConfig,
    pub results: ResultsConfig,
    pub auth: AuthConfig,
    pub limits: LimitsConfig,
    pub pool: PoolConfig,
    pub guest: GuestConfig,
    pub tasks: TasksConfig,
    pub usage: UsageConfig,
    pub processes: ProcessesConfig,
    pub preview: PreviewConfig,
    pub telemetry: TelemetryConfig,
    /// Several servers as one, through etcd (see docs/cluster.md); absent:
    /// a single host.
    pub cluster: Option<ClusterConfig>,
    /// `[[templates]]`: prepared environments sandboxes may start from
    /// (see docs/templates.md).
    pub templates: Vec<TemplateConfig>,
}

/// `[server]`
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    pub host: IpAddr,
    pub port: u16,
    /// Base of artifact links; defaults to `http://{host}:{port}`.
    pub public_url: Option<String>,
    /// Origins allowed to call the HTTP endpoints from a browser; requests
    /// with any other `Origin` get 403 (DNS-rebinding protection).
    pub allowed_origins: Vec<String>,
    /// Records, agent sockets and other server state.
    pub state_dir: PathBuf,
    /// Proxies (addresses or CIDR networks) whose forwarding header names
    /// the client; nobody else's are read.
    pub trusted_proxies: Vec<String>,
    /// The one header trusted proxies name the client in
    /// (`x-forwarded-for`, `forwarded` or `x-real-ip`); the others are ignored.
    pub forwarded_header: ForwardedHeader,
    /// Host names (`Host` header) served besides the public URL's, IP
    /// literals and `localhost`; others get 403 (DNS-rebinding protection).
    pub allowed_hosts: Vec<String>,
    /// Preview links are served at `http(s)://{label}.{preview_domain}`,
    /// one host name per sandbox and port (wildcard DNS to the server):
    /// each preview is an origin of its own. See docs/previews.md.
    pub preview_domain: Option<String>,
    /// A listener of its own for preview links (on `host`), for a server
    /// without a preview domain: the previews' origin is then not the
    /// server's, though previews share it with each other.
    pub preview_port: Option<u16>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            host: IpAddr::from([127, 0, 0, 1]),
            port: 8181,
            public_url: None,
            allowed_origins: vec![],
            state_dir: PathBuf::from("state"),
            trusted_proxies: vec![],
            forwarded_header: ForwardedHeader::default(),
            allowed_hosts: vec![],
            preview_domain: None,
            preview_port: None,
        }
    }
}

/// `[preview]`: the caps of preview links (see docs/previews.md); where
/// they are served is `server.preview_domain` or `server.preview_port`.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PreviewConfig {
    /// Open preview connections to one sandbox (1 to 1024).
    pub max_connections_per_sandbox: usize,
    /// Bytes both ways through one sandbox's previews, per minute, in MB.
    pub mb_per_minute: u64,
    /// Largest request body sent to a preview, in MB.
    pub max_request_mb: u64,
    /// How long a preview may take to begin its answer (1 to 600 s).
    pub response_timeout_seconds: u64,
    /// A preview connection with no byte either way for this long is
    /// closed (1 to 3600 s).
    pub idle_timeout_seconds: u64,
}

impl Default for PreviewConfig {
    fn default() -> Self {
        Self {
            max_connections_per_sandbox: 64,
            mb_per_minute: 6000,
            max_request_mb: 32,
            response_timeout_seconds: 60,
            idle_timeout_seconds: 300,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum InvalidPreview {
    #[error("preview.{0}: {1}")]
    Range(&'static str, &'static str),
    #[error("server.preview_domain: a DNS name such as preview.example.com, not {0:?}")]
    Domain(String),
    #[error("server.preview_port: a port other than server.port ({0})")]
    Port(u16),
}

impl PreviewConfig {
    /// Checks what serde cannot, with `[server]`'s preview keys.
    pub fn validate(&self, server: &ServerConfig) -> Result<(), InvalidPreview> {
        let ranges = [
            (
                "max_connections_per_sandbox",
                self.max_connections_per_sandbox as u64,
                1,
                1024,
                "from 1 to 1024",
            ),
            ("mb_per_minute", self.mb_per_minute, 1, 1 << 20, "from 1 to 1048576"),
            ("max_request_mb", self.max_request_mb, 1, 4096, "from 1 to 4096"),
            (
                "response_timeout_seconds",
                self.response_timeout_seconds,
                1,
                600,
                "from 1 to 600",
            ),
            (
                "idle_timeout_seconds",
                self.idle_timeout_seconds,
                1,
                3600,
                "from 1 to 3600",
            ),
        ];
        if let Some((key, .., why)) = ranges.iter().find(|(_, v, lo, hi, _)| !(lo..=hi).contains(&v)) {
            return Err(InvalidPreview::Range(key, why));
        }
        if let Some(domain) = &server.preview_domain {
            let label_ok = |l: &str| {
                !l.is_empty()
                    && l.len() <= 63
                    && l.bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            };
            if domain.len() > 180 || !domain.split('.').all(label_ok) {
                return Err(InvalidPreview::Domain(domain.clone()));
            }
        }
        if server.preview_port == Some(server.port) || server.preview_port == Some(0) {
            return Err(InvalidPreview::Port(server.port));
        }
        Ok(())
    }
}

/// `[results]`
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ResultsConfig {
    /// Host folder holding each sandbox's `/app/results`.
    pub dir: PathBuf,
    /// Images a run creates or changes come back in its MCP result as
    /// `image` items, so that a multimodal model sees its plots.
    pub inline_images: bool,
    /// Largest inline image, in bytes of the encoded image (base64 adds a
    /// third); larger ones are downscaled until they fit.
    pub inline_image_max_bytes: usize,
    /// All inline images of one result together, in the same bytes.
    pub inline_result_max_bytes: usize,
    /// Most inline images in one result (the newest are shown).
    pub inline_images_per_result: usize,
}

impl Default for ResultsConfig {
    fn default() -> Self {
        Self {
            dir: PathBuf::from("results"),
            inline_images: true,
            inline_image_max_bytes: 64 * 1024,
            inline_result_max_bytes: 192 * 1024,
            inline_images_per_result: 3,
        }
    }
}

/// Bounds of the inline-image keys: clients and model APIs refuse images
/// of more than a few MB, and a result of many images floods the context.
const INLINE_IMAGE_BYTES: std::ops::RangeInclusive<usize> = 1024..=(4 << 20);
const INLINE_RESULT_MAX_BYTES: usize = 16 << 20;
const INLINE_IMAGES_PER_RESULT: std::ops::RangeInclusive<usize> = 1..=16;

impl ResultsConfig {
    /// What may be shown inline.
    pub fn inline_budgets(&self) -> Budgets {
        Budgets {
            enabled: self.inline_images,
            max_bytes: self.inline_image_max_bytes,
            result_max_bytes: self.inline_result_max_bytes,
            per_result: self.inline_images_per_result,
        }
    }

    fn validate(&self) -> Result<(), ConfigError> {
        if !INLINE_IMAGE_BYTES.contains(&self.inline_image_max_bytes) {
            return Err(ConfigError::InlineImageBytes);
        }
        if !(self.inline_image_max_bytes..=INLINE_RESULT_MAX_BYTES).contains(&self.inline_result_max_bytes) {
            return Err(ConfigError::InlineResultBytes {
                image_kib: self.inline_image_max_bytes / 1024,
            });
        }
        if !INLINE_IMAGES_PER_RESULT.contains(&self.inline_images_per_result) {
            return Err(ConfigError::InlineImagesPerResult);
        }
        Ok(())
    }
}

const SECTIONS: [&str; 15] = [
    "server",
    "processes",
    "preview",
    "sandbox",
    "packages",
    "uploads",
    "results",
    "auth",
    "limits",
    "pool",
    "guest",
    "tasks",
    "usage",
    "telemetry",
    "cluster",
];
const ENV_PREFIX: &str = "MCP_SANDBOX_";
/// Variables of the prefix that are no settings: the API key that
/// `stdio --connect` presents to a running server.
const NOT_SETTINGS: &[&str] = &["MCP_SANDBOX_KEY"];
/// Keys with an earlier name that is still accepted: (section, old, new).
/// A variable under the old name sets the new key, whatever the file used.
const RENAMED: [(&str, &str, &str); 1] = [("pool", "size", "min")];

/// The current name of `key` in `section`.
fn current_key<'a>(section: &str, key: &'a str) -> &'a str {
    RENAMED
        .iter()
        .find(|(s, old, _)| *s == section && *old == key)
        .map_or(key, |(_, _, new)| new)
}

/// Why the configuration cannot be used; the message names the file or
/// variable, and the key.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("reading {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    /// Not TOML, or a value of the wrong type or an unknown key; `from` is
    /// the file (or "defaults").
    #[error("{from}: {source}")]
    Toml { from: String, source: toml::de::Error },
    #[error("{0}: no configuration section matches (sections: {sections})", sections = SECTIONS.join(", "))]
    UnknownSection(String),
    #[error("[{0}] must be a table")]
    NotATable(&'static str),
    /// A `[sandbox]` or `[packages]` value, as the sandbox domain checks it.
    #[error(transparent)]
    Sandbox(#[from] sandbox_actors::config::InvalidConfig),
    #[error(transparent)]
    Limits(#[from] LimitsError),
    /// A `[[templates]]` entry, or an allow-list of them, is wrong; the
    /// message names the key.
    #[error("{0}")]
    Templates(String),
    #[error(transparent)]
    Tasks(#[from] TasksConfigError),
    #[error(transparent)]
    Keys(#[from] KeysError),
    #[error(transparent)]
    Guest(#[from] GuestError),
    #[error(transparent)]
    Telemetry(#[from] TelemetryError),
    #[error(transparent)]
    Cluster(#[from] sandbox_cluster::config::InvalidCluster),
    #[error(transparent)]
    Preview(#[from] InvalidPreview),
    #[error(transparent)]
    TrustedProxies(#[from] NotANetwork),
    #[error(
        "results.inline_image_max_bytes: from {} to {} (1 KiB to 4 MiB)",
        INLINE_IMAGE_BYTES.start(),
        INLINE_IMAGE_BYTES.end()
    )]
    InlineImageBytes,
    #[error(
        "results.inline_result_max_bytes: at least results.inline_image_max_bytes ({image_kib} KiB) and at most {} KiB",
        INLINE_RESULT_MAX_BYTES / 1024
    )]
    InlineResultBytes { image_kib: usize },
    #[error(
        "results.inline_images_per_result: from {} to {}",
        INLINE_IMAGES_PER_RESULT.start(),
        INLINE_IMAGES_PER_RESULT.end()
    )]
    InlineImagesPerResult,
    #[error("server.allowed_hosts: {0:?} is not a host name")]
    AllowedHost(String),
    #[error("server.public_url: an http(s) URL, not {0:?}")]
    PublicUrl(String),
    #[error("uploads.max_upload_mb: from 1 to {0}")]
    MaxUpload(u64),
    #[error("uploads.allowed_dirs: {} is not an absolute path", .0.display())]
    UploadDir(PathBuf),
    /// An upload folder that is, holds or lies inside the results or state
    /// folder would let any tenant copy every tenant's files, or the
    /// server's records and link secret, into a sandbox of its own.
    #[error(
        "uploads.allowed_dirs: {} {relation} {key} ({}); uploads from it could copy other tenants' files or the server's own state into a sandbox: use a folder apart from both",
        dir.display(),
        other.display()
    )]
    UploadDirOverlap {
        dir: PathBuf,
        relation: &'static str,
        key: &'static str,
        other: PathBuf,
    },
}

impl Config {
    /// The egress proxy connections each sandbox may hold:
    /// `sandbox.egress_max_connections` when some policy in force (the
    /// server's, a key's or the guests') sends sandboxes through the proxy,
    /// and none when every policy is `open`, so that the open-file budget
    /// of a server whose proxy serves nobody does not count it.
    pub fn proxied_connections_per_sandbox(&self) -> usize {
        let keys = self.auth.keys.iter().filter_map(|k| k.egress);
        let guests = self.guest.enabled.then_some(self.guest.network).flatten();
        let templates = self.templates.iter().filter_map(|t| t.network);
        let mut policies = std::iter::once(self.sandbox.network)
            .chain(keys)
            .chain(guests)
            .chain(templates);
        match policies.any(sandbox_actors::EgressPolicy::is_proxied) {
            true => self.sandbox.egress_max_connections,
            false => 0,
        }
    }

    /// Loads `path` (a missing file means the defaults; a file named on the
    /// command line must exist) and applies `MCP_SANDBOX_*` variables.
    pub fn load(path: Option<&Path>, env: impl Iterator<Item = (String, String)>) -> Result<Self, ConfigError> {
        let (text, source) = match path {
            Some(p) => (
                std::fs::read_to_string(p).map_err(|e| ConfigError::Read {
                    path: p.into(),
                    source: e,
                })?,
                p.display().to_string(),
            ),
            None => match std::fs::read_to_string("config.toml") {
                Ok(t) => (t, "config.toml".to_string()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => (String::new(), "defaults".to_string()),
                Err(e) => {
                    return Err(ConfigError::Read {
                        path: "config.toml".into(),
                        source: e,
                    })
                }
            },
        };
        let bad_toml = |e: toml::de::Error| ConfigError::Toml {
            from: source.clone(),
            source: e,
        };
        let mut table: toml::Table = text.parse().map_err(bad_toml)?;
        for (section, old, new) in RENAMED {
            if let Some(toml::Value::Table(t)) = table.get_mut(section) {
                if !t.contains_key(new) {
                    if let Some(v) = t.remove(old) {
                        t.insert(new.to_string(), v);
                    }
                }
            }
        }
        for (name, value) in env {
            let Some(rest) = name
                .strip_prefix(ENV_PREFIX)
                .filter(|_| !NOT_SETTINGS.contains(&name.as_str()))
            else {
                continue;
            };
            let rest = rest.to_ascii_lowercase();
            let Some(section) = SECTIONS.iter().find(|s| rest.starts_with(&format!("{s}_"))) else {
                return Err(ConfigError::UnknownSection(name));
            };
            let key = &rest[section.len() + 1..];
            // A value is read as TOML (numbers, booleans, arrays) and
            // otherwise taken as a plain string.
            let parsed = format!("v = {value}")
                .parse::<toml::Table>()
                .ok()
                .and_then(|mut t| t.remove("v"))
                .unwrap_or(toml::Value::String(value));
            let entry = table
                .entry(section.to_string())
                .or_insert_with(|| toml::Value::Table(Default::default()));
            let toml::Value::Table(section_table) = entry else {
                return Err(ConfigError::NotATable(section));
            };
            section_table.insert(current_key(section, key).to_string(), parsed);
        }
        let mut config: Config = Config::deserialize(table).map_err(bad_toml)?;
        if let Some(folder) = path.and_then(|p| std::path::absolute(p).ok()?.parent().map(Path::to_path_buf)) {
            config.resolve_from(&folder);
        }
        config.validate()?;
        Ok(config)
    }

    /// Takes the relative paths of a configuration file named on the command
    /// line from that file's folder, wherever the server is started from:
    /// `mcp-sandbox stdio --config /srv/sandbox/config.toml`, started by a
    /// desktop client in another folder, uses the state and results beside
    /// the file, as the server started there does.
    fn resolve_from(&mut self, folder: &Path) {
        let resolve = |path: &mut PathBuf| {
            if path.is_relative() {
                *path = folder.join(&*path);
            }
        };
        resolve(&mut self.server.state_dir);
        resolve(&mut self.results.dir);
        if let Some(ca) = &mut self.sandbox.ca_bundle {
            resolve(ca);
        }
        for files in self.templates.iter_mut().filter_map(|t| t.files.as_mut()) {
            resolve(files);
        }
        if let Some(cluster) = &mut self.cluster {
            for file in [
                &mut cluster.etcd_ca_file,
                &mut cluster.etcd_cert_file,
                &mut cluster.etcd_key_file,
            ]
            .into_iter()
            .flatten()
            {
                resolve(file);
            }
        }
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        self.sandbox.validate()?;
        self.packages.validate()?;
        self.limits.validate()?;
        self.pool.validate()?;
        self.usage.validate()?;
        self.processes.validate()?;
        self.preview.validate(&self.server)?;
        self.results.validate()?;
        self.telemetry.validate()?;
        if let Some(cluster) = &self.cluster {
            cluster.validate()?;
        }
        let longest_run = self
            .sandbox
            .max_exec_timeout_seconds
            .max(self.sandbox.install_timeout_seconds);
        self.tasks.validate(longest_run)?;
        Keys::from_config(&self.auth, self.guest.enabled)?;
        self.guest.validate(self.auth.enabled)?;
        self.validate_templates()?;
        self.client_addresses()?;
        if let Some(bad) = self
            .server
            .allowed_hosts
            .iter()
            .find(|h| h.trim().is_empty() || h.contains('/'))
        {
            return Err(ConfigError::AllowedHost(bad.clone()));
        }
        if let Some(url) = &self.server.public_url {
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                return Err(ConfigError::PublicUrl(url.clone()));
            }
        }
        let most_mb = sandbox_actors::uploads::MAX_UPLOAD_BYTES / (1024 * 1024);
        if !(1..=most_mb).contains(&self.uploads.max_upload_mb) {
            return Err(ConfigError::MaxUpload(most_mb));
        }
        let keep_apart = [
            ("results.dir", comparable(&self.results.dir)),
            ("server.state_dir", comparable(&self.server.state_dir)),
        ];
        for dir in &self.uploads.allowed_dirs {
            if !dir.is_absolute() {
                return Err(ConfigError::UploadDir(dir.clone()));
            }
            let upload = comparable(dir);
            for (key, other) in &keep_apart {
                let relation = match () {
                    _ if upload == *other => "is",
                    _ if other.starts_with(&upload) => "holds",
                    _ if upload.starts_with(other) => "lies inside",
                    _ => continue,
                };
                return Err(ConfigError::UploadDirOverlap {
                    dir: dir.clone(),
                    relation,
                    key,
                    other: other.clone(),
                });
            }
        }
        Ok(())
    }

    /// Each template's own checks, unique names, and allow-lists of keys
    /// and guests that name only templates there are.
    fn validate_templates(&self) -> Result<(), ConfigError> {
        let most = sandbox_runtime::template::MAX_TEMPLATES;
        if self.templates.len() > most {
            return Err(ConfigError::Templates(format!("templates: at most {most}")));
        }
        let memory_mb = sandbox_host::figures::memory_bytes().map(|b| b >> 20);
        let cpus = std::thread::available_parallelism().map_or(1, usize::from);
        for (i, t) in self.templates.iter().enumerate() {
            t.validate(&self.sandbox, memory_mb, cpus)?;
            if self.templates[..i].iter().any(|o: &TemplateConfig| o.name == t.name) {
                return Err(ConfigError::Templates(format!(
                    "templates: {:?} is defined twice",
                    t.name
                )));
            }
        }
        let lists = self
            .auth
            .keys
            .iter()
            .map(|k| (format!("auth.keys[{}].templates", k.name), &k.templates))
            .chain([("guest.templates".to_string(), &self.guest.templates)]);
        for (key, list) in lists {
            for name in list.iter().flatten() {
                if !self.templates.iter().any(|t| &t.name == name) {
                    return Err(ConfigError::Templates(format!(
                        "{key}: {name:?} is not the name of a [[templates]] entry"
                    )));
                }
            }
        }
        Ok(())
    }

    /// How client addresses are found behind proxies and grouped.
    pub fn client_addresses(&self) -> Result<ClientAddresses, NotANetwork> {
        ClientAddresses::parse(
            &self.server.trusted_proxies,
            self.server.forwarded_header,
            self.limits.ipv6_prefix,
        )
    }

    /// Base URL of links the server hands out.
    pub fn public_url(&self) -> String {
        match &self.server.public_url {
            Some(u) => u.trim_end_matches('/').to_string(),
            None => format!("http://{}:{}", self.server.host, self.server.port),
        }
    }

    /// The sandbox domain's settings; relative folders are made absolute so
    /// that bind mounts and upload checks do not depend on the working folder.
    pub fn settings(&self, config_path: Option<&Path>) -> std::io::Result<Settings> {
        let cwd = std::env::current_dir()?;
        let abs = |p: &Path| {
            if p.is_absolute() {
                p.to_path_buf()
            } else {
                cwd.join(p)
            }
        };
        Ok(Settings {
            sandbox: self.sandbox.clone(),
            packages: self.packages.clone(),
            uploads: self.uploads.clone(),
            pool: self.pool.clone(),
            usage: self.usage.clone(),
            processes: self.processes.clone(),
            templates: self.templates.clone(),
            state_dir: abs(&self.server.state_dir),
            results_dir: abs(&self.results.dir),
            protected: config_path
                .map(abs)
                .into_iter()
                .chain([abs(Path::new("config.toml"))])
                .collect(),
            min_free_disk_mb: self.limits.min_free_disk_mb,
            max_sandboxes_total: self.limits.max_sandboxes_total,
            live_cap: Default::default(),
            max_hibernated_total: self.limits.max_hibernated_total,
            max_hibernated_per_tenant: self.limits.max_hibernated_per_tenant,
            egress_total_connections: sandbox_actors::config::DEFAULT_EGRESS_TOTAL,
        })
    }
}

/// `path` as the folder it names, for telling whether two folders overlap:
/// made absolute from the working folder (as [`Config::settings`] does),
/// then canonicalised (links resolved) if it exists. One that does not exist
/// yet has its `.` and `..` resolved as written and its longest existing
/// ancestor canonicalised, so it compares as the folder it will be.
fn comparable(path: &Path) -> PathBuf {
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    if let Ok(real) = absolute.canonicalize() {
        return real;
    }
    let mut lexical = PathBuf::new();
    for c in absolute.components() {
        match c {
            Component::ParentDir => {
                lexical.pop();
            }
            Component::CurDir => {}
            other => lexical.push(other),
        }
    }
    lexical
        .ancestors()
        .find_map(|a| Some(a.canonicalize().ok()?.join(lexical.strip_prefix(a).ok()?)))
        .unwrap_or(lexical)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandbox_actors::config::PoolMin;

    fn load(text: &str, env: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(&path, text).unwrap();
        Config::load(Some(&path), env.iter().map(|(a, b)| (a.to_string(), b.to_string())))
    }

    #[test]
    fn defaults_file_and_environment_layer() {
        let c = load(
            "[sandbox]\nmemory_mb = 1024\n",
            &[
                ("MCP_SANDBOX_SERVER_PORT", "9000"),
                ("MCP_SANDBOX_SANDBOX_NETWORK", "none"),
            ],
        )
        .unwrap();
        assert_eq!(c.sandbox.memory_mb, 1024);
        assert_eq!(c.server.port, 9000);
        assert_eq!(c.sandbox.network, sandbox_actors::config::EgressPolicy::None);
        assert_eq!(c.sandbox.pids_limit, SandboxConfig::default().pids_limit);
    }

    #[test]
    fn egress_policies_are_set_per_server_and_per_key() {
        use sandbox_actors::EgressPolicy;
        let c = load(
            "[sandbox]\nnetwork = \"bridge\"\n[[auth.keys]]\nname = \"a\"\nkey = \"0123456789abcdef\"\negress = \"packages\"\n",
            &[],
        )
        .unwrap();
        assert_eq!(c.sandbox.network, EgressPolicy::Open, "bridge is the old name of open");
        assert_eq!(c.auth.keys[0].egress, Some(EgressPolicy::Packages));
        let c = load("", &[("MCP_SANDBOX_SANDBOX_NETWORK", "allowlist")]).unwrap();
        assert_eq!(c.sandbox.network, EgressPolicy::Allowlist);
        assert_eq!(c.packages.hosts(), ["pypi.org", "files.pythonhosted.org"]);
    }

    #[test]
    fn the_egress_proxy_s_descriptors_count_only_when_some_policy_in_force_uses_it() {
        let per_sandbox = |text: &str| load(text, &[]).unwrap().proxied_connections_per_sandbox();
        assert_eq!(per_sandbox(""), 0, "every sandbox open: the proxy serves nobody");
        assert_eq!(per_sandbox("[sandbox]\nnetwork = \"packages\"\n"), 64);
        let key = "[[auth.keys]]\nname = \"a\"\nkey = \"0123456789abcdef\"\negress = \"none\"\n";
        assert_eq!(per_sandbox(key), 64, "one key's sandboxes go through it");
        assert_eq!(
            per_sandbox("[guest]\nnetwork = \"allowlist\"\n"),
            0,
            "guests that are off use nothing"
        );
        let guests = "[auth]\nenabled = true\n[guest]\nenabled = true\nnetwork = \"allowlist\"\n";
        assert_eq!(per_sandbox(guests), 64);
    }

    #[test]
    fn the_pool_s_earlier_key_still_sets_its_minimum() {
        assert_eq!(load("[pool]\nsize = 3\n", &[]).unwrap().pool.min, PoolMin::Fixed(3));
        let c = load("[pool]\nmin = 2\nmax = 9\n", &[("MCP_SANDBOX_POOL_SIZE", "5")]).unwrap();
        assert_eq!(
            (c.pool.min, c.pool.max),
            (PoolMin::Fixed(5), 9),
            "the variable wins over the file's new name"
        );
        assert!(
            load("[pool]\nmin = 2\nsize = 3\n", &[]).is_err(),
            "both names in one file conflict"
        );
    }

    #[test]
    fn the_pool_s_minimum_is_a_number_or_auto_for_this_host() {
        let auto = PoolMin::Auto;
        assert_eq!(load("[pool]\nmin = \"auto\"\n", &[]).unwrap().pool.min, auto);
        assert_eq!(load("", &[("MCP_SANDBOX_POOL_MIN", "auto")]).unwrap().pool.min, auto);
        assert_eq!(load("", &[]).unwrap().pool.min, auto, "the default is automatic");
        let wrong = load("[pool]\nmin = \"many\"\n", &[]).unwrap_err().to_string();
        assert!(wrong.contains("min") && wrong.contains("auto"), "{wrong}");
        assert!(load("[pool]\nmin = -1\n", &[]).is_err());
        let memory = sandbox_host::figures::memory_bytes();
        assert_eq!(auto.resolve(memory), sandbox_actors::config::auto_pool_min(memory));
        assert_eq!(PoolMin::Fixed(7).resolve(memory), 7);
    }

    #[test]
    fn every_supported_runtime_is_accepted() {
        let auto = [sandbox_actors::config::AUTO_OCI_RUNTIME];
        for runtime in sandbox_actors::config::OCI_RUNTIMES.iter().chain(&auto) {
            let c = load(&format!("[sandbox]\nruntime = \"{runtime}\"\n"), &[]).unwrap();
            assert_eq!(c.sandbox.runtime, *runtime);
        }
    }

    /// Every key of every section, read off the pretty `Debug` of the
    /// defaults: each section is a struct whose fields are its keys (none
    /// is renamed for TOML), so a key added in code shows up here.
    fn every_key() -> Vec<(String, String)> {
        let text = format!("{:#?}", Config::default());
        let mut section = String::new();
        let mut keys = vec![];
        for line in text.lines() {
            let indent = line.len() - line.trim_start().len();
            let Some((name, _)) = line.trim_start().split_once(": ") else {
                continue;
            };
            match indent {
                4 => section = name.to_string(),
                8 => keys.push((section.clone(), name.to_string())),
                _ => {}
            }
        }
        keys
    }

    #[test]
    fn every_key_is_in_the_shipped_config_and_on_the_configuration_page() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let shipped = std::fs::read_to_string(root.join("config.toml")).unwrap();
        let page = std::fs::read_to_string(root.join("docs/configuration.md")).unwrap();
        let keys = every_key();
        assert!(keys.len() > 50, "keys read off the defaults: {keys:?}");
        let mut missing = vec![];
        for (section, key) in &keys {
            // In its section of config.toml, set or commented out (an
            // array of tables as `[[section.key]]`).
            let in_shipped = shipped
                .split("\n[")
                .find(|s| s.starts_with(&format!("{section}]")))
                .is_some_and(|body| {
                    body.lines().any(|l| {
                        let l = l.trim_start_matches(['#', ' ']);
                        l.starts_with(&format!("[[{section}.{key}]]"))
                            || l.strip_prefix(key.as_str())
                                .is_some_and(|rest| rest.trim_start().starts_with('='))
                    })
                });
            // On the page: `section.key`, or `key` in a row that names the section.
            let in_page = page.contains(&format!("`{section}.{key}`"))
                || page
                    .lines()
                    .any(|l| l.starts_with(&format!("| `{section}.")) && l.contains(&format!("`{key}`")));
            if !in_shipped {
                missing.push(format!("{section}.{key} is not in config.toml"));
            }
            if !in_page {
                missing.push(format!("{section}.{key} is not in docs/configuration.md"));
            }
        }
        assert!(missing.is_empty(), "{missing:#?}");
    }

    #[test]
    fn the_shipped_config_states_the_defaults() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("config.toml");
        let shipped = Config::load(Some(&path), std::iter::empty()).unwrap();
        let mut defaults = Config::default();
        defaults.resolve_from(path.parent().unwrap());
        assert_eq!(format!("{shipped:?}"), format!("{defaults:?}"));
    }

    #[test]
    fn inline_image_bounds_are_inclusive() {
        let c = load(
            "[results]\ninline_image_max_bytes = 1024\ninline_result_max_bytes = 1024\ninline_images_per_result = 1\n",
            &[],
        )
        .unwrap();
        assert_eq!(c.results.inline_result_max_bytes, 1024);
        let c = load(
            "[results]\ninline_image_max_bytes = 4194304\ninline_result_max_bytes = 16777216\ninline_images_per_result = 16\n",
            &[("MCP_SANDBOX_RESULTS_INLINE_IMAGES", "false")],
        )
        .unwrap();
        assert!(!c.results.inline_images);
    }

    #[test]
    fn upload_folders_must_not_overlap_the_results_or_state_folder() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path().canonicalize().unwrap();
        let (results, state) = (r.join("data/results"), r.join("srv/state"));
        std::fs::create_dir_all(&results).unwrap();
        std::os::unix::fs::symlink(&results, r.join("via-link")).unwrap();
        let config = |allowed: &Path, state: &Path| {
            format!(
                "[server]\nstate_dir = {state:?}\n[results]\ndir = {results:?}\n[uploads]\nallowed_dirs = [{allowed:?}]\n"
            )
        };
        for (allowed, state, key) in [
            // Equal to, containing, inside the results folder (which exists).
            (results.clone(), state.clone(), "results.dir"),
            (r.join("data"), state.clone(), "results.dir"),
            (results.join("tenant"), state.clone(), "results.dir"),
            // The same, reached through a link.
            (r.join("via-link"), state.clone(), "results.dir"),
            // The state folder does not exist yet: compared as written.
            (state.clone(), state.clone(), "server.state_dir"),
            (r.join("srv"), state.clone(), "server.state_dir"),
            (state.join("agents"), state.clone(), "server.state_dir"),
            (r.join("srv/other/.."), state.clone(), "server.state_dir"),
            (r.join("srv2"), r.join("srv2/./x/../state"), "server.state_dir"),
        ] {
            let err = load(&config(&allowed, &state), &[]).unwrap_err().to_string();
            assert!(
                err.contains("uploads.allowed_dirs") && err.contains(key),
                "{allowed:?}: {err:?} does not name uploads.allowed_dirs and {key}"
            );
        }
        for allowed in [r.join("data/results2"), r.join("srv/uploads"), r.join("uploads")] {
            let c = load(&config(&allowed, &state), &[]);
            assert!(c.is_ok(), "{allowed:?} refused: {:?}", c.err());
        }
        // A relative results folder is taken from the configuration file's
        // folder.
        let folder = tempfile::tempdir().unwrap();
        let path = folder.path().join("config.toml");
        let text = format!(
            "[results]\ndir = \"results\"\n[uploads]\nallowed_dirs = [{:?}]\n",
            folder.path()
        );
        std::fs::write(&path, text).unwrap();
        let err = Config::load(Some(&path), std::iter::empty()).unwrap_err().to_string();
        assert!(
            err.contains("uploads.allowed_dirs") && err.contains("results.dir"),
            "{err}"
        );
    }

    #[test]
    fn relative_paths_are_taken_from_the_configuration_file_s_folder() {
        let folder = tempfile::tempdir().unwrap();
        let path = folder.path().join("config.toml");
        std::fs::write(
            &path,
            "[server]\nstate_dir = \"var/state\"\n[sandbox]\nca_bundle = \"ca.pem\"\n",
        )
        .unwrap();
        std::fs::write(folder.path().join("ca.pem"), "").unwrap();
        let c = Config::load(Some(&path), std::iter::empty()).unwrap();
        assert_eq!(c.server.state_dir, folder.path().join("var/state"));
        assert_eq!(c.results.dir, folder.path().join("results"), "the default as well");
        assert_eq!(c.sandbox.ca_bundle, Some(folder.path().join("ca.pem")));
        let c = Config::load(
            Some(&path),
            [("MCP_SANDBOX_RESULTS_DIR".into(), "/srv/results".into())].into_iter(),
        )
        .unwrap();
        assert_eq!(c.results.dir, PathBuf::from("/srv/results"), "an absolute path stays");
    }

    #[test]
    fn bad_values_name_their_key() {
        for (text, env, key) in [
            ("[sandbox]\nmemory_mb = \"lots\"\n", vec![], "memory_mb"),
            ("[sandbox]\nnetwork = \"host\"\n", vec![], "network"),
            ("[sandbox]\nruntime = \"kata\"\n", vec![], "sandbox.runtime"),
            ("[sandbox]\nmemroy_mb = 1\n", vec![], "memroy_mb"),
            ("", vec![("MCP_SANDBOX_SANDBOX_CPUS", "0")], "sandbox.cpus"),
            ("", vec![("MCP_SANDBOX_SERVER_PORT", "http")], "port"),
            ("", vec![("MCP_SANDBOX_NOPE_X", "1")], "MCP_SANDBOX_NOPE_X"),
            ("[server]\npublic_url = \"ftp://x\"\n", vec![], "server.public_url"),
            ("[uploads]\nmax_upload_mb = 0\n", vec![], "uploads.max_upload_mb"),
            ("[uploads]\nmax_upload_mb = 257\n", vec![], "uploads.max_upload_mb"),
            ("[sandbox]\negress_allow = [\"*\"]\n", vec![], "sandbox.egress_allow"),
            (
                "[sandbox]\negress_max_connections = 0\n",
                vec![],
                "sandbox.egress_max_connections",
            ),
            (
                "[sandbox]\negress_mb_per_minute = 3\n",
                vec![],
                "sandbox.egress_mb_per_minute",
            ),
            ("[packages]\nindex_url = \"ftp://x\"\n", vec![], "packages.index_url"),
            ("[packages]\nfile_hosts = [\"a/b\"]\n", vec![], "packages.file_hosts"),
            (
                "[[auth.keys]]\nname = \"a\"\nkey = \"0123456789abcdef\"\negress = \"wide\"\n",
                vec![],
                "egress",
            ),
            (
                "[server]\ntrusted_proxies = [\"10.0.0.0/40\"]\n",
                vec![],
                "server.trusted_proxies",
            ),
            ("[server]\nallowed_hosts = [\"\"]\n", vec![], "server.allowed_hosts"),
            ("[guest]\nenabled = true\n", vec![], "guest.enabled"),
            (
                "[limits]\nmax_sessions_total = 0\n",
                vec![],
                "limits.max_sessions_total",
            ),
            (
                "",
                vec![("MCP_SANDBOX_GUEST_KEY_TTL_SECONDS", "0")],
                "guest.key_ttl_seconds",
            ),
            ("[sandbox]\nresults_mb = 8\n", vec![], "sandbox.results_mb"),
            ("[sandbox]\npackages_inodes = 10\n", vec![], "sandbox.packages_inodes"),
            (
                "[results]\ninline_image_max_bytes = 1023\n",
                vec![],
                "results.inline_image_max_bytes",
            ),
            (
                "",
                vec![("MCP_SANDBOX_RESULTS_INLINE_IMAGE_MAX_BYTES", "4194305")],
                "results.inline_image_max_bytes",
            ),
            (
                "[results]\ninline_result_max_bytes = 65535\n",
                vec![],
                "results.inline_result_max_bytes",
            ),
            (
                "[results]\ninline_result_max_bytes = 16777217\n",
                vec![],
                "results.inline_result_max_bytes",
            ),
            (
                "[results]\ninline_images_per_result = 0\n",
                vec![],
                "results.inline_images_per_result",
            ),
            (
                "[results]\ninline_images_per_result = 17\n",
                vec![],
                "results.inline_images_per_result",
            ),
        ] {
            let err = load(text, &env).unwrap_err().to_string();
            assert!(err.contains(key), "{err:?} does not name {key}");
        }
    }
}
