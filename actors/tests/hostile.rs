//! The sandbox as the adversary, against the real engine: programs planted
//! in its package volume, a frozen agent, a run that outlives the sandbox's
//! lifetime, a flood of distinct failing installs, creators that hang up,
//! and a container that dies while nobody calls (or while paused: among the
//! runtime checks of `checks/`). Each test performs the attack and checks
//! the defence.

mod common;

use std::time::{Duration, Instant};

use common::{docker, Harness, OWNER};
use sandbox_actors::records::RecordStore;
use sandbox_actors::EgressPolicy;
use sandbox_actors::{InstallStatusKind, Quota, SandboxError, SandboxStatus, Work};
use sandbox_runtime::{ContainerRuntime, SandboxPaths};

/// Programs a sandbox could plant where an installer might look for its own.
const PLANTED: [&str; 8] = ["uv", "uvx", "python", "python3", "pip", "pip3", "sh", "env"];

/// Sent by the sandbox's own code: stops its agent (SIGSTOP), so that
/// nothing it is asked is ever answered.
fn freeze_agent() -> Work {
    let code = [
        "import os, signal",
        "for p in os.listdir('/proc'):",
        "    if not p.isdigit() or int(p) == os.getpid():",
        "        continue",
        "    try:",
        "        argv = open(f'/proc/{p}/cmdline', 'rb').read().split(bytes(1))",
        "    except OSError:",
        "        continue",
        "    if any(a.startswith(b'/opt/mcp-agent/agent.py') for a in argv) and b'--worker' not in argv:",
        "        os.kill(int(p), signal.SIGSTOP)",
    ]
    .join("\n");
    Work::Program(vec!["/usr/bin/python3".into(), "-c".into(), code])
}

#[tokio::test(flavor = "multi_thread")]
async fn programs_planted_in_the_venv_never_run_during_an_offline_install() {
    let h = Harness::with(|s| s.sandbox.network = EgressPolicy::None).await;
    let id = h.create().await;
    let plant = PLANTED
        .iter()
        .map(|name| {
            format!(
                "rm -f /app/.venv/bin/{name}; printf '#!/bin/sh\\necho \"$0 $(hostname)\" >> /app/.venv/PLANTED\\nexit 1\\n' > /app/.venv/bin/{name}; chmod 755 /app/.venv/bin/{name}"
            )
        })
        .collect::<Vec<_>>()
        .join("; ");
    let planted = h.sh(id, &format!("{plant}; ls /app/.venv/bin"), None).await.output;
    assert_eq!(planted.exit_code, 0, "{}", planted.stderr);

    let st = h.install(id, "six").await;
    assert_eq!(st.status, InstallStatusKind::Success, "{st:?}");
    // Read without a search path: the planted `sh` would answer otherwise.
    let ran = h
        .sb()
        .run(
            OWNER,
            id,
            Work::Program(vec!["/bin/cat".into(), "/app/.venv/PLANTED".into()]),
            None,
            None,
        )
        .await
        .unwrap()
        .output;
    assert_ne!(ran.exit_code, 0, "a planted program ran: {}", ran.stdout);
    assert!(ran.stderr.contains("No such file"), "{}", ran.stderr);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_offline_install_takes_wheels_only_and_says_how_to_allow_builds() {
    let h = Harness::with(|s| s.sandbox.network = EgressPolicy::None).await;
    let id = h.create().await;
    // A release published as a source distribution only.
    let st = h.install(id, "pycparser==2.10").await;
    assert_eq!(st.status, InstallStatusKind::Failed, "{st:?}");
    assert!(
        st.message.contains("packages.allow_source_builds"),
        "{}: {:?}",
        st.message,
        st.output
    );
}

/// A probe that connects to a port on the host (the network's gateway) and
/// to the cloud metadata address, printing what each connection did.
fn probe(port: u16) -> String {
    format!(
        "import socket, struct\n\
         gw = next(socket.inet_ntoa(struct.pack('<L', int(f[2], 16))) for f in (l.split() for l in open('/proc/net/route').read().splitlines()[1:]) if f[1] == '00000000')\n\
         for name, addr in (('host', (gw, {port})), ('metadata', ('169.254.169.254', 80)), ('index', ('pypi.org', 443))):\n\
         \x20   try:\n\
         \x20       socket.create_connection(addr, timeout=3).close()\n\
         \x20       print(name, 'reached')\n\
         \x20   except OSError as e:\n\
         \x20       print(name, 'blocked', type(e).__name__)\n"
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn the_installer_has_no_route_to_the_host_or_link_local_addresses() {
    let listener = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || for _ in listener.incoming() {});
    let h = Harness::with(|s| s.sandbox.network = EgressPolicy::None).await;
    let id = h.create().await;
    // The installer of this very sandbox, running a probe instead of uv.
    let settings = common::settings(h.root.path());
    let runtime = common::docker_runtime(&h.server_id, &settings).await;
    let paths = SandboxPaths {
        id,
        results: settings.results_dir.join(id.to_string()),
        agent: sandbox_host::agent_dir(&settings.agents_dir(), id),
        egress: None,
        packages: Some(settings.state_dir.join("disks").join(id.to_string()).join("packages")),
        template: None,
    };
    let volume = format!("mcp-sandbox-{id}-venv");
    let argv = vec!["/opt/uv/bin/python".into(), "-c".into(), probe(port)];
    let done = runtime
        .run_installer(&paths, &volume, argv, Duration::from_secs(60))
        .await
        .unwrap();
    let out = done.output;
    assert!(out.contains("host blocked"), "{out}");
    assert!(out.contains("metadata blocked"), "{out}");
    // The control: the package index is reachable, so the probe did run.
    assert!(out.contains("index reached"), "{out}");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_interpreter_planted_in_the_venv_never_becomes_the_agent() {
    let h = Harness::new().await;
    let id = h.create().await;
    // The sandbox replaces the venv's interpreter with its own program,
    // which notes how it was started, then has its container restarted.
    let plant = "real=$(readlink -f /app/.venv/bin/python); rm -f /app/.venv/bin/python; \
         printf '#!/bin/sh\\necho \"$*\" >> /app/results/.started\\nexec %s \"$@\"\\n' \"$real\" > /app/.venv/bin/python; \
         chmod 755 /app/.venv/bin/python";
    let planted = h.sh(id, plant, None).await.output;
    assert_eq!(planted.exit_code, 0, "{}", planted.stderr);
    h.sb().restart(OWNER, id).await.expect("restart");
    assert_eq!(h.py(id, "print(6 * 7)").await.output.stdout, "42\n");
    let started = h.sh(id, "cat /app/results/.started", None).await.output.stdout;
    assert!(
        started.lines().any(|l| l.contains("--worker")),
        "the user's code runs on the venv's interpreter: {started:?}"
    );
    assert!(
        started.lines().all(|l| l.contains("--worker")),
        "the planted interpreter started the agent: {started:?}"
    );
    assert!(
        started.lines().all(|l| l.contains("/opt/mcp-agent/agent.py --worker")),
        "another interpreter than the image's runs the worker from source: {started:?}"
    );
    // The agent that answers is the image's interpreter, from the read-only root.
    let agent = h
        .py(
            id,
            "import os\nfor p in filter(str.isdigit, os.listdir('/proc')):\n    \
             argv = open(f'/proc/{p}/cmdline', 'rb').read().split(bytes(1))\n    \
             if any(a.startswith(b'/opt/mcp-agent/agent.py') for a in argv) and b'--worker' not in argv:\n        \
             print(os.path.realpath(f'/proc/{p}/exe'), argv[0].decode())",
        )
        .await
        .output;
    let line = agent.stdout.trim();
    assert!(line.ends_with(" /opt/mcp-agent/python"), "{line:?} {}", agent.stderr);
    assert!(line.starts_with("/usr/"), "{line:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn delete_answers_while_the_agent_is_frozen() {
    let h = Harness::new().await;
    let id = h.create().await;
    let neighbour = h.create().await;
    // The sandbox stops its own agent: nothing it is asked is answered.
    let sb = h.sb();
    let freeze = sb.run(OWNER, id, freeze_agent(), Some(5), None);
    let delete = async {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let started = Instant::now();
        let deleted = sb.delete(OWNER, id).await;
        (deleted, started.elapsed())
    };
    let (frozen, (deleted, took)) = tokio::join!(freeze, delete);
    deleted.expect("delete");
    assert!(took < Duration::from_secs(15), "delete took {took:?}");
    let err = frozen.expect_err("the frozen run cannot have finished");
    assert!(matches!(err, SandboxError::Ended { .. }), "{err}");
    assert!(h.container_of(id).is_empty(), "its container is gone");
    assert_eq!(h.py(neighbour, "print(2)").await.output.stdout, "2\n");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_frozen_agent_is_restarted_after_the_run_deadline() {
    let h = Harness::new().await;
    let id = h.create().await;
    h.py(id, "x = 1").await;
    let started = Instant::now();
    let err = h
        .sb()
        .run(OWNER, id, freeze_agent(), Some(1), None)
        .await
        .expect_err("a frozen agent never answers");
    assert!(matches!(err, SandboxError::Unresponsive { .. }), "{err}");
    assert!(err.to_string().contains("restarted"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(90), "{:?}", started.elapsed());
    // The container was restarted: the sandbox works again, without its state.
    let ran = h.py(id, "print('back')").await;
    assert_eq!(ran.output.stdout, "back\n", "{}", ran.output.stderr);
    assert!(ran.notice.is_some_and(|n| n.contains("Python variables were lost")));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_busy_sandbox_is_removed_at_its_lifetime_and_its_caller_told() {
    let h = Harness::with(|s| s.sandbox.max_lifetime_seconds = 8).await;
    let id = h.create().await;
    let started = Instant::now();
    let err = h
        .sb()
        .run(
            OWNER,
            id,
            Work::Python("import time\ntime.sleep(600)".into()),
            Some(600),
            None,
        )
        .await
        .expect_err("the run outlives the sandbox");
    assert!(err.to_string().contains("lifetime"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(60), "{:?}", started.elapsed());
    common::eventually("the sandbox's objects are removed", || h.own_objects() == (0, 0)).await;
    gone_from_listings(&h).await;
}

/// The actor leaves the registry just after its objects are removed.
async fn gone_from_listings(h: &Harness) {
    for _ in 0..200 {
        if h.sb().list(OWNER).await.is_empty() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("a removed sandbox is still listed: {:?}", h.sb().list(OWNER).await);
}

#[tokio::test(flavor = "multi_thread")]
async fn distinct_failing_installs_leave_the_records_bounded() {
    let h = Harness::new().await;
    let id = h.create().await;
    let n: usize = std::env::var("SANDBOX_TEST_FAILING_INSTALLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let records = h.root.path().join("state").join("records.redb");
    let mut size_at_cap = 0;
    for i in 0..n {
        // Not a valid requirement for uv: fails at once, with no network.
        let st = h.install(id, &format!("p{i}==1==2")).await;
        assert_eq!(st.status, InstallStatusKind::Failed, "{st:?}");
        if i + 1 == sandbox_actors::MAX_INSTALL_RECORDS {
            size_at_cap = std::fs::metadata(&records).unwrap().len();
        }
    }
    let size = std::fs::metadata(&records).unwrap().len();
    assert!(
        size <= 2 * size_at_cap.max(1 << 20),
        "the records grew from {size_at_cap} to {size} bytes"
    );
    // The newest are remembered, the oldest forgotten.
    let newest = h
        .sb()
        .install_status(OWNER, id, &format!("p{}==1==2", n - 1))
        .await
        .unwrap();
    assert_eq!(newest.status, InstallStatusKind::Failed);
    let oldest = h.sb().install_status(OWNER, id, "p0==1==2").await.unwrap();
    assert_eq!(oldest.status, InstallStatusKind::NotFound, "{oldest:?}");
    // Installer output is kept once and capped.
    assert!(newest.output.is_some_and(|o| o.len() <= 16 * 1024));
    assert!(!newest.message.contains("p0=="), "{}", newest.message);
}

#[tokio::test(flavor = "multi_thread")]
async fn creates_whose_callers_hang_up_leave_nothing_behind() {
    let h = Harness::new().await;
    for _ in 0..3 {
        let create = h.sb().create(OWNER, None, Quota::UNLIMITED, Default::default());
        assert!(
            tokio::time::timeout(Duration::from_millis(60), create).await.is_err(),
            "a cold creation takes longer than that"
        );
    }
    common::eventually("abandoned sandboxes are removed", || h.own_objects() == (0, 0)).await;
    gone_from_listings(&h).await;
    // The quota they held is free again, once each creation's task has
    // finished its clean-up (under load, a moment after its objects went).
    let quota = Quota { per_owner: 1, total: 1 };
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        match h.sb().create(OWNER, None, quota, Default::default()).await {
            Ok(_) => break,
            Err(e) if std::time::Instant::now() < deadline => {
                assert!(
                    matches!(
                        e,
                        sandbox_actors::SandboxError::TooMany { .. } | sandbox_actors::SandboxError::Quota(_)
                    ),
                    "{e}"
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("no place was freed: {e}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_container_that_dies_while_idle_shows_it_until_brought_back() {
    let h = Harness::new().await;
    let id = h.create().await;
    h.py(id, "print(1)").await;
    docker(&["kill", &h.container_of(id)]);
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        let status = h.sb().info(OWNER, id).await.unwrap().status;
        if seen.last() != Some(&status) {
            seen.push(status);
        }
        if seen.contains(&SandboxStatus::Stopped) && status == SandboxStatus::Running {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(seen.contains(&SandboxStatus::Stopped), "{seen:?}");
    assert_eq!(seen.last(), Some(&SandboxStatus::Running), "{seen:?}");
    let ran = h.py(id, "print(2)").await;
    assert_eq!(ran.output.stdout, "2\n");
    assert!(ran.notice.is_some_and(|n| n.contains("restarted")));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_removal_cut_short_by_a_crash_is_finished_at_the_next_start() {
    let mut h = Harness::new().await;
    let id = h.create().await;
    h.sandboxes.take().unwrap().shutdown().await;
    {
        // As a server killed in the middle of a delete leaves it.
        let store = RecordStore::open(&h.root.path().join("state").join("records.redb")).unwrap();
        let mut record = store.all().await.unwrap().into_iter().find(|r| r.id == id).unwrap();
        record.deleting = true;
        store.put(record).await.unwrap();
    }
    h.restart().await;
    assert!(h.sb().list(OWNER).await.is_empty(), "not adopted");
    assert_eq!(h.own_objects(), (0, 0), "its container and volume are gone");
}

#[tokio::test(flavor = "multi_thread")]
async fn runs_leave_no_spool_behind_even_when_their_output_cannot_be_kept() {
    let h = Harness::with(|s| s.sandbox.results_mb = 64).await;
    let id = h.create().await;
    for _ in 0..20 {
        h.py(id, "print(1)").await;
    }
    // Fill the results folder, then flood: the full output cannot be kept.
    h.sh(
        id,
        "dd if=/dev/zero of=/app/results/fill bs=1M count=100 2>/dev/null; true",
        None,
    )
    .await;
    let flood = h.py(id, "import sys\nsys.stdout.write('x' * (40 * 1024 * 1024))").await;
    assert!(flood.output.truncated, "{:?}", flood.output.stderr);
    let spool = h
        .sb()
        .run(
            OWNER,
            id,
            Work::Program(vec![
                "/bin/sh".into(),
                "-c".into(),
                // The spare shell's two files (spare.out, spare.err) are
                // there whenever a spare waits; a run's own are not left.
                "ls /tmp/.mcp-agent | grep -v '^spare\\.' | wc -l; du -sm /tmp | cut -f1".into(),
            ]),
            None,
            None,
        )
        .await
        .unwrap()
        .output
        .stdout;
    let figures: Vec<u64> = spool.split_whitespace().filter_map(|n| n.parse().ok()).collect();
    assert!(figures[0] <= 2, "spool files left behind: {spool}");
    assert!(figures[1] < 8, "MB left in /tmp: {spool}");
    assert_eq!(h.py(id, "print('still')").await.output.stdout, "still\n");
}
