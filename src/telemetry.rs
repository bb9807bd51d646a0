//! Traces of tool calls as OpenTelemetry spans, sent over OTLP/HTTP
//! (protobuf) when `[telemetry] otlp_endpoint` is set; without it no layer
//! is installed and nothing is exported.
//!
//! The spans are the `tracing` spans of the two crates: the call
//! (`tools/call`, a child of the client's W3C trace context when the
//! request carries one), the operation (`tool`), the wait in the sandbox's
//! queue (`queued`), the job (`job`: a run, an install, an upload…), the
//! agent exchange (`agent`), engine calls (`engine`) and image inlining
//! (`inline_images`). Their fields are names, ids, sizes and outcomes:
//! spans never carry code, output or keys, and log events are not exported
//! (they may quote a sandbox's own words).

use std::collections::HashMap;

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider};
use opentelemetry_sdk::Resource;
use rmcp::service::RequestContext;
use rmcp::RoleServer;
use serde::Deserialize;
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::filter::{filter_fn, Targets};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

/// The crates whose spans are exported: the project's own, not the HTTP or
/// MCP libraries'. The agent and engine spans are the runtime's.
const TRACED: [&str; 5] = [
    "mcp_sandbox",
    "sandbox_actors",
    "sandbox_runtime",
    "sandbox_egress",
    "sandbox_host",
];
/// A `traceparent` is exactly this long (version 00, W3C Trace Context);
/// other lengths are not a context this server reads.
const TRACEPARENT_LEN: usize = 55;
/// Longest `tracestate` carried on (the W3C's limit for what a vendor must
/// propagate); a longer one is dropped, so that no client makes every span
/// of its calls large.
const MAX_TRACESTATE: usize = 512;
const TRACES_PATH: &str = "/v1/traces";

/// `[telemetry]`
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TelemetryConfig {
    /// Base URL of an OTLP/HTTP receiver (`http://collector:4318`); spans
    /// are posted to `{otlp_endpoint}/v1/traces`. Unset: no traces.
    pub otlp_endpoint: Option<String>,
    /// The `service.name` resource attribute of every span.
    pub service_name: String,
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        Self {
            otlp_endpoint: None,
            service_name: "mcp-sandbox".into(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("telemetry.otlp_endpoint: an http(s) URL, not {0:?}")]
    Endpoint(String),
    #[error("telemetry.service_name: 1 to 255 characters")]
    ServiceName,
    #[error("telemetry: the OTLP exporter could not be built: {0}")]
    Exporter(#[from] opentelemetry_otlp::ExporterBuildError),
}

impl TelemetryConfig {
    pub fn validate(&self) -> Result<(), TelemetryError> {
        if let Some(url) = &self.otlp_endpoint {
            let rest = url.strip_prefix("http://").or_else(|| url.strip_prefix("https://"));
            if rest.is_none_or(|r| r.is_empty() || r.contains(char::is_whitespace)) {
                return Err(TelemetryError::Endpoint(url.clone()));
            }
        }
        if self.service_name.is_empty() || self.service_name.len() > 255 {
            return Err(TelemetryError::ServiceName);
        }
        Ok(())
    }
}

/// Where spans are posted, for the endpoint `base`.
fn traces_url(base: &str) -> String {
    let base = base.trim_end_matches('/');
    match base.ends_with(TRACES_PATH) {
        true => base.to_string(),
        false => format!("{base}{TRACES_PATH}"),
    }
}

/// The exporter of a running server; [`Exporter::shutdown`] sends what is
/// still buffered.
pub struct Exporter(SdkTracerProvider);

impl Exporter {
    /// Flushes the buffered spans (the exporter's own timeout bounds it).
    pub fn shutdown(self) {
        if let Err(e) = self.0.shutdown() {
            eprintln!("mcp-sandbox: telemetry: the last spans were not sent: {e}");
        }
    }
}

/// The layer that turns this server's spans into OpenTelemetry spans and
/// its exporter, or `None` when no endpoint is configured. Spans are sent
/// in batches from a thread of the exporter's own (the batch processor's
/// `OTEL_BSP_*` variables apply); a receiver that is down or slow costs
/// dropped spans, never a call.
pub fn layer<S>(config: &TelemetryConfig) -> Result<Option<(impl Layer<S>, Exporter)>, TelemetryError>
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
{
    let Some(base) = &config.otlp_endpoint else {
        return Ok(None);
    };
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_endpoint(traces_url(base))
        .with_timeout(std::time::Duration::from_secs(10))
        .build()?;
    // Every call is recorded, whatever the client's sampled flag says: a
    // client could otherwise hide its calls from the operator, or force
    // the recording of all of them past the operator's choice.
    let provider = SdkTracerProvider::builder()
        .with_sampler(Sampler::AlwaysOn)
        .with_batch_exporter(exporter)
        .with_resource(
            Resource::builder()
                .with_service_name(config.service_name.clone())
                .build(),
        )
        .build();
    let tracer = provider.tracer("mcp-sandbox");
    let targets = TRACED
        .iter()
        .fold(Targets::new(), |t, target| t.with_target(*target, tracing::Level::INFO));
    let only_spans = filter_fn(move |meta| meta.is_span() && targets.would_enable(meta.target(), meta.level()));
    let layer = tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_tracked_inactivity(false)
        .with_filter(only_spans);
    Ok(Some((layer, Exporter(provider))))
}

/// The span of one MCP tool call (`tool`: the tool's name, `None` when the
/// client named no tool of this server's): a child of the caller's trace
/// when the request's `_meta` (or, over HTTP, its headers) carries a W3C
/// `traceparent`; a root otherwise.
pub fn call_span(tool: Option<&str>, ctx: &RequestContext<RoleServer>) -> Span {
    let span = tracing::info_span!("tools/call", tool = tool.unwrap_or("unknown"), rpc.system = "mcp");
    let meta = |name: &str| ctx.meta.get(name).and_then(|v| v.as_str());
    let header = |name: &str| {
        ctx.extensions
            .get::<axum::http::request::Parts>()
            .and_then(|parts| parts.headers.get(name))
            .and_then(|v| v.to_str().ok())
    };
    if let Some(fields) = context_fields(meta).or_else(|| context_fields(header)) {
        let parent = TraceContextPropagator::new().extract(&fields);
        // Fails only when no OpenTelemetry layer is installed: then there
        // is nothing to parent.
        let _ = span.set_parent(parent);
    }
    span
}

/// The trace context one source (`_meta` or the headers) carries: its
/// `traceparent` when it has the one valid length, with its `tracestate`
/// when that is within bounds.
fn context_fields<'a>(field: impl Fn(&str) -> Option<&'a str>) -> Option<HashMap<String, String>> {
    let parent = field("traceparent").filter(|v| v.len() == TRACEPARENT_LEN)?;
    let mut fields = HashMap::from([("traceparent".to_string(), parent.to_string())]);
    if let Some(state) = field("tracestate").filter(|v| v.len() <= MAX_TRACESTATE) {
        fields.insert("tracestate".to_string(), state.to_string());
    }
    Some(fields)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_urls_and_traces_go_to_their_path() {
        let mut c = TelemetryConfig::default();
        assert!(c.validate().is_ok());
        for bad in ["collector:4318", "http://", "ftp://x", "http://a b"] {
            c.otlp_endpoint = Some(bad.into());
            assert!(matches!(c.validate(), Err(TelemetryError::Endpoint(_))), "{bad}");
        }
        c.otlp_endpoint = Some("http://collector:4318".into());
        assert!(c.validate().is_ok());
        assert_eq!(traces_url("http://c:4318/"), "http://c:4318/v1/traces");
        assert_eq!(traces_url("http://c:4318/v1/traces"), "http://c:4318/v1/traces");
        c.service_name = String::new();
        assert!(matches!(c.validate(), Err(TelemetryError::ServiceName)));
    }

    #[test]
    fn only_a_traceparent_of_its_length_and_a_bounded_tracestate_are_read() {
        let parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        let from = |p: &'static str, s: &'static str| {
            move |name: &str| match name {
                "traceparent" => Some(p),
                _ => Some(s),
            }
        };
        let read = context_fields(from(parent, "a=1")).unwrap();
        assert_eq!(read["traceparent"], parent);
        assert_eq!(read["tracestate"], "a=1");
        let long_state: &'static str = Box::leak("a=1,".repeat(200).into_boxed_str());
        assert!(!context_fields(from(parent, long_state))
            .unwrap()
            .contains_key("tracestate"));
        let long_parent: &'static str = Box::leak(format!("{parent}-00").into_boxed_str());
        assert!(context_fields(from(long_parent, "a=1")).is_none());
        assert!(context_fields(|_| None).is_none());
    }
}
