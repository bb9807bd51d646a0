//! Connections to a sandbox's apps kept open between exchanges. Opening
//! one asks the sandbox's agent for a socket, which costs more than most
//! small answers take; a page's many small requests instead reuse the
//! connection an earlier one finished with, as a browser would.
//!
//! What the sandbox can make the server keep is bounded: a few idle
//! connections per sandbox, each for a short while, and only one that is
//! ready for another request (an app that answers `Connection: close` or
//! keeps writing is never kept). A kept connection never skips a check: every
//! request is still let through by the sandbox (the port exposed, the
//! sandbox not being deleted) before one is taken.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use hyper::client::conn::http1::SendRequest;
use tokio::time::Instant;

use crate::http::preview::caps::Sandbox;

/// A connection to an app, ready for a request.
pub(crate) type Sender = SendRequest<Body>;

/// Idle connections one sandbox keeps, over all its ports.
const KEPT_PER_SANDBOX: usize = 8;

/// How long an idle connection is kept: shorter than the keep-alive of
/// common app servers, so a kept one is seldom closed under a request.
const KEEP_FOR: Duration = Duration::from_secs(15);

/// How long a finished exchange's connection may take to be ready again.
const READY_WITHIN: Duration = Duration::from_secs(1);

/// One sandbox's idle connections.
#[derive(Default)]
pub(crate) struct Kept {
    idle: Mutex<Vec<Idle>>,
}

struct Idle {
    port: u16,
    sender: Sender,
    since: Instant,
}

impl Kept {
    /// The most recently kept connection to `port` that is still open.
    pub(crate) fn take(&self, port: u16) -> Option<Sender> {
        let mut idle = self.idle.lock().expect("kept lock");
        prune(&mut idle);
        let at = idle.iter().rposition(|i| i.port == port && i.sender.is_ready())?;
        Some(idle.remove(at).sender)
    }

    fn put(&self, port: u16, sender: Sender) {
        let mut idle = self.idle.lock().expect("kept lock");
        prune(&mut idle);
        if idle.len() >= KEPT_PER_SANDBOX {
            idle.remove(0);
        }
        idle.push(Idle {
            port,
            sender,
            since: Instant::now(),
        });
    }

    fn prune(&self) {
        prune(&mut self.idle.lock().expect("kept lock"));
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.idle.lock().expect("kept lock").len()
    }
}

fn prune(idle: &mut Vec<Idle>) {
    let now = Instant::now();
    idle.retain(|i| now - i.since < KEEP_FOR && !i.sender.is_closed());
}

/// Keeps `sender` among `share`'s idle connections to `port` once its
/// exchange is over and it can carry another request; drops it otherwise.
pub(crate) fn keep_when_ready(share: Arc<Sandbox>, port: u16, mut sender: Sender) {
    tokio::spawn(async move {
        if matches!(tokio::time::timeout(READY_WITHIN, sender.ready()).await, Ok(Ok(()))) {
            share.kept.put(port, sender);
            // Closed when its time is up even if no request comes again.
            tokio::time::sleep(KEEP_FOR).await;
            share.kept.prune();
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::PreviewConfig;
    use crate::http::preview::caps::Caps;
    use crate::http::preview::relay::connect;
    use uuid::Uuid;

    /// An app that answers every request with an empty 200, keeping its
    /// connections open when `keep_alive`.
    async fn app(keep_alive: bool) -> std::net::SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let at = listener.local_addr().unwrap();
        tokio::spawn(async move {
            loop {
                let (io, _) = listener.accept().await.unwrap();
                let service = hyper::service::service_fn(|_req| async {
                    Ok::<_, std::convert::Infallible>(hyper::Response::new(Body::empty()))
                });
                tokio::spawn(
                    hyper::server::conn::http1::Builder::new()
                        .keep_alive(keep_alive)
                        .serve_connection(hyper_util::rt::TokioIo::new(io), service),
                );
            }
        });
        at
    }

    async fn sender(at: std::net::SocketAddr) -> Sender {
        connect(tokio::net::TcpStream::connect(at).await.unwrap())
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn a_sandbox_keeps_a_few_connections_for_a_while_and_each_port_its_own() {
        let at = app(true).await;
        let caps = Caps::new(&PreviewConfig::default());
        let (_permit, share) = caps.open(Uuid::new_v4()).unwrap();
        for _ in 0..KEPT_PER_SANDBOX + 3 {
            share.kept.put(8000, sender(at).await);
        }
        assert_eq!(share.kept.len(), KEPT_PER_SANDBOX, "the oldest went");
        assert!(share.kept.take(8001).is_none(), "no connection of another port");
        assert!(share.kept.take(8000).is_some());
        tokio::time::pause();
        tokio::time::advance(KEEP_FOR).await;
        assert!(share.kept.take(8000).is_none(), "expired");
        assert_eq!(share.kept.len(), 0);
    }

    #[tokio::test]
    async fn a_connection_is_kept_only_when_ready_for_another_request() {
        let at = app(true).await;
        let caps = Caps::new(&PreviewConfig::default());
        let (_permit, share) = caps.open(Uuid::new_v4()).unwrap();
        let mut used = sender(at).await;
        let answer = used.send_request(hyper::Request::new(Body::empty())).await.unwrap();
        drop(answer);
        keep_when_ready(share.clone(), 8000, used);
        let mut kept = None;
        for _ in 0..100 {
            kept = share.kept.take(8000);
            if kept.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let mut kept = kept.expect("kept once its answer was read");
        let answer = kept.send_request(hyper::Request::new(Body::empty())).await;
        assert!(answer.is_ok(), "{answer:?}");
        // An app that closes after each answer leaves nothing to keep.
        let mut once = sender(app(false).await).await;
        drop(once.send_request(hyper::Request::new(Body::empty())).await.unwrap());
        keep_when_ready(share.clone(), 8001, once);
        tokio::time::sleep(READY_WITHIN + Duration::from_millis(200)).await;
        assert!(share.kept.take(8001).is_none());
    }
}
