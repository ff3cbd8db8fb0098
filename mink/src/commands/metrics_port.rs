//! The metrics port (`--metrics-listen HOST:PORT`, `docs/operations.md`) of a server or a
//! worker: `/metrics` in Prometheus' text format, and on a server the status page at `/`
//! with the figures it draws at `/status.json`.
//!
//! ```text
//!  Prometheus ──GET /metrics──▶ mink_metrics::encode(counters, histograms
//!                                 + the node's bucket gauges + Kafka group lag, read now)
//!  a browser  ──GET /─────────▶ status.html ──every 2 s──▶ GET /status.json[?since=MS]
//!                                 (nodes, tables and buckets now, and the last hour's
//!                                  samples the port takes every 10 s: `status`)
//! ```
//!
//! It is an HTTP port like the Iceberg REST catalog ([`mink_auth::serve_http`]: the
//! connection limit, TLS with the server's certificate, loopback only without a login).
//! With a login every request carries it as HTTP basic auth, which Prometheus' scrape
//! config (`basic_auth`) and browsers send.

mod status;

use std::sync::Arc;

use axum::Router;
use axum::extract::{Query, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{Html, IntoResponse, Json, Response};
use axum::routing::get;
use mink_auth::{Credentials, ListenerHandle, Port, TlsIdentity};
use mink_kafka::GroupLag;
use mink_node::Node;
use tokio::net::TcpListener;

use crate::error::CliError;
use status::History;

/// The status page: one self-contained file, no build step, no external fetches.
const STATUS_PAGE: &str = include_str!("metrics_port/status.html");

/// What a scrape reads besides the process's counters.
#[derive(Debug, Clone, Default)]
pub(crate) struct Sources {
    /// A server's node and the address of its node port: its bucket gauges, and the
    /// status page.
    pub(crate) node: Option<(Arc<Node>, String)>,
    /// A server's Kafka listener: consumer group lag.
    pub(crate) kafka: Option<GroupLag>,
}

/// How the port is served: the server's login and TLS, and its connection limit.
#[derive(Debug)]
pub(crate) struct MetricsOptions {
    pub(crate) credentials: Option<Credentials>,
    pub(crate) tls: Option<TlsIdentity>,
    pub(crate) max_connections: usize,
}

/// A running metrics port; dropping it stops the port and its sampling.
#[derive(Debug)]
pub(crate) struct MetricsPort {
    listener: ListenerHandle,
    _sampling: Option<status::Sampling>,
}

impl MetricsPort {
    /// The address the port is bound to.
    pub(crate) fn addr(&self) -> std::net::SocketAddr {
        self.listener.addr()
    }
}

#[derive(Debug, Clone)]
struct PortState {
    sources: Sources,
    history: Arc<History>,
    credentials: Option<Credentials>,
}

/// Serves the metrics port on `listen`.
///
/// # Errors
/// The address cannot be bound, is not loopback without a login, or the TLS identity
/// does not load.
pub(crate) async fn serve(
    listen: &str,
    options: MetricsOptions,
    sources: Sources,
) -> Result<MetricsPort, CliError> {
    let listener = TcpListener::bind(listen)
        .await
        .map_err(CliError::io(format!("cannot listen on {listen}")))?;
    let history = Arc::new(History::default());
    let sampling = (sources.node.as_ref())
        .map(|(node, _)| status::sample(Arc::clone(node), Arc::clone(&history)));
    let state = PortState {
        sources,
        history,
        credentials: options.credentials.clone(),
    };
    let listener = mink_auth::serve_http(
        Port::Metrics,
        listener,
        options.credentials.as_ref(),
        options.tls.as_ref(),
        options.max_connections,
        router(state),
    )
    .map_err(CliError::Usage)?;
    Ok(MetricsPort {
        listener,
        _sampling: sampling,
    })
}

fn router(state: PortState) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/", get(status_page))
        .route("/status.json", get(status_json))
        .layer(middleware::from_fn_with_state(state.clone(), check_login))
        .with_state(state)
}

/// Every request carries the server's login as HTTP basic auth, when it has one.
async fn check_login(State(state): State<PortState>, request: Request, next: Next) -> Response {
    let Some(expected) = &state.credentials else {
        return next.run(request).await;
    };
    let given = (request.headers().get(header::AUTHORIZATION))
        .and_then(|value| value.to_str().ok())
        .and_then(mink_auth::basic_credentials);
    if given.is_some_and(|given| expected.accepts(&given)) {
        return next.run(request).await;
    }
    let challenge = [(header::WWW_AUTHENTICATE, "Basic realm=\"mink\"")];
    (
        StatusCode::UNAUTHORIZED,
        challenge,
        "this port requires the server's user and password\n",
    )
        .into_response()
}

async fn metrics(State(state): State<PortState>) -> Response {
    let mut scraped = Vec::new();
    if let Some(kafka) = &state.sources.kafka {
        scraped.push(kafka.scraped_metrics().await);
    }
    // Off the runtime's workers: the node's metadata may be etcd's (a round trip per
    // table), and a node of many buckets takes milliseconds to encode, which writes
    // would otherwise wait behind.
    let node = state
        .sources
        .node
        .as_ref()
        .map(|(node, _)| Arc::clone(node));
    let text = tokio::task::spawn_blocking(move || {
        if let Some(node) = node {
            scraped.extend(node.scraped_metrics());
        }
        mink_metrics::encode(scraped)
    })
    .await;
    match text {
        Ok(text) => ([(header::CONTENT_TYPE, mink_metrics::CONTENT_TYPE)], text).into_response(),
        Err(error) => (StatusCode::INTERNAL_SERVER_ERROR, error.to_string()).into_response(),
    }
}

async fn status_page(State(state): State<PortState>) -> Response {
    if state.sources.node.is_none() {
        return (
            StatusCode::NOT_FOUND,
            "a worker has no status page: see /metrics\n",
        )
            .into_response();
    }
    Html(STATUS_PAGE).into_response()
}

/// `/status.json?since=MS`: the history's samples after `since` only (the page asks for
/// the new ones after its first poll).
#[derive(Debug, serde::Deserialize)]
struct StatusQuery {
    since: Option<i64>,
}

async fn status_json(State(state): State<PortState>, Query(query): Query<StatusQuery>) -> Response {
    let Some((node, address)) = &state.sources.node else {
        return (StatusCode::NOT_FOUND, "a worker has no status\n").into_response();
    };
    let since = query.since.unwrap_or(i64::MIN);
    Json(status::now(node, address, &state.history, since).await).into_response()
}
