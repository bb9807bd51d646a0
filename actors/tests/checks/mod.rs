//! What the container runtime must enforce for a sandbox, each check a
//! function of the runtime's name: the hardening of the container, its
//! memory, CPU and PID limits, network isolation, pause and unpause, and
//! the restarts that keep a sandbox's files. [`runtime_checks!`] makes one
//! test per check for one runtime, so that every runtime that shares the
//! host's kernel runs the same bodies (`isolation.rs`: runc; `crun.rs`: crun).

use std::time::{Duration, Instant};

use crate::common::{docker, eventually, Harness, OWNER};
use sandbox_actors::EgressPolicy;
use sandbox_actors::{InstallStatusKind, SandboxError, SandboxStatus, Scope, Work};

/// Defines one `#[tokio::test]` per check below, each running it under
/// `$runtime`, or skipping it where `$available` is false.
macro_rules! runtime_checks {
    ($runtime:literal) => {
        runtime_checks!($runtime if true);
    };
    ($runtime:literal if $available:expr) => {
        runtime_checks!(@each $runtime, $available, [
            a_sandbox_is_confined_as_configured,
            an_offline_sandbox_has_no_network_but_installs_packages,
            bridged_sandboxes_cannot_reach_the_hosts_services,
            memory_and_pid_limits_hold_and_the_sandbox_recovers,
            a_frozen_container_is_thawed_and_a_killed_one_comes_back_with_its_files,
            a_requested_restart_waits_its_turn_keeps_files_and_is_recorded,
            a_restarted_server_adopts_its_sandboxes,
            idle_sandboxes_are_paused_and_woken_by_the_next_call,
            a_paused_sandbox_whose_container_died_works_on_the_next_call,
        ]);
    };
    (@each $runtime:literal, $available:expr, [$($check:ident),* $(,)?]) => {
        $(
            #[tokio::test(flavor = "multi_thread")]
            async fn $check() {
                if $available {
                    $crate::checks::$check($runtime).await;
                }
            }
        )*
    };
}

/// The first line of `file` under the container's cgroup in `controller`
/// (cgroup v1), or of `v2_file` in its unified cgroup, read on the host.
fn cgroup_value(container_id: &str, controller: &str, file: &str, v2_file: &str) -> String {
    [
        format!("/sys/fs/cgroup/{controller}/docker/{container_id}/{file}"),
        format!("/sys/fs/cgroup/docker/{container_id}/{v2_file}"),
        format!("/sys/fs/cgroup/system.slice/docker-{container_id}.scope/{v2_file}"),
    ]
    .iter()
    .find_map(|p| std::fs::read_to_string(p).ok())
    .unwrap_or_else(|| panic!("no {controller} cgroup of {container_id} on the host"))
    .trim()
    .to_string()
}

/// The sandbox's own view (uid, capabilities, no-new-privileges, seccomp,
/// read-only root, the tmpfs, the writable mounts, no Docker socket) and
/// the host's (the runtime Docker used, the limits in the container's
/// cgroups), all as configured.
pub async fn a_sandbox_is_confined_as_configured(runtime: &str) {
    let h = Harness::on(runtime, |_| {}).await;
    let id = h.create().await;
    let container = h.container_of(id);
    assert_eq!(
        docker(&["inspect", "-f", "{{.HostConfig.Runtime}}", &container]).trim(),
        runtime
    );

    let r = h
        .sh(
            id,
            "id -u; id -g; cat /proc/self/oom_score_adj; \
             grep -E '^(CapInh|CapPrm|CapEff|CapBnd|CapAmb|NoNewPrivs|Seccomp):' /proc/self/status",
            None,
        )
        .await
        .output;
    let seen: Vec<String> = r
        .stdout
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect();
    let none = "0000000000000000";
    assert_eq!(
        seen,
        [
            "1000".to_string(),
            "1000".into(),
            "500".into(),
            format!("CapInh: {none}"),
            format!("CapPrm: {none}"),
            format!("CapEff: {none}"),
            format!("CapBnd: {none}"),
            format!("CapAmb: {none}"),
            "NoNewPrivs: 1".into(),
            "Seccomp: 2".into(),
        ],
        "{r:?}"
    );

    let r = h
        .sh(
            id,
            "touch /usr/planted 2>&1; touch /planted 2>&1; \
             touch /tmp/t /app/results/t /app/.venv/t && rm /tmp/t /app/results/t /app/.venv/t && echo writable; \
             grep -E ' (/|/tmp) ' /proc/mounts | cut -d' ' -f2-4; \
             test -e /var/run/docker.sock || test -e /run/docker.sock || echo 'no docker socket'",
            None,
        )
        .await
        .output;
    let lines: Vec<&str> = r.stdout.lines().collect();
    assert!(lines[..2].iter().all(|l| l.contains("Read-only file system")), "{r:?}");
    assert_eq!(lines[2], "writable", "{r:?}");
    let root = lines.iter().find(|l| l.starts_with("/ ")).expect("the root mount");
    assert!(root.split(' ').nth(2).unwrap().starts_with("ro,"), "{root}");
    let tmp = lines.iter().find(|l| l.starts_with("/tmp ")).expect("the /tmp mount");
    let size_kib = h.settings.sandbox.tmp_size_mb * 1024;
    assert!(
        tmp.starts_with("/tmp tmpfs rw,nosuid,nodev") && tmp.contains(&format!("size={size_kib}k")),
        "{tmp}"
    );
    assert_eq!(lines.last(), Some(&"no docker socket"), "{r:?}");

    let full_id = docker(&["inspect", "-f", "{{.Id}}", &container]).trim().to_string();
    let c = &h.settings.sandbox;
    let memory = (c.memory_mb * 1024 * 1024).to_string();
    assert_eq!(
        cgroup_value(&full_id, "memory", "memory.limit_in_bytes", "memory.max"),
        memory
    );
    if let Ok(swap) = std::fs::read_to_string(format!(
        "/sys/fs/cgroup/memory/docker/{full_id}/memory.memsw.limit_in_bytes"
    )) {
        assert_eq!(swap.trim(), memory, "no swap beyond the memory limit");
    }
    assert_eq!(
        cgroup_value(&full_id, "pids", "pids.max", "pids.max"),
        c.pids_limit.to_string()
    );
    let quota = cgroup_value(&full_id, "cpu", "cpu.cfs_quota_us", "cpu.max");
    let period = cgroup_value(&full_id, "cpu", "cpu.cfs_period_us", "cpu.max");
    let (quota, period): (f64, f64) = match quota.split_once(' ') {
        Some((q, p)) => (q.parse().unwrap(), p.parse().unwrap()),
        None => (quota.parse().unwrap(), period.parse().unwrap()),
    };
    assert!(
        (quota / period - c.cpus).abs() < 0.01,
        "{quota}/{period} for {} CPUs",
        c.cpus
    );
}

const CONNECT: &str = "import socket\ntry:\n    socket.create_connection(('pypi.org', 443), timeout=5)\n    print('connected')\nexcept OSError as e:\n    print('blocked', type(e).__name__)";

pub async fn an_offline_sandbox_has_no_network_but_installs_packages(runtime: &str) {
    let h = Harness::on(runtime, |s| s.sandbox.network = EgressPolicy::None).await;
    let id = h.create().await;
    let r = h.py(id, CONNECT).await.output;
    assert!(r.stdout.starts_with("blocked"), "{r:?}");

    h.install_ok(id, "six").await;
    let r = h.py(id, "import six; print(six.__name__)").await.output;
    assert_eq!(r.stdout, "six\n", "{}", r.stderr);
    assert!(
        h.py(id, CONNECT).await.output.stdout.starts_with("blocked"),
        "still offline after the install"
    );
    h.install_of_a_missing_package_fails(id).await;
    // Installer containers are gone; only the sandbox's own remains.
    assert_eq!(h.own_objects(), (1, 1));
}

/// Connects from the sandbox to a listener on the host's side of its
/// network (the default gateway): "reached" or "blocked".
fn reach_host(port: u16) -> String {
    format!(
        "import socket, struct\n\
         gw = next(socket.inet_ntoa(struct.pack('<L', int(f[2], 16))) for f in (l.split() for l in open('/proc/net/route').read().splitlines()[1:]) if f[1] == '00000000')\n\
         try:\n    s = socket.create_connection((gw, {port}), timeout=3)\n    print('reached', s.recv(5).decode())\n\
         except OSError as e:\n    print('blocked', type(e).__name__)"
    )
}

async fn host_reachability(runtime: &str, isolate: bool) -> String {
    let listener = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        use std::io::Write;
        for mut s in listener.incoming().flatten().take(1) {
            let _ = s.write_all(b"hello");
        }
    });
    let h = Harness::on(runtime, |s| s.sandbox.isolate_host = isolate).await;
    let id = h.create().await;
    let out = h.py(id, &reach_host(port)).await.output;
    assert_eq!(out.exit_code, 0, "{}", out.stderr);
    out.stdout
}

pub async fn bridged_sandboxes_cannot_reach_the_hosts_services(runtime: &str) {
    // The control: without the rules, the host's listener answers.
    assert_eq!(host_reachability(runtime, false).await.trim(), "reached hello");
    assert!(host_reachability(runtime, true).await.starts_with("blocked"));
}

pub async fn memory_and_pid_limits_hold_and_the_sandbox_recovers(runtime: &str) {
    let h = Harness::on(runtime, |_| {}).await;
    let id = h.create().await;
    h.py(id, "open('keep.txt','w').write('k')").await;

    let r = h
        .py(id, "b = bytearray(2 * 1024**3)\nb[::4096] = b'x' * len(b[::4096])")
        .await;
    assert_ne!(r.output.exit_code, 0, "{r:?}");
    assert!(r.output.state_lost, "{r:?}");
    assert_eq!(h.py(id, "print(open('keep.txt').read())").await.output.stdout, "k\n");

    let r = h
        .py_t(
            id,
            "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
            Some(3),
        )
        .await
        .output;
    assert!(r.timed_out || r.exit_code != 0, "{r:?}");
    let r = h.py(id, "print('after')").await.output;
    assert_eq!(r.stdout, "after\n");
    // Killed at once, but a loaded machine takes a while to reap them all.
    let mut n = usize::MAX;
    for _ in 0..30 {
        let procs = h.sh(id, "ls /proc | grep -c '^[0-9]'", None).await.output;
        n = procs.stdout.trim().parse().unwrap();
        if n < 20 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    }
    assert!(n < 20, "the fork bomb's processes are gone ({n} left after 30 s)");
}

pub async fn a_frozen_container_is_thawed_and_a_killed_one_comes_back_with_its_files(runtime: &str) {
    let h = Harness::on(runtime, |_| {}).await;
    let id = h.create().await;
    h.py(id, "open('data.csv','w').write('1,2'); kept = 'state'").await;
    // Frozen behind the server's back while it holds a connection to the
    // agent: the next run finds it frozen, thaws it and goes on (its
    // Python state kept: no restart), long before the run's watchdog.
    assert_eq!(
        docker(&["pause", &h.container_of(id)]),
        format!("{}\n", h.container_of(id))
    );
    let started = Instant::now();
    let r = h.py(id, "print(kept)").await;
    assert_eq!(r.output.stdout, "state\n", "{}", r.output.stderr);
    assert!(r.notice.is_none(), "thawed, not restarted: {:?}", r.notice);
    assert!(started.elapsed() < Duration::from_secs(20), "{:?}", started.elapsed());
    docker(&["kill", &h.container_of(id)]);
    let r = h.py(id, "print(open('data.csv').read())").await;
    assert_eq!(r.output.stdout, "1,2\n");
    let notice = r.notice.expect("the result says the sandbox was restarted");
    assert!(notice.contains("restarted"), "{notice}");
    let r = h.py(id, "print(2)").await;
    assert!(r.notice.is_none(), "the notice is told once");

    // Removed outright: re-created with the same packages volume and files.
    docker(&["rm", "-f", &h.container_of(id)]);
    let r = h.py(id, "print(open('data.csv').read())").await;
    assert_eq!(r.output.stdout, "1,2\n");
    assert!(r.notice.unwrap().contains("re-created"));
}

pub async fn a_requested_restart_waits_its_turn_keeps_files_and_is_recorded(runtime: &str) {
    let h = Harness::on(runtime, |_| {}).await;
    let id = h.create().await;
    h.py(id, "open('keep.txt','w').write('k')").await;
    let before = h.sb().stats().await.container_restarts;
    // Queued behind a run that sets a variable, and before one that reads it.
    let (first, restarted, second) = tokio::join!(
        h.py(id, "import time; time.sleep(3); x = 5"),
        async {
            tokio::time::sleep(Duration::from_millis(200)).await;
            h.sb().restart(OWNER, id).await
        },
        async {
            tokio::time::sleep(Duration::from_millis(400)).await;
            h.py(id, "print(open('keep.txt').read()); print(x)").await
        },
    );
    assert_eq!(first.output.exit_code, 0);
    assert_eq!(restarted.unwrap().status.as_str(), "running");
    assert_eq!(second.output.stdout, "k\n", "files stay");
    assert!(
        second.output.stderr.contains("NameError"),
        "Python state went with the restart"
    );
    assert!(second.notice.unwrap_or_default().contains("restarted on request"));
    assert_eq!(h.sb().stats().await.container_restarts, before + 1);

    let history = h.sb().history(OWNER, id).await.unwrap();
    let kinds: Vec<_> = history.iter().map(|c| (c.kind, c.ok)).collect();
    use sandbox_actors::CallKind::{Python, Restart};
    assert_eq!(
        kinds,
        vec![(Python, true), (Python, true), (Restart, true), (Python, false)]
    );
    assert_eq!(history[1].summary, "import time; time.sleep(3); x = 5");
    assert_eq!(history[3].outcome, "exit 1");

    let usage = h.sb().usage(OWNER, id).await.unwrap();
    assert!(
        usage.memory_bytes > 0 && usage.memory_limit_bytes >= usage.memory_bytes,
        "{usage:?}"
    );
    assert!(usage.cpu_seconds > 0.0, "{usage:?}");
    // Another tenant reaches none of it; the administrators' scope does.
    assert!(matches!(
        h.sb().restart("intruder", id).await,
        Err(SandboxError::NotFound(_))
    ));
    assert!(matches!(
        h.sb().history("intruder", id).await,
        Err(SandboxError::NotFound(_))
    ));
    assert!(matches!(
        h.sb().usage("intruder", id).await,
        Err(SandboxError::NotFound(_))
    ));
    assert!(h.sb().history(Scope::Everyone, id).await.is_ok());
}

pub async fn a_restarted_server_adopts_its_sandboxes(runtime: &str) {
    let mut h = Harness::on(runtime, |_| {}).await;
    let id = h.create().await;
    h.py(id, "survivor = 7").await;
    h.restart().await;
    let list = h.sb().list(OWNER).await;
    assert_eq!(list.len(), 1);
    assert_eq!(list[0].sandbox_id, id);
    // The agent kept running, so even Python state survives.
    assert_eq!(h.py(id, "print(survivor)").await.output.stdout, "7\n");
    assert_eq!(h.own_objects(), (1, 1));
}

fn paused(container: &str) -> bool {
    docker(&["inspect", "-f", "{{.State.Paused}}", container]).trim() == "true"
}

pub async fn idle_sandboxes_are_paused_and_woken_by_the_next_call(runtime: &str) {
    let h = Harness::on(runtime, |s| s.sandbox.pause_after_seconds = 1).await;
    let id = h.create().await;
    h.py(id, "kept = 'state'").await;
    let container = h.container_of(id);
    eventually("the idle sandbox is paused", || paused(&container)).await;
    assert_eq!(h.sb().list(OWNER).await[0].status.as_str(), "paused");
    let r = h
        .sb()
        .run(OWNER, id, Work::Python("print(kept)".into()), None, None)
        .await
        .unwrap();
    assert_eq!(r.output.stdout, "state\n", "memory survived the pause");
    assert!(r.notice.is_none(), "a pause is not a restart: {:?}", r.notice);
    let st = h.sb().install_status(OWNER, id, "never-installed").await.unwrap();
    assert_eq!(st.status, InstallStatusKind::NotFound, "queries wake it too");
}

pub async fn a_paused_sandbox_whose_container_died_works_on_the_next_call(runtime: &str) {
    let h = Harness::on(runtime, |s| s.sandbox.pause_after_seconds = 1).await;
    let id = h.create().await;
    h.py(id, "print(1)").await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while h.sb().info(OWNER, id).await.unwrap().status != SandboxStatus::Paused {
        assert!(Instant::now() < deadline, "the idle sandbox was never paused");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    docker(&["kill", &h.container_of(id)]);
    let ran = h.py(id, "print('after')").await;
    assert_eq!(ran.output.stdout, "after\n", "{}", ran.output.stderr);
}
