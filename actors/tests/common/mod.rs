//! Harness for tests against the real Docker engine: every test gets its own
//! state and results folders, hence its own server id, and removes exactly
//! the containers and volumes labelled with that id, even when it panics.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use sandbox_actors::{InstallStatus, InstallStatusKind, Quota, Ran, Sandboxes, Settings, Work};
use sandbox_runtime::labels;
use sandbox_runtime::DockerRuntime;
use uuid::Uuid;

pub const OWNER: &str = "tester";

pub fn settings(root: &Path) -> Settings {
    let ca = PathBuf::from("/etc/ssl/certs/ca-certificates.crt");
    let uploads = root.join("uploads");
    std::fs::create_dir_all(&uploads).unwrap();
    let mut s = Settings::under(root);
    s.sandbox.ca_bundle = ca.is_file().then_some(ca);
    s.sandbox.memory_mb = 512;
    s.sandbox.pids_limit = 128;
    s.uploads.allowed_dirs = vec![uploads];
    // No warm pool: tests count their own objects; the pool has tests of its own.
    s
}

pub struct Harness {
    pub sandboxes: Option<Sandboxes>,
    pub root: tempfile::TempDir,
    pub server_id: String,
    /// What the server was started with; a restart reuses it.
    pub settings: Settings,
}

impl Harness {
    pub async fn new() -> Self {
        Self::with(|_| {}).await
    }

    pub async fn with(tweak: impl FnOnce(&mut Settings)) -> Self {
        Self::on("runc", tweak).await
    }

    /// A server whose sandboxes run under the OCI runtime `runtime`.
    pub async fn on(runtime: &str, tweak: impl FnOnce(&mut Settings)) -> Self {
        let root = tempfile::tempdir().unwrap();
        let mut s = settings(root.path());
        s.sandbox.runtime = runtime.into();
        tweak(&mut s);
        let sandboxes = Sandboxes::start(s.clone()).await.expect("start (is Docker running?)");
        let server_id = sandboxes.server_id().to_string();
        Self {
            sandboxes: Some(sandboxes),
            root,
            server_id,
            settings: s,
        }
    }

    pub fn sb(&self) -> &Sandboxes {
        self.sandboxes.as_ref().unwrap()
    }

    /// Stops the server side and starts it again on the same state.
    pub async fn restart(&mut self) {
        if let Some(s) = self.sandboxes.take() {
            s.shutdown().await;
        }
        let s = Sandboxes::start(self.settings.clone()).await.unwrap();
        assert_eq!(s.server_id(), self.server_id);
        self.sandboxes = Some(s);
    }

    pub async fn create(&self) -> Uuid {
        self.sb()
            .create(OWNER, None, Quota::UNLIMITED, Default::default())
            .await
            .unwrap()
            .sandbox_id
    }

    pub async fn py(&self, id: Uuid, code: &str) -> Ran {
        self.py_t(id, code, None).await
    }

    pub async fn py_t(&self, id: Uuid, code: &str, timeout: Option<u64>) -> Ran {
        self.sb()
            .run(OWNER, id, Work::Python(code.into()), timeout, None)
            .await
            .unwrap()
    }

    pub async fn sh(&self, id: Uuid, cmd: &str, timeout: Option<u64>) -> Ran {
        let argv = vec!["sh".into(), "-c".into(), cmd.into()];
        self.sb()
            .run(OWNER, id, Work::Program(argv), timeout, None)
            .await
            .unwrap()
    }

    /// Installs `package`, waiting for the outcome.
    pub async fn install(&self, id: Uuid, package: &str) -> InstallStatus {
        self.sb()
            .install(OWNER, id, package, Duration::from_secs(180))
            .await
            .unwrap()
    }

    /// Installs `package` successfully and finds it listed with the sandbox.
    pub async fn install_ok(&self, id: Uuid, package: &str) {
        let st = self.install(id, package).await;
        assert_eq!(st.status, InstallStatusKind::Success, "{st:?}");
        let listed = self
            .sb()
            .list(OWNER)
            .await
            .into_iter()
            .find(|s| s.sandbox_id == id)
            .unwrap()
            .installed_packages;
        assert!(listed.iter().any(|p| p.name == package), "{listed:?}");
    }

    /// A package that does not exist fails with the installer's message.
    pub async fn install_of_a_missing_package_fails(&self, id: Uuid) {
        let name = "surely-no-such-package-mcp-sandbox-xyz";
        let st = self.install(id, name).await;
        assert_eq!(st.status, InstallStatusKind::Failed);
        assert!(
            st.message.contains(name) && st.output.unwrap_or_default().contains(name),
            "{}",
            st.message
        );
    }

    pub fn container_of(&self, id: Uuid) -> String {
        docker(&["ps", "-aq", "--filter", &format!("label={}={id}", labels::SANDBOX)])
            .trim()
            .to_string()
    }

    pub fn own_objects(&self) -> (usize, usize) {
        let filter = format!("label={}={}", labels::SERVER, self.server_id);
        let c = docker(&["ps", "-aq", "--filter", &filter]).lines().count();
        let v = docker(&["volume", "ls", "-q", "--filter", &filter]).lines().count();
        (c, v)
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        // Stop the domain first: a live actor brings back a container it
        // finds removed, and the pool refills, both after any cleanup.
        if let Some(sandboxes) = self.sandboxes.take() {
            let runtime = tokio::runtime::Handle::current();
            tokio::task::block_in_place(|| runtime.block_on(sandboxes.shutdown()));
        }
        let filter = format!("label={}={}", labels::SERVER, self.server_id);
        for id in docker(&["ps", "-aq", "--filter", &filter]).lines() {
            docker(&["rm", "-f", "-v", id]);
        }
        for v in docker(&["volume", "ls", "-q", "--filter", &filter]).lines() {
            docker(&["volume", "rm", "-f", v]);
        }
        for n in docker(&["network", "ls", "-q", "--filter", &filter]).lines() {
            docker(&["network", "rm", n]);
        }
        let _ = sandbox_host::firewall::remove(&sandbox_host::syscalls::Linux, &self.server_id);
        unmount_under(self.root.path());
    }
}

/// A Docker runtime of the server `server_id` under `settings`, its
/// network (and firewall rules) set up, as a server's start sets it up.
pub async fn docker_runtime(server_id: &str, settings: &Settings) -> DockerRuntime {
    let mut runtime = DockerRuntime::connect(
        server_id,
        &settings.sandbox,
        &settings.state_dir,
        settings.agents_dir(),
        sandbox_host::syscalls::linux(),
    )
    .await
    .unwrap();
    runtime.isolate_network().await.unwrap();
    runtime
}

/// Detaches every file system mounted under `root` (the sandboxes' disk
/// images and agent folders), deepest first, so that removing the folder
/// removes only folders.
pub fn unmount_under(root: &Path) {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut mounts: Vec<&str> = mountinfo
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|m| Path::new(m).starts_with(root))
        .collect();
    mounts.sort_by_key(|m| std::cmp::Reverse(m.len()));
    for m in mounts {
        let _ = Command::new("umount").args(["-l", m]).status();
    }
}

/// Whether the OCI runtime `name` is registered with Docker. Where it is
/// not, a test skips, except where `SANDBOX_TEST_REQUIRE_<NAME>` is set
/// (scripts/test registers crun and runsc and sets it for both).
pub fn runtime_available(name: &str) -> bool {
    if docker(&["info", "--format", "{{json .Runtimes}}"]).contains(&format!("\"{name}\"")) {
        return true;
    }
    let required = format!("SANDBOX_TEST_REQUIRE_{}", name.to_ascii_uppercase());
    assert!(
        std::env::var_os(&required).is_none(),
        "{name} is not registered with Docker ({required} is set)"
    );
    eprintln!("skipped: {name} is not registered with Docker (scripts/test registers it)");
    false
}

pub fn docker(args: &[&str]) -> String {
    let out = Command::new("docker").args(args).output().expect("docker CLI");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub async fn eventually<F: Fn() -> bool>(what: &str, f: F) {
    within(what, Duration::from_secs(10), f).await
}

/// Waits until `f` holds, at most `limit` (a generous bound: machines are shared).
pub async fn within<F: Fn() -> bool>(what: &str, limit: Duration, f: F) {
    let deadline = std::time::Instant::now() + limit;
    while std::time::Instant::now() < deadline {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{what} did not happen within {limit:?}");
}
