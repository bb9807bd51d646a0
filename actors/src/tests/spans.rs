//! Traces: the job a call queues runs under the call's span (its wait, its
//! work, the agent exchange), and work outside any call makes no span.

use std::sync::{Arc, Mutex};

use tracing::span::{Attributes, Id};
use tracing::Instrument;
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::{Layer, Registry};

use super::Server;

/// A span's name and its parent's.
type SeenSpan = (&'static str, Option<&'static str>);

/// Every span made.
#[derive(Clone, Default)]
struct SpanRecorder(Arc<Mutex<Vec<SeenSpan>>>);

impl<S: tracing::Subscriber + for<'a> LookupSpan<'a>> Layer<S> for SpanRecorder {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        // Not ractor's own spans, in which every actor runs.
        if attrs.metadata().target().starts_with("ractor") {
            return;
        }
        let parent = ctx.span(id).and_then(|s| s.parent()).map(|p| p.name());
        self.0.lock().unwrap().push((attrs.metadata().name(), parent));
    }
}

impl SpanRecorder {
    fn take(&self) -> Vec<(&'static str, Option<&'static str>)> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }
}

#[tokio::test(start_paused = true)]
async fn a_calls_job_runs_under_its_span_and_upkeep_makes_none() {
    let spans = SpanRecorder::default();
    let _guard = tracing::subscriber::set_default(Registry::default().with(spans.clone()));
    let s = Server::start().await;
    let id = s.create().await;
    s.run(id, "echo untraced").await.unwrap();
    assert_eq!(spans.take(), [], "work outside a call's span is not traced");

    let call = tracing::info_span!("call");
    s.run(id, "echo traced").instrument(call).await.unwrap();
    let seen = spans.take();
    for (span, parent) in [("queued", "call"), ("job", "call"), ("agent", "job")] {
        assert!(seen.contains(&(span, Some(parent))), "{span} under {parent}: {seen:?}");
    }
    let roots: Vec<_> = seen.iter().filter(|(_, parent)| parent.is_none()).collect();
    assert_eq!(roots, [&("call", None)], "one root, the call's");
}
