//! Preview links against the container's own address, in one run, on a
//! sandbox under `open` (so its address is reachable from the host):
//!
//! - a 100 MB download from `python -m http.server` through the link and
//!   directly, alternating: MB/s of each (goal: the link at least half);
//! - a 1 KB GET, alternating, one new client connection each (as a
//!   browser's first request): p50/p99 of each and what the link adds
//!   (goal: p50 at most 1 ms, p99 at most 5 ms more), from an app that keeps
//!   its connections open (`http.server --protocol HTTP/1.1`, as Flask,
//!   uvicorn, Node and Streamlit do) and from one that closes each (its
//!   HTTP/1.0 default), whose every request costs the link a new connection
//!   through the agent;
//! - 100 WebSockets opened at once through the link to an echo app, each
//!   echoing a message: how many were served, and the server's RSS and
//!   descriptors before, while they are open, and after.
//!
//! `cargo bench --bench preview [-- --n 5 --gets 300 --sockets 100 --bin PATH]`
//! (default binary target/release/mcp-sandbox; build it first; Docker must
//! run).

mod common;

use std::time::{Duration, Instant};

use common::mcp::{McpClient, Server};
use common::{arg, header, row, Series};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// An asyncio WebSocket echo server on the port given, stdlib only.
const ECHO: &str = r#"
import asyncio, base64, hashlib, sys
async def handle(r, w):
    try:
        head = await r.readuntil(b"\r\n\r\n")
        key = [l.split(b": ", 1)[1] for l in head.split(b"\r\n") if l.lower().startswith(b"sec-websocket-key")][0]
        acc = base64.b64encode(hashlib.sha1(key + b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest())
        w.write(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: " + acc + b"\r\n\r\n")
        while True:
            b1, b2 = await r.readexactly(2)
            mask = await r.readexactly(4)
            data = bytes(c ^ mask[i % 4] for i, c in enumerate(await r.readexactly(b2 & 127)))
            w.write(bytes([b1, len(data)]) + data)
            await w.drain()
    except (asyncio.IncompleteReadError, ConnectionError, IndexError):
        w.close()
async def main():
    async with await asyncio.start_server(handle, "0.0.0.0", int(sys.argv[1]), backlog=512) as s:
        await s.serve_forever()
asyncio.run(main())
"#;

#[tokio::main]
async fn main() {
    let n: usize = arg("--n", 5);
    let gets: usize = arg("--gets", 300);
    let sockets: usize = arg("--sockets", 100);
    let bin: String = arg("--bin", "target/release/mcp-sandbox".to_string());
    let preview_port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let server = Server::start(
        &bin,
        &[
            ("MCP_SANDBOX_SERVER_PREVIEW_PORT", preview_port.to_string()),
            ("MCP_SANDBOX_SANDBOX_NETWORK", "open".to_string()),
            // The direct baseline: the host reaches the container's address.
            ("MCP_SANDBOX_SANDBOX_ISOLATE_HOST", "false".to_string()),
            (
                "MCP_SANDBOX_PREVIEW_MAX_CONNECTIONS_PER_SANDBOX",
                (sockets + 16).to_string(),
            ),
        ],
    )
    .await;
    let http = reqwest::Client::new();
    let c = McpClient::http(http.clone(), &server.base).await;
    let sid = c.try_create("preview-bench").await.unwrap();
    let made = c
        .py(
            &sid,
            "import os, socket\nos.makedirs('site', exist_ok=True)\n\
             open('site/big.bin', 'wb').write(os.urandom(1 << 20) * 100)\nopen('site/small.txt', 'w').write('x' * 1024)\n\
             s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.connect(('192.0.2.1', 9)); print(s.getsockname()[0])",
        )
        .await;
    let ip = made["stdout"].as_str().unwrap().trim().to_string();
    c.tool(
        "write_file",
        json!({"sandbox_id": sid, "path": "echo.py", "content": ECHO}),
    )
    .await
    .unwrap();
    for (command, cwd) in [
        ("python -m http.server 8000", "/app/results/site"),
        ("python echo.py 8001", "/app/results"),
        ("python -m http.server --protocol HTTP/1.1 8002", "/app/results/site"),
    ] {
        let started = c
            .tool(
                "start_process",
                json!({"sandbox_id": sid, "command": command, "cwd": cwd}),
            )
            .await
            .unwrap();
        assert_eq!(started["process"]["state"], "running", "{started}");
    }
    let link = |port: u16| {
        let c = &c;
        let sid = sid.clone();
        async move {
            let r = c
                .tool("expose_port", json!({"sandbox_id": sid, "port": port}))
                .await
                .unwrap();
            let url = r["url"].as_str().unwrap().to_string();
            let (base, token) = url.split_once("?mcp_preview_token=").unwrap();
            (base.to_string(), token.to_string())
        }
    };
    let (files, token) = link(8000).await;
    let (echo, echo_token) = link(8001).await;
    let (kept, kept_token) = link(8002).await;
    let cookie = format!("mcp_preview={token}");
    let direct = format!("http://{ip}:8000/");

    // Downloads, alternating.
    let fetch = |url: String| {
        let (http, cookie) = (http.clone(), cookie.clone());
        async move {
            let t = Instant::now();
            let mut r = http.get(&url).header("cookie", cookie).send().await.unwrap();
            assert!(r.status().is_success(), "{url}: {}", r.status());
            let mut bytes = 0usize;
            while let Some(chunk) = r.chunk().await.unwrap() {
                bytes += chunk.len();
            }
            (bytes, t.elapsed())
        }
    };
    let mut rates: [Vec<f64>; 2] = [vec![], vec![]];
    for round in 0..=n {
        for (i, base) in [&files, &direct].into_iter().enumerate() {
            let (bytes, took) = fetch(format!("{base}big.bin")).await;
            assert_eq!(bytes, 100 << 20);
            if round > 0 {
                rates[i].push(bytes as f64 / 1e6 / took.as_secs_f64());
            }
        }
    }
    let p50 = |v: &mut Vec<f64>| {
        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
        v[(v.len() - 1) / 2]
    };
    let (link_rate, direct_rate) = (p50(&mut rates[0]), p50(&mut rates[1]));
    println!("\n100 MB download, {n} rounds each, alternating");
    println!("{:<40} {:>10}", "series", "MB/s p50");
    println!("{:<40} {:>10.0}", "through the preview link", link_rate);
    println!("{:<40} {:>10.0}", "direct to the container's address", direct_rate);
    println!("link / direct: {:.2} (goal: at least 0.5)", link_rate / direct_rate);

    // Small GETs, one client connection each, alternating.
    let fresh = || reqwest::Client::builder().pool_max_idle_per_host(0).build().unwrap();
    for (what, (link, cookie), straight) in [
        (
            "an app that keeps connections",
            (&kept, format!("mcp_preview={kept_token}")),
            format!("http://{ip}:8002/"),
        ),
        (
            "an app that closes each connection",
            (&files, cookie.clone()),
            direct.clone(),
        ),
    ] {
        let mut times: [Vec<Duration>; 2] = [vec![], vec![]];
        for _ in 0..gets {
            for (i, base) in [link, &straight].into_iter().enumerate() {
                let client = fresh();
                let t = Instant::now();
                let r = client
                    .get(format!("{base}small.txt"))
                    .header("cookie", &cookie)
                    .send()
                    .await
                    .unwrap();
                assert!(r.status().is_success());
                r.bytes().await.unwrap();
                times[i].push(t.elapsed());
            }
        }
        let [through, straight] = times;
        let (through, straight) = (
            Series::new("1 KB GET through the link", through),
            Series::new("1 KB GET direct", straight),
        );
        println!("\n{gets} GETs each from {what}, a new client connection each, alternating");
        header();
        row(&through);
        row(&straight);
        println!(
            "the link adds: p50 {:.2} ms (goal: at most 1), p99 {:.2} ms (goal: at most 5)",
            through.pct(50.0) - straight.pct(50.0),
            through.pct(99.0) - straight.pct(99.0)
        );
    }

    // WebSockets at once.
    let (rss0, fds0) = (server.rss_mb(), server.descriptors());
    let path = echo.split_once(&format!(":{preview_port}")).unwrap().1.to_string();
    let open = (0..sockets).map(|i| {
        let (path, token) = (path.clone(), echo_token.clone());
        async move {
            let mut s = TcpStream::connect(("127.0.0.1", preview_port)).await.ok()?;
            let hello = format!(
                "GET {path}?mcp_preview_token={token} HTTP/1.1\r\nHost: 127.0.0.1:{preview_port}\r\nUpgrade: websocket\r\n\
                 Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
            );
            s.write_all(hello.as_bytes()).await.ok()?;
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") {
                s.read_exact(&mut byte).await.ok()?;
                head.push(byte[0]);
            }
            if !head.starts_with(b"HTTP/1.1 101") {
                return None;
            }
            let text = format!("message {i}");
            let mut frame = vec![0x81, 0x80 | text.len() as u8, 0, 0, 0, 0];
            frame.extend_from_slice(text.as_bytes());
            s.write_all(&frame).await.ok()?;
            let mut back = vec![0u8; 2 + text.len()];
            s.read_exact(&mut back).await.ok()?;
            (back[2..] == *text.as_bytes()).then_some(s)
        }
    });
    let t = Instant::now();
    let held: Vec<_> = futures_util::future::join_all(open).await;
    let took = t.elapsed();
    let served = held.iter().filter(|s| s.is_some()).count();
    let (rss1, fds1) = (server.rss_mb(), server.descriptors());
    drop(held);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (rss2, fds2) = (server.rss_mb(), server.descriptors());
    println!("\n{sockets} WebSockets through links at once (each echoing one message)");
    println!("served: {served}/{sockets} in {:.0} ms", took.as_secs_f64() * 1000.0);
    println!("server RSS MB: before {rss0:.1}, open {rss1:.1}, after {rss2:.1}");
    println!("server descriptors: before {fds0}, open {fds1}, after {fds2}");

    c.tool("delete_sandbox", json!({"sandbox_id": sid})).await.unwrap();
}
