//! Real etcd members for the tests, on loopback ports of their own, each
//! with its data in a temporary folder; killed and removed when dropped.

#![allow(dead_code)]

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sandbox_cluster::ClusterConfig;

pub struct Member {
    pub name: String,
    pub client: String,
    child: Option<Child>,
}

pub struct EtcdCluster {
    pub members: Vec<Member>,
    _data: tempfile::TempDir,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

impl EtcdCluster {
    /// `n` members, started and answering.
    pub fn start(n: usize) -> Self {
        let data = tempfile::tempdir().unwrap();
        let ports: Vec<(u16, u16)> = (0..n).map(|_| (free_port(), free_port())).collect();
        let token = format!("test-{}", uuid::Uuid::new_v4().simple());
        let initial: Vec<String> = ports
            .iter()
            .enumerate()
            .map(|(i, (_, peer))| format!("m{i}=http://127.0.0.1:{peer}"))
            .collect();
        let members = ports
            .iter()
            .enumerate()
            .map(|(i, (client, peer))| {
                let name = format!("m{i}");
                let client_url = format!("http://127.0.0.1:{client}");
                let peer_url = format!("http://127.0.0.1:{peer}");
                let child = Command::new("etcd")
                    .args(["--name", &name])
                    .arg("--data-dir")
                    .arg(data.path().join(&name))
                    .args([
                        "--listen-client-urls",
                        &client_url,
                        "--advertise-client-urls",
                        &client_url,
                    ])
                    .args([
                        "--listen-peer-urls",
                        &peer_url,
                        "--initial-advertise-peer-urls",
                        &peer_url,
                    ])
                    .args(["--initial-cluster", &initial.join(",")])
                    .args(["--initial-cluster-state", "new", "--initial-cluster-token", &token])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .expect("etcd (Debian's etcd-server) is installed");
                Member {
                    name,
                    client: client_url,
                    child: Some(child),
                }
            })
            .collect();
        let cluster = Self { members, _data: data };
        cluster.wait_ready();
        cluster
    }

    fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        for m in &self.members {
            loop {
                let ok = Command::new("etcdctl")
                    .env("ETCDCTL_API", "3")
                    .args(["--endpoints", &m.client, "--command-timeout=1s", "put", "/ready", "1"])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status()
                    .is_ok_and(|s| s.success());
                if ok {
                    break;
                }
                assert!(Instant::now() < deadline, "etcd member {} did not start", m.name);
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }

    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(|m| m.client.clone()).collect()
    }

    /// SIGKILL of member `i`.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.members[i].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Freezes or thaws every member (SIGSTOP, SIGCONT): etcd stops
    /// answering without closing its connections, as a cut-off network does.
    pub fn freeze(&self, frozen: bool) {
        let signal = if frozen { "-STOP" } else { "-CONT" };
        for m in &self.members {
            if let Some(child) = &m.child {
                Command::new("kill")
                    .args([signal, &child.id().to_string()])
                    .status()
                    .unwrap();
            }
        }
    }

    /// A `[cluster]` section for node `name` on these members.
    pub fn config(&self, name: &str, prefix: &str) -> ClusterConfig {
        ClusterConfig {
            etcd_endpoints: self.endpoints(),
            etcd_ca_file: None,
            etcd_cert_file: None,
            etcd_key_file: None,
            node_name: name.into(),
            advertise_url: format!("http://{name}.test:8080"),
            secret: "0123456789abcdef0123456789abcdef".into(),
            lease_seconds: 3,
            prefix: prefix.into(),
        }
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        self.freeze(false);
        for i in 0..self.members.len() {
            self.kill(i);
        }
    }
}
