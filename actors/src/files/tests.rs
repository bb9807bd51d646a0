use super::*;

fn p(raw: &str) -> ResultsPath {
    ResultsPath::parse(raw).unwrap()
}

fn window(offset: u64, max_bytes: usize, max_lines: usize) -> Window {
    Window {
        offset,
        max_bytes,
        max_lines,
        bytes: false,
    }
}

fn text(read: FileRead) -> TextWindow {
    match read.content {
        Content::Text(t) => t,
        other => panic!("not text: {other:?}"),
    }
}

const ALL: ListOptions = ListOptions {
    depth: MAX_LIST_DEPTH,
    max_entries: MAX_LIST_ENTRIES,
    files_only: false,
};

#[tokio::test]
async fn a_host_access_past_its_deadline_is_answered_without_waiting() {
    let started = std::time::Instant::now();
    let slow = within(Duration::from_millis(50), PathBuf::from("/"), "sleeping", |_| {
        std::thread::sleep(Duration::from_secs(1));
        Ok(())
    });
    assert!(matches!(slow.await, Err(FileError::Slow { .. })));
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "{:?}",
        started.elapsed()
    );
    let quick = within(Duration::from_secs(5), PathBuf::from("/"), "nothing", |_| Ok(1));
    assert_eq!(quick.await.unwrap(), 1);
}

#[test]
fn paths_stay_under_results() {
    assert_eq!(p("/app/results/a/b.txt").relative(), "a/b.txt");
    assert_eq!(p("a//./b.txt").absolute(), "/app/results/a/b.txt");
    assert!(p("/app/results").is_root() && p("").is_root() && p("/app/results/").is_root());
    assert_eq!(p("d/f").parent().absolute(), "/app/results/d");
    for bad in [
        "/etc/passwd",
        "/app/resultsx/a",
        "../x",
        "a/../../x",
        "/app/results/..",
        "a\0b",
    ] {
        assert!(ResultsPath::parse(bad).is_err(), "{bad:?} accepted");
    }
}

#[test]
fn links_fifos_and_folders_are_refused_by_name() {
    let root = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret"), "s").unwrap();
    std::fs::create_dir(root.path().join("d")).unwrap();
    std::fs::write(root.path().join("d/ok.txt"), "ok").unwrap();
    std::os::unix::fs::symlink(outside.path().join("secret"), root.path().join("link")).unwrap();
    std::os::unix::fs::symlink(outside.path(), root.path().join("dirlink")).unwrap();
    std::os::unix::fs::symlink("loop", root.path().join("loop")).unwrap();
    let fifo = std::ffi::CString::new(root.path().join("fifo").to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
    let read = |path: &str| read(root.path(), &p(path), window(0, 100, 0));
    assert_eq!(text(read("d/ok.txt").unwrap()).text, "ok");
    assert!(matches!(read("link"), Err(FileError::Symlink(_))));
    assert!(matches!(read("loop"), Err(FileError::Symlink(_))));
    assert!(matches!(read("dirlink/secret"), Err(FileError::Symlink(p)) if p == "/app/results/dirlink"));
    // Opening a FIFO for reading would block until a writer came.
    assert!(matches!(read("fifo"), Err(FileError::Special(_))));
    assert!(matches!(read("d"), Err(FileError::IsFolder(_))));
    assert!(matches!(read("d/ok.txt/x"), Err(FileError::NotFolder(_))));
    assert!(matches!(read("nope"), Err(FileError::NotFound(p)) if p == "/app/results/nope"));
    assert!(matches!(
        list(root.path(), &p("dirlink"), ALL),
        Err(FileError::Symlink(_))
    ));
    assert!(matches!(
        list(root.path(), &p("d/ok.txt"), ALL),
        Err(FileError::NotFolder(_))
    ));
    assert!(open_file(root.path(), &p("link")).is_err());
    assert!(check_writable(root.path(), &p("d/new/x.txt")).is_ok());
    assert!(check_writable(root.path(), &p("d/ok.txt")).is_ok());
    for bad in ["link", "dirlink/x", "fifo", "d", "d/ok.txt/x"] {
        assert!(check_writable(root.path(), &p(bad)).is_err(), "{bad} writable");
    }
}

#[test]
fn listing_reports_links_without_following_them() {
    let root = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret"), "s").unwrap();
    std::fs::create_dir_all(root.path().join("d/e")).unwrap();
    std::fs::write(root.path().join("d/b.txt"), "bb").unwrap();
    std::fs::write(root.path().join("d/e/deep.txt"), "d").unwrap();
    std::fs::write(root.path().join("a b.png"), "a").unwrap();
    std::os::unix::fs::symlink(outside.path(), root.path().join("dirlink")).unwrap();
    let listed = list(root.path(), &p(""), ALL).unwrap();
    let got: Vec<_> = listed.entries.iter().map(|e| (e.path.as_str(), e.kind)).collect();
    use EntryKind::*;
    assert_eq!(
        got,
        vec![
            ("a b.png", File),
            ("d", Folder),
            ("d/b.txt", File),
            ("d/e", Folder),
            ("d/e/deep.txt", File),
            ("dirlink", Symlink)
        ]
    );
    assert!(!listed.truncated);
    let shallow = list(root.path(), &p("d"), ListOptions { depth: 1, ..ALL }).unwrap();
    let got: Vec<_> = shallow.entries.iter().map(|e| e.path.as_str()).collect();
    assert_eq!(got, vec!["d/b.txt", "d/e"]);
    let files = list(
        root.path(),
        &p(""),
        ListOptions {
            files_only: true,
            ..ALL
        },
    )
    .unwrap();
    assert_eq!(files.entries.len(), 3);
}

#[test]
fn listing_stops_at_its_entry_cap_keeping_the_shallowest() {
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir(root.path().join("sub")).unwrap();
    for i in 0..20 {
        std::fs::write(root.path().join(format!("{i:02}")), "").unwrap();
        std::fs::write(root.path().join(format!("sub/{i:02}")), "").unwrap();
    }
    let listed = list(root.path(), &p(""), ListOptions { max_entries: 21, ..ALL }).unwrap();
    assert_eq!(listed.entries.len(), 21);
    assert!(listed.truncated);
    assert!(listed.entries.iter().all(|e| !e.path.starts_with("sub/")));
}

#[test]
fn listing_a_deep_tree_stops_at_the_deepest_level() {
    let root = tempfile::tempdir().unwrap();
    let deep: String = (0..MAX_LIST_DEPTH + 5).map(|i| format!("{i}/")).collect();
    std::fs::create_dir_all(root.path().join(&deep)).unwrap();
    let listed = list(root.path(), &p(""), ListOptions { depth: 1000, ..ALL }).unwrap();
    assert_eq!(listed.entries.len(), MAX_LIST_DEPTH);
}

#[test]
fn listing_a_huge_folder_stops_after_scanning_its_bound() {
    let root = tempfile::tempdir().unwrap();
    for i in 0..MAX_SCANNED + 10 {
        std::fs::File::create(root.path().join(i.to_string())).unwrap();
    }
    let listed = list(
        root.path(),
        &p(""),
        ListOptions {
            max_entries: 10,
            files_only: true,
            ..ALL
        },
    )
    .unwrap();
    assert!(listed.truncated && listed.entries.len() == 10);
    let all = list(
        root.path(),
        &p(""),
        ListOptions {
            depth: 1,
            max_entries: usize::MAX,
            files_only: true,
        },
    )
    .unwrap();
    assert!(all.truncated, "more names than a listing scans");
    assert_eq!(all.entries.len(), MAX_SCANNED);
}

#[test]
fn text_is_read_in_windows_with_head_and_tail() {
    let root = tempfile::tempdir().unwrap();
    let body: String = (0..1000).map(|i| format!("line {i}\n")).collect();
    std::fs::write(root.path().join("big.txt"), &body).unwrap();
    let first = text(read(root.path(), &p("big.txt"), window(0, 100, 0)).unwrap());
    assert_eq!(first.text, body[..100]);
    assert_eq!(first.next_offset, Some(100));
    assert_eq!(
        first.tail.as_deref(),
        Some(&body[body.len() - first.tail.as_ref().unwrap().len()..])
    );
    assert!(
        first.tail.unwrap().starts_with("line "),
        "the tail starts with a whole line"
    );
    let mut all = String::new();
    let mut offset = 0;
    loop {
        let w = text(read(root.path(), &p("big.txt"), window(offset, 4096, 0)).unwrap());
        assert!(w.tail.is_none() || offset == 0);
        all.push_str(&w.text);
        match w.next_offset {
            Some(n) => offset = n,
            None => break,
        }
    }
    assert_eq!(all, body);
    let lines = text(read(root.path(), &p("big.txt"), window(7, 10_000, 2)).unwrap());
    assert_eq!(lines.text, "line 1\nline 2\n");
    assert_eq!(lines.next_offset, Some(21));
    let past = text(read(root.path(), &p("big.txt"), window(1 << 40, 10, 0)).unwrap());
    assert_eq!((past.text.as_str(), past.next_offset), ("", None));
    let capped = text(read(root.path(), &p("big.txt"), window(0, usize::MAX, 0)).unwrap());
    assert_eq!(capped.text.len(), body.len().min(MAX_READ_BYTES));
}

#[test]
fn windows_never_cut_a_character() {
    let root = tempfile::tempdir().unwrap();
    let body = "é".repeat(100);
    std::fs::write(root.path().join("u.txt"), &body).unwrap();
    let w = text(read(root.path(), &p("u.txt"), window(0, 5, 0)).unwrap());
    assert_eq!((w.text.as_str(), w.next_offset), ("éé", Some(4)));
    let inside = text(read(root.path(), &p("u.txt"), window(1, 4, 0)).unwrap());
    assert_eq!((inside.offset, inside.text.as_str()), (2, "éé"));
}

#[test]
fn images_and_binaries_are_told_apart_from_text() {
    let root = tempfile::tempdir().unwrap();
    std::fs::write(root.path().join("plot.dat"), b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR").unwrap();
    std::fs::write(root.path().join("x.svg"), "<svg/>").unwrap();
    std::fs::write(root.path().join("blob"), b"ab\0cd").unwrap();
    std::fs::write(root.path().join("latin1"), b"caf\xe9").unwrap();
    std::fs::write(root.path().join("empty"), b"").unwrap();
    let kind = |name: &str| read(root.path(), &p(name), window(0, 100, 0)).unwrap().content;
    assert!(matches!(kind("plot.dat"), Content::Image { mime: "image/png", .. }));
    assert!(matches!(
        kind("x.svg"),
        Content::Image {
            mime: "image/svg+xml",
            ..
        }
    ));
    assert!(matches!(kind("blob"), Content::Binary));
    assert!(matches!(kind("latin1"), Content::Binary));
    assert!(matches!(
        kind("empty"),
        Content::Text(TextWindow { next_offset: None, .. })
    ));
}

#[test]
fn bytes_are_read_in_windows_from_any_file() {
    let root = tempfile::tempdir().unwrap();
    let all: Vec<u8> = (0..=255u8).cycle().take(1000).collect();
    std::fs::write(root.path().join("blob"), &all).unwrap();
    std::fs::write(root.path().join("plot.png"), b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR").unwrap();
    let bytes = |name: &str, offset: u64, max_bytes: usize| {
        let w = Window {
            bytes: true,
            ..window(offset, max_bytes, 1)
        };
        match read(root.path(), &p(name), w).unwrap().content {
            Content::Bytes(b) => b,
            other => panic!("not bytes: {other:?}"),
        }
    };
    let mut got = vec![];
    let mut at = Some(0);
    while let Some(offset) = at {
        let w = bytes("blob", offset, 300);
        assert_eq!(w.offset, offset);
        assert!(w.data.len() <= 300);
        got.extend_from_slice(&w.data);
        at = w.next_offset;
    }
    assert_eq!(got, all, "four windows make the file, max_lines aside");
    assert_eq!(
        bytes("plot.png", 0, 4).data,
        b"\x89PNG",
        "an image's bytes, not its kind"
    );
    let past = bytes("blob", 5000, 10);
    assert_eq!((past.data.len(), past.offset, past.next_offset), (0, 1000, None));
    let most = bytes("blob", 0, usize::MAX);
    assert_eq!(most.data.len(), 1000);
}
