//! Network policy against the real engine: an offline sandbox cannot open a
//! socket yet installs packages (through an installer container), and
//! bridged sandboxes cannot reach the host's services.

mod common;

use common::Harness;
use sandbox_actors::config::EgressPolicy;

const CONNECT: &str = "import socket\ntry:\n    socket.create_connection(('pypi.org', 443), timeout=5)\n    print('connected')\nexcept OSError as e:\n    print('blocked', type(e).__name__)";

#[tokio::test(flavor = "multi_thread")]
async fn an_offline_sandbox_has_no_network_but_installs_packages() {
    let h = Harness::with(|s| s.sandbox.network = EgressPolicy::None).await;
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

async fn host_reachability(isolate: bool) -> String {
    let listener = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        use std::io::Write;
        for mut s in listener.incoming().flatten().take(1) {
            let _ = s.write_all(b"hello");
        }
    });
    let h = Harness::with(|s| s.sandbox.isolate_host = isolate).await;
    let id = h.create().await;
    let out = h.py(id, &reach_host(port)).await.output;
    assert_eq!(out.exit_code, 0, "{}", out.stderr);
    out.stdout
}

#[tokio::test(flavor = "multi_thread")]
async fn bridged_sandboxes_cannot_reach_the_hosts_services() {
    // The control: without the rules, the host's listener answers.
    assert_eq!(host_reachability(false).await.trim(), "reached hello");
    assert!(host_reachability(true).await.starts_with("blocked"));
}
