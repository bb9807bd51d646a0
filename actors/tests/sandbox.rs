//! The sandbox domain against the real Docker engine: execution semantics,
//! installs, uploads, ownership, quotas and clean-up. What depends on the
//! container runtime (limits, restarts, adoption) is in `checks/`, run under
//! each runtime.

mod common;

use std::time::Duration;

use common::{docker, Harness, OWNER};
use sandbox_actors::{InstallStatusKind, SandboxError, Work};

/// `sandbox.runtime = "auto"` runs sandboxes under crun where the engine
/// has it registered (the test scripts register it) and under runc
/// otherwise, and its trial container is gone once the server runs.
#[tokio::test(flavor = "multi_thread")]
async fn auto_runs_sandboxes_under_crun_where_it_is_registered() {
    let h = Harness::on("auto", |_| {}).await;
    let expected = if common::runtime_available("crun") {
        "crun"
    } else {
        "runc"
    };
    let id = h.create().await;
    let runtime = docker(&["inspect", "-f", "{{.HostConfig.Runtime}}", &h.container_of(id)]);
    assert_eq!(runtime.trim(), expected);
    assert_eq!(h.py(id, "print(6 * 7)").await.output.stdout, "42\n");
    let probes = docker(&[
        "ps",
        "-aq",
        "--filter",
        &format!("name=mcp-sandbox-{}-probe", h.server_id),
    ]);
    assert!(probes.trim().is_empty(), "{probes}");
}

#[tokio::test(flavor = "multi_thread")]
async fn python_state_output_and_exit_codes() {
    let h = Harness::new().await;
    let id = h.create().await;

    let r = h.py(id, "x = 41\nimport json\nprint('hi')").await.output;
    assert_eq!((r.stdout.as_str(), r.exit_code), ("hi\n", 0));
    let r = h.py(id, "x += 1\nprint(json.dumps({'x': x}))").await.output;
    assert_eq!(r.stdout, "{\"x\": 42}\n", "variables and imports persist");

    let r = h
        .py(id, "import sys\nprint('out')\nprint('err', file=sys.stderr)")
        .await
        .output;
    assert_eq!((r.stdout.as_str(), r.stderr.as_str()), ("out\n", "err\n"));

    let r = h.py(id, "def f():\n    raise ValueError('boom')\nf()").await.output;
    assert_eq!(r.exit_code, 1);
    assert!(
        r.stderr.contains("Traceback") && r.stderr.contains("ValueError: boom"),
        "{}",
        r.stderr
    );
    assert!(!r.stderr.contains("agent.py"), "agent frames leak: {}", r.stderr);
    // The worker runs on the image's own interpreter here, so it starts from
    // the image's bytecode (the frames above are filtered all the same).
    let r = h
        .py(
            id,
            "print(open('/proc/self/cmdline', 'rb').read().split(bytes(1))[2].decode())",
        )
        .await
        .output;
    assert_eq!(r.stdout, "/opt/mcp-agent/agent.pyc\n", "{}", r.stderr);

    assert_eq!(h.py(id, "import sys; sys.exit(3)").await.output.exit_code, 3);
    assert_eq!(h.py(id, "raise SystemExit").await.output.exit_code, 0);
    let r = h.py(id, "print(1").await.output;
    assert!(r.exit_code == 1 && r.stderr.contains("SyntaxError"), "{r:?}");

    // Output of child processes and C code is captured too.
    let r = h.py(id, "import os; os.system('echo from-child')").await.output;
    assert_eq!(r.stdout, "from-child\n");

    // Files created or changed by a run are reported; untouched ones are not.
    let r = h.py(id, "open('a.txt','w').write('1')\nimport os; os.makedirs('d/e', exist_ok=True)\nopen('d/e/b b.txt','w').write('2')").await.output;
    assert_eq!(r.files, vec!["/app/results/a.txt", "/app/results/d/e/b b.txt"]);
    let r = h.py(id, "print(open('a.txt').read())").await.output;
    assert!(r.files.is_empty(), "{:?}", r.files);
    let r = h.py(id, "open('a.txt','a').write('more')").await.output;
    assert_eq!(r.files, vec!["/app/results/a.txt"]);
    // Shell commands report theirs too.
    let r = h.sh(id, "echo 3 > c.txt && cat a.txt", None).await.output;
    assert_eq!(r.files, vec!["/app/results/c.txt"]);

    h.sb().delete(OWNER, id).await.unwrap();
    assert_eq!(h.own_objects(), (0, 0), "delete removes the container and its volume");
    assert!(h.sb().list(OWNER).await.is_empty());
    let mut h = h;
    h.sandboxes.take().unwrap().shutdown().await;
    let filter = format!("label=io.mcp-sandbox.server={}", h.server_id);
    assert_eq!(
        docker(&["network", "ls", "-q", "--filter", &filter]).trim(),
        "",
        "a stopped server with no sandboxes leaves no network"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn code_runs_unmodified_whatever_it_contains() {
    let h = Harness::new().await;
    let id = h.create().await;
    let code = "s = '''\nEOL\nEOF\n'''\nprint(s.count('EOL'), \"quote's\", 'dq\"')\nprint('$(id) `id` $HOME')\nimport sys\nsys.stdout.buffer.write(b'\\xff\\xfe bytes \\x00\\n')\n";
    let r = h.py(id, code).await.output;
    assert_eq!(r.exit_code, 0, "{}", r.stderr);
    let lines: Vec<&str> = r.stdout.lines().collect();
    assert_eq!(lines[0], "1 quote's dq\"");
    assert_eq!(lines[1], "$(id) `id` $HOME");
    assert_eq!(
        lines[2], "\u{fffd}\u{fffd} bytes \u{0}",
        "invalid UTF-8 is replaced, not an error"
    );

    let r = h
        .sh(
            id,
            "echo a | tr a b && cd /tmp && pwd; echo \"$HOME\" >&2; exit 4",
            None,
        )
        .await
        .output;
    assert_eq!(
        (r.stdout.as_str(), r.stderr.as_str(), r.exit_code),
        ("b\n/tmp\n", "/tmp\n", 4)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn timeouts_interrupt_and_keep_state() {
    let h = Harness::new().await;
    let id = h.create().await;
    h.py(id, "kept = 'yes'").await;
    let r = h.py_t(id, "while True: pass", Some(1)).await.output;
    assert!(r.timed_out && r.exit_code == 124 && !r.state_lost, "{r:?}");
    assert!(r.stderr.contains("KeyboardInterrupt"));
    assert_eq!(h.py(id, "print(kept)").await.output.stdout, "yes\n");

    // Code that swallows the interrupt gets its worker replaced.
    let r = h
        .py_t(
            id,
            "import time\nwhile True:\n    try:\n        time.sleep(10)\n    except KeyboardInterrupt:\n        pass",
            Some(1),
        )
        .await
        .output;
    assert!(r.timed_out && r.state_lost, "{r:?}");
    assert!(h.py(id, "print(kept)").await.output.stderr.contains("NameError"));
    assert_eq!(h.py(id, "print('ok')").await.output.stdout, "ok\n");

    let r = h.sh(id, "sleep 100", Some(1)).await.output;
    assert!(r.timed_out && r.exit_code == 124, "{r:?}");

    let err = h
        .sb()
        .run(OWNER, id, Work::Python("1".into()), Some(100_000), None)
        .await
        .unwrap_err();
    assert!(matches!(err, SandboxError::InvalidArgument(_)), "{err}");
}

#[tokio::test(flavor = "multi_thread")]
async fn sent_bytes_are_uploaded_under_their_name_only() {
    let h = Harness::new().await;
    let id = h.create().await;
    let up = h
        .sb()
        .upload_bytes(OWNER, id, "ü b.txt", b"sent".to_vec().into(), "/app/results/in")
        .await
        .unwrap();
    assert_eq!(up.path, "/app/results/in/ü b.txt");
    let r = h
        .sh(
            id,
            "cat '/app/results/in/ü b.txt'; stat -c %u '/app/results/in/ü b.txt'",
            None,
        )
        .await;
    assert_eq!(r.output.stdout, "sent1000\n");
    for (name, dest) in [
        ("../x", "/app/results"),
        ("a/b", "/app/results"),
        ("ok", "/etc"),
        ("ok", "/app/results/../.."),
    ] {
        let refused = h.sb().upload_bytes(OWNER, id, name, vec![1].into(), dest).await;
        assert!(
            matches!(
                refused,
                Err(SandboxError::UploadRefused(_) | SandboxError::InvalidArgument(_))
            ),
            "{name} into {dest}: {refused:?}"
        );
    }
    let foreign = h
        .sb()
        .upload_bytes("intruder", id, "x", vec![1].into(), "/app/results")
        .await;
    assert!(matches!(foreign, Err(SandboxError::NotFound(_))));
}

#[tokio::test(flavor = "multi_thread")]
async fn installs_are_ordered_before_later_runs() {
    let h = Harness::new().await;
    let id = h.create().await;
    // Queue the install and a run right behind it, without waiting.
    let first = h.sb().install(OWNER, id, "six", Duration::ZERO).await.unwrap();
    assert_eq!(first.status, InstallStatusKind::Installing);
    let r = h.py(id, "import six; print(six.__name__)").await.output;
    assert_eq!(r.stdout, "six\n", "{}", r.stderr);
    let st = h.sb().install_status(OWNER, id, "six").await.unwrap();
    assert_eq!(st.status, InstallStatusKind::Success, "{st:?}");
    assert!(h.sb().list(OWNER).await[0]
        .installed_packages
        .iter()
        .any(|p| p.name == "six"));
    h.install_of_a_missing_package_fails(id).await;

    // Installed from the shell: found by the status check all the same.
    let r = h.sh(id, "uv pip install -q tomli 2>&1", Some(120)).await.output;
    assert_eq!(r.exit_code, 0, "{}", r.stdout);
    let st = h.sb().install_status(OWNER, id, "tomli").await.unwrap();
    assert_eq!(st.status, InstallStatusKind::Success, "{st:?}");
    let st = h.sb().install_status(OWNER, id, "never-installed-pkg").await.unwrap();
    assert_eq!(st.status, InstallStatusKind::NotFound);

    for bad in ["--index-url http://x six", "-r /etc/passwd", "six; id"] {
        let err = h.sb().install(OWNER, id, bad, Duration::ZERO).await.unwrap_err();
        assert!(matches!(err, SandboxError::InvalidArgument(_)), "{bad}: {err}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn sandboxes_do_not_wait_on_each_other() {
    let h = Harness::new().await;
    let (a, b) = (h.create().await, h.create().await);
    let slow = h.py(a, "import time; time.sleep(4); print('slow')");
    tokio::pin!(slow);
    // While a's run is in flight, b answers.
    tokio::select! {
        _ = &mut slow => panic!("the slow run finished before the other sandbox answered"),
        r = h.py(b, "print('fast')") => assert_eq!(r.output.stdout, "fast\n"),
    }
    assert_eq!(slow.await.output.stdout, "slow\n");
}

#[tokio::test(flavor = "multi_thread")]
async fn uploads_only_from_allowed_folders_and_tenants_are_separate() {
    let h = Harness::new().await;
    let id = h.create().await;
    let uploads = h.root.path().join("uploads");
    std::fs::write(uploads.join("in put.txt"), "payload").unwrap();
    std::fs::create_dir_all(uploads.join("folder/sub")).unwrap();
    std::fs::write(uploads.join("folder/sub/x.txt"), "x").unwrap();

    let up = h
        .sb()
        .upload(
            OWNER,
            id,
            uploads.join("in put.txt").to_str().unwrap(),
            "/app/results/data",
        )
        .await
        .unwrap();
    assert_eq!(up.path, "/app/results/data/in put.txt");
    h.sb()
        .upload(OWNER, id, uploads.join("folder").to_str().unwrap(), "/app/results")
        .await
        .unwrap();
    let r = h
        .py(
            id,
            "print(open('data/in put.txt').read(), open('folder/sub/x.txt').read())",
        )
        .await
        .output;
    assert_eq!(r.stdout, "payload x\n", "{}", r.stderr);
    let r = h.sh(id, "echo more >> 'data/in put.txt' && echo ok", None).await.output;
    assert_eq!(
        r.stdout, "ok\n",
        "uploaded files belong to the sandbox user: {}",
        r.stderr
    );

    for (src, dest) in [
        ("/etc/passwd", "/app/results"),
        (
            h.root.path().join("state/records.redb").to_str().unwrap(),
            "/app/results",
        ),
        (uploads.join("../state/records.redb").to_str().unwrap(), "/app/results"),
        (uploads.join("in put.txt").to_str().unwrap(), "/etc"),
        (uploads.join("in put.txt").to_str().unwrap(), "/app/results/../../etc"),
    ] {
        let err = h.sb().upload(OWNER, id, src, dest).await.unwrap_err();
        assert!(
            matches!(err, SandboxError::UploadRefused(_) | SandboxError::InvalidArgument(_)),
            "{src} -> {dest}: {err}"
        );
    }

    // Another tenant sees nothing and can do nothing.
    assert!(h.sb().list("mallory").await.is_empty());
    let err = h
        .sb()
        .run("mallory", id, Work::Python("print(1)".into()), None, None)
        .await
        .unwrap_err();
    assert!(matches!(err, SandboxError::NotFound(_)));
    assert!(matches!(
        h.sb().delete("mallory", id).await.unwrap_err(),
        SandboxError::NotFound(_)
    ));
    assert_eq!(h.sb().list(OWNER).await.len(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn quotas_queues_and_lifetimes_are_enforced() {
    use sandbox_actors::Quota;
    let h = Harness::with(|s| {
        s.sandbox.idle_timeout_seconds = 3;
        s.sandbox.max_queued_calls = 2;
    })
    .await;
    let quota = Quota {
        per_owner: 1,
        total: 10,
    };
    let id = h
        .sb()
        .create(OWNER, None, quota, Default::default())
        .await
        .unwrap()
        .sandbox_id;
    let err = h.sb().create(OWNER, None, quota, Default::default()).await.unwrap_err();
    assert!(matches!(&err, SandboxError::TooMany { most: 1, asked: 1, .. }), "{err}");
    assert_eq!(h.own_objects(), (1, 1), "nothing was created past the quota");
    // Another owner has its own count; the total counts everyone.
    let total = Quota { per_owner: 5, total: 1 };
    assert!(matches!(
        h.sb()
            .create("other", None, total, Default::default())
            .await
            .unwrap_err(),
        SandboxError::Quota(_)
    ));

    // One run in flight and two queued: the fourth call is refused.
    let listed = h.sb().list(OWNER).await;
    assert!(listed[0].expires_at.is_some(), "an idle timeout gives an expiry");
    let sb = h.sb();
    let slow = || sb.run(OWNER, id, Work::Python("import time; time.sleep(2)".into()), None, None);
    let (a, b, c, d) = tokio::join!(slow(), slow(), slow(), async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        sb.run(OWNER, id, Work::Python("1".into()), None, None).await
    });
    assert!(a.is_ok() && b.is_ok() && c.is_ok());
    assert!(matches!(d.unwrap_err(), SandboxError::Quota(m) if m.contains("waiting")));

    // Idle past its timeout, the sandbox is removed with its data.
    let results = h.root.path().join("results").join(id.to_string());
    assert!(results.exists());
    for _ in 0..100 {
        if h.sb().list(OWNER).await.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(h.sb().list(OWNER).await.is_empty(), "the idle sandbox was reaped");
    common::eventually("its container and volume are removed", || h.own_objects() == (0, 0)).await;
    assert!(!results.exists(), "its results are removed");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_lifetime_given_at_creation_ends_the_sandbox() {
    use sandbox_actors::{CreateOptions, Quota};
    let h = Harness::new().await;
    let options = CreateOptions {
        lifetime: Some(Duration::from_secs(2)),
        ..Default::default()
    };
    let info = h.sb().create(OWNER, None, Quota::UNLIMITED, options).await.unwrap();
    let lifetime = info.expires_at.expect("a lifetime gives an expiry") - info.created_at;
    assert_eq!(lifetime, Duration::from_secs(2));
    for _ in 0..100 {
        if h.sb().list(OWNER).await.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        h.sb().list(OWNER).await.is_empty(),
        "the sandbox is deleted when its lifetime ends"
    );
    common::eventually("its container and volume are removed", || h.own_objects() == (0, 0)).await;
}
