//! The spans of a call's work below its job: agent exchanges and engine
//! calls. They are made only under a call's span; the server's own upkeep
//! (pool refills, ticks, usage samples) runs outside any, or in ractor's
//! own `Actor` spans, and makes none, so that only calls become traces.

use std::future::Future;

use tracing::instrument::Instrumented;
use tracing::{Instrument, Span};

/// `fut` as one exchange with a sandbox's agent (`op` names the request).
pub fn agent<F: Future>(op: &'static str, fut: F) -> Instrumented<F> {
    fut.instrument(under_current(|| tracing::info_span!("agent", op)))
}

/// `fut` as one call to the container engine (`op` names it).
pub fn engine<F: Future>(op: &'static str, fut: F) -> Instrumented<F> {
    fut.instrument(under_current(|| tracing::info_span!("engine", op)))
}

/// The current span when it is a call's: one of the server's own, not
/// none and not the span ractor runs every actor in.
pub fn current_call() -> Option<Span> {
    let span = Span::current();
    let ours = span.metadata().is_some_and(|m| !m.target().starts_with("ractor"));
    ours.then_some(span)
}

fn under_current(make: impl FnOnce() -> Span) -> Span {
    match current_call() {
        Some(_) => make(),
        None => Span::none(),
    }
}
