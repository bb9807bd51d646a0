//! The agent protocol from both ends without Docker: the real
//! `docker/agent.py`, started with the host's `python3` on a temporary socket
//! folder and results folder, driven by the real [`AgentClient`].
//!
//! Needs neither a Docker engine nor root; a missing `python3` fails the tests.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use sandbox_runtime::agent::{AgentClient, AgentError, CarriedState, Package, PythonState, Work, SOCKET_NAME};
use tokio::sync::mpsc;

const AGENT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docker/agent.py");
const CAP: usize = 64 * 1024;
/// A distribution that only the test's `PYTHONPATH` holds.
const DIST: (&str, &str) = ("mcp-sandbox-protocol-test", "1.2.3");

/// One agent process with folders of its own; killed, with every process it
/// started, when dropped.
struct Agent {
    child: tokio::process::Child,
    socket: PathBuf,
    results: PathBuf,
    dir: tempfile::TempDir,
}

impl Agent {
    async fn start() -> Self {
        Self::start_with(|_| {}).await
    }

    /// An agent whose results folder `prepare` fills before it starts.
    async fn start_with(prepare: impl FnOnce(&Path)) -> Self {
        Self::launch(prepare, Path::new("python3")).await
    }

    /// An agent whose worker runs on `worker_python` (the venv's
    /// interpreter in a sandbox).
    async fn launch(prepare: impl FnOnce(&Path), worker_python: &Path) -> Self {
        // Under /tmp: a unix socket's path is limited to 107 bytes.
        let dir = tempfile::Builder::new()
            .prefix("agent-protocol")
            .tempdir_in("/tmp")
            .unwrap();
        let (sock_dir, results, spool, site) = (
            dir.path().join("sock"),
            dir.path().join("results"),
            dir.path().join("spool"),
            dir.path().join("site"),
        );
        let dist_info = site.join(format!("{}-{}.dist-info", DIST.0.replace('-', "_"), DIST.1));
        for d in [&sock_dir, &results, &spool, &dist_info] {
            std::fs::create_dir_all(d).unwrap();
        }
        prepare(&results);
        std::fs::write(
            dist_info.join("METADATA"),
            format!("Metadata-Version: 2.1\nName: {}\nVersion: {}\n", DIST.0, DIST.1),
        )
        .unwrap();
        let log = std::fs::File::create(dir.path().join("agent.log")).unwrap();
        let child = tokio::process::Command::new("python3")
            .arg("-u")
            .arg(AGENT)
            .env("MCP_AGENT_DIR", &sock_dir)
            .env("MCP_AGENT_RESULTS", &results)
            .env("MCP_AGENT_SPOOL", &spool)
            .env("PYTHONPATH", &site)
            .env("MCP_AGENT_SITE", &site)
            .env("MCP_AGENT_WORKER_PYTHON", worker_python)
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .env_remove("MCP_EGRESS_SOCKET")
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("these tests need python3 on PATH to run docker/agent.py: {e}"));
        let mut agent = Self {
            child,
            socket: sock_dir.join(SOCKET_NAME),
            results,
            dir,
        };
        agent.wait_ready().await;
        agent
    }

    async fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!("the agent ended ({status}) before listening: {}", self.log());
            }
            if let Ok(mut c) = AgentClient::connect(&self.socket, CAP).await {
                if c.ping().await.is_ok() {
                    return;
                }
            }
            assert!(Instant::now() < deadline, "the agent never listened: {}", self.log());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("agent.log")).unwrap_or_default()
    }

    async fn client(&self) -> AgentClient {
        AgentClient::connect(&self.socket, CAP).await.unwrap()
    }

    /// The host path of a path the agent reported under `/app/results`.
    fn host_path(&self, reported: &str) -> PathBuf {
        let rel = reported
            .strip_prefix("/app/results/")
            .expect("reported under /app/results");
        self.results.join(rel)
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        // The worker and the programs of runs live in sessions of their own:
        // end them first, while they are still the agent's children.
        if let Some(pid) = self.child.id() {
            for leader in processes().filter(|p| p.ppid == pid).map(|p| p.pid) {
                for p in processes().filter(|p| p.session == leader) {
                    // SAFETY: signalling a process id; no memory is involved.
                    unsafe { libc::kill(p.pid as i32, libc::SIGKILL) };
                }
            }
        }
        let _ = self.child.start_kill();
    }
}

struct Proc {
    pid: u32,
    ppid: u32,
    session: u32,
}

fn processes() -> impl Iterator<Item = Proc> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
            let fields: Vec<&str> = stat[stat.rfind(')')? + 2..].split(' ').collect();
            Some(Proc {
                pid,
                ppid: fields.get(1)?.parse().ok()?,
                session: fields.get(3)?.parse().ok()?,
            })
        })
}

fn py(code: &str) -> Work {
    Work::Python(code.into())
}

fn program(argv: &[&str]) -> Work {
    Work::Program(argv.iter().map(|s| s.to_string()).collect())
}

async fn exec(c: &mut AgentClient, code: &str) -> sandbox_runtime::agent::RunOutput {
    c.run(&py(code), 30.0, CAP, None).await.unwrap()
}

/// A progress sender for a run, and the stdout of its first progress line:
/// user code that prints a marker is then known to be running.
fn first_progress() -> (
    mpsc::Sender<sandbox_runtime::agent::Progress>,
    tokio::sync::oneshot::Receiver<String>,
) {
    let (tx, mut rx) = mpsc::channel::<sandbox_runtime::agent::Progress>(64);
    let (seen_tx, seen_rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        if let Some(p) = rx.recv().await {
            let _ = seen_tx.send(p.stdout);
        }
        while rx.recv().await.is_some() {}
    });
    (tx, seen_rx)
}

#[tokio::test]
async fn python_state_persists_across_execs() {
    let agent = Agent::start().await;
    let mut c = agent.client().await;
    let r = exec(&mut c, "import json\nx = 41\nprint('hi')").await;
    assert_eq!(
        (r.stdout.as_str(), r.exit_code, r.state_lost),
        ("hi\n", 0, false),
        "{r:?}"
    );
    let r = exec(&mut c, "x += 1\nimport os\nprint(json.dumps({'x': x}), os.getpid())").await;
    let (x, pid) = r.stdout.trim().rsplit_once(' ').unwrap();
    assert_eq!(x, "{\"x\": 42}", "variables and imports persist: {r:?}");
    let r = exec(&mut c, "print(os.getpid())").await;
    assert_eq!(r.stdout.trim(), pid, "the same worker runs every exec");

    let r = exec(&mut c, "import sys\nprint('err', file=sys.stderr)\nsys.exit(3)").await;
    assert_eq!((r.stderr.as_str(), r.exit_code), ("err\n", 3), "{r:?}");
    let r = exec(&mut c, "def f():\n    raise ValueError('boom')\nf()").await;
    assert_eq!(r.exit_code, 1);
    assert!(
        r.stderr.contains("ValueError: boom") && !r.stderr.contains("agent.py"),
        "{}",
        r.stderr
    );
    let r = exec(&mut c, "import os\nprint(os.getcwd())").await;
    assert_eq!(
        Path::new(r.stdout.trim()),
        agent.results.as_path(),
        "code runs in the results folder"
    );
    assert_eq!(
        exec(&mut c, "print(x)").await.stdout,
        "42\n",
        "a failed exec keeps the state"
    );
}

#[tokio::test]
async fn interrupt_cancels_a_sleep_and_keeps_the_state() {
    let agent = Agent::start().await;
    let mut c = agent.client().await;
    exec(&mut c, "import time\nx = 7").await;

    let (tx, seen) = first_progress();
    let interrupter = c.interrupter();
    let interrupting = tokio::spawn(async move {
        let marker = seen.await.unwrap();
        assert!(marker.contains("sleeping"), "{marker:?}");
        interrupter.interrupt().await;
    });
    let started = Instant::now();
    let r = c
        .run(
            &py("print('sleeping', flush=True)\ntime.sleep(60)"),
            120.0,
            CAP,
            Some(&tx),
        )
        .await
        .unwrap();
    interrupting.await.unwrap();
    assert!(started.elapsed() < Duration::from_secs(10), "{:?}", started.elapsed());
    assert!(r.cancelled && !r.timed_out, "{r:?}");
    assert_eq!(r.exit_code, 130, "{r:?}");
    assert!(
        r.stderr.contains("KeyboardInterrupt") && r.stderr.contains("Cancelled"),
        "{}",
        r.stderr
    );
    // An interrupted sleep leaves the worker alive: the state is kept.
    assert!(!r.state_lost, "{r:?}");
    assert_eq!(exec(&mut c, "print(x)").await.stdout, "7\n");
}

#[tokio::test]
async fn a_python_timeout_interrupts_and_keeps_the_state() {
    let agent = Agent::start().await;
    let mut c = agent.client().await;
    exec(&mut c, "import time\nx = 8").await;
    let started = Instant::now();
    let r = c.run(&py("time.sleep(60)"), 0.5, CAP, None).await.unwrap();
    assert!(started.elapsed() < Duration::from_secs(10), "{:?}", started.elapsed());
    assert!(r.timed_out && !r.cancelled && !r.state_lost, "{r:?}");
    assert_eq!(r.exit_code, 124);
    assert_eq!(exec(&mut c, "print(x)").await.stdout, "8\n");
}

#[tokio::test]
async fn reset_replaces_the_worker_and_keeps_files() {
    let agent = Agent::start().await;
    let mut c = agent.client().await;
    let before = exec(
        &mut c,
        "import os\nx = 1\nopen('kept.txt', 'w').write('kept')\nprint(os.getpid())",
    )
    .await;
    assert_eq!(before.files, vec!["/app/results/kept.txt".to_string()]);
    c.reset().await.unwrap();
    let r = exec(&mut c, "print(x)").await;
    assert_eq!(r.exit_code, 1, "{r:?}");
    assert!(r.stderr.contains("NameError"), "the namespace is new: {}", r.stderr);
    let r = exec(&mut c, "import os\nprint(os.getpid(), open('kept.txt').read())").await;
    let (pid, content) = r.stdout.trim().split_once(' ').unwrap();
    assert_ne!(pid, before.stdout.trim(), "a new worker");
    assert_eq!(content, "kept", "files are kept");
    assert!(agent.results.join("kept.txt").is_file());
}

#[tokio::test]
async fn a_parked_copy_of_the_worker_restores_its_namespace_any_number_of_times() {
    let agent = Agent::start().await;
    let mut c = agent.client().await;
    let slot = "0123456789abcdef0123456789abcdef";
    assert_eq!(c.snapshot(slot).await.unwrap(), PythonState::Fresh, "no worker yet");
    exec(&mut c, "x = 1").await;
    assert_eq!(c.snapshot(slot).await.unwrap(), PythonState::Parked);
    // A run's end kills what it left in the worker's session: not the copy.
    exec(&mut c, "x = 2\nimport subprocess\nsubprocess.Popen(['sleep', '30'])").await;
    assert_eq!(c.restore(slot, true).await.unwrap(), PythonState::Restored);
    assert_eq!(exec(&mut c, "print(x)\nx = 3").await.stdout, "1\n");
    let crashed = c.run(&py("import os; os._exit(9)"), 10.0, CAP, None).await.unwrap();
    assert!(crashed.state_lost, "{crashed:?}");
    assert_eq!(c.restore(slot, true).await.unwrap(), PythonState::Restored);
    assert_eq!(exec(&mut c, "print(x)").await.stdout, "1\n", "again, after a crash");
    c.forget(slot).await.unwrap();
    assert_eq!(c.restore(slot, true).await.unwrap(), PythonState::Lost);
    let r = exec(&mut c, "print(x)").await;
    assert!(r.stderr.contains("NameError"), "a fresh namespace: {r:?}");
    assert!(c.snapshot("../../etc/passwd").await.is_err(), "a slot is 32 hex digits");
}

/// The fork file of `slot` under an agent's results folder.
fn fork_file(results: &Path, slot: &str) -> PathBuf {
    results.join(".mcp-sandbox/fork").join(format!("{slot}.pickle"))
}

#[tokio::test]
async fn a_namespace_is_carried_to_another_agent_and_what_does_not_pickle_is_named() {
    let (source, fork) = (Agent::start().await, Agent::start().await);
    let mut c = source.client().await;
    let slot = "00000000000000000000000000000001";
    let carried = c.dump(slot, None, Duration::from_secs(30)).await.unwrap();
    assert_eq!(carried.python, CarriedState::Fresh, "no worker yet: {carried:?}");

    // `big` pickles as a large out-of-band buffer, as a numpy array does.
    exec(
        &mut c,
        "import pickle\nclass Big:\n    def __reduce_ex__(self, protocol):\n        \
         return (bytes, (pickle.PickleBuffer(bytearray(1 << 20)),))\n\
         x = {'a': [1, 2]}\ny = x\ng = (i for i in range(3))\nbig = Big()\ndel Big",
    )
    .await;
    let carried = c.dump(slot, None, Duration::from_secs(30)).await.unwrap();
    assert_eq!(carried.python, CarriedState::Partial, "{carried:?}");
    assert_eq!(carried.names, 4, "{carried:?}");
    assert_eq!(carried.skipped.len(), 1, "{carried:?}");
    assert_eq!(carried.skipped[0].0, "g");
    assert!(carried.skipped[0].1.contains("generator"), "{carried:?}");
    // The fork file goes to the other agent (the server moves it on the host).
    let place = |slot: &str| {
        let target = fork_file(&fork.results, slot);
        std::fs::create_dir_all(target.parent().unwrap()).unwrap();
        std::fs::rename(fork_file(&source.results, slot), &target).unwrap();
        target
    };
    let first = place(slot);

    // A snapshot's parked copy dumps its own namespace, not the worker's.
    let parked = "00000000000000000000000000000002";
    assert_eq!(c.snapshot(parked).await.unwrap(), PythonState::Parked);
    exec(&mut c, "x = 'later'").await;
    let other = "00000000000000000000000000000003";
    let from_snapshot = c.dump(other, Some(parked), Duration::from_secs(30)).await.unwrap();
    assert_eq!(from_snapshot.python, CarriedState::Partial, "{from_snapshot:?}");
    assert_eq!(
        exec(&mut c, "print(x)").await.stdout,
        "later\n",
        "the worker is untouched"
    );
    let second = place(other);

    let mut f = fork.client().await;
    for (slot, target) in [(slot, first), (other, second)] {
        let loaded = f.load(slot, Duration::from_secs(30)).await.unwrap();
        assert_eq!(loaded.python, CarriedState::Carried, "{loaded:?}");
        assert_eq!(
            exec(&mut f, "print(x, x is y, len(big))").await.stdout,
            "{'a': [1, 2]} True 1048576\n"
        );
        assert!(!target.exists(), "a loaded file is removed");
    }
    let missing = f.load(slot, Duration::from_secs(30)).await.unwrap();
    assert_eq!(missing.python, CarriedState::Lost, "{missing:?}");
    assert!(
        c.dump("../../etc/passwd", None, Duration::from_secs(5)).await.is_err(),
        "a slot is 32 hex digits"
    );
}

#[tokio::test]
async fn a_dump_past_its_deadline_is_killed_and_the_sandboxs_worker_stays() {
    let agent = Agent::start().await;
    let mut c = agent.client().await;
    exec(
        &mut c,
        // Deaf to the interrupt: the dump's worker is killed after the grace.
        "x = 1\nclass Slow:\n    def __reduce__(self):\n        import signal, time\n        signal.signal(signal.SIGINT, signal.SIG_IGN)\n        time.sleep(60)\ns = Slow()",
    )
    .await;
    let started = Instant::now();
    let slot = "00000000000000000000000000000004";
    let carried = c.dump(slot, None, Duration::from_secs(1)).await.unwrap();
    assert_eq!(carried.python, CarriedState::Lost, "{carried:?}");
    assert!(carried.skipped[0].1.contains("timed out"), "{carried:?}");
    assert!(started.elapsed() < Duration::from_secs(20), "{:?}", started.elapsed());
    assert!(
        !fork_file(&agent.results, slot).exists(),
        "nothing half-written is left"
    );
    assert_eq!(
        exec(&mut c, "print(x)").await.stdout,
        "1\n",
        "the worker and its state stay"
    );
}

#[tokio::test]
async fn a_killed_worker_is_reported_and_replaced() {
    let agent = Agent::start().await;
    let mut c = agent.client().await;
    exec(&mut c, "x = 1").await;
    let r = exec(&mut c, "import os\nos.kill(os.getpid(), 9)").await;
    assert!(r.state_lost, "{r:?}");
    assert_eq!(r.exit_code, 137, "{r:?}");
    assert!(r.stderr.contains("worker was killed"), "{}", r.stderr);
    let r = exec(&mut c, "print(x)").await;
    assert!(
        r.exit_code == 1 && r.stderr.contains("NameError"),
        "the state is gone: {r:?}"
    );
    assert_eq!(exec(&mut c, "print(2)").await.stdout, "2\n", "the next exec works");

    exec(&mut c, "y = 1").await;
    let r = exec(&mut c, "import os\nprint('bye', flush=True)\nos._exit(5)").await;
    assert!(r.state_lost && !r.cancelled && !r.timed_out, "{r:?}");
    assert_eq!((r.stdout.as_str(), r.exit_code), ("bye\n", 5), "{r:?}");
    let r = exec(&mut c, "print(y)").await;
    assert!(r.exit_code == 1 && r.stderr.contains("NameError"), "{r:?}");
    let r = exec(&mut c, "print(3)").await;
    assert_eq!((r.stdout.as_str(), r.state_lost), ("3\n", false));
}

#[tokio::test]
async fn an_output_flood_is_truncated_and_kept_in_full() {
    let agent = Agent::start().await;
    let mut c = agent.client().await;
    let cap = 4096;
    let r = c
        .run(
            &py("import sys\nprint('o' * 100_000)\nsys.stderr.write('e' * 50_000)"),
            30.0,
            cap,
            None,
        )
        .await
        .unwrap();
    assert!(r.truncated, "{r:?}");
    assert!(
        r.stdout.len() < cap + 200 && r.stdout.contains("bytes omitted"),
        "{}",
        r.stdout.len()
    );
    assert!(r.stderr.len() < cap + 200, "{}", r.stderr.len());
    assert!(r.stdout.starts_with("ooo") && r.stdout.ends_with("ooo\n"));
    assert_eq!(r.output_files.len(), 2, "{r:?}");
    for (path, name, size) in [
        (&r.output_files[0], "stdout", 100_001),
        (&r.output_files[1], "stderr", 50_000),
    ] {
        assert!(
            path.starts_with("/app/results/.mcp-sandbox/output/") && path.ends_with(&format!("-{name}.txt")),
            "{path}"
        );
        let full = std::fs::metadata(agent.host_path(path)).unwrap();
        assert_eq!(full.len(), size, "{path} holds the full output");
    }
    assert!(
        r.files.is_empty(),
        "the agent's own files are no artifacts: {:?}",
        r.files
    );

    let r = c.run(&py("print('o' * 1000)"), 30.0, cap, None).await.unwrap();
    assert!(!r.truncated && r.output_files.is_empty(), "{r:?}");
    assert_eq!(r.stdout.len(), 1001);
}

#[tokio::test]
async fn files_written_under_results_are_reported() {
    let agent = Agent::start().await;
    std::fs::write(agent.results.join("old.txt"), "old").unwrap();
    let mut c = agent.client().await;
    let code = "import os\n\
                open('a.txt', 'w').write('a')\n\
                os.makedirs('sub/deep')\n\
                open('sub/deep/b.csv', 'w').write('1,2')\n\
                os.makedirs('.mcp-sandbox/mine', exist_ok=True)\n\
                open('.mcp-sandbox/mine/private.txt', 'w').write('p')\n\
                os.symlink('/etc/passwd', 'link')";
    let r = exec(&mut c, code).await;
    assert_eq!(r.exit_code, 0, "{r:?}");
    assert_eq!(
        r.files,
        vec![
            "/app/results/a.txt".to_string(),
            "/app/results/sub/deep/b.csv".to_string()
        ],
        "new regular files only, the agent's private folder and untouched files left out"
    );
    assert_eq!(std::fs::read_to_string(agent.host_path(&r.files[1])).unwrap(), "1,2");

    assert!(
        exec(&mut c, "print(1)").await.files.is_empty(),
        "a run that writes nothing"
    );
    let r = exec(&mut c, "open('sub/deep/b.csv', 'a').write('\\n3,4')").await;
    assert_eq!(
        r.files,
        vec!["/app/results/sub/deep/b.csv".to_string()],
        "a changed file"
    );
    let r = c
        .run(&program(&["sh", "-c", "echo x > c.txt"]), 30.0, CAP, None)
        .await
        .unwrap();
    assert_eq!(r.files, vec!["/app/results/c.txt".to_string()], "a program's files too");
}

/// Whether the agent holds an inotify descriptor (watches its results
/// folder rather than scanning it after each run).
fn watches(agent: &Agent) -> bool {
    let pid = agent.child.id().expect("the agent runs");
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|fd| std::fs::read_link(fd.unwrap().path()).ok())
        .any(|target| target.to_string_lossy() == "anon_inode:inotify")
}

/// A small results folder is scanned as each run begins and ends; one past
/// the agent's `SCAN_AT_MOST` (64 entries), at its start or grown since, is
/// watched from the next run on, and reports the same files.
#[tokio::test]
async fn a_large_results_folder_is_watched_and_reports_the_same_files() {
    let agent = Agent::start().await;
    let mut c = agent.client().await;
    let r = exec(&mut c, "open('a.txt', 'w').write('a')").await;
    assert_eq!(r.files, vec!["/app/results/a.txt".to_string()]);
    assert!(!watches(&agent), "a small folder is scanned");
    let r = exec(
        &mut c,
        "import os\nos.makedirs('many')\nfor i in range(100): open(f'many/{i}.txt', 'w')",
    )
    .await;
    assert_eq!(r.files.len(), 100, "{:?}", r.files);
    let r = exec(&mut c, "open('many/7.txt', 'a').write('y')\nopen('b.txt', 'w')").await;
    assert_eq!(
        r.files,
        vec!["/app/results/b.txt".to_string(), "/app/results/many/7.txt".to_string()]
    );
    assert!(watches(&agent), "a folder grown to 102 entries is watched");

    let large = Agent::start_with(|results| {
        let many = results.join("many");
        std::fs::create_dir(&many).unwrap();
        for i in 0..100 {
            std::fs::write(many.join(format!("{i}.txt")), "x").unwrap();
        }
    })
    .await;
    let mut c = large.client().await;
    let r = exec(
        &mut c,
        "import os\nos.makedirs('new/deep')\nopen('new/deep/b.txt', 'w').write('b')",
    )
    .await;
    assert_eq!(r.files, vec!["/app/results/new/deep/b.txt".to_string()]);
    assert!(watches(&large), "a folder of 101 entries at the start is watched");
    assert!(exec(&mut c, "print(1)").await.files.is_empty());
}

/// The sandbox owns its venv: a worker interpreter it turned into a chain of
/// a thousand symbolic links fails that sandbox's Python calls, and nothing
/// else: the agent still answers, resets and runs programs.
#[tokio::test]
async fn a_worker_interpreter_behind_a_chain_of_links_fails_python_calls_only() {
    let chain = tempfile::Builder::new()
        .prefix("agent-protocol")
        .tempdir_in("/tmp")
        .unwrap();
    let python3 = std::process::Command::new("sh")
        .args(["-c", "command -v python3"])
        .output()
        .unwrap();
    let mut link = PathBuf::from(String::from_utf8(python3.stdout).unwrap().trim());
    for i in 0..1000 {
        let next = chain.path().join(format!("l{i}"));
        std::os::unix::fs::symlink(&link, &next).unwrap();
        link = next;
    }
    let agent = Agent::launch(|_| {}, &link).await;
    let mut c = agent.client().await;
    let err = c.run(&py("print(1)"), 30.0, CAP, None).await;
    assert!(err.is_err(), "the worker started: {err:?}");
    let _ = c.reset().await;
    c.ping().await.expect("the agent answers after a reset");
    let r = c
        .run(&program(&["sh", "-c", "echo ok"]), 30.0, CAP, None)
        .await
        .unwrap();
    assert_eq!(r.stdout, "ok\n");
}

#[tokio::test]
async fn programs_run_with_exit_code_and_timeout() {
    let agent = Agent::start().await;
    let mut c = agent.client().await;
    let r = c
        .run(
            &program(&["sh", "-c", "echo out; echo err >&2; pwd -P; exit 3"]),
            30.0,
            CAP,
            None,
        )
        .await
        .unwrap();
    assert_eq!(r.exit_code, 3, "{r:?}");
    let mut lines = r.stdout.lines();
    assert_eq!(lines.next(), Some("out"));
    assert_eq!(
        Path::new(lines.next().unwrap()),
        agent.results.as_path(),
        "runs in the results folder"
    );
    assert_eq!(r.stderr, "err\n");
    assert!(!r.timed_out && !r.cancelled && !r.state_lost, "{r:?}");

    let started = Instant::now();
    let r = c.run(&program(&["sleep", "60"]), 0.5, CAP, None).await.unwrap();
    assert!(started.elapsed() < Duration::from_secs(10), "{:?}", started.elapsed());
    assert!(r.timed_out, "{r:?}");
    assert_eq!(r.exit_code, 124);

    let r = c
        .run(&program(&["sh", "-c", "kill -9 $$"]), 30.0, CAP, None)
        .await
        .unwrap();
    assert_eq!(r.exit_code, 137, "killed by a signal: {r:?}");

    let err = c
        .run(&program(&["/nonexistent/program"]), 30.0, CAP, None)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, AgentError::Protocol(e) if e.contains("could not start")),
        "{err}"
    );
    assert_eq!(exec(&mut c, "print('after')").await.stdout, "after\n");
}

/// The agent's spare shell (`sh -s`, started once the agent has been idle
/// a second), waited for.
async fn spare_shell(agent: &Agent) -> u32 {
    let agent_pid = agent.child.id().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let spare = processes().find(|p| {
            p.ppid == agent_pid && std::fs::read(format!("/proc/{}/cmdline", p.pid)).is_ok_and(|c| c == b"sh\0-s\0")
        });
        if let Some(p) = spare {
            return p.pid;
        }
        assert!(Instant::now() < deadline, "no spare shell: {}", agent.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A process's state letter in `/proc/<pid>/stat` (`Z` a zombie, `T`
/// stopped); None once it is gone.
fn process_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat[stat.rfind(')')? + 2..].chars().next()
}

/// What `sh -c command` prints and exits with (128 + a signal's number, as
/// the agent reports it), started here as the agent would start it, its
/// process id in what it prints replaced by `PID`.
fn sh_c(results: &Path, command: &str) -> (String, String, i64) {
    use std::os::unix::process::ExitStatusExt;
    let child = std::process::Command::new("sh")
        .args(["-c", command])
        .current_dir(results)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let out = child.wait_with_output().unwrap();
    let text = |b: Vec<u8>| String::from_utf8(b).unwrap().replace(&pid.to_string(), "PID");
    let code = out.status.code().unwrap_or_else(|| 128 + out.status.signal().unwrap());
    (text(out.stdout), text(out.stderr), i64::from(code))
}

/// Each command is compared with what the host's `sh -c` makes of it:
/// messages and line numbers, `$0`, `$#`, `$-`, standard input, the folder,
/// exit codes (a signal's included), output before a kill.
#[tokio::test]
async fn a_shell_command_after_a_pause_runs_in_a_spare_shell_as_sh_c_runs_it() {
    let agent = Agent::start().await;
    let mut c = agent.client().await;
    let commands = [
        "echo \"$$ $0 $# [$-]\"; no-such-program",
        "echo $$; echo one\nif then",
        "cat; readlink /proc/self/fd/0; echo \"$$ in $(pwd -P)\" >&2; exit 3",
        "printf '%s\\n' \"$$ $(printf 'x%.0s' 1 2 3)\"; kill -9 $$",
    ];
    for command in commands {
        let spare = spare_shell(&agent).await.to_string();
        let r = c.run(&program(&["sh", "-c", command]), 30.0, CAP, None).await.unwrap();
        let (stdout, stderr, code) = sh_c(&agent.results, command);
        assert!(
            r.stdout.starts_with(&spare) || r.stderr.starts_with(&spare),
            "{command}: not run in the spare shell: {r:?}"
        );
        assert_eq!(r.stdout.replace(&spare, "PID"), stdout, "{command}");
        assert_eq!(r.stderr.replace(&spare, "PID"), stderr, "{command}");
        assert_eq!(r.exit_code, code, "{command}");
    }

    // Longer than a pipe takes at once, or able to turn the shell's own
    // input to a file (whose rest the spare shell would run as its script):
    // started as `sh -c`; the spare stays.
    let spare = spare_shell(&agent).await;
    let long = format!(": {}; echo $$", "a".repeat(5000));
    let r = c.run(&program(&["sh", "-c", &long]), 30.0, CAP, None).await.unwrap();
    assert_ne!(r.stdout.trim(), spare.to_string(), "{r:?}");
    let data = "printf 'one\\necho INJECTED\\n' > data.txt; exec <data.txt; read x; echo \"got $x\"";
    let r = c.run(&program(&["sh", "-c", data]), 30.0, CAP, None).await.unwrap();
    assert_eq!((r.stdout.as_str(), r.exit_code), ("got one\n", 0), "{r:?}");
    assert_eq!(spare_shell(&agent).await, spare);

    // A spare killed while the agent waits is not used: the command runs.
    // SAFETY: signalling a process id; no memory is involved.
    unsafe { libc::kill(spare as i32, libc::SIGKILL) };
    let dead = || process_state(spare).is_none_or(|s| s == 'Z');
    let deadline = Instant::now() + Duration::from_secs(10);
    while !dead() {
        assert!(Instant::now() < deadline, "the spare shell outlived SIGKILL");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let r = c
        .run(&program(&["sh", "-c", "echo $$"]), 30.0, CAP, None)
        .await
        .unwrap();
    assert_eq!(r.exit_code, 0, "{r:?}");
    assert_ne!(r.stdout.trim(), spare.to_string(), "{r:?}");

    // A FIFO planted at the spool name of the next spare's output (as a
    // run's code can) neither blocks the agent nor is written to.
    let fifo = agent.dir.path().join("spool").join("spare.out");
    let _ = std::fs::remove_file(&fifo);
    let path = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path; no memory is kept.
    assert_eq!(unsafe { libc::mkfifo(path.as_ptr(), 0o600) }, 0);
    let spare = spare_shell(&agent).await;
    assert!(std::fs::metadata(&fifo).unwrap().is_file(), "made afresh");

    // A spare stopped with its pipe filled (through /proc, as the same
    // user) does not block the agent: the command runs as `sh -c`.
    // SAFETY: signalling a process id; no memory is involved.
    unsafe { libc::kill(spare as i32, libc::SIGSTOP) };
    // Stopped before the pipe is filled, or it would read some of it.
    let stopped = || process_state(spare) == Some('T');
    let deadline = Instant::now() + Duration::from_secs(10);
    while !stopped() {
        assert!(Instant::now() < deadline, "the spare shell did not stop");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut pipe = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(format!("/proc/{spare}/fd/0"))
        .unwrap();
    while pipe.write(&[b'#'; 4096]).is_ok() {}
    let r = tokio::time::timeout(
        Duration::from_secs(20),
        c.run(&program(&["sh", "-c", "echo $$"]), 5.0, CAP, None),
    )
    .await
    .expect("the agent answers")
    .unwrap();
    assert_eq!(r.exit_code, 0, "{r:?}");
    assert_ne!(r.stdout.trim(), spare.to_string(), "{r:?}");
}

#[tokio::test]
async fn a_second_connection_while_a_request_runs_is_busy() {
    let agent = Agent::start().await;
    let mut first = agent.client().await;
    exec(&mut first, "import time").await;
    let interrupter = first.interrupter();
    let (tx, seen) = first_progress();
    let running = tokio::spawn(async move {
        first
            .run(
                &py("print('sleeping', flush=True)\ntime.sleep(60)"),
                120.0,
                CAP,
                Some(&tx),
            )
            .await
    });
    seen.await.unwrap();

    let mut second = agent.client().await;
    let err = second.run(&py("print(1)"), 30.0, CAP, None).await.unwrap_err();
    assert!(matches!(err, AgentError::Busy), "{err}");
    let err = second.run(&program(&["true"]), 30.0, CAP, None).await.unwrap_err();
    assert!(matches!(err, AgentError::Busy), "{err}");
    let err = second.reset().await.unwrap_err();
    assert!(matches!(err, AgentError::Busy), "{err}");
    second.ping().await.expect("ping answers while a request runs");
    assert!(!second.packages().await.unwrap().is_empty(), "so do queries");

    interrupter.interrupt().await;
    let r = running.await.unwrap().unwrap();
    assert!(r.cancelled, "{r:?}");
    assert_eq!(
        second.run(&py("print(1)"), 30.0, CAP, None).await.unwrap().stdout,
        "1\n"
    );
}

#[tokio::test]
async fn progress_arrives_while_a_request_runs() {
    let agent = Agent::start().await;
    let mut c = agent.client().await;
    let (tx, mut rx) = mpsc::channel(64);
    let r = c
        .run(
            &py("import time\nprint('early', flush=True)\ntime.sleep(1.5)\nprint('late')"),
            30.0,
            CAP,
            Some(&tx),
        )
        .await
        .unwrap();
    assert_eq!(r.stdout, "early\nlate\n");
    let p = rx.try_recv().expect("a progress line came before the result");
    assert_eq!(p.stdout, "early\n");
}

#[tokio::test]
async fn ping_and_packages() {
    let agent = Agent::start().await;
    let mut c = agent.client().await;
    c.ping().await.unwrap();
    let packages = c.packages().await.unwrap();
    assert!(
        packages.contains(&Package {
            name: DIST.0.into(),
            version: DIST.1.into()
        }),
        "{packages:?}"
    );
    assert!(packages.iter().all(|p| !p.name.is_empty()), "{packages:?}");
    // The connection stays usable for a run after queries.
    c.ping().await.unwrap();
    assert_eq!(exec(&mut c, "print('ok')").await.stdout, "ok\n");
}

#[tokio::test]
async fn a_broken_distribution_planted_in_the_venv_is_left_out_of_the_listing() {
    let agent = Agent::start().await;
    let mut c = agent.client().await;
    exec(&mut c, "x = 1").await;
    // Metadata that is not UTF-8 makes importlib.metadata raise.
    let planted = agent.dir.path().join("site").join("planted-1.0.dist-info");
    std::fs::create_dir_all(&planted).unwrap();
    std::fs::write(planted.join("METADATA"), b"Name: plan\xffted\nVersion: 1.0\n").unwrap();
    let packages = c.packages().await.unwrap();
    assert!(packages.iter().any(|p| p.name == DIST.0), "{packages:?}");
    assert!(!packages.iter().any(|p| p.name.starts_with("plan")), "{packages:?}");
    // The agent, and with it the Python state, is still there.
    assert_eq!(exec(&mut c, "print(x)").await.stdout, "1\n");
}

/// An echo server on the host's loopback, which the agent (on the host
/// here) reaches as a sandbox's agent reaches its sandbox's ports.
async fn echo_server() -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = s.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    port
}

#[tokio::test]
async fn a_port_is_reached_through_a_passed_connection_or_the_agents_relay() {
    use sandbox_runtime::ports::{open_port, PortError, PortStream};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let agent = Agent::start().await;
    let port = echo_server().await;
    for relay in [false, true] {
        let mut stream = open_port(&agent.socket, port, relay).await.unwrap();
        assert_eq!(matches!(stream, PortStream::Relayed { .. }), relay);
        let payload = vec![7u8; 300_000];
        let (mut r, mut w) = tokio::io::split(&mut stream);
        let (_, echoed) = tokio::join!(
            async {
                w.write_all(&payload).await.unwrap();
                w.shutdown().await.unwrap();
            },
            async {
                let mut got = Vec::new();
                r.read_to_end(&mut got).await.unwrap();
                got
            }
        );
        assert_eq!(echoed.len(), payload.len(), "relay {relay}");
    }
    // Nothing listens: refused, with the reason, and the agent still answers.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    match open_port(&agent.socket, closed, false).await {
        Err(PortError::Refused(why)) => assert!(why.contains("refused"), "{why}"),
        Err(e) => panic!("not refused: {e}"),
        Ok(_) => panic!("connected to a closed port"),
    }
    agent.client().await.ping().await.unwrap();
}

#[tokio::test]
async fn a_background_process_is_started_followed_fed_stopped_and_remembered() {
    use sandbox_runtime::processes::{ProcessState, StartProcess};
    let agent = Agent::start().await;
    let mut c = agent.client().await;
    let start = StartProcess {
        command: "echo \"$GREETING\"; read line; echo \"got $line\"; sleep 600".into(),
        cwd: None,
        env: [("GREETING".to_string(), "hi there".to_string())].into(),
        name: Some("greeter".into()),
        keep: 64 * 1024,
        max_processes: 2,
    };
    let info = c.start_process(&start).await.unwrap();
    assert_eq!(info.state, ProcessState::Running);
    let first = c.read_process(&info.process_id, 0, 1024, 5.0, false).await.unwrap();
    assert_eq!(first.output, "hi there\n");
    let (written, _) = c.process_input(&info.process_id, "abc\n").await.unwrap();
    assert_eq!(written, 4);
    let next = c
        .read_process(&info.process_id, first.next_offset, 1024, 5.0, false)
        .await
        .unwrap();
    assert_eq!(next.output, "got abc\n");
    // The cap on running processes.
    let second = c.start_process(&start).await.unwrap();
    // Its log is made with its first output: read it before the files are counted.
    let said = c.read_process(&second.process_id, 0, 1024, 5.0, false).await.unwrap();
    assert_eq!(said.output, "hi there\n");
    let third = c.start_process(&start).await.unwrap_err();
    assert!(third.to_string().contains("already runs 2"), "{third}");
    // TERM after a grace of 0 kills the session: the sleep goes with it.
    let stopped = c.stop_process(&info.process_id, "TERM", 0.0).await.unwrap();
    assert_eq!(stopped.state, ProcessState::Exited);
    assert_eq!(stopped.exit_code, Some(137));
    // A later agent (the container restarted) lists them as ended with it.
    drop(c);
    let records = agent.results.join(".mcp-sandbox/processes");
    let kept = std::fs::read_dir(&records).unwrap().count();
    assert!(kept >= 4, "{kept} files in {}", records.display());
    let again = Agent::start_with(|results| {
        let to = results.join(".mcp-sandbox/processes");
        std::fs::create_dir_all(&to).unwrap();
        for f in std::fs::read_dir(&records).unwrap() {
            let f = f.unwrap();
            std::fs::copy(f.path(), to.join(f.file_name())).unwrap();
        }
        // A record the sandbox rewrote is read as untrusted.
        std::fs::write(to.join("0123456789ab.json"), "{\"command\": 5, \"state\": [1]}").unwrap();
    })
    .await;
    let listed = again.client().await.list_processes().await.unwrap();
    assert_eq!(listed.len(), 3, "{listed:?}");
    assert!(listed.iter().all(|p| p.state == ProcessState::Exited), "{listed:?}");
    let note = |p: &sandbox_runtime::processes::ProcessInfo| p.note.clone().unwrap_or_default();
    assert!(
        listed.iter().any(|p| note(p).contains("ended with its container")),
        "{listed:?}"
    );
}
