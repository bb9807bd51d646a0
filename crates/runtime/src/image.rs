//! The sandbox image: built on first use when missing.
//!
//! Its tag is a hash of the build context compiled into this binary, so a
//! server always runs the agent it was built with. Where a registry is
//! reachable the Dockerfile builds on `python:3.12-slim`; where none is, the
//! same Dockerfile builds on a Debian root file system that
//! `docker/bootstrap-rootfs.sh` makes with debootstrap and the Engine API
//! imports. That base is kept, so the slow step runs once per machine.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use bollard::query_parameters::{BuildImageOptionsBuilder, CreateImageOptionsBuilder, ListImagesOptionsBuilder};
use bollard::Docker;
use futures_util::StreamExt;
use tokio_util::io::ReaderStream;
use tracing::info;

use crate::config::SandboxConfig;
use crate::labels;
use crate::template::{Definition, RUN_STEP};
use crate::{ImageError, Result};

const DOCKERFILE: &[u8] = include_bytes!("../../../docker/Dockerfile");
const AGENT: &[u8] = include_bytes!("../../../docker/agent.py");
const EGRESS_RELAY: &[u8] = include_bytes!("../../../docker/egress_relay.py");
const OUTPUTS: &[u8] = include_bytes!("../../../docker/outputs.py");
const BOOTSTRAP: &[u8] = include_bytes!("../../../docker/bootstrap-rootfs.sh");
const REGISTRY_BASE: &str = "python:3.12-slim";

/// `{image}:{hash of the build context}`.
pub fn tag(config: &SandboxConfig) -> String {
    // FNV-1a: stable across builds and platforms, and enough to tell contexts apart.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in DOCKERFILE
        .iter()
        .chain(b"\0")
        .chain(AGENT)
        .chain(b"\0")
        .chain(EGRESS_RELAY)
        .chain(b"\0")
        .chain(OUTPUTS)
    {
        h ^= u64::from(*byte);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{}:{:012x}", config.image, h >> 16)
}

fn offline_base(config: &SandboxConfig) -> String {
    format!("{}-base:bookworm", config.image)
}

async fn exists(docker: &Docker, image: &str) -> bool {
    docker.inspect_image(image).await.is_ok()
}

/// How long one image request (a build, an import) may take. The engine
/// client's default of 120 s is for its other calls: a first build on a
/// busy two-core machine, behind a proxy, can pass it, and the request
/// would end with the build half done.
const IMAGE_REQUEST_TIMEOUT: Duration = Duration::from_secs(30 * 60);

/// Builds `image` unless present. `scratch` is a folder for the bootstrap
/// script (it is compiled in, so the binary needs no checkout) and the root
/// file system it makes.
pub async fn ensure(docker: &Docker, config: &SandboxConfig, image: &str, scratch: &Path) -> Result<()> {
    let docker = &docker.clone().with_timeout(IMAGE_REQUEST_TIMEOUT);
    if exists(docker, image).await {
        return Ok(());
    }
    info!(%image, "sandbox image missing: building it");
    let base = offline_base(config);
    if !exists(docker, &base).await {
        match build(docker, context(config)?, image, REGISTRY_BASE, &[], &log_line).await {
            Ok(()) => return Ok(()),
            Err(e) => {
                info!(error = %e, "building on {REGISTRY_BASE} failed; making an offline base with debootstrap")
            }
        }
        let script = scratch.join("bootstrap-rootfs.sh");
        std::fs::write(&script, BOOTSTRAP).map_err(|source| ImageError::File {
            what: "writing",
            path: script.clone(),
            source,
        })?;
        let rootfs = scratch.join("bootstrap-rootfs.tar");
        let imported = import_rootfs(docker, &base, &script, &rootfs).await;
        let _ = std::fs::remove_file(&script);
        let _ = std::fs::remove_file(&rootfs);
        imported?;
    }
    build(docker, context(config)?, image, &base, &[], &log_line).await
}

/// The CA bundle of `sandbox.ca_bundle`, or nothing.
fn ca_bundle(config: &SandboxConfig) -> Result<Vec<u8>> {
    match &config.ca_bundle {
        Some(path) => Ok(std::fs::read(path).map_err(|source| ImageError::File {
            what: "reading sandbox.ca_bundle",
            path: path.clone(),
            source,
        })?),
        None => Ok(Vec::new()),
    }
}

/// A build context: a tar of `files`.
fn tar_of(files: &[(&str, &[u8])]) -> Result<Vec<u8>> {
    let mut tar = tar::Builder::new(Vec::new());
    for (name, data) in files {
        let mut header = tar::Header::new_gnu();
        header.set_size(data.len() as u64);
        header.set_mode(0o644);
        header.set_cksum();
        tar.append_data(&mut header, name, *data).map_err(ImageError::Context)?;
    }
    Ok(tar.into_inner().map_err(ImageError::Context)?)
}

fn context(config: &SandboxConfig) -> Result<Vec<u8>> {
    let ca = ca_bundle(config)?;
    tar_of(&[
        ("Dockerfile", DOCKERFILE),
        ("agent.py", AGENT),
        ("egress_relay.py", EGRESS_RELAY),
        ("outputs.py", OUTPUTS),
        ("ca-bundle.crt", ca.as_slice()),
    ])
}

/// How many of a failed build's last output lines its error carries:
/// what the step printed of its failure (the package the index did not
/// have, the host that could not be reached).
const FAILED_LINES: usize = 12;

/// Builds `context` into `image` on `base` (the build argument `BASE`),
/// labelled as the project's and with `labels`; `progress` hears each
/// line the build prints.
async fn build(
    docker: &Docker,
    context: Vec<u8>,
    image: &str,
    base: &str,
    labels: &[(&str, &str)],
    progress: &(dyn Fn(&str) + Send + Sync),
) -> Result<()> {
    let buildargs = HashMap::from([("BASE".to_string(), base.to_string())]);
    let mut all_labels = HashMap::from([(labels::PROJECT.to_string(), labels::PROJECT_VALUE.to_string())]);
    all_labels.extend(labels.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    let options = BuildImageOptionsBuilder::default()
        .dockerfile("Dockerfile")
        .t(image)
        .rm(true)
        .forcerm(true)
        .buildargs(&buildargs)
        .labels(&all_labels)
        .build();
    let mut stream = docker.build_image(options, None, Some(bollard::body_full(context.into())));
    let mut tls_failed = false;
    let mut last: std::collections::VecDeque<String> = Default::default();
    // The images the steps made, which a failed build leaves untagged.
    let mut made: Vec<String> = vec![];
    let hint = |tls_failed: bool| {
        match tls_failed {
        true => " (TLS verification failed inside the build: behind a TLS-intercepting proxy, set sandbox.ca_bundle to the host's CA bundle)",
        false => "",
    }
    };
    let output = |last: &std::collections::VecDeque<String>| last.iter().cloned().collect::<Vec<_>>().join("\n");
    let mut failure = None;
    while let Some(item) = stream.next().await {
        let info = match item {
            Ok(info) => info,
            Err(source) => {
                failure = Some(ImageError::Engine {
                    base: base.into(),
                    source,
                    hint: hint(tls_failed),
                    output: output(&last),
                });
                break;
            }
        };
        if let Some(detail) = info.error_detail {
            failure = Some(ImageError::Step {
                base: base.into(),
                message: detail.message.unwrap_or_default(),
                hint: hint(tls_failed),
                output: output(&last),
            });
            break;
        }
        if let Some(text) = info.stream.as_deref() {
            for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
                tls_failed |= line.contains("CERTIFICATE_VERIFY_FAILED") || line.contains("invalid peer certificate");
                if let Some(id) = line
                    .strip_prefix("---> ")
                    .filter(|id| id.bytes().all(|b| b.is_ascii_hexdigit()))
                {
                    made.push(id.to_string());
                }
                progress(line);
                if last.len() == FAILED_LINES {
                    last.pop_front();
                }
                last.push_back(line.to_string());
            }
        }
    }
    if let Some(failure) = failure {
        remove_untagged(docker, &made).await;
        return Err(failure.into());
    }
    if exists(docker, image).await {
        info!(%image, "image built");
        Ok(())
    } else {
        Err(ImageError::NotProduced {
            base: base.into(),
            image: image.into(),
        }
        .into())
    }
}

/// Removes the images of `ids` that carry no tag: the steps' layers of a
/// build that failed (a tagged one, such as the base a step reports, or
/// one a later build was made on, stays).
async fn remove_untagged(docker: &Docker, ids: &[String]) {
    for id in ids.iter().rev() {
        let untagged = docker
            .inspect_image(id)
            .await
            .is_ok_and(|i| i.repo_tags.unwrap_or_default().is_empty());
        if untagged {
            let _ = docker
                .remove_image(id, None::<bollard::query_parameters::RemoveImageOptions>, None)
                .await;
        }
    }
}

/// The engine's lines of the sandbox image's build, in the server's log.
fn log_line(line: &str) {
    info!(target: "mcp_sandbox::image", "{line}");
}

/// Builds template `definition` into `image` on the sandbox image `base`,
/// unless present, labelled as server `server_id`'s; `progress` hears a
/// line per build step. The build's steps run in the engine's build
/// containers, with the engine's default network and none of the server's
/// privileges.
pub async fn ensure_template(
    docker: &Docker,
    server_id: &str,
    config: &SandboxConfig,
    definition: &Definition,
    image: &str,
    base: &str,
    progress: &(dyn Fn(&str) + Send + Sync),
) -> Result<bool> {
    let docker = &docker.clone().with_timeout(IMAGE_REQUEST_TIMEOUT);
    if exists(docker, image).await {
        return Ok(false);
    }
    let ca = ca_bundle(config)?;
    let dockerfile = definition.dockerfile();
    let requirements = definition.requirements();
    let context = tar_of(&[
        ("Dockerfile", dockerfile.as_bytes()),
        ("run", RUN_STEP.as_bytes()),
        ("ca-bundle.crt", ca.as_slice()),
        ("requirements.txt", requirements.as_bytes()),
    ])?;
    let steps = |line: &str| {
        if line.starts_with("Step ") {
            progress(line);
        }
    };
    let name = definition.config.name.as_str();
    let labels = [(labels::TEMPLATE, name), (labels::SERVER, server_id)];
    build(docker, context, image, base, &labels, &steps).await?;
    Ok(true)
}

/// Removes the template images server `server_id` built that `keep` does
/// not name (the images of the templates in force and of sandboxes made
/// from earlier definitions); an image a container still uses stays. Other
/// servers' images are theirs to remove: they may have sandboxes of them.
pub async fn remove_unused_templates(docker: &Docker, server_id: &str, keep: &HashSet<String>) -> Result<Vec<String>> {
    let mut filters = labels::server_filter(server_id);
    filters
        .entry("label".to_string())
        .or_default()
        .push(labels::TEMPLATE.to_string());
    let options = ListImagesOptionsBuilder::default().filters(&filters).build();
    let mut removed = vec![];
    for image in docker.list_images(Some(options)).await? {
        for tag in image.repo_tags.iter().filter(|t| !keep.contains(*t)) {
            match docker
                .remove_image(tag, None::<bollard::query_parameters::RemoveImageOptions>, None)
                .await
            {
                Ok(_) => removed.push(tag.clone()),
                Err(e) => info!(image = %tag, error = %e, "an unused template image stays for now"),
            }
        }
    }
    Ok(removed)
}

/// Runs the bootstrap script into the file `rootfs`, then imports it. The
/// script runs to its end first: streamed as it ran, its minute or more
/// of debootstrap would count against the import request's time, and an
/// ended request would show only as the script's broken pipe.
async fn import_rootfs(docker: &Docker, base: &str, script: &Path, rootfs: &Path) -> Result<()> {
    info!(script = %script.display(), "bootstrapping a Debian root file system (about a minute)");
    let file = |what: &'static str, path: &Path| {
        let path = path.to_path_buf();
        move |source| ImageError::File { what, path, source }
    };
    let tar = std::fs::File::create(rootfs).map_err(file("writing", rootfs))?;
    let status = tokio::process::Command::new("bash")
        .arg(script)
        .stdout(Stdio::from(tar))
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .status()
        .await
        .map_err(file("running", script))?;
    if !status.success() {
        return Err(ImageError::Bootstrap {
            script: script.to_path_buf(),
            status,
        }
        .into());
    }
    let tar = tokio::fs::File::open(rootfs).await.map_err(file("reading", rootfs))?;
    let (repo, tag) = base.split_once(':').expect("base has a tag");
    let options = CreateImageOptionsBuilder::default()
        .from_src("-")
        .repo(repo)
        .tag(tag)
        .changes(vec![format!("LABEL {}={}", labels::PROJECT, labels::PROJECT_VALUE)])
        .build();
    let body = bollard::body_try_stream(ReaderStream::new(tar));
    let mut stream = docker.create_image(Some(options), Some(body), None);
    let mut failure = None;
    while let Some(item) = stream.next().await {
        match item {
            Ok(info) => {
                if let Some(detail) = info.error_detail {
                    failure = Some(ImageError::ImportRefused(detail.message.unwrap_or_default()));
                }
            }
            Err(e) => failure = Some(ImageError::Import(e)),
        }
    }
    if let Some(f) = failure {
        // An import cut short may leave what the engine had read: such a
        // base must not stay to be built on at every later start.
        let _ = docker
            .remove_image(base, None::<bollard::query_parameters::RemoveImageOptions>, None)
            .await;
        return Err(f.into());
    }
    info!(%base, "offline base image imported");
    Ok(())
}
