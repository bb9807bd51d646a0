//! What the sandbox's agent costs in CPU, measured inside a real sandbox
//! (its image, user, limits and seccomp filter): its start up to the bind of
//! its socket (which every creation pays), the start of its Python worker
//! with a first `pass` (which a warm pooled sandbox and every first Python
//! call pay), and one `echo ok` run (an agent's share of a call). Each
//! figure is the mean over `--n` agents (`--runs` runs), in milliseconds of
//! CPU: the start's from `wait4`, the worker's and the runs' from `/proc`
//! (in clock ticks, which the mean smooths).
//!
//! The floor beside them: the bare interpreter's start and exit, as the
//! agent is started. `--baseline FILE` measures an `agent.py` of another revision beside the
//! image's, in alternating rounds (`--rounds`): compiled to bytecode in the
//! sandbox and run the same way.
//!
//! `cargo bench --bench agent [-- --n 40 --runs 300 --rounds 3 --baseline <(git show REV:docker/agent.py)]`
//! (Docker must run.)

mod common;

use common::arg;
use sandbox_actors::{Quota, Sandboxes, Settings, Work};

const OWNER: &str = "bench";

/// Runs in the sandbox as its user; prints one JSON object per variant and
/// round. argv: n, runs, rounds, and the baseline's source (optional).
const MEASURE: &str = r#"
import json, os, py_compile, signal, socket, subprocess, sys, time
n, runs, rounds = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
variants = [("image", "/opt/mcp-agent/agent.pyc")]
if len(sys.argv) > 4:
    os.makedirs("/tmp/bench-agent/base", exist_ok=True)
    with open("/tmp/bench-agent/base/agent.py", "w") as f:
        f.write(sys.argv[4])
    py_compile.compile("/tmp/bench-agent/base/agent.py", cfile="/tmp/bench-agent/base/agent.pyc", doraise=True)
    variants.insert(0, ("baseline", "/tmp/bench-agent/base/agent.pyc"))
tick = os.sysconf("SC_CLK_TCK")

def proc_cpu(pid):
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / tick

def start(pyc, i):
    d = f"/tmp/bench-agent/{i}"
    for sub in ("sock", "results", "spool"):
        os.makedirs(f"{d}/{sub}", exist_ok=True)
    env = dict(os.environ, MCP_AGENT_DIR=f"{d}/sock", MCP_AGENT_RESULTS=f"{d}/results", MCP_AGENT_SPOOL=f"{d}/spool")
    env.pop("MCP_EGRESS_SOCKET", None)
    p = subprocess.Popen(["/opt/mcp-agent/python", "-I", "-S", "-u", pyc], env=env, stdin=subprocess.DEVNULL)
    path = f"{d}/sock/agent.sock"
    deadline = time.monotonic() + 20
    while True:
        try:
            s = socket.socket(socket.AF_UNIX)
            s.connect(path)
            return p, s
        except OSError:
            s.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.002)

def ask(s, f, req):
    s.sendall((json.dumps(req) + "\n").encode())
    while True:
        m = json.loads(f.readline())
        if m.get("type") in ("result", "error"):
            return m

def stop(p):
    os.kill(p.pid, signal.SIGKILL)
    return os.wait4(p.pid, 0)[2]

for r in range(rounds):
    bare = 0.0
    for i in range(n):
        ru = os.wait4(subprocess.Popen(["/opt/mcp-agent/python", "-I", "-S", "-c", "pass"]).pid, 0)[2]
        bare += ru.ru_utime + ru.ru_stime
    print(json.dumps({"round": r + 1, "agent": "floor: the interpreter alone (-I -S -c pass)",
                      "start_ms": bare / n * 1000}), flush=True)
    for name, pyc in variants:
        boot = worker = 0.0
        for i in range(n):
            p, s = start(pyc, i)
            ru = stop(p)
            s.close()
            boot += ru.ru_utime + ru.ru_stime
        for i in range(n):
            p, s = start(pyc, i)
            f = s.makefile("rb")
            before = set(os.listdir("/proc"))
            m = ask(s, f, {"op": "exec", "id": 1, "code": "pass", "timeout": 30, "output_cap": 65536})
            assert m.get("exit_code") == 0, m
            kids = [int(x) for x in set(os.listdir("/proc")) - before if x.isdigit()]
            for k in kids:
                try:
                    worker += proc_cpu(k)
                    os.kill(k, signal.SIGKILL)
                except OSError:
                    pass
            stop(p)
            s.close()
        p, s = start(pyc, 0)
        f = s.makefile("rb")
        ask(s, f, {"op": "run", "id": 0, "argv": ["true"], "timeout": 30, "output_cap": 65536})
        first = proc_cpu(p.pid)
        for i in range(runs):
            m = ask(s, f, {"op": "run", "id": i + 1, "argv": ["sh", "-c", "echo ok"], "timeout": 30, "output_cap": 65536})
            assert m.get("stdout") == "ok\n", m
        per_run = (proc_cpu(p.pid) - first) / runs
        stop(p)
        s.close()
        print(json.dumps({"round": r + 1, "agent": name, "start_ms": boot / n * 1000,
                          "worker_ms": worker / n * 1000, "run_ms": per_run * 1000}), flush=True)
"#;

#[tokio::main]
async fn main() {
    let n: usize = arg("--n", 40);
    let runs: usize = arg("--runs", 300);
    let rounds: usize = arg("--rounds", 3);
    let baseline: Option<String> = std::env::args()
        .skip_while(|a| a != "--baseline")
        .nth(1)
        .map(|path| std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("--baseline {path}: {e}")));

    let root = tempfile::tempdir().unwrap();
    let ca = std::path::PathBuf::from("/etc/ssl/certs/ca-certificates.crt");
    let mut settings = Settings::under(root.path());
    settings.sandbox.ca_bundle = ca.is_file().then_some(ca);
    settings.sandbox.max_exec_timeout_seconds = 3600;
    let sandboxes = Sandboxes::start(settings).await.expect("start (is Docker running?)");
    let id = sandboxes
        .create(OWNER, None, Quota::UNLIMITED, Default::default())
        .await
        .expect("create a sandbox")
        .sandbox_id;
    let mut argv = vec![
        "/opt/mcp-agent/python".to_string(),
        "-c".into(),
        MEASURE.into(),
        n.to_string(),
        runs.to_string(),
        rounds.to_string(),
    ];
    argv.extend(baseline);
    let ran = sandboxes.run(OWNER, id, Work::Program(argv), Some(3600), None).await;
    let _ = sandboxes.delete(OWNER, id).await;
    sandboxes.shutdown().await;
    let out = ran.expect("the measurement ran").output;
    assert_eq!(out.exit_code, 0, "the measurement failed: {}", out.stderr);

    println!("agent CPU in a sandbox, ms (mean of {n} agents; a run: mean of {runs})");
    println!("| round | agent | start to listening | worker start + `pass` | one `echo ok` run |");
    println!("|---|---|---|---|---|");
    for line in out.stdout.lines() {
        let v: serde_json::Value = serde_json::from_str(line).expect("a JSON line");
        let ms = |key: &str, digits: usize| v[key].as_f64().map_or("".to_string(), |x| format!("{x:.digits$}"));
        println!(
            "| {} | {} | {} | {} | {} |",
            v["round"],
            v["agent"].as_str().unwrap_or("?"),
            ms("start_ms", 2),
            ms("worker_ms", 2),
            ms("run_ms", 3)
        );
    }
}
