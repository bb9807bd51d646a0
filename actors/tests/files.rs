//! The file tools' domain and `reset_python`, against the real engine: a
//! write is ordered with the sandbox's other calls and lands as the sandbox
//! user's file; what a hostile sandbox plants in `/app/results` (links to
//! host files and folders, a link loop, a FIFO, a deep tree) is refused or
//! bounded without the server ever leaving the folder or stalling; another
//! tenant sees nothing; a Python reset forgets variables, keeps files, and
//! an older agent without the operation says so.

mod common;

use std::time::{Duration, Instant};

use common::{docker, Harness, OWNER};
use sandbox_actors::files::{
    Content, EntryKind, FileError, ListOptions, ResultsPath, Window, MAX_LIST_DEPTH, MAX_WRITE_BYTES,
};
use sandbox_actors::{SandboxError, Work};

fn path(raw: &str) -> ResultsPath {
    ResultsPath::parse(raw).unwrap()
}

const WHOLE: Window = Window {
    offset: 0,
    max_bytes: 4096,
    max_lines: 0,
    bytes: false,
};

const DEEP: ListOptions = ListOptions {
    depth: MAX_LIST_DEPTH,
    max_entries: 1000,
    files_only: false,
};

#[tokio::test(flavor = "multi_thread")]
async fn a_write_sent_before_a_run_is_done_before_it() {
    let h = Harness::new().await;
    let id = h.create().await;
    let sb = h.sb();
    let data = "x".repeat(MAX_WRITE_BYTES);
    // Sent together: the write first, then a run that reads what it wrote.
    let write = sb.write_file(
        OWNER,
        id,
        path("/app/results/new/sub/data.txt"),
        data.clone().into_bytes(),
    );
    let read = sb.run(
        OWNER,
        id,
        Work::Python("import os\nst = os.stat('new/sub/data.txt')\nprint(st.st_size, st.st_uid)".into()),
        None,
        None,
    );
    let (written, ran) = tokio::join!(write, read);
    assert_eq!(written.unwrap().path, "/app/results/new/sub/data.txt");
    let ran = ran.unwrap();
    assert_eq!(
        ran.output.stdout,
        format!("{} 1000\n", data.len()),
        "{}",
        ran.output.stderr
    );
    // The sandbox owns what was written: it can change it and replace it.
    let ran = h.sh(id, "echo more >> new/sub/data.txt && echo ok", None).await;
    assert_eq!(ran.output.stdout, "ok\n", "{}", ran.output.stderr);
    sb.write_file(OWNER, id, path("new/sub/data.txt"), b"short".to_vec())
        .await
        .unwrap();
    let read = sb.read_file(OWNER, id, path("new/sub/data.txt"), WHOLE).await.unwrap();
    assert!(
        matches!(read.content, Content::Text(ref w) if w.text == "short"),
        "{read:?}"
    );

    let too_big = vec![b'x'; MAX_WRITE_BYTES + 1];
    let err = sb.write_file(OWNER, id, path("big.txt"), too_big).await.unwrap_err();
    assert!(matches!(err, SandboxError::File(FileError::TooLarge { .. })), "{err}");
    let err = sb
        .write_file(OWNER, id, path("/app/results"), vec![])
        .await
        .unwrap_err();
    assert!(matches!(err, SandboxError::File(FileError::IsFolder(_))), "{err}");
}

#[tokio::test(flavor = "multi_thread")]
async fn what_a_sandbox_plants_never_leads_the_server_out_or_stalls_it() {
    let h = Harness::new().await;
    let id = h.create().await;
    let sb = h.sb();
    let passwd = std::fs::read("/etc/passwd").unwrap();
    let deep: String = (0..40).map(|i| format!("{i}/")).collect();
    let plant = format!(
        "ln -s /etc/passwd passwd && ln -s / root && ln -s loop loop && mkfifo fifo && \
         mkdir -p d {deep} && ln -s /etc d/etc && echo hi > d/ok.txt && echo planted"
    );
    assert_eq!(h.sh(id, &plant, None).await.output.stdout, "planted\n");

    let started = Instant::now();
    for (target, link) in [
        ("passwd", "passwd"),
        ("root/etc/passwd", "root"),
        ("loop", "loop"),
        ("d/etc/passwd", "d/etc"),
    ] {
        let err = sb.read_file(OWNER, id, path(target), WHOLE).await.unwrap_err();
        let expected = path(link).absolute();
        assert!(
            matches!(&err, SandboxError::File(FileError::Symlink(p)) if *p == expected),
            "{target}: {err}"
        );
        let err = sb.list_files(OWNER, id, path(target), DEEP).await.unwrap_err();
        assert!(
            matches!(err, SandboxError::File(FileError::Symlink(_))),
            "{target}: {err}"
        );
    }
    // Opening a FIFO would block until a writer came: it is never opened.
    let err = sb.read_file(OWNER, id, path("fifo"), WHOLE).await.unwrap_err();
    assert!(matches!(err, SandboxError::File(FileError::Special(_))), "{err}");
    assert!(matches!(
        ResultsPath::parse("../../etc/passwd"),
        Err(FileError::Outside(_))
    ));
    assert!(started.elapsed() < Duration::from_secs(20), "{:?}", started.elapsed());

    // Writes never go through a planted link or over a folder or a FIFO.
    for target in ["passwd", "root/etc/passwd", "d/etc/passwd", "fifo", "d", "loop"] {
        let err = sb.write_file(OWNER, id, path(target), b"owned".to_vec()).await;
        assert!(matches!(err, Err(SandboxError::File(_))), "{target}: {err:?}");
    }
    assert_eq!(std::fs::read("/etc/passwd").unwrap(), passwd);
    assert_eq!(
        h.sh(id, "cat d/ok.txt", None).await.output.stdout,
        "hi\n",
        "the folder is intact"
    );

    // The listing shows the links as links and stops at its depth.
    let listing = sb.list_files(OWNER, id, path(""), DEEP).await.unwrap();
    let kind = |p: &str| listing.entries.iter().find(|e| e.path == p).map(|e| e.kind);
    assert_eq!(kind("passwd"), Some(EntryKind::Symlink));
    assert_eq!(kind("root"), Some(EntryKind::Symlink));
    assert_eq!(kind("fifo"), Some(EntryKind::Other));
    assert_eq!(kind("d/ok.txt"), Some(EntryKind::File));
    assert!(listing
        .entries
        .iter()
        .all(|e| !e.path.starts_with("root/") && !e.path.starts_with("d/etc/")));
    let deepest = listing
        .entries
        .iter()
        .map(|e| e.path.matches('/').count())
        .max()
        .unwrap();
    assert_eq!(deepest, MAX_LIST_DEPTH - 1);

    // Another tenant cannot tell the sandbox exists.
    for err in [
        sb.read_file("intruder", id, path("d/ok.txt"), WHOLE).await.unwrap_err(),
        sb.list_files("intruder", id, path(""), DEEP).await.unwrap_err(),
        sb.write_file("intruder", id, path("x.txt"), b"x".to_vec())
            .await
            .unwrap_err(),
    ] {
        assert!(matches!(err, SandboxError::NotFound(_)), "{err}");
    }
    assert_eq!(h.py(id, "print('still here')").await.output.stdout, "still here\n");
}

/// Prints when the container's first process started: a restarted
/// container prints another time.
const BOOTED: &str = "print(open('/proc/1/stat').read().rsplit(')', 1)[1].split()[19])";

#[tokio::test(flavor = "multi_thread")]
async fn reset_python_forgets_variables_and_keeps_files() {
    let h = Harness::new().await;
    let id = h.create().await;
    let sb = h.sb();
    let ran = h
        .py(
            id,
            &format!("import json\nx = 41\nopen('kept.txt', 'w').write('kept')\n{BOOTED}"),
        )
        .await;
    assert_eq!(ran.output.exit_code, 0, "{}", ran.output.stderr);
    let booted = ran.output.stdout;
    // Sent together: the reset first, then a run that must find it done.
    let reset = sb.reset_python(OWNER, id);
    let after = sb.run(
        OWNER,
        id,
        Work::Python(format!(
            "print('x' in globals(), 'json' in globals(), open('kept.txt').read())\n{BOOTED}"
        )),
        None,
        None,
    );
    let (reset, after) = tokio::join!(reset, after);
    assert_eq!(reset.unwrap(), None, "nothing else happened to the sandbox");
    let after = after.unwrap();
    assert_eq!(
        after.output.stdout,
        format!("False False kept\n{booted}"),
        "the same container answered: {}",
        after.output.stderr
    );
    assert!(!after.output.state_lost && after.notice.is_none());
    // The fresh namespace works like the first one did.
    assert_eq!(h.py(id, "y = 2").await.output.exit_code, 0);
    assert_eq!(h.py(id, "print(y)").await.output.stdout, "2\n");
    let err = sb.reset_python("intruder", id).await.unwrap_err();
    assert!(matches!(err, SandboxError::NotFound(_)), "{err}");
}

/// An image tagged like the server's own, whose agent predates `reset`;
/// removed when dropped.
struct OlderImage(String);

impl OlderImage {
    fn build(current: &str, repository: &str) -> Self {
        let tag = current.rsplit_once(':').expect("tagged").1;
        let name = format!("{repository}:{tag}");
        let dockerfile = format!(
            "FROM {current}\nUSER root\n\
             RUN sed -i 's/elif op == \"reset\":/elif op == \"no-reset-here\":/' /opt/mcp-agent/agent.py \
             && grep -q no-reset-here /opt/mcp-agent/agent.py \
             && python3 -c 'import py_compile as c; c.compile(\"/opt/mcp-agent/agent.py\", \"/opt/mcp-agent/agent.pyc\", doraise=True)'\n\
             USER 1000:1000\n"
        );
        let mut child = std::process::Command::new("docker")
            .args(["build", "-q", "-t", &name, "-"])
            .stdin(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write;
        child.stdin.take().unwrap().write_all(dockerfile.as_bytes()).unwrap();
        assert!(child.wait().unwrap().success(), "building {name}");
        Self(name)
    }
}

impl Drop for OlderImage {
    fn drop(&mut self) {
        docker(&["rmi", "-f", &self.0]);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_older_agent_says_it_cannot_reset_and_keeps_the_state() {
    let current = {
        let h = Harness::new().await;
        let id = h.create().await;
        docker(&["inspect", "-f", "{{.Config.Image}}", &h.container_of(id)])
            .trim()
            .to_string()
    };
    let repository = format!("mcp-sandbox-test-older-agent-{}", uuid::Uuid::new_v4().simple());
    let _image = OlderImage::build(&current, &repository);
    let h = Harness::with(|s| s.sandbox.image = repository.clone()).await;
    let id = h.create().await;
    h.py(id, "x = 41").await;
    let err = h.sb().reset_python(OWNER, id).await.unwrap_err();
    assert!(matches!(err, SandboxError::Outdated { .. }), "{err}");
    assert!(err.to_string().contains("nothing was changed"), "{err}");
    assert_eq!(
        h.py(id, "print(x + 1)").await.output.stdout,
        "42\n",
        "nothing was reset"
    );
}
