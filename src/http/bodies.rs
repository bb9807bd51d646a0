//! Request bodies under a cap and a deadline, so that a client cannot hold
//! a connection (and the memory of a body nearly sent) by sending slowly.
//!
//! A body whose `Content-Length` is past its route's cap is refused before
//! a byte of it is handed to the route (413). Every body must then keep arriving: it has
//! `limits.body_timeout_seconds`, plus one second for each
//! `limits.body_min_bytes_per_second` bytes it has delivered, so a small
//! body arrives within the timeout and a large upload at no less than the
//! minimum rate; and it may never pause for longer than the timeout, so a
//! body sent fast and then stopped short of its end does not live on the
//! time its bytes bought. Past either the request is answered 408 and the
//! connection closed. The header deadline is [`crate::access::connections`]'s.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes, HttpBody};
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::Response;
use http_body::{Frame, SizeHint};
use tokio::time::{Instant, Sleep};

use crate::access::limits::LimitsConfig;
use crate::http::error::error;
use crate::ops::verbs::execute_python_code::MAX_CODE_BYTES;

/// Largest request body but uploads': the largest `code`, JSON-escaped,
/// with room to spare.
pub const MAX_BODY_BYTES: usize = 8 * MAX_CODE_BYTES;

/// The body rules of a group of routes.
#[derive(Debug, Clone, Copy)]
pub struct BodyRules {
    /// Largest body, in bytes.
    pub cap: usize,
    /// Time every body has, however small.
    pub grace: Duration,
    /// Bytes a second that buy a large body more time.
    pub min_rate: u64,
}

impl BodyRules {
    pub fn new(limits: &LimitsConfig, cap: usize) -> Self {
        Self {
            cap,
            grace: Duration::from_secs(limits.body_timeout_seconds),
            min_rate: limits.body_min_bytes_per_second.max(1),
        }
    }
}

/// Why a body was cut off: it did not arrive in time.
#[derive(Debug, thiserror::Error)]
#[error("the request body arrived too slowly")]
struct TooSlow;

/// A body that fails once its deadline passes, and says so in `expired`.
struct Deadlined {
    inner: Body,
    started: Instant,
    /// When the last bytes came.
    last: Instant,
    received: u64,
    rules: BodyRules,
    sleep: Pin<Box<Sleep>>,
    expired: Arc<AtomicBool>,
}

impl Deadlined {
    fn deadline(&self) -> Instant {
        let bought = Duration::from_secs_f64(self.received as f64 / self.rules.min_rate as f64);
        (self.started + self.rules.grace + bought).min(self.last + self.rules.grace)
    }
}

impl HttpBody for Deadlined {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        // Once cut off, always cut off: no reader may take the rest for an end.
        if self.expired.load(Ordering::Relaxed) {
            return Poll::Ready(Some(Err(axum::Error::new(TooSlow))));
        }
        if let Poll::Ready(frame) = Pin::new(&mut self.inner).poll_frame(cx) {
            if let Some(Ok(data)) = frame.as_ref().map(|f| f.as_ref().map(Frame::data_ref)) {
                self.received += data.map_or(0, |d| d.len() as u64);
                self.last = Instant::now();
                let deadline = self.deadline();
                self.sleep.as_mut().reset(deadline);
            }
            return Poll::Ready(frame);
        }
        ready!(self.sleep.as_mut().poll(cx));
        self.expired.store(true, Ordering::Relaxed);
        Poll::Ready(Some(Err(axum::Error::new(TooSlow))))
    }

    fn is_end_stream(&self) -> bool {
        !self.expired.load(Ordering::Relaxed) && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// An answer after which the connection closes: the rest of the body is
/// not read by the route (the connection drains it for a moment, so that
/// the client can read the answer: see `connections::discard`).
fn closing(status: StatusCode, message: &str) -> Response {
    let mut r = error(status, message);
    r.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    r
}

/// Middleware: refuses a declared body past the cap, and puts the body
/// under its deadline.
pub async fn guard(State(rules): State<BodyRules>, req: Request, next: Next) -> Response {
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > rules.cap as u64) {
        return closing(
            StatusCode::PAYLOAD_TOO_LARGE,
            &format!(
                "the request body is larger than this route accepts ({} bytes)",
                rules.cap
            ),
        );
    }
    let expired = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let req = req.map(|inner| {
        Body::new(Deadlined {
            inner,
            started,
            last: started,
            received: 0,
            rules,
            sleep: Box::pin(tokio::time::sleep_until(started + rules.grace)),
            expired: expired.clone(),
        })
    });
    let response = next.run(req).await;
    if expired.load(Ordering::Relaxed) {
        return closing(
            StatusCode::REQUEST_TIMEOUT,
            &format!(
                "the request body did not arrive in time (within {} s, then at least {} bytes a second)",
                rules.grace.as_secs(),
                rules.min_rate
            ),
        );
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::StreamExt;
    use http_body_util::BodyExt;

    fn rules() -> BodyRules {
        BodyRules {
            cap: 1 << 20,
            grace: Duration::from_secs(10),
            min_rate: 1000,
        }
    }

    fn deadlined(inner: Body) -> (Deadlined, Arc<AtomicBool>) {
        let expired = Arc::new(AtomicBool::new(false));
        let started = Instant::now();
        let body = Deadlined {
            inner,
            started,
            last: started,
            received: 0,
            rules: rules(),
            sleep: Box::pin(tokio::time::sleep_until(started + rules().grace)),
            expired: expired.clone(),
        };
        (body, expired)
    }

    /// A body that delivers `chunk` bytes every `every`, `times` times.
    fn trickle(chunk: usize, every: Duration, times: usize) -> Body {
        let stream = futures_util::stream::unfold(0, move |i| async move {
            if i == times {
                return None;
            }
            tokio::time::sleep(every).await;
            Some((Ok::<_, std::io::Error>(Bytes::from(vec![b'x'; chunk])), i + 1))
        });
        Body::from_stream(stream)
    }

    /// `body`, then nothing for an hour.
    fn then_silent(body: Body) -> Body {
        let silence = futures_util::stream::once(async {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            Ok(Bytes::new())
        });
        Body::from_stream(body.into_data_stream().chain(silence))
    }

    #[tokio::test(start_paused = true)]
    async fn a_trickling_body_is_cut_off_after_the_grace() {
        // One byte every 2 s: it buys a millisecond each time.
        let (body, expired) = deadlined(trickle(1, Duration::from_secs(2), 1000));
        let started = Instant::now();
        let err = body.collect().await.expect_err("cut off");
        assert!(err.to_string().contains("too slowly"), "{err}");
        assert!(expired.load(Ordering::Relaxed));
        let took = started.elapsed();
        assert!(
            took >= Duration::from_secs(10) && took < Duration::from_secs(11),
            "{took:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_large_body_at_the_minimum_rate_is_read_whole() {
        // 2,000 bytes a second for 60 s: well past the grace, above the rate.
        let (body, expired) = deadlined(trickle(2000, Duration::from_secs(1), 60));
        let bytes = body.collect().await.expect("whole body").to_bytes();
        assert_eq!(bytes.len(), 120_000);
        assert!(!expired.load(Ordering::Relaxed));
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_sent_fast_then_stopped_is_cut_off_one_grace_after_its_last_bytes() {
        // 500 s of credit in a second, then silence.
        let (body, expired) = deadlined(then_silent(trickle(500_000, Duration::from_millis(100), 1)));
        let started = Instant::now();
        let mut body = std::pin::pin!(body);
        assert!(body.frame().await.expect("the fast part").is_ok());
        assert!(body.frame().await.expect("cut off").is_err());
        let took = started.elapsed();
        assert!(
            took >= Duration::from_secs(10) && took < Duration::from_secs(11),
            "{took:?}"
        );
        assert!(expired.load(Ordering::Relaxed));
        assert!(
            body.frame().await.is_some_and(|f| f.is_err()),
            "still an error, never an end"
        );
        assert!(!body.is_end_stream());
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_that_slows_below_the_rate_is_cut_off() {
        // 20 s at the rate, then silence: the bytes bought 20 s beyond the
        // grace, but a pause may never last longer than the grace.
        let (body, expired) = deadlined(then_silent(trickle(1000, Duration::from_secs(1), 20)));
        let started = Instant::now();
        assert!(body.collect().await.is_err());
        assert!(expired.load(Ordering::Relaxed));
        let took = started.elapsed();
        assert!(
            took >= Duration::from_secs(30) && took < Duration::from_secs(31),
            "{took:?}"
        );
    }
}
