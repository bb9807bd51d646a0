//! Traces of tool calls as OpenTelemetry spans, sent over OTLP/HTTP
//! (protobuf) when `[telemetry] otlp_endpoint` is set; without it no layer
//! is installed and nothing is exported.
//!
//! The spans are the `tracing` spans of the two crates: the call
//! (`tools/call`, a child of the client's W3C trace context when the
//! request carries one), the operation (`tool`), the wait in the sandbox's
//! queue (`queued`), the job (`job`), the agent exchange (`agent`), the
//! install (`install`), engine calls (`engine`) and image inlining
//! (`inline_images`). Their fields are names, ids, sizes and outcomes:
//! spans never carry code, output or keys, and log events are not exported
//! (they may quote a sandbox's own words).

use std::collections::HashMap;

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;
use rmcp::service::RequestContext;
use rmcp::RoleServer;
use serde::Deserialize;
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::filter::{filter_fn, Targets};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

/// The crates whose spans are exported (not the HTTP or MCP libraries').
const TRACED: [&str; 2] = ["mcp_sandbox", "sandbox_actors"];
/// The W3C trace-context fields read from a request's `_meta` or headers.
const CONTEXT_FIELDS: [&str; 2] = ["traceparent", "tracestate"];
/// Longest field read: a `traceparent` is 55 characters, a `tracestate` at
/// most 32 members of 256 (W3C Trace Context); longer values are ignored.
const MAX_FIELD: usize = 8192;
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

    /// Where spans are posted.
    fn traces_url(&self, base: &str) -> String {
        let base = base.trim_end_matches('/');
        match base.ends_with(TRACES_PATH) {
            true => base.to_string(),
            false => format!("{base}{TRACES_PATH}"),
        }
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
        .with_endpoint(config.traces_url(base))
        .with_timeout(std::time::Duration::from_secs(10))
        .build()?;
    let provider = SdkTracerProvider::builder()
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

/// The span of one MCP tool call: a child of the caller's trace when the
/// request's `_meta` (or, over HTTP, its headers) carries a W3C
/// `traceparent`; a root otherwise.
pub fn call_span(tool: &str, ctx: &RequestContext<RoleServer>) -> Span {
    let span = tracing::info_span!("tools/call", tool, rpc.system = "mcp");
    let mut fields: HashMap<String, String> = HashMap::new();
    for name in CONTEXT_FIELDS {
        let from_meta = ctx.meta.get(name).and_then(|v| v.as_str());
        let from_headers = || {
            ctx.extensions
                .get::<axum::http::request::Parts>()
                .and_then(|parts| parts.headers.get(name))
                .and_then(|v| v.to_str().ok())
        };
        if let Some(value) = from_meta.or_else(from_headers).filter(|v| v.len() <= MAX_FIELD) {
            fields.insert(name.to_string(), value.to_string());
        }
    }
    if fields.contains_key("traceparent") {
        let parent = TraceContextPropagator::new().extract(&fields);
        // Fails only when no OpenTelemetry layer is installed: then there
        // is nothing to parent.
        let _ = span.set_parent(parent);
    }
    span
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
        assert_eq!(c.traces_url("http://c:4318/"), "http://c:4318/v1/traces");
        assert_eq!(c.traces_url("http://c:4318/v1/traces"), "http://c:4318/v1/traces");
        c.service_name = String::new();
        assert!(matches!(c.validate(), Err(TelemetryError::ServiceName)));
    }
}
