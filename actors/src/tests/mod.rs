//! Unit tests of the domain's logic on the in-memory runtime
//! ([`sandbox_runtime::fake`]) and tokio's paused clock: no Docker engine,
//! and a deadline of minutes passes at once. The same paths against the
//! real engine are in `actors/tests/`.

mod actor;
mod agent_connection;
mod disks;
mod fork;
mod pool;
mod registry;
mod rest;
mod snapshot;
mod spans;
mod supervisor;
mod templates;
mod usage;

use std::sync::Arc;
use std::time::Duration;

use sandbox_host::recording::Recorder;
use uuid::Uuid;

use crate::error::Result;
use crate::{Quota, Ran, Sandboxes, Settings};
use sandbox_runtime::agent::Work;
use sandbox_runtime::fake::FakeRuntime;

pub const OWNER: &str = "tester";

/// A server on the fake runtime, with its own folders.
pub struct Server {
    pub sandboxes: Option<Sandboxes>,
    pub fake: FakeRuntime,
    /// Every mount and `mkfs` the server makes, recorded and played.
    pub host: Arc<Recorder>,
    pub settings: Settings,
    _root: tempfile::TempDir,
}

impl Server {
    pub async fn start() -> Self {
        Self::with(|_| {}).await
    }

    pub async fn with(tweak: impl FnOnce(&mut Settings)) -> Self {
        let root = tempfile::tempdir().unwrap();
        let mut settings = Settings::under(root.path());
        // No capped file systems (the recorder plays them for the tests
        // that turn them on), no egress proxy, no pausing unless a test
        // asks.
        settings.sandbox.results_mb = 0;
        settings.sandbox.packages_mb = 0;
        settings.sandbox.pause_after_seconds = 0;
        tweak(&mut settings);
        let fake = FakeRuntime::new(settings.sandbox.output_cap_bytes);
        let host = Arc::new(Recorder::new());
        let sandboxes = open(&settings, &fake, &host).await.expect("start on the fake runtime");
        Self {
            sandboxes: Some(sandboxes),
            fake,
            host,
            settings,
            _root: root,
        }
    }

    pub fn sb(&self) -> &Sandboxes {
        self.sandboxes.as_ref().expect("running")
    }

    /// Stops the server and starts it again on the same records and engine.
    pub async fn restart(&mut self) {
        if let Some(s) = self.sandboxes.take() {
            s.shutdown().await;
        }
        self.sandboxes = Some(open(&self.settings, &self.fake, &self.host).await.expect("restart"));
    }

    pub async fn create(&self) -> Uuid {
        self.sb()
            .create(OWNER, None, Quota::UNLIMITED, Default::default())
            .await
            .expect("create")
            .sandbox_id
    }

    /// A sandbox deleted `lifetime` after its creation; lifetimes are read
    /// on the wall clock, which the paused clock leaves alone.
    pub async fn create_for(&self, lifetime: Duration) -> Uuid {
        let options = crate::CreateOptions {
            lifetime: Some(lifetime),
            ..Default::default()
        };
        self.sb()
            .create(OWNER, None, Quota::UNLIMITED, options)
            .await
            .expect("create")
            .sandbox_id
    }

    /// Runs one directive of the fake agent (see `sandbox_runtime::fake`).
    pub async fn run(&self, id: Uuid, directive: &str) -> Result<Ran> {
        self.sb()
            .run(OWNER, id, Work::Python(directive.into()), None, None)
            .await
    }

    pub async fn stdout(&self, id: Uuid, directive: &str) -> String {
        let ran = self.run(id, directive).await.expect("run");
        ran.output.stdout
    }

    pub fn container(&self, id: Uuid) -> String {
        self.fake.container_of(id).expect("a container")
    }

    /// The directives starting with `prefix` that sandbox `id`'s agents ran,
    /// in the order they ran.
    pub fn ran_starting(&self, id: Uuid, prefix: &str) -> Vec<String> {
        self.fake
            .execs(id)
            .into_iter()
            .map(|(work, _)| work)
            .filter(|w| w.starts_with(prefix))
            .collect()
    }
}

async fn open(settings: &Settings, fake: &FakeRuntime, host: &Arc<Recorder>) -> Result<Sandboxes> {
    Sandboxes::on_fake(settings.clone(), fake, host.clone()).await
}

/// Lets background work (ticks, refills, retries) run for `d` of paused time.
pub async fn pass(d: Duration) {
    tokio::time::sleep(d).await;
}

/// Waits (in paused time, at most a minute) until `cond` holds.
pub async fn until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !cond() {
        assert!(tokio::time::Instant::now() < deadline, "never happened: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
