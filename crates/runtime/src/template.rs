//! Templates: sandbox images a deployment prepares on top of the sandbox
//! image, with pip packages installed, build steps run and files to place
//! in every new sandbox's `/app/results`, and limits of their own.
//!
//! A template's definition ([`TemplateConfig`], a `[[templates]]` entry)
//! is built into an image tagged by a hash of what goes into it and of the
//! base image's tag ([`Definition::tag`]), so that an unchanged definition
//! is never built twice and a changed one never runs the old image. The
//! packages go into `/opt/template/site-packages`, owned by root in the
//! image's read-only root, which the sandbox's venv sees through a `.pth`
//! file: every sandbox of the template shares them from the image's layer
//! (nothing is copied into its package volume), and what the sandbox
//! installs itself goes into its venv, ahead of them on `sys.path`.
//! The files are not in the image: `/app/results` is a disk of the
//! sandbox's own, so they are read once here and written into each new
//! sandbox's disk when it is made.
//! What a sandbox was made from is a [`Template`], kept in its record, so
//! that a restart, a revival or a wake makes the same container whatever
//! the configuration says by then.

use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::config::{invalid, InvalidConfig, SandboxConfig, OCI_RUNTIMES};
use sandbox_egress::EgressPolicy;

/// The most templates a server may define.
pub const MAX_TEMPLATES: usize = 32;
/// The most bytes of files one template may place in a sandbox, and the
/// most files and folders: they are held in the server's memory and
/// written into every new sandbox of the template.
pub const MAX_FILE_BYTES: u64 = 64 << 20;
pub const MAX_FILES: usize = 10_000;
/// Where a template's packages live in its image.
pub const SITE_PACKAGES: &str = "/opt/template/site-packages";

/// `[[templates]]`: one prepared environment.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TemplateConfig {
    /// What `create_sandbox(template=...)` names it by: lowercase letters,
    /// digits and dashes.
    pub name: String,
    pub description: String,
    /// pip requirements installed at build time (pins allowed).
    pub packages: Vec<String>,
    /// A host folder whose files are placed in `/app/results` of every new
    /// sandbox of the template.
    pub files: Option<PathBuf>,
    /// Shell steps run once at build time, as root, with network, in the
    /// engine's build container (before the packages are installed).
    pub steps: Vec<String>,
    /// Overrides of `[sandbox]` for the template's sandboxes.
    pub network: Option<EgressPolicy>,
    pub memory_mb: Option<u64>,
    pub cpus: Option<f64>,
    pub runtime: Option<String>,
    /// Sizes of its sandboxes' `/app/results` and package volume, in MiB,
    /// where `[sandbox]` caps them (their inodes in the same proportion).
    pub results_mb: Option<u64>,
    pub packages_mb: Option<u64>,
    /// Sandboxes of the template kept ready in the warm pool always (the
    /// pool adds more as claims show, within `pool.max` over all pools).
    pub pool_min: usize,
}

impl TemplateConfig {
    /// Checks what serde cannot, within the server's own limits; each
    /// message names the template and its key.
    pub fn validate(
        &self,
        sandbox: &SandboxConfig,
        host_memory_mb: Option<u64>,
        host_cpus: usize,
    ) -> Result<(), InvalidConfig> {
        let key = |k: &str| format!("templates.{}.{k}", self.name);
        let ok_name = !self.name.is_empty()
            && self.name.len() <= 40
            && self
                .name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !self.name.starts_with('-')
            && !self.name.ends_with('-');
        if !ok_name {
            return Err(invalid(
                format!("templates.{:?}.name", self.name),
                "1 to 40 lowercase letters, digits and dashes, not starting or ending with a dash",
            ));
        }
        if self.description.chars().count() > 500 {
            return Err(invalid(key("description"), "at most 500 characters"));
        }
        if self.packages.len() > 200 {
            return Err(invalid(key("packages"), "at most 200 requirements"));
        }
        for p in &self.packages {
            // A requirement, never an option of the installer nor a second
            // line of the requirements file.
            let p = p.trim();
            if p.is_empty() || p.starts_with('-') || p.len() > 200 || p.chars().any(char::is_control) {
                return Err(invalid(
                    key("packages"),
                    format!(
                        "{p:?} is not a requirement: a name with optional extras and version, at most 200 characters"
                    ),
                ));
            }
        }
        if self.steps.len() > 50 || self.steps.iter().any(|s| s.trim().is_empty() || s.len() > 10_000) {
            return Err(invalid(
                key("steps"),
                "at most 50 steps, each not empty and at most 10000 bytes",
            ));
        }
        if let Some(dir) = &self.files {
            if !dir.is_dir() {
                return Err(invalid(key("files"), format!("{} is not a folder", dir.display())));
            }
        }
        if let Some(mb) = self.memory_mb {
            let most = host_memory_mb.unwrap_or(u64::MAX);
            if mb < 64 || mb > most {
                return Err(invalid(
                    key("memory_mb"),
                    format!("from 64 to the host's memory ({most} MB)"),
                ));
            }
        }
        if let Some(cpus) = self.cpus {
            if !(cpus > 0.0 && cpus <= host_cpus.max(1) as f64) {
                return Err(invalid(
                    key("cpus"),
                    format!("more than 0 and at most the host's {host_cpus}"),
                ));
            }
        }
        if let Some(runtime) = &self.runtime {
            if !OCI_RUNTIMES.contains(&runtime.as_str()) {
                return Err(invalid(key("runtime"), format!("one of {OCI_RUNTIMES:?}")));
            }
        }
        if self.joins_the_bridge_under_gvisor(sandbox, self.network.unwrap_or(sandbox.network)) {
            return Err(invalid(
                key("network"),
                "a template that runs under runsc, on a server whose sandboxes do not, cannot join the \
                 server's network: set network to \"none\", \"packages\" or \"allowlist\"",
            ));
        }
        for (name, mb, capped) in [
            ("results_mb", self.results_mb, sandbox.results_mb > 0),
            ("packages_mb", self.packages_mb, sandbox.packages_mb > 0),
        ] {
            match mb {
                Some(_) if !capped => {
                    return Err(invalid(
                        key(name),
                        format!("sandbox.{name} is 0 (not capped): set it there first"),
                    ))
                }
                Some(mb) if !(16..=1 << 20).contains(&mb) => return Err(invalid(key(name), "from 16 to 1048576")),
                _ => {}
            }
        }
        Ok(())
    }
}

impl TemplateConfig {
    /// Whether a sandbox of it under `egress` would run under gVisor on the
    /// server's bridge, which the server joins from outside the container's
    /// kernel (only a server whose sandboxes all run under runsc has the
    /// engine network them instead).
    pub fn joins_the_bridge_under_gvisor(&self, sandbox: &SandboxConfig, egress: EgressPolicy) -> bool {
        self.runtime.as_deref() == Some("runsc") && sandbox.runtime != "runsc" && !egress.is_proxied()
    }
}

/// One file or folder a template places in `/app/results`: its path under
/// it, and its bytes (none for a folder).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateFile {
    pub path: PathBuf,
    pub bytes: Option<Vec<u8>>,
    pub executable: bool,
}

/// Why a template's files could not be read.
#[derive(Debug, thiserror::Error)]
pub enum FilesError {
    #[error("reading {}: {source}", .path.display())]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{}: more than {MAX_FILES} files or {} MiB", .0.display(), MAX_FILE_BYTES >> 20)]
    TooLarge(PathBuf),
}

/// Reads the files of `dir`, folders before what they hold; symbolic links
/// and special files are left out (they would point outside the sandbox).
pub fn read_files(dir: &Path) -> Result<Vec<TemplateFile>, FilesError> {
    use std::os::unix::fs::PermissionsExt;
    let mut out = Vec::new();
    let mut bytes = 0u64;
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let here = dir.join(&rel);
        let read = |source| FilesError::Read {
            path: here.clone(),
            source,
        };
        let mut entries: Vec<_> = std::fs::read_dir(&here)
            .map_err(read)?
            .collect::<Result<_, _>>()
            .map_err(read)?;
        entries.sort_by_key(|e| e.file_name());
        for entry in entries {
            let path = rel.join(entry.file_name());
            let meta = entry.metadata().map_err(|source| FilesError::Read {
                path: entry.path(),
                source,
            })?;
            if out.len() >= MAX_FILES {
                return Err(FilesError::TooLarge(dir.into()));
            }
            if meta.is_dir() {
                out.push(TemplateFile {
                    path: path.clone(),
                    bytes: None,
                    executable: false,
                });
                stack.push(path);
            } else if meta.is_file() {
                bytes += meta.len();
                if bytes > MAX_FILE_BYTES {
                    return Err(FilesError::TooLarge(dir.into()));
                }
                let data = std::fs::read(entry.path()).map_err(|source| FilesError::Read {
                    path: entry.path(),
                    source,
                })?;
                out.push(TemplateFile {
                    path,
                    bytes: Some(data),
                    executable: meta.permissions().mode() & 0o111 != 0,
                });
            }
        }
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    debug_assert!(out
        .iter()
        .all(|f| f.path.components().all(|c| matches!(c, Component::Normal(_)))));
    Ok(out)
}

/// A template's definition with its files read: what its image is built
/// from.
#[derive(Debug, Clone)]
pub struct Definition {
    pub config: TemplateConfig,
    pub files: Vec<TemplateFile>,
}

impl Definition {
    /// `{sandbox.image}-template-{name}-{server_id}:{hash}`. The server's id
    /// is in the name so that each server's images are its own: a server
    /// removes what it no longer uses without taking an image another
    /// server on the engine runs (a second build of the same definition
    /// comes from the engine's cache of build steps). The hash covers the base
    /// image's tag and everything the build is given (its Dockerfile, so
    /// the steps, the packages and how they are run, and the files), so
    /// that any change makes a new tag; description and limits are left
    /// out (they change no byte of the image).
    pub fn tag(&self, sandbox: &SandboxConfig, server_id: &str, base: &str) -> String {
        let mut h = Fnv::default();
        for part in [base, &self.dockerfile(), RUN_STEP, &self.requirements()] {
            h.add(part.as_bytes());
        }
        for f in &self.files {
            h.add(f.path.as_os_str().as_encoded_bytes());
            h.add(&[u8::from(f.executable)]);
            h.add(f.bytes.as_deref().unwrap_or(b"/"));
        }
        let name = &self.config.name;
        format!("{}-template-{name}-{server_id}:{:012x}", sandbox.image, h.0 >> 16)
    }

    /// The Dockerfile of its image, on the build argument `BASE`: each step
    /// and the install in the exec form (a JSON array) through [`RUN_STEP`],
    /// so that no text of the configuration is parsed by the Dockerfile's
    /// own syntax.
    pub fn dockerfile(&self) -> String {
        let run = |script: &str| {
            let argv = ["/bin/sh", "/opt/template/run", script].map(String::from);
            format!("RUN {}\n", serde_json::to_string(&argv).expect("strings serialise"))
        };
        let mut out =
            String::from("ARG BASE\nFROM ${BASE}\nUSER 0:0\nCOPY run ca-bundle.crt requirements.txt /opt/template/\n");
        for step in &self.config.steps {
            out.push_str(&run(step));
        }
        if !self.config.packages.is_empty() {
            out.push_str(&run(&format!(
                "uv pip install --no-cache --compile-bytecode --python /app/.venv/bin/python --target {SITE_PACKAGES} \
                 -r /opt/template/requirements.txt; \
                 for d in /app/.venv/lib/python3*/site-packages; do echo {SITE_PACKAGES} > \"$d/mcp-template.pth\"; done"
            )));
        }
        out.push_str("RUN [\"rm\", \"-f\", \"/opt/template/ca-bundle.crt\", \"/opt/template/run\"]\n");
        out.push_str("USER 1000:1000\n");
        out
    }

    /// The requirements file the install reads, one requirement a line.
    pub fn requirements(&self) -> String {
        self.config.packages.iter().map(|p| format!("{}\n", p.trim())).collect()
    }
}

/// Runs one build step (`$1`) of a template, with the CA bundle of a
/// TLS-intercepting proxy where the server has one (`sandbox.ca_bundle`);
/// both are gone from the image once it is built.
pub const RUN_STEP: &str = "\
if [ -s /opt/template/ca-bundle.crt ]; then
  export SSL_CERT_FILE=/opt/template/ca-bundle.crt PIP_CERT=/opt/template/ca-bundle.crt \\
    REQUESTS_CA_BUNDLE=/opt/template/ca-bundle.crt CURL_CA_BUNDLE=/opt/template/ca-bundle.crt
fi
exec /bin/sh -ec \"$1\"
";

/// FNV-1a: stable across builds and platforms, and enough to tell
/// definitions apart.
struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Self {
        Self(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv {
    fn add(&mut self, bytes: &[u8]) {
        for byte in bytes.iter().chain(b"\0") {
            self.0 ^= u64::from(*byte);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }
}

/// What a sandbox of a template is made of, as its record keeps it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Template {
    pub name: String,
    /// The image's tag when the sandbox was made.
    pub image: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_mb: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub results_mb: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub packages_mb: Option<u64>,
    /// Its egress policy, where it sets one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<EgressPolicy>,
}

impl Template {
    /// The egress policy of its sandboxes for a caller whose key (or tier)
    /// sets `key`'s: the key's, else the template's; but a template without
    /// network never has any. `None`: the server's.
    pub fn egress(template: Option<EgressPolicy>, key: Option<EgressPolicy>) -> Option<EgressPolicy> {
        match template {
            Some(EgressPolicy::None) => Some(EgressPolicy::None),
            template => key.or(template),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn definition(packages: &[&str], steps: &[&str]) -> Definition {
        Definition {
            config: TemplateConfig {
                name: "data".into(),
                packages: packages.iter().map(|s| s.to_string()).collect(),
                steps: steps.iter().map(|s| s.to_string()).collect(),
                ..Default::default()
            },
            files: vec![],
        }
    }

    #[test]
    fn the_tag_changes_with_what_goes_into_the_image_and_only_with_that() {
        let sandbox = SandboxConfig::default();
        let a = definition(&["pandas"], &[]);
        let tag = a.tag(&sandbox, "s1", "mcp-sandbox-python:1");
        assert!(tag.starts_with("mcp-sandbox-python-template-data-s1:"), "{tag}");
        assert_ne!(
            tag,
            a.tag(&sandbox, "s2", "mcp-sandbox-python:1"),
            "another server's own"
        );
        assert_eq!(tag, a.tag(&sandbox, "s1", "mcp-sandbox-python:1"), "stable");
        assert_ne!(tag, a.tag(&sandbox, "s1", "mcp-sandbox-python:2"), "a new base");
        assert_ne!(
            tag,
            definition(&["pandas==2.2.3"], &[]).tag(&sandbox, "s1", "mcp-sandbox-python:1")
        );
        assert_ne!(
            tag,
            definition(&["pandas"], &["true"]).tag(&sandbox, "s1", "mcp-sandbox-python:1")
        );
        let mut described = a.clone();
        described.config.description = "other words".into();
        described.config.memory_mb = Some(1024);
        assert_eq!(tag, described.tag(&sandbox, "s1", "mcp-sandbox-python:1"));
        let mut filed = a.clone();
        filed.files.push(TemplateFile {
            path: "a.csv".into(),
            bytes: Some(b"x".to_vec()),
            executable: false,
        });
        assert_ne!(tag, filed.tag(&sandbox, "s1", "mcp-sandbox-python:1"));
    }

    #[test]
    fn steps_reach_the_dockerfile_as_json_never_as_its_syntax() {
        let d = definition(&["pandas"], &["echo 'a'\nRUN rm -rf / # \"x\""]);
        let file = d.dockerfile();
        let runs: Vec<&str> = file.lines().filter(|l| l.starts_with("RUN ")).collect();
        assert_eq!(runs.len(), 3, "one line each, newlines kept inside the strings: {file}");
        let argv: Vec<String> = serde_json::from_str(&runs[0][4..]).unwrap();
        assert_eq!(argv[2], "echo 'a'\nRUN rm -rf / # \"x\"");
        assert!(runs[1].contains("--target /opt/template/site-packages"));
        assert!(file.ends_with("USER 1000:1000\n"));
        assert_eq!(d.requirements(), "pandas\n");
    }

    #[test]
    fn a_bad_definition_is_named_by_its_key() {
        let sandbox = SandboxConfig {
            packages_mb: 0,
            ..SandboxConfig::default()
        };
        let check = |t: TemplateConfig| t.validate(&sandbox, Some(8192), 4).map_err(|e| e.to_string());
        let ok = TemplateConfig {
            name: "web-2".into(),
            ..Default::default()
        };
        assert!(check(ok.clone()).is_ok());
        let gvisor = TemplateConfig {
            runtime: Some("runsc".into()),
            network: Some(EgressPolicy::Packages),
            ..ok.clone()
        };
        assert!(check(gvisor).is_ok(), "gVisor behind the proxy");
        for (bad, key) in [
            (
                TemplateConfig {
                    name: "Web".into(),
                    ..ok.clone()
                },
                "name",
            ),
            (
                TemplateConfig {
                    name: "web-".into(),
                    ..ok.clone()
                },
                "name",
            ),
            (
                TemplateConfig {
                    packages: vec!["--index-url=http://x".into()],
                    ..ok.clone()
                },
                "packages",
            ),
            (
                TemplateConfig {
                    packages: vec!["a\nb".into()],
                    ..ok.clone()
                },
                "packages",
            ),
            (
                TemplateConfig {
                    memory_mb: Some(9000),
                    ..ok.clone()
                },
                "memory_mb",
            ),
            (
                TemplateConfig {
                    cpus: Some(5.0),
                    ..ok.clone()
                },
                "cpus",
            ),
            (
                TemplateConfig {
                    runtime: Some("kata".into()),
                    ..ok.clone()
                },
                "runtime",
            ),
            (
                TemplateConfig {
                    results_mb: Some(8),
                    ..ok.clone()
                },
                "results_mb",
            ),
            (
                TemplateConfig {
                    runtime: Some("runsc".into()),
                    ..ok.clone()
                },
                "cannot join the server's network",
            ),
            (
                TemplateConfig {
                    packages_mb: Some(4096),
                    ..ok.clone()
                },
                "sandbox.packages_mb is 0",
            ),
            (
                TemplateConfig {
                    files: Some("/no/such/folder".into()),
                    ..ok.clone()
                },
                "files",
            ),
            (
                TemplateConfig {
                    steps: vec![" ".into()],
                    ..ok.clone()
                },
                "steps",
            ),
        ] {
            let e = check(bad).unwrap_err();
            assert!(e.contains(key), "{e}");
        }
    }

    #[test]
    fn files_are_read_whole_without_links() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("data")).unwrap();
        std::fs::write(dir.path().join("data/a.csv"), "x,y\n1,2\n").unwrap();
        std::fs::write(dir.path().join("README.md"), "hello").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", dir.path().join("passwd")).unwrap();
        let files = read_files(dir.path()).unwrap();
        let paths: Vec<_> = files.iter().map(|f| f.path.display().to_string()).collect();
        assert_eq!(paths, ["README.md", "data", "data/a.csv"]);
        assert_eq!(files[2].bytes.as_deref(), Some(&b"x,y\n1,2\n"[..]));
    }
}
