//! A container runtime in memory, for unit tests of the domain's logic
//! without a Docker engine: containers that start, pause, stop, die and
//! vanish, an engine that can go down, and for each running container an
//! in-process agent that speaks the real agent protocol (JSON lines) over a
//! socket pair and can be told to answer slowly, never, wrongly or hugely.
//!
//! Tests run it on tokio's paused clock, so a deadline of minutes passes in
//! microseconds and the order of events is the same on every run.
//!
//! The agent reads the code it is sent as one directive (see [`exec`]), so a
//! test says what the sandbox does in a word: `sleep 3`, `set x 1`, `oom`.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::unix::OwnedWriteHalf;
use tokio::net::UnixStream;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::agent::AgentClient;
use crate::{
    ContainerRef, ContainerRuntime, ContainerState, Installed, Labelled, Result, RuntimeError, SandboxPaths, Usage,
};

/// How an agent answers: what the sandbox's user can put in its place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Behaviour {
    /// The real agent's answers.
    Normal,
    /// Accepts connections and reads requests, never answers.
    Silent,
    /// Answers every request with a line that is not JSON.
    Garbage,
    /// Answers every request with a line of this many bytes.
    Huge(usize),
    /// Answers every run with a well-formed error whose text has this many
    /// bytes (and the rest as the real agent does).
    Wordy(usize),
}

/// One container: its state, and the life of its current start (ended when
/// it stops, restarts or is removed, which closes its agent's connections).
struct Container {
    sandbox: Uuid,
    /// The sandbox's results folder on the host, where a fork's namespace
    /// is written and read (`dump`, `load`).
    results: PathBuf,
    volume: String,
    /// The template's image it was made from (none: the sandbox image).
    image: Option<String>,
    state: ContainerState,
    life: CancellationToken,
    paused: watch::Sender<bool>,
    worker: Arc<Mutex<Worker>>,
    /// When its current start began.
    booted: tokio::time::Instant,
}

impl Container {
    fn boot(&mut self) {
        self.booted = tokio::time::Instant::now();
        self.life.cancel();
        self.life = CancellationToken::new();
        self.worker = Arc::default();
        self.state = ContainerState::Running;
        self.paused.send_replace(false);
    }

    fn halt(&mut self, exit_code: i64, oom_killed: bool) {
        self.life.cancel();
        self.state = ContainerState::Stopped { exit_code, oom_killed };
        self.paused.send_replace(false);
    }
}

/// The Python worker of one start: its namespace, and whether it runs a request.
#[derive(Default)]
struct Worker {
    vars: HashMap<String, String>,
    busy: bool,
    /// Copies of `vars` parked by snapshots, by slot; gone with the start.
    parked: HashMap<String, HashMap<String, String>>,
}

/// What the fake did, for tests to assert on.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    Created {
        container: String,
        sandbox: Uuid,
        volume: String,
    },
    Started(String),
    Restarted(String),
    Paused(String),
    Unpaused(String),
    Removed(String),
    VolumeRemoved(String),
    /// A connection to a sandbox's agent was made.
    AgentConnected(Uuid),
    /// An agent began a request: exec code, or the program's argv joined.
    Exec {
        sandbox: Uuid,
        work: String,
        at: tokio::time::Instant,
    },
    Upload {
        container: String,
        dest: String,
        bytes: usize,
    },
    Installer {
        sandbox: Uuid,
        argv: Vec<String>,
    },
}

#[derive(Default)]
struct State {
    containers: HashMap<String, Container>,
    /// Volume → its sandbox.
    volumes: HashMap<String, Uuid>,
    /// Sandbox → its current container (a re-creation replaces it).
    current: HashMap<Uuid, String>,
    behaviour: HashMap<Uuid, Behaviour>,
    /// What a sandbox's containers report using (none set: nothing).
    usage: HashMap<Uuid, Usage>,
    /// What a sandbox's installer containers use, each.
    installer_usage: HashMap<Uuid, Usage>,
    events: Vec<Event>,
    next: u64,
    create_delay: Duration,
    fail_creates: usize,
    /// How long a started container's agent takes to listen.
    agent_start: Duration,
    /// Calls of `state`: each is an inspection by a real engine.
    inspections: usize,
    /// Template images built and not removed.
    images: std::collections::BTreeSet<String>,
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    engine_down: AtomicBool,
}

/// The in-memory runtime; clones share one engine.
#[derive(Clone)]
pub struct FakeRuntime {
    shared: Arc<Shared>,
    /// `sandbox.output_cap_bytes`, which bounds the agent's reply lines.
    output_cap: usize,
}

impl FakeRuntime {
    pub fn new(output_cap: usize) -> Self {
        Self {
            shared: Arc::default(),
            output_cap,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.shared.state.lock().expect("fake runtime lock")
    }

    fn engine(&self) -> Result<()> {
        match self.shared.engine_down.load(Ordering::SeqCst) {
            true => Err(refusal(503, "the fake engine is down".into())),
            false => Ok(()),
        }
    }

    /// Every runtime call but the agent's connection fails while down.
    pub fn set_engine_down(&self, down: bool) {
        self.shared.engine_down.store(down, Ordering::SeqCst);
    }

    /// How the agents of `sandbox` answer from their next request on.
    pub fn set_behaviour(&self, sandbox: Uuid, behaviour: Behaviour) {
        self.lock().behaviour.insert(sandbox, behaviour);
    }

    /// What the containers of `sandbox` report using from now on.
    pub fn set_usage(&self, sandbox: Uuid, usage: Usage) {
        self.lock().usage.insert(sandbox, usage);
    }

    /// What each installer container of `sandbox` uses from now on.
    pub fn set_installer_usage(&self, sandbox: Uuid, usage: Usage) {
        self.lock().installer_usage.insert(sandbox, usage);
    }

    /// Each creation takes this long (a slow engine).
    pub fn set_create_delay(&self, delay: Duration) {
        self.lock().create_delay = delay;
    }

    /// Agents listen this long after their container starts (a loaded host).
    pub fn set_agent_start(&self, delay: Duration) {
        self.lock().agent_start = delay;
    }

    /// How many times the state of a container was asked for.
    pub fn inspections(&self) -> usize {
        self.lock().inspections
    }

    /// The next `n` creations fail.
    pub fn fail_creates(&self, n: usize) {
        self.lock().fail_creates = n;
    }

    /// The container `sandbox` runs in now.
    pub fn container_of(&self, sandbox: Uuid) -> Option<String> {
        self.lock().current.get(&sandbox).cloned()
    }

    pub fn state_of(&self, container: &str) -> ContainerState {
        self.lock()
            .containers
            .get(container)
            .map_or(ContainerState::Missing, |c| c.state.clone())
    }

    /// The template image `container` was made from (none: the sandbox image).
    pub fn image_of(&self, container: &str) -> Option<String> {
        self.lock().containers.get(container).and_then(|c| c.image.clone())
    }

    /// The template images built so far.
    pub fn template_images(&self) -> Vec<String> {
        self.lock().images.iter().cloned().collect()
    }

    pub fn volume_of(&self, container: &str) -> Option<String> {
        self.lock().containers.get(container).map(|c| c.volume.clone())
    }

    /// Containers that exist (in any state), with their sandbox.
    pub fn containers(&self) -> Vec<(String, Uuid)> {
        let mut all: Vec<_> = self
            .lock()
            .containers
            .iter()
            .map(|(id, c)| (id.clone(), c.sandbox))
            .collect();
        all.sort();
        all
    }

    pub fn volumes(&self) -> Vec<String> {
        let mut all: Vec<_> = self.lock().volumes.keys().cloned().collect();
        all.sort();
        all
    }

    pub fn events(&self) -> Vec<Event> {
        self.lock().events.clone()
    }

    /// The work agents began, in order, for one sandbox.
    pub fn execs(&self, sandbox: Uuid) -> Vec<(String, tokio::time::Instant)> {
        self.lock()
            .events
            .iter()
            .filter_map(|e| match e {
                Event::Exec { sandbox: s, work, at } if *s == sandbox => Some((work.clone(), *at)),
                _ => None,
            })
            .collect()
    }

    pub fn count(&self, pick: impl Fn(&Event) -> bool) -> usize {
        self.lock().events.iter().filter(|e| pick(e)).count()
    }

    /// The container stops behind the server's back (`docker kill`, or the
    /// memory limit when `oom_killed`).
    pub fn kill(&self, container: &str, oom_killed: bool) {
        if let Some(c) = self.lock().containers.get_mut(container) {
            c.halt(137, oom_killed);
        }
    }

    /// The container is frozen behind the server's back (`docker pause`).
    pub fn freeze(&self, container: &str) {
        if let Some(c) = self.lock().containers.get_mut(container) {
            c.state = ContainerState::Paused;
            c.paused.send_replace(true);
        }
    }

    /// The container is removed behind the server's back (`docker rm -f`);
    /// its volume stays.
    pub fn vanish(&self, container: &str) {
        if let Some(c) = self.lock().containers.remove(container) {
            c.life.cancel();
        }
    }

    fn record(&self, event: Event) {
        self.lock().events.push(event);
    }

    /// Applies `change` to an existing container, or says it is missing.
    fn with_container<T>(&self, id: &str, change: impl FnOnce(&mut Container) -> Result<T>) -> Result<T> {
        self.engine()?;
        let mut state = self.lock();
        let c = state
            .containers
            .get_mut(id)
            .ok_or_else(|| refusal(404, format!("no such container: {id}")))?;
        change(c)
    }
}

#[async_trait]
impl ContainerRuntime for FakeRuntime {
    async fn ping(&self) -> Result<()> {
        self.engine()
    }

    async fn create(&self, paths: &SandboxPaths, volume: Option<&str>) -> Result<ContainerRef> {
        self.engine()?;
        let delay = self.lock().create_delay;
        tokio::time::sleep(delay).await;
        self.engine()?;
        let mut state = self.lock();
        if state.fail_creates > 0 {
            state.fail_creates -= 1;
            return Err(refusal(500, "the fake engine refused the creation".into()));
        }
        state.next += 1;
        let container_id = format!("fake-{}", state.next);
        let volume = volume.map_or_else(|| format!("fake-volume-{}", state.next), str::to_string);
        let mut c = Container {
            sandbox: paths.id,
            results: paths.results.clone(),
            volume: volume.clone(),
            image: paths.template.as_ref().map(|t| t.image.clone()),
            state: ContainerState::Missing,
            life: CancellationToken::new(),
            paused: watch::channel(false).0,
            worker: Arc::default(),
            booted: tokio::time::Instant::now(),
        };
        c.boot();
        state.containers.insert(container_id.clone(), c);
        state.volumes.insert(volume.clone(), paths.id);
        state.current.insert(paths.id, container_id.clone());
        state.events.push(Event::Created {
            container: container_id.clone(),
            sandbox: paths.id,
            volume: volume.clone(),
        });
        Ok(ContainerRef { container_id, volume })
    }

    async fn start(&self, container_id: &str) -> Result<()> {
        self.with_container(container_id, |c| {
            if matches!(c.state, ContainerState::Stopped { .. }) {
                c.boot();
            }
            Ok(())
        })?;
        self.record(Event::Started(container_id.into()));
        Ok(())
    }

    async fn state(&self, container_id: &str) -> Result<ContainerState> {
        self.engine()?;
        self.lock().inspections += 1;
        Ok(self.state_of(container_id))
    }

    /// Read without an inspection, as the Docker runtime reads the cgroup.
    async fn started_state(&self, container_id: &str) -> Result<ContainerState> {
        self.engine()?;
        Ok(self.state_of(container_id))
    }

    async fn usage(&self, container_id: &str) -> Result<Usage> {
        let sandbox = self.with_container(container_id, |c| Ok(c.sandbox))?;
        Ok(self.lock().usage.get(&sandbox).copied().unwrap_or_default())
    }

    async fn pause(&self, container_id: &str) -> Result<()> {
        self.with_container(container_id, |c| match c.state {
            ContainerState::Running => {
                c.state = ContainerState::Paused;
                c.paused.send_replace(true);
                Ok(())
            }
            _ => Err(refusal(409, format!("container {container_id} is not running"))),
        })?;
        self.record(Event::Paused(container_id.into()));
        Ok(())
    }

    async fn unpause(&self, container_id: &str) -> Result<()> {
        self.with_container(container_id, |c| match c.state {
            ContainerState::Paused => {
                c.state = ContainerState::Running;
                c.paused.send_replace(false);
                Ok(())
            }
            _ => Err(refusal(409, format!("container {container_id} is not paused"))),
        })?;
        self.record(Event::Unpaused(container_id.into()));
        Ok(())
    }

    async fn restart(&self, container_id: &str) -> Result<()> {
        self.with_container(container_id, |c| {
            c.boot();
            Ok(())
        })?;
        self.record(Event::Restarted(container_id.into()));
        Ok(())
    }

    async fn remove_volume(&self, name: &str) -> Result<()> {
        self.engine()?;
        if self.lock().volumes.remove(name).is_some() {
            self.record(Event::VolumeRemoved(name.into()));
        }
        Ok(())
    }

    async fn remove(&self, container_id: &str, volume: Option<&str>) -> Result<()> {
        self.engine()?;
        let removed = self.lock().containers.remove(container_id);
        if let Some(c) = removed {
            c.life.cancel();
            self.record(Event::Removed(container_id.into()));
        }
        if let Some(v) = volume {
            self.remove_volume(v).await?;
        }
        Ok(())
    }

    async fn list_containers(&self) -> Result<Vec<Labelled>> {
        self.engine()?;
        Ok(self
            .containers()
            .into_iter()
            .map(|(id, sandbox)| Labelled {
                id,
                sandbox: Some(sandbox),
            })
            .collect())
    }

    async fn sandbox_containers(&self, sandbox: Uuid) -> Result<Vec<String>> {
        self.engine()?;
        Ok(self
            .containers()
            .into_iter()
            .filter(|(_, of)| *of == sandbox)
            .map(|(id, _)| id)
            .collect())
    }

    async fn list_volumes(&self) -> Result<Vec<Labelled>> {
        self.engine()?;
        Ok(self
            .lock()
            .volumes
            .iter()
            .map(|(id, sandbox)| Labelled {
                id: id.clone(),
                sandbox: Some(*sandbox),
            })
            .collect())
    }

    async fn upload(&self, container_id: &str, dest_dir: &str, tar: Vec<u8>) -> Result<()> {
        self.with_container(container_id, |c| match c.state {
            ContainerState::Running => Ok(()),
            _ => Err(refusal(409, format!("container {container_id} is not running"))),
        })?;
        self.record(Event::Upload {
            container: container_id.into(),
            dest: dest_dir.into(),
            bytes: tar.len(),
        });
        Ok(())
    }

    async fn run_installer(
        &self,
        paths: &SandboxPaths,
        _volume: &str,
        argv: Vec<String>,
        _timeout: Duration,
    ) -> Result<Installed> {
        self.engine()?;
        self.record(Event::Installer {
            sandbox: paths.id,
            argv,
        });
        Ok(Installed {
            exit_code: 0,
            output: "installed".into(),
            timed_out: false,
            usage: self.lock().installer_usage.get(&paths.id).copied().unwrap_or_default(),
        })
    }

    async fn release(&self) -> Result<()> {
        self.engine()
    }

    async fn open_port(
        &self,
        _paths: &SandboxPaths,
        port: u16,
    ) -> Result<crate::ports::PortStream, crate::ports::PortError> {
        Err(crate::ports::PortError::Refused(format!(
            "port {port}: the test runtime has no network"
        )))
    }

    /// Builds nothing: a template whose packages name `no-such-package`
    /// fails as an index without it would.
    async fn ensure_template(
        &self,
        definition: &crate::template::Definition,
        progress: &(dyn for<'l> Fn(&'l str) + Send + Sync),
    ) -> Result<(String, bool)> {
        self.engine()?;
        if let Some(p) = definition
            .config
            .packages
            .iter()
            .find(|p| p.contains("no-such-package"))
        {
            return Err(RuntimeError::Internal(format!(
                "{p} was not found in the package registry"
            )));
        }
        let tag = definition.tag(&crate::config::SandboxConfig::default(), "fake", "fake-image");
        progress("Step 1/1");
        let built = self.lock().images.insert(tag.clone());
        Ok((tag, built))
    }

    /// runc and crun, as on a host without gVisor.
    async fn oci_runtimes(&self) -> Result<Vec<String>> {
        self.engine()?;
        Ok(vec!["runc".into(), "crun".into()])
    }

    async fn remove_unused_templates(&self, keep: &std::collections::HashSet<String>) -> Result<Vec<String>> {
        self.engine()?;
        let mut state = self.lock();
        let gone: Vec<String> = state.images.iter().filter(|i| !keep.contains(*i)).cloned().collect();
        for image in &gone {
            state.images.remove(image);
        }
        Ok(gone)
    }

    async fn connect_agent(&self, sandbox: Uuid) -> std::io::Result<AgentClient> {
        let refused = || std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "no agent listens");
        let agent = {
            let state = self.lock();
            let id = state.current.get(&sandbox).ok_or_else(refused)?;
            let c = state.containers.get(id).ok_or_else(refused)?;
            if matches!(c.state, ContainerState::Stopped { .. } | ContainerState::Missing)
                || c.booted.elapsed() < state.agent_start
            {
                return Err(refused());
            }
            Agent {
                runtime: self.clone(),
                sandbox: c.sandbox,
                results: c.results.clone(),
                container: id.clone(),
                life: c.life.clone(),
                paused: c.paused.subscribe(),
                worker: c.worker.clone(),
            }
        };
        self.record(Event::AgentConnected(agent.sandbox));
        let (ours, theirs) = UnixStream::pair()?;
        tokio::spawn(agent.serve(theirs));
        Ok(AgentClient::from_stream(ours, self.output_cap))
    }
}

/// The agent of one container start, serving one connection.
struct Agent {
    runtime: FakeRuntime,
    sandbox: Uuid,
    results: PathBuf,
    container: String,
    life: CancellationToken,
    paused: watch::Receiver<bool>,
    worker: Arc<Mutex<Worker>>,
}

impl Agent {
    /// The fork file of `slot`, as the real agent names it.
    fn fork_file(&self, slot: &Value) -> PathBuf {
        let slot = slot.as_str().unwrap_or_default();
        self.results.join(".mcp-sandbox/fork").join(format!("{slot}.pickle"))
    }

    /// Writes the namespace (or a parked copy's) to the fork file, as JSON.
    fn dump(&self, req: &Value) -> Value {
        let worker = self.worker.lock().expect("worker lock");
        let vars = match req["from"].as_str() {
            Some(from) => match worker.parked.get(from) {
                Some(vars) => vars.clone(),
                None => return json!({"python": "lost", "names": 0, "skipped": []}),
            },
            None => worker.vars.clone(),
        };
        let path = self.fork_file(&req["slot"]);
        let written = std::fs::create_dir_all(path.parent().expect("a folder"))
            .and_then(|()| std::fs::write(&path, serde_json::to_vec(&vars).expect("serialisable")));
        match written {
            Ok(()) => json!({"python": "carried", "names": vars.len(), "skipped": []}),
            Err(e) => json!({"python": "lost", "names": 0, "skipped": [["*", e.to_string()]]}),
        }
    }

    /// Reads the fork file into the namespace and removes it.
    fn load(&self, req: &Value) -> Value {
        let path = self.fork_file(&req["slot"]);
        let read = std::fs::read(&path)
            .map_err(|e| e.to_string())
            .and_then(|bytes| serde_json::from_slice::<HashMap<String, String>>(&bytes).map_err(|e| e.to_string()));
        let _ = std::fs::remove_file(&path);
        match read {
            Ok(vars) => {
                let names = vars.len();
                self.worker.lock().expect("worker lock").vars.extend(vars);
                json!({"python": "carried", "names": names, "skipped": []})
            }
            Err(e) => json!({"python": "lost", "names": 0, "skipped": [["*", e]]}),
        }
    }

    async fn serve(mut self, stream: UnixStream) {
        let (r, mut w) = stream.into_split();
        let (tx, mut requests) = mpsc::channel::<Value>(16);
        let reader = tokio::spawn(async move {
            let mut lines = BufReader::new(r).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let Ok(req) = serde_json::from_str(&line) else { break };
                if tx.send(req).await.is_err() {
                    break;
                }
            }
        });
        let life = self.life.clone();
        tokio::select! {
            _ = self.answer(&mut requests, &mut w) => {}
            _ = life.cancelled() => {}
        }
        reader.abort();
    }

    async fn answer(&mut self, requests: &mut mpsc::Receiver<Value>, w: &mut OwnedWriteHalf) {
        while let Some(req) = requests.recv().await {
            // A frozen container answers nothing until it is thawed.
            if self.paused.wait_for(|p| !p).await.is_err() {
                return;
            }
            let id = req["id"].clone();
            let behaviour = self
                .runtime
                .lock()
                .behaviour
                .get(&self.sandbox)
                .copied()
                .unwrap_or(Behaviour::Normal);
            let reply = match behaviour {
                Behaviour::Silent => continue,
                Behaviour::Garbage => Some(b"<html>not the protocol</html>".to_vec()),
                Behaviour::Huge(n) => Some(vec![b'x'; n]),
                Behaviour::Wordy(n) if matches!(req["op"].as_str(), Some("exec" | "run")) => Some(
                    json!({"id": id, "type": "error", "error": "e".repeat(n)})
                        .to_string()
                        .into_bytes(),
                ),
                Behaviour::Wordy(_) => None,
                Behaviour::Normal => None,
            };
            if let Some(line) = reply {
                if send_raw(w, &line).await.is_err() {
                    return;
                }
                continue;
            }
            let ok = |body: Value| {
                let mut reply = json!({"id": id, "type": "result"});
                if let (Value::Object(r), Value::Object(b)) = (&mut reply, body) {
                    r.extend(b);
                }
                reply
            };
            let reply = match req["op"].as_str().unwrap_or_default() {
                "ping" => ok(json!({"pong": true})),
                "reset" => {
                    self.worker.lock().expect("worker lock").vars.clear();
                    ok(json!({"reset": true}))
                }
                "packages" => ok(json!({"packages": [{"name": "pip", "version": "24.0"}]})),
                "snapshot" => {
                    let mut worker = self.worker.lock().expect("worker lock");
                    let vars = worker.vars.clone();
                    worker
                        .parked
                        .insert(req["slot"].as_str().unwrap_or_default().into(), vars);
                    ok(json!({"python": "parked"}))
                }
                "restore" => {
                    let mut worker = self.worker.lock().expect("worker lock");
                    let parked = worker.parked.get(req["slot"].as_str().unwrap_or_default()).cloned();
                    let (vars, python) = match (req["python"].as_bool(), parked) {
                        (Some(true), Some(vars)) => (vars, "restored"),
                        (Some(true), None) => (HashMap::new(), "lost"),
                        _ => (HashMap::new(), "fresh"),
                    };
                    worker.vars = vars;
                    ok(json!({"python": python}))
                }
                "forget" => {
                    self.worker
                        .lock()
                        .expect("worker lock")
                        .parked
                        .remove(req["slot"].as_str().unwrap_or_default());
                    ok(json!({"forgotten": true}))
                }
                "dump" => ok(self.dump(&req)),
                "load" => ok(self.load(&req)),
                "interrupt" => continue,
                op @ ("exec" | "run") => {
                    let busy = std::mem::replace(&mut self.worker.lock().expect("worker lock").busy, true);
                    if busy {
                        json!({"id": id, "type": "error", "error": "busy"})
                    } else {
                        let work = match op {
                            "exec" => req["code"].as_str().unwrap_or_default().to_string(),
                            _ => req["argv"]
                                .as_array()
                                .map(|a| a.iter().filter_map(Value::as_str).collect::<Vec<_>>().join(" "))
                                .unwrap_or_default(),
                        };
                        let out = self.exec(&work, &req, requests).await;
                        self.worker.lock().expect("worker lock").busy = false;
                        ok(out)
                    }
                }
                op => json!({"id": id, "type": "error", "error": format!("unknown op {op:?}")}),
            };
            // Frozen while it worked, it answers once thawed.
            if self.paused.wait_for(|p| !p).await.is_err() {
                return;
            }
            if send_raw(w, reply.to_string().as_bytes()).await.is_err() {
                return;
            }
        }
    }

    /// Runs one directive, the first word of `work`:
    /// - `sleep S`: takes S seconds; an interrupt ends it (exit 130), and so
    ///   does the request's timeout (exit 124);
    /// - `stubborn S`: takes S seconds whatever the interrupts;
    /// - `hang`: never ends;
    /// - `exit` / `oom`: the container stops under the run (the memory
    ///   limit for `oom`), which ends the connection;
    /// - `set K V` / `get K`: the worker's namespace;
    /// - `flood N`: N bytes of output, truncated at the request's cap;
    /// - anything else is echoed on stdout.
    async fn exec(&mut self, work: &str, req: &Value, requests: &mut mpsc::Receiver<Value>) -> Value {
        self.runtime.record(Event::Exec {
            sandbox: self.sandbox,
            work: work.to_string(),
            at: tokio::time::Instant::now(),
        });
        let words: Vec<&str> = work.split_whitespace().collect();
        let timeout = Duration::from_secs_f64(req["timeout"].as_f64().unwrap_or(30.0));
        let cap = req["output_cap"].as_u64().unwrap_or(64 * 1024) as usize;
        let seconds = |i: usize| Duration::from_secs_f64(words.get(i).and_then(|s| s.parse().ok()).unwrap_or(0.0));
        let done = |stdout: String, exit_code: i64| json!({"stdout": stdout, "stderr": "", "exit_code": exit_code});
        match words.first().copied().unwrap_or_default() {
            "sleep" => {
                let sleep = tokio::time::sleep(seconds(1).min(timeout));
                tokio::pin!(sleep);
                loop {
                    tokio::select! {
                        _ = &mut sleep => break,
                        req = requests.recv() => match req {
                            Some(r) if r["op"] == "interrupt" => {
                                return json!({"stdout": "", "stderr": "KeyboardInterrupt\n", "exit_code": 130, "cancelled": true});
                            }
                            Some(_) => {}
                            // The caller hung up: the run goes on to its end.
                            None => {
                                (&mut sleep).await;
                                break;
                            }
                        },
                    }
                }
                match seconds(1) > timeout {
                    true => json!({"stdout": "", "stderr": "", "exit_code": 124, "timed_out": true}),
                    false => done(String::new(), 0),
                }
            }
            "stubborn" => {
                tokio::time::sleep(seconds(1)).await;
                done(String::new(), 0)
            }
            "hang" => std::future::pending().await,
            stop @ ("exit" | "oom") => {
                self.runtime.kill(&self.container, stop == "oom");
                std::future::pending().await
            }
            "set" if words.len() == 3 => {
                let mut worker = self.worker.lock().expect("worker lock");
                worker.vars.insert(words[1].into(), words[2].into());
                done(String::new(), 0)
            }
            "get" if words.len() == 2 => match self.worker.lock().expect("worker lock").vars.get(words[1]) {
                Some(v) => done(format!("{v}\n"), 0),
                None => {
                    json!({"stdout": "", "stderr": format!("NameError: name '{}' is not defined\n", words[1]), "exit_code": 1})
                }
            },
            "flood" => {
                let n: usize = words.get(1).and_then(|s| s.parse().ok()).unwrap_or(0);
                json!({"stdout": "y".repeat(n.min(cap)), "stderr": "", "exit_code": 0, "truncated": n > cap})
            }
            _ => done(format!("{work}\n"), 0),
        }
    }
}

/// An error as the engine answers it.
fn refusal(status_code: u16, message: String) -> RuntimeError {
    bollard::errors::Error::DockerResponseServerError { status_code, message }.into()
}

async fn send_raw(w: &mut OwnedWriteHalf, line: &[u8]) -> std::io::Result<()> {
    w.write_all(line).await?;
    w.write_all(b"\n").await
}
