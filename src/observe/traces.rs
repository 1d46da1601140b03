//! Tool calls as OpenTelemetry spans, exported over OTLP/HTTP (JSON) when
//! `[telemetry] otlp_endpoint` is set: guildhall shows up in Jaeger, Tempo or Honeycomb next
//! to the agents' own traces.
//!
//! [`Traces`] follows the runtime's event stream on its own task, as [`super::Metrics`]
//! does: a call's `invoked` event opens its span, the event that ends it (`completed`,
//! `failed`, `denied`) closes it, with the agent, tool, decision and outcome as attributes.
//! Finished spans go out in batches (every second, or at 512) through the official OTLP
//! exporter. Off, nothing subscribes and a call pays nothing; on, a call pays what any
//! event subscriber costs it, and a collector that is slow or down loses spans (counted in
//! the log), never a call.

use std::collections::BTreeMap;

use serde::Deserialize;

/// The `[telemetry]` section.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TelemetryConfig {
    /// An OTLP/HTTP collector (`http://127.0.0.1:4318`; `/v1/traces` is added unless the
    /// URL ends with it). Unset: no traces.
    #[serde(default)]
    pub otlp_endpoint: Option<String>,
    /// Headers sent with every export (an API key, say).
    #[serde(default)]
    pub otlp_headers: BTreeMap<String, String>,
}

/// Why traces could not be started.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TelemetryError {
    /// The endpoint is not an http(s) URL.
    #[error("[telemetry] otlp_endpoint `{0}` is not an http:// or https:// URL")]
    Endpoint(String),
    /// The exporter could not be built.
    #[error("the OTLP exporter could not be built")]
    Exporter(#[source] Box<dyn std::error::Error + Send + Sync>),
}

#[cfg(feature = "otlp")]
pub use exporting::Traces;

#[cfg(feature = "otlp")]
mod exporting {
    use std::borrow::Cow;
    use std::collections::HashMap;
    use std::sync::Arc;
    use std::time::{Duration, SystemTime};

    use super::{TelemetryConfig, TelemetryError};

    /// Spans sent in one export at most.
    const BATCH: usize = 512;
    /// How often finished spans are sent.
    const CADENCE: Duration = Duration::from_secs(1);
    /// Calls open at once that a span is kept for; past it the oldest are dropped.
    const OPEN: usize = 65_536;

    use opentelemetry::trace::{
        SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState,
    };
    use opentelemetry::{InstrumentationScope, KeyValue};
    use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
    use opentelemetry_sdk::Resource;
    use opentelemetry_sdk::trace::{SpanData, SpanEvents, SpanExporter, SpanLinks};
    use tokio::sync::{mpsc, oneshot};
    use tokio_util::sync::{CancellationToken, DropGuard};

    use crate::events::ToolEvent;
    use crate::runtime::Runtime;

    /// Exports a runtime's tool calls as spans while the value lives; dropping it sends
    /// what is finished and stops.
    pub struct Traces {
        flush: mpsc::Sender<oneshot::Sender<()>>,
        _following: DropGuard,
    }

    impl std::fmt::Debug for Traces {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("Traces").finish_non_exhaustive()
        }
    }

    /// Our reqwest client as the exporter's HTTP client (the exporter's own is an older
    /// reqwest).
    #[derive(Debug)]
    struct Client(reqwest::Client);

    #[async_trait::async_trait]
    impl opentelemetry_http::HttpClient for Client {
        async fn send_bytes(
            &self,
            request: opentelemetry_http::Request<opentelemetry_http::Bytes>,
        ) -> Result<
            opentelemetry_http::Response<opentelemetry_http::Bytes>,
            opentelemetry_http::HttpError,
        > {
            let request = reqwest::Request::try_from(request.map(reqwest::Body::from))?;
            let response = self.0.execute(request).await?;
            let status = response.status();
            let body = response.bytes().await?;
            Ok(opentelemetry_http::Response::builder()
                .status(status)
                .body(body)?)
        }
    }

    /// A call whose span is open.
    struct Open {
        tool: Arc<str>,
        agent: Option<Arc<str>>,
        trace: Option<crate::TraceParent>,
        start: SystemTime,
    }

    impl Traces {
        /// Starts exporting `runtime`'s calls as `config` says; `None` when it names no
        /// endpoint. Must be called within a Tokio runtime.
        ///
        /// # Errors
        /// [`TelemetryError`] for an endpoint that is not an http(s) URL, or an exporter
        /// that cannot be built.
        pub fn start(
            runtime: &Runtime,
            config: &TelemetryConfig,
        ) -> Result<Option<Self>, TelemetryError> {
            let Some(endpoint) = config.otlp_endpoint.as_deref() else {
                return Ok(None);
            };
            if !(endpoint.starts_with("http://") || endpoint.starts_with("https://")) {
                return Err(TelemetryError::Endpoint(endpoint.to_owned()));
            }
            let url = if endpoint.trim_end_matches('/').ends_with("/v1/traces") {
                endpoint.to_owned()
            } else {
                format!("{}/v1/traces", endpoint.trim_end_matches('/'))
            };
            #[cfg(feature = "tls")]
            crate::tls::install();
            let client = reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .build()
                .map_err(|e| TelemetryError::Exporter(Box::new(e)))?;
            let headers: HashMap<String, String> = config
                .otlp_headers
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            let mut exporter = opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_protocol(Protocol::HttpJson)
                .with_http_client(Client(client))
                .with_endpoint(url)
                .with_headers(headers)
                .build()
                .map_err(|e| TelemetryError::Exporter(Box::new(e)))?;
            exporter.set_resource(
                &Resource::builder_empty()
                    .with_service_name("guildhall")
                    .build(),
            );
            let stop = CancellationToken::new();
            let (flush, flushes) = mpsc::channel(4);
            tokio::spawn(follow(
                runtime.governance().events(),
                exporter,
                flushes,
                stop.clone(),
            ));
            Ok(Some(Self {
                flush,
                _following: stop.drop_guard(),
            }))
        }

        /// Sends every span finished so far and waits for the export.
        ///
        /// # Cancel safety
        /// Cancel safe: the export goes ahead without the caller.
        pub async fn flush(&self) {
            let (done, exported) = oneshot::channel();
            if self.flush.send(done).await.is_ok() {
                let _ = exported.await;
            }
        }
    }

    async fn follow(
        mut events: crate::EventStream,
        exporter: opentelemetry_otlp::SpanExporter,
        mut flushes: mpsc::Receiver<oneshot::Sender<()>>,
        stop: CancellationToken,
    ) {
        let scope = InstrumentationScope::builder("guildhall")
            .with_version(env!("CARGO_PKG_VERSION"))
            .build();
        let mut open: HashMap<uuid::Uuid, Open> = HashMap::new();
        let mut order: std::collections::VecDeque<uuid::Uuid> = Default::default();
        let mut done: Vec<SpanData> = Vec::new();
        let mut tick = tokio::time::interval(CADENCE);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = stop.cancelled() => break,
                _ = tick.tick() => send(&exporter, &mut done).await,
                flush = flushes.recv() => {
                    // Events already published are taken first, so a flush covers them.
                    while let Ok(Some(event)) =
                        tokio::time::timeout(Duration::ZERO, events.next()).await
                    {
                        take(event, &mut open, &mut order, &mut done, &scope);
                    }
                    send(&exporter, &mut done).await;
                    if let Some(flush) = flush {
                        let _ = flush.send(());
                    }
                }
                event = events.next() => {
                    let Some(event) = event else { break };
                    take(event, &mut open, &mut order, &mut done, &scope);
                    if done.len() >= BATCH {
                        send(&exporter, &mut done).await;
                    }
                }
            }
        }
        send(&exporter, &mut done).await;
    }

    async fn send(exporter: &opentelemetry_otlp::SpanExporter, done: &mut Vec<SpanData>) {
        if done.is_empty() {
            return;
        }
        let spans = std::mem::take(done);
        let n = spans.len();
        if let Err(err) = exporter.export(spans).await {
            tracing::warn!(error = %guildhall_actors::ErrorChain(&err), spans = n, "OTLP export failed; these spans are lost");
        }
    }

    fn take(
        event: ToolEvent,
        open: &mut HashMap<uuid::Uuid, Open>,
        order: &mut std::collections::VecDeque<uuid::Uuid>,
        done: &mut Vec<SpanData>,
        scope: &InstrumentationScope,
    ) {
        let (call_id, outcome, decision, status, error) = match event {
            ToolEvent::Invoked {
                call_id,
                tool,
                agent,
                trace,
            } => {
                if open.len() >= OPEN
                    && let Some(oldest) = order.pop_front()
                {
                    open.remove(&oldest);
                }
                open.insert(
                    call_id,
                    Open {
                        tool,
                        agent,
                        trace,
                        start: SystemTime::now(),
                    },
                );
                order.push_back(call_id);
                // Ids of ended calls linger in `order` until here: keep it near `open`.
                if order.len() > 2 * OPEN {
                    order.retain(|id| open.contains_key(id));
                }
                return;
            }
            ToolEvent::Completed { call_id, .. } => (call_id, "ok", "allow", Status::Ok, None),
            ToolEvent::Failed {
                call_id,
                kind,
                message,
                ..
            } => (call_id, kind, "allow", Status::error(message), Some(kind)),
            ToolEvent::Denied {
                call_id, reason, ..
            } => (
                call_id,
                "denied",
                "deny",
                Status::error(reason),
                Some("denied"),
            ),
            _ => return,
        };
        let Some(call) = open.remove(&call_id) else {
            return;
        };
        // OpenTelemetry's GenAI conventions for a tool's execution, then guildhall's own.
        let mut attributes = vec![
            KeyValue::new("gen_ai.operation.name", "execute_tool"),
            KeyValue::new("gen_ai.tool.name", call.tool.to_string()),
            KeyValue::new("gen_ai.tool.call.id", call_id.to_string()),
            KeyValue::new("gen_ai.tool.type", "function"),
            KeyValue::new("guildhall.tool", call.tool.to_string()),
            KeyValue::new("guildhall.call_id", call_id.to_string()),
            KeyValue::new("guildhall.decision", decision),
            KeyValue::new("guildhall.outcome", outcome),
        ];
        if let Some(agent) = &call.agent {
            attributes.push(KeyValue::new("gen_ai.agent.id", agent.to_string()));
            attributes.push(KeyValue::new("guildhall.agent", agent.to_string()));
        }
        if let Some(error) = error {
            attributes.push(KeyValue::new("error.type", error));
        }
        // In the caller's trace when it named one, under its span, and only if the caller
        // records it (parent-based sampling, OpenTelemetry's default). Otherwise the call id
        // is the trace id, so a span found in the collector names its audit record. The
        // span is the one the call handed on while it ran (`CallContext::span`): a message
        // it sent names it as its parent.
        if call.trace.is_some_and(|parent| !parent.sampled) {
            return;
        }
        let own = crate::TraceParent::of_call(&call_id, call.trace);
        let parent_span_id = call
            .trace
            .map_or(SpanId::INVALID, |parent| SpanId::from_bytes(parent.span_id));
        done.push(SpanData {
            span_context: SpanContext::new(
                TraceId::from_bytes(own.trace_id),
                SpanId::from_bytes(own.span_id),
                TraceFlags::SAMPLED,
                false,
                TraceState::default(),
            ),
            parent_span_id,
            parent_span_is_remote: call.trace.is_some(),
            span_kind: SpanKind::Internal,
            name: Cow::Owned(format!("execute_tool {}", call.tool)),
            start_time: call.start,
            end_time: SystemTime::now(),
            attributes,
            dropped_attributes_count: 0,
            events: SpanEvents::default(),
            links: SpanLinks::default(),
            status,
            instrumentation_scope: scope.clone(),
        });
    }
}
