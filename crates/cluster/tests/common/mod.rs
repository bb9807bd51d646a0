//! Real etcd members for the tests, on loopback ports of their own, each
//! with its data in a temporary folder; killed and removed when dropped.
//! With TLS, the members serve HTTPS and ask every client for a certificate,
//! all signed by a CA made for the test with `openssl`.

#![allow(dead_code)]

use std::net::TcpListener;
use std::path::{Path, PathBuf};
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
    /// The CA, and a client's certificate and key, with TLS.
    pub tls: Option<TlsFiles>,
    _data: tempfile::TempDir,
}

pub struct TlsFiles {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
    server_cert: PathBuf,
    server_key: PathBuf,
}

fn openssl(dir: &Path, args: &[&str]) {
    let ok = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("openssl is installed");
    assert!(ok.success(), "openssl {args:?}");
}

impl TlsFiles {
    /// A CA, a certificate for the members (127.0.0.1) and one for clients,
    /// in `dir`; keys in PKCS#8, as the node reads them.
    fn make(dir: &Path) -> Self {
        let days = ["-days", "2"];
        openssl(
            dir,
            &[
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-keyout",
                "ca.key",
                "-out",
                "ca.pem",
                "-subj",
                "/CN=test-ca",
                days[0],
                days[1],
            ],
        );
        for (name, ext) in [
            ("server", "subjectAltName=IP:127.0.0.1"),
            ("client", "extendedKeyUsage=clientAuth"),
        ] {
            openssl(
                dir,
                &[
                    "req",
                    "-newkey",
                    "rsa:2048",
                    "-nodes",
                    "-keyout",
                    &format!("{name}.key"),
                    "-out",
                    &format!("{name}.csr"),
                    "-subj",
                    &format!("/CN={name}"),
                ],
            );
            let ext_file = dir.join(format!("{name}.ext"));
            std::fs::write(&ext_file, format!("{ext}\n")).unwrap();
            openssl(
                dir,
                &[
                    "x509",
                    "-req",
                    "-in",
                    &format!("{name}.csr"),
                    "-CA",
                    "ca.pem",
                    "-CAkey",
                    "ca.key",
                    "-CAcreateserial",
                    "-out",
                    &format!("{name}.pem"),
                    "-extfile",
                    &format!("{name}.ext"),
                    days[0],
                    days[1],
                ],
            );
        }
        Self {
            ca: dir.join("ca.pem"),
            cert: dir.join("client.pem"),
            key: dir.join("client.key"),
            server_cert: dir.join("server.pem"),
            server_key: dir.join("server.key"),
        }
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

impl EtcdCluster {
    /// `n` members, started and answering.
    pub fn start(n: usize) -> Self {
        Self::start_with(n, false)
    }

    /// `n` members that serve HTTPS and take only clients with a
    /// certificate signed by their CA.
    pub fn start_tls(n: usize) -> Self {
        Self::start_with(n, true)
    }

    fn start_with(n: usize, tls: bool) -> Self {
        let data = tempfile::tempdir().unwrap();
        let tls = tls.then(|| TlsFiles::make(data.path()));
        let scheme = if tls.is_some() { "https" } else { "http" };
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
                let client_url = format!("{scheme}://127.0.0.1:{client}");
                let peer_url = format!("http://127.0.0.1:{peer}");
                let mut etcd = Command::new("etcd");
                if let Some(t) = &tls {
                    etcd.arg("--cert-file")
                        .arg(&t.server_cert)
                        .arg("--key-file")
                        .arg(&t.server_key)
                        .arg("--trusted-ca-file")
                        .arg(&t.ca)
                        .arg("--client-cert-auth");
                }
                let child = etcd
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
        let cluster = Self {
            members,
            tls,
            _data: data,
        };
        cluster.wait_ready();
        cluster
    }

    fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        for m in &self.members {
            loop {
                let mut etcdctl = Command::new("etcdctl");
                if let Some(t) = &self.tls {
                    etcdctl
                        .arg("--cacert")
                        .arg(&t.ca)
                        .arg("--cert")
                        .arg(&t.cert)
                        .arg("--key")
                        .arg(&t.key);
                }
                let ok = etcdctl
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
            etcd_ca_file: self.tls.as_ref().map(|t| t.ca.clone()),
            etcd_cert_file: self.tls.as_ref().map(|t| t.cert.clone()),
            etcd_key_file: self.tls.as_ref().map(|t| t.key.clone()),
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
