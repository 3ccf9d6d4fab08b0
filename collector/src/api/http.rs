//! The HTTP API (SPEC §11): a thin translation onto the control protocol.
//!
//! Every route turns its request into a [`Request`] of the control
//! protocol and sends it, as an [`AdminCommand`], over the same channel the
//! control socket uses, so the core answers both ([`crate::core::admin`])
//! and stays the one owner of the state; nothing here binds or releases.
//! The one exception is a `select` that names no leg and changes nothing:
//! it is drawn here, on the HTTP thread, from the copy of the core the loop
//! publishes ([`crate::api::read_only`]), and only asked of the core when
//! that copy chooses no MSR.
//!
//! | route | control request | 200 body |
//! |---|---|---|
//! | `GET /v1/select?zone=&site=[&msr=][&call_id=][&leg=][&conference=][&random=][&explain=]` | `select` | the `data` object of the answer (`kind` `selected`) |
//! | `POST /v1/release` `{"call_id":…,"leg":…}` | `release` | `kind` `released` |
//! | `GET /v1/resources` | `resource_list` | `kind` `resources` |
//! | `GET /health` | `resource_list` | `{"status":"ready",…}`, or 503 |
//! | `GET /metrics` | `resource_list`, `msr_list`, `cluster_list` | OpenMetrics or Prometheus text, by `Accept` ([`crate::api::metrics`]) |
//!
//! Errors are `{"code":…,"message":…}` with the status of [`status_of`].
//!
//! Limits ([`ServeLimits`]): at most [`MAX_CONNECTIONS`] connections at
//! once (one more gets `503` and is closed), and a connection that does not
//! send a whole request head within [`HEADER_TIMEOUT`] — after it opens,
//! or after the previous response — is closed. So neither idle keep-alive
//! clients nor a slowloris (headers sent a byte at a time) can use up the
//! collector's file descriptors or tasks.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{to_bytes, Body};
use axum::extract::{DefaultBodyLimit, RawQuery, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response as HttpResponse};
use axum::routing::{get, post};
use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use msr_shared::admin::{
    ErrorCode, HealthState, RegistrationStatus, Request, Response, ResponseData, SelectQuery,
};
use serde::Deserialize;
use subtle::ConstantTimeEq;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::api::control::AdminCommand;
use crate::api::metrics::{self, IngestCounts, Metrics, ProcessStats, Snapshot};
use crate::api::read_only::ReadOnly;
use crate::core::snapshot::Published;
use crate::daemon::IngestStats;

/// The longest request body read (`POST /v1/release`); longer gets 400.
pub const MAX_BODY_BYTES: usize = 64 * 1024;

/// How long a request body may take to arrive (a client sending it a byte
/// at a time, or never after `Expect: 100-continue`, would otherwise hold
/// its connection for good); later gets 408.
pub const BODY_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a request waits for the shell's answer before it gets 503
/// `unavailable` (the loop is stuck or shutting down).
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);

/// The most HTTP connections served at once (see the module docs).
pub const MAX_CONNECTIONS: usize = 512;

/// The largest request head (request line and headers) read, bytes: every
/// route's head fits in a few hundred, and a client sending more holds that
/// much of the collector's memory per connection; longer gets `431`.
/// hyper buffers at most this much (its floor is 8 KiB).
pub const MAX_HEAD_BYTES: usize = 16 * 1024;

/// How long a connection may take to send a complete request head, counted
/// from its accept and again from each response (so it bounds idle
/// keep-alive connections too).
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// The limits [`serve_with`] applies; [`serve`] uses the defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServeLimits {
    /// Connections served at once.
    pub max_connections: usize,
    /// Longest wait for a complete request head.
    pub header_timeout: Duration,
}

impl Default for ServeLimits {
    fn default() -> Self {
        Self {
            max_connections: MAX_CONNECTIONS,
            header_timeout: HEADER_TIMEOUT,
        }
    }
}

/// What every route needs.
#[derive(Clone)]
struct Api {
    tx: mpsc::Sender<AdminCommand>,
    /// The selections answered here (`read_only`).
    read_only: ReadOnly,
    metrics: Arc<Metrics>,
    ingest: Arc<IngestStats>,
}

/// `GET /v1/legs` query parameters: the `leg_list` op's fields.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct LegParams {
    msr: Option<String>,
    /// Read as text and parsed here, as `random` of [`SelectParams`].
    older_than: Option<String>,
    limit: Option<String>,
}

/// `GET /v1/select` query parameters: the `select` op's fields.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SelectParams {
    /// Absent: `[defaults]`, decided by the core ([`SelectQuery::zone`]).
    #[serde(default)]
    zone: String,
    #[serde(default)]
    site: String,
    msr: Option<String>,
    call_id: Option<String>,
    leg: Option<String>,
    conference: Option<String>,
    /// Read as text and parsed here, so a bad value's error names the
    /// parameter (serde_urlencoded's says only "invalid digit").
    random: Option<String>,
    explain: Option<String>,
    /// Failover (SPEC §14): the MSRs that failed this leg, comma-separated.
    failed: Option<String>,
    /// Why the last of them failed: `timeout`, a SIP status, `error`,
    /// `load-limit`.
    failure: Option<String>,
    /// The offer's codecs (SPEC §15), comma-separated: `pcma,g729,h264`.
    codecs: Option<String>,
}

/// `POST /v1/release` body: the `release` op's fields.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReleaseBody {
    call_id: String,
    #[serde(default)]
    leg: Option<String>,
}

/// The HTTP status of a control-protocol error code:
///
/// * 400: `bad_request`, `invalid_value`, `unknown_site`, `bad_event` (the
///   request is wrong: fix it, do not retry);
/// * 409: `site_exists`, `site_in_use`, `conflict`, `leg_released` (the
///   leg's release overtook its select, SPEC §9: nothing was placed and
///   nothing should be), `no_capable_msr` (no MSR takes the offer, SPEC
///   §15: the same offer will not do better; the redirect answers 488);
/// * 503: `msr_not_found`, `msr_overloaded`, `msr_unhealthy`,
///   `msr_unavailable`, `unavailable`, `store_unavailable` (no MSR can
///   take the leg now, or
///   the collector cannot answer: take the core's fallback);
/// * 500: `store_failed` and codes this build does not know.
pub fn status_of(code: ErrorCode) -> StatusCode {
    match code {
        ErrorCode::BadRequest
        | ErrorCode::InvalidValue
        | ErrorCode::UnknownSite
        | ErrorCode::BadEvent => StatusCode::BAD_REQUEST,
        ErrorCode::SiteExists
        | ErrorCode::SiteInUse
        | ErrorCode::Conflict
        | ErrorCode::LegReleased
        | ErrorCode::NoCapableMsr => StatusCode::CONFLICT,
        ErrorCode::MsrNotFound
        | ErrorCode::MsrOverloaded
        | ErrorCode::MsrUnhealthy
        | ErrorCode::MsrUnavailable
        | ErrorCode::Unavailable
        | ErrorCode::StoreUnavailable => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// An error answer: `{"code":…,"message":…}`.
/// The `code` of an HTTP error body: the control protocol's codes, which
/// the API shares, and the four that only HTTP has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HttpErrorCode {
    Control(ErrorCode),
    /// 401: `[http] token` is set and the request lacks it.
    Unauthorized,
    /// 408: the body did not arrive in time.
    RequestTimeout,
    /// 404: no such route.
    NotFound,
    /// 405: the route exists, the method does not.
    MethodNotAllowed,
}

impl HttpErrorCode {
    fn as_str(self) -> &'static str {
        match self {
            HttpErrorCode::Control(code) => code.as_str(),
            HttpErrorCode::Unauthorized => "unauthorized",
            HttpErrorCode::RequestTimeout => "request_timeout",
            HttpErrorCode::NotFound => "not_found",
            HttpErrorCode::MethodNotAllowed => "method_not_allowed",
        }
    }
}

impl From<ErrorCode> for HttpErrorCode {
    fn from(code: ErrorCode) -> Self {
        HttpErrorCode::Control(code)
    }
}

fn error(
    status: StatusCode,
    code: impl Into<HttpErrorCode>,
    message: impl Into<String>,
) -> HttpResponse {
    let body = serde_json::json!({ "code": code.into().as_str(), "message": message.into() });
    (status, json_headers(), body.to_string()).into_response()
}

fn json_headers() -> [(header::HeaderName, HeaderValue); 1] {
    [(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    )]
}

/// The HTTP form of a control answer: 200 with its `data`, or the error
/// with [`status_of`] its code.
fn reply(response: &Response) -> HttpResponse {
    match response {
        Response::Ok(data) => match serde_json::to_string(data) {
            Ok(text) => (StatusCode::OK, json_headers(), text).into_response(),
            Err(e) => error(
                StatusCode::INTERNAL_SERVER_ERROR,
                ErrorCode::Unavailable,
                format!("answer could not be encoded: {e}"),
            ),
        },
        Response::Err(body) => match serde_json::to_string(body) {
            Ok(text) => (status_of(body.code), json_headers(), text).into_response(),
            Err(e) => error(
                StatusCode::INTERNAL_SERVER_ERROR,
                ErrorCode::Unavailable,
                format!("answer could not be encoded: {e}"),
            ),
        },
    }
}

impl Api {
    /// Sends `request` to the shell, for the core, and waits for its answer.
    /// The timeout covers the wait for a place in the loop's queue too:
    /// under a flood of other requests the answer is a prompt 503, not a
    /// late one.
    async fn ask(&self, request: Request) -> Response {
        let asked = async {
            let (reply, answer) = oneshot::channel();
            let command = AdminCommand {
                request,
                reply,
                origin: crate::core::admin::Origin::Http,
            };
            if self.tx.send(command).await.is_err() {
                return Response::error(ErrorCode::Unavailable, "collector is shutting down");
            }
            answer.await.unwrap_or_else(|_| {
                Response::error(ErrorCode::Unavailable, "collector dropped the request")
            })
        };
        match tokio::time::timeout(ANSWER_TIMEOUT, asked).await {
            Ok(response) => response,
            Err(_) => Response::error(
                ErrorCode::Unavailable,
                format!(
                    "collector did not answer within {} s",
                    ANSWER_TIMEOUT.as_secs()
                ),
            ),
        }
    }
}

/// Every request, whatever its route, passes here first (an axum layer):
/// with `[http] token` set, one without `Authorization: Bearer <token>`
/// gets the 401 (RFC 6750 §3) before anything else is looked at — an
/// unknown route included.
async fn require_token(
    State(token): State<Option<Arc<str>>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> HttpResponse {
    let Some(token) = token.as_deref() else {
        return next.run(request).await;
    };
    let given = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer_credentials);
    // Constant time: the time taken does not tell how much of a guess is right.
    if given.is_some_and(|g| bool::from(g.as_bytes().ct_eq(token.as_bytes()))) {
        return next.run(request).await;
    }
    let mut response = error(
        StatusCode::UNAUTHORIZED,
        HttpErrorCode::Unauthorized,
        "this api needs `Authorization: Bearer <http.token>`",
    );
    response.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static("Bearer realm=\"msr-collector\""),
    );
    response
}

/// The token of an `Authorization: Bearer <token>` value; the scheme's
/// name is case-insensitive (RFC 9110 §11.1).
fn bearer_credentials(value: &str) -> Option<&str> {
    let (scheme, token) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then_some(token)
}

/// The message of the 400 answer to a query parameter whose value does not
/// parse: the parameter, the value as sent (printable, cut) and what it
/// takes, e.g. `invalid query string: limit=ten: expected a whole number
/// of legs, 1 to 10000`; serde_urlencoded's own says only "invalid digit found
/// in string".
fn bad_parameter(name: &str, value: &str, expected: &str) -> String {
    format!(
        "invalid query string: {name}={}: expected {expected}",
        msr_shared::logging::printable(value, 40)
    )
}

/// A whole-number query parameter, or the message of [`bad_parameter`]
/// with what it takes.
fn whole_number<T: std::str::FromStr>(
    name: &str,
    value: Option<&str>,
    expected: &str,
) -> Result<Option<T>, String> {
    value
        .map(|text| {
            text.trim()
                .parse::<T>()
                .map_err(|_| bad_parameter(name, text, expected))
        })
        .transpose()
}

/// Reads the query string of `GET /v1/select` into a `select` request.
///
/// # Errors
/// The message of the 400 answer: a missing, unknown, repeated or
/// ill-typed parameter.
fn select_request(query: Option<&str>) -> Result<Request, String> {
    let params: SelectParams = serde_urlencoded::from_str(query.unwrap_or(""))
        .map_err(|e| format!("invalid query string: {e}"))?;
    // Percent-decoding replaces bytes that are not UTF-8 with U+FFFD: such
    // a name is not one the collector could hold (SPEC §6's names are
    // printable), and "no such zone" would hide the client's bug.
    let names = [&params.zone, &params.site].into_iter().chain(
        [
            &params.msr,
            &params.call_id,
            &params.leg,
            &params.conference,
            &params.failed,
            &params.failure,
            &params.codecs,
        ]
        .into_iter()
        .flatten(),
    );
    if names.into_iter().any(|n| n.contains('\u{FFFD}')) {
        return Err("invalid query string: a value is not UTF-8 once percent-decoded".into());
    }
    let random = match params.random.as_deref() {
        None => None,
        Some(text) => Some(
            text.trim()
                .parse::<f64>()
                .ok()
                .filter(|r| r.is_finite())
                .ok_or_else(|| bad_parameter("random", text, "a finite number"))?,
        ),
    };
    let explain = match params.explain.as_deref() {
        None | Some("false") => false,
        Some("true") => true,
        Some(other) => return Err(bad_parameter("explain", other, "true or false")),
    };
    if params.call_id.is_none() && (params.leg.is_some() || params.conference.is_some()) {
        return Err("leg and conference name a leg: they need call_id".into());
    }
    Ok(Request::Select(SelectQuery {
        zone: params.zone,
        site: params.site,
        msr: params.msr,
        random,
        explain,
        call_id: params.call_id,
        leg: params.leg,
        conference: params.conference,
        failed: params
            .failed
            .as_deref()
            .map(|list| list.split(',').map(|m| m.trim().to_owned()).collect())
            .unwrap_or_default(),
        failure: params.failure,
        codecs: params
            .codecs
            .as_deref()
            .map(|list| {
                list.split(',')
                    .map(str::trim)
                    .filter(|c| !c.is_empty())
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default(),
    }))
}

async fn select(State(api): State<Api>, RawQuery(query): RawQuery) -> HttpResponse {
    match select_request(query.as_deref()) {
        Ok(request) => match api.read_only.answer(&request) {
            Some(response) => reply(&response),
            None => reply(&api.ask(request).await),
        },
        Err(message) => error(StatusCode::BAD_REQUEST, ErrorCode::BadRequest, message),
    }
}

async fn release(State(api): State<Api>, RawQuery(query): RawQuery, body: Body) -> HttpResponse {
    if query.is_some_and(|q| !q.is_empty()) {
        return error(
            StatusCode::BAD_REQUEST,
            ErrorCode::BadRequest,
            "POST /v1/release takes no query string: send {\"call_id\":…,\"leg\":…} as the body",
        );
    }
    let body = match tokio::time::timeout(BODY_TIMEOUT, to_bytes(body, MAX_BODY_BYTES)).await {
        Ok(Ok(body)) => body,
        Ok(Err(e)) => {
            return error(
                StatusCode::BAD_REQUEST,
                ErrorCode::BadRequest,
                format!("cannot read the body (at most {MAX_BODY_BYTES} bytes): {e}"),
            )
        }
        Err(_) => {
            return error(
                StatusCode::REQUEST_TIMEOUT,
                HttpErrorCode::RequestTimeout,
                format!(
                    "the body did not arrive within {} s",
                    BODY_TIMEOUT.as_secs()
                ),
            )
        }
    };
    // serde reads a struct from an array too (`["c1"]`): the body is an
    // object, as the documentation says, or it is refused.
    let parsed = if body.trim_ascii_start().starts_with(b"{") {
        serde_json::from_slice::<ReleaseBody>(&body).map_err(|e| e.to_string())
    } else {
        Err("not a JSON object".to_owned())
    };
    match parsed {
        Ok(ReleaseBody { call_id, leg }) => {
            reply(&api.ask(Request::Release { call_id, leg }).await)
        }
        Err(e) => error(
            StatusCode::BAD_REQUEST,
            ErrorCode::BadRequest,
            format!("invalid body, expected {{\"call_id\":…,\"leg\":…}}: {e}"),
        ),
    }
}

/// `GET /v1/legs[?msr=M][&older_than=SECS][&limit=N]`: the live legs
/// (SPEC §9), as `leg_list` answers them.
async fn legs(State(api): State<Api>, RawQuery(query): RawQuery) -> HttpResponse {
    match legs_request(query.as_deref()) {
        Ok(request) => reply(&api.ask(request).await),
        Err(message) => error(StatusCode::BAD_REQUEST, ErrorCode::BadRequest, message),
    }
}

/// Reads the query string of `GET /v1/legs` into a `leg_list` request.
///
/// # Errors
/// The message of the 400 answer: an unknown or repeated parameter, or a
/// number that does not parse ([`bad_parameter`]).
fn legs_request(query: Option<&str>) -> Result<Request, String> {
    let params: LegParams = serde_urlencoded::from_str(query.unwrap_or(""))
        .map_err(|e| format!("invalid query string: {e}"))?;
    Ok(Request::LegList {
        msr: params.msr,
        older_than_secs: whole_number(
            "older_than",
            params.older_than.as_deref(),
            "seconds, a whole number 0 or more",
        )?,
        // The range is the `leg_list` op's (checked by the core).
        limit: whole_number(
            "limit",
            params.limit.as_deref(),
            &format!(
                "a whole number of legs, 1 to {}",
                msr_shared::admin::MAX_LEG_LIST_LIMIT
            ),
        )?,
    })
}

/// Refuses a query string on routes that take none.
fn no_query(query: Option<&str>) -> Option<HttpResponse> {
    query.filter(|q| !q.is_empty()).map(|_| {
        error(
            StatusCode::BAD_REQUEST,
            ErrorCode::BadRequest,
            "this route takes no query parameters",
        )
    })
}

async fn resources(State(api): State<Api>, RawQuery(query): RawQuery) -> HttpResponse {
    if let Some(refused) = no_query(query.as_deref()) {
        return refused;
    }
    reply(&api.ask(Request::ResourceList { active_only: false }).await)
}

/// Liveness (the loop answered) and readiness (at least one registered
/// contact is healthy, so a selection can succeed somewhere), with the
/// operator store's state (SPEC §12: with etcd unreachable the collector is
/// still ready, selecting on the last configuration it saw, and says so).
async fn health(State(api): State<Api>, RawQuery(query): RawQuery) -> HttpResponse {
    if let Some(refused) = no_query(query.as_deref()) {
        return refused;
    }
    let store = match api.ask(Request::ClusterList {}).await {
        Response::Ok(ResponseData::Cluster(view)) => Some(view.store),
        _ => None,
    };
    let store_text = store.as_ref().map_or_else(String::new, |s| {
        format!("; store {} {}", s.backend, s.status)
    });
    match api.ask(Request::ResourceList { active_only: false }).await {
        Response::Ok(ResponseData::Resources { rows }) => {
            let mut healthy: Vec<&str> = rows
                .iter()
                .filter(|r| {
                    r.health == HealthState::Healthy && r.status == RegistrationStatus::Registered
                })
                .map(|r| r.msr.as_str())
                .collect();
            healthy.dedup();
            if healthy.is_empty() {
                error(
                    StatusCode::SERVICE_UNAVAILABLE,
                    ErrorCode::MsrNotFound,
                    format!(
                        "live, not ready: no healthy msr ({} contacts known){store_text}",
                        rows.len()
                    ),
                )
            } else {
                let body = serde_json::json!({
                    "status": "ready",
                    "healthy_msrs": healthy.len(),
                    "contacts": rows.len(),
                    "store": store,
                });
                (StatusCode::OK, json_headers(), body.to_string()).into_response()
            }
        }
        other => reply(&other),
    }
}

async fn scrape(
    State(api): State<Api>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> HttpResponse {
    if let Some(refused) = no_query(query.as_deref()) {
        return refused;
    }
    let resources = match api.ask(Request::ResourceList { active_only: false }).await {
        Response::Ok(ResponseData::Resources { rows }) => rows,
        other => return reply(&other),
    };
    let msrs = match api.ask(Request::MsrList {}).await {
        Response::Ok(ResponseData::Msrs { msrs }) => msrs,
        other => return reply(&other),
    };
    // SPEC §13: the store's state and the cluster's size.
    let cluster = match api.ask(Request::ClusterList {}).await {
        Response::Ok(ResponseData::Cluster(view)) => view,
        other => return reply(&other),
    };
    let relaxed = std::sync::atomic::Ordering::Relaxed;
    let ingest = IngestCounts {
        refused: api.ingest.refused.load(relaxed),
        shed: api.ingest.shed.load(relaxed),
        malformed: api.ingest.malformed.load(relaxed),
        oversized: api.ingest.oversized.load(relaxed),
    };
    let text = api.metrics.render(&Snapshot {
        resources: &resources,
        msrs: &msrs,
        cluster: Some(&cluster),
        ingest,
        process: ProcessStats::read(),
    });
    // Content negotiation (metrics module docs): OpenMetrics when asked.
    let openmetrics = headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(metrics::wants_openmetrics);
    let (content_type, text) = if openmetrics {
        (metrics::CONTENT_TYPE, text)
    } else {
        (metrics::TEXT_CONTENT_TYPE, metrics::to_text_format(&text))
    };
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, HeaderValue::from_static(content_type))],
        text,
    )
        .into_response()
}

/// Every route, as the 404 and 405 answers list them (the same as
/// [`router`]'s).
const ROUTES: &str =
    "GET /v1/select, POST /v1/release, GET /v1/resources, GET /v1/legs, GET /health, GET /metrics";

async fn not_found() -> HttpResponse {
    error(
        StatusCode::NOT_FOUND,
        HttpErrorCode::NotFound,
        format!("no such route: {ROUTES}"),
    )
}

async fn head_of_select() -> HttpResponse {
    let mut response = error(
        StatusCode::METHOD_NOT_ALLOWED,
        HttpErrorCode::MethodNotAllowed,
        "HEAD /v1/select is not served: a selection places a leg; use GET",
    );
    response
        .headers_mut()
        .insert(header::ALLOW, HeaderValue::from_static("GET"));
    response
}

async fn method_not_allowed() -> HttpResponse {
    error(
        StatusCode::METHOD_NOT_ALLOWED,
        HttpErrorCode::MethodNotAllowed,
        format!("method not allowed on this route: {ROUTES}"),
    )
}

/// The routes over `tx` (the shell's admin channel).
pub fn router(
    tx: mpsc::Sender<AdminCommand>,
    published: Published,
    metrics: Arc<Metrics>,
    ingest: Arc<IngestStats>,
    token: Option<String>,
) -> Router {
    let token: Option<Arc<str>> = token.map(Arc::from);
    let api = Api {
        tx,
        read_only: ReadOnly {
            published,
            metrics: Arc::clone(&metrics),
        },
        metrics,
        ingest,
    };
    Router::new()
        // HEAD must not change anything (RFC 9110 §9.2.1): axum would serve
        // it with the GET handler, and a select with a call_id places a leg.
        .route("/v1/select", get(select).head(head_of_select))
        .route("/v1/release", post(release))
        .route("/v1/resources", get(resources))
        .route("/v1/legs", get(legs))
        .route("/health", get(health))
        .route("/metrics", get(scrape))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(axum::middleware::from_fn_with_state(token, require_token))
        .with_state(api)
}

/// Serves `router` on `listener` until `shutdown` is cancelled, with the
/// default [`ServeLimits`].
pub async fn serve(listener: TcpListener, router: Router, shutdown: CancellationToken) {
    serve_with(listener, router, shutdown, ServeLimits::default()).await;
}

/// [`serve`] with the given limits: one task per connection, each holding
/// a permit of the connection bound until it ends; on `shutdown` every
/// connection finishes its request in progress and closes.
pub async fn serve_with(
    listener: TcpListener,
    router: Router,
    shutdown: CancellationToken,
    limits: ServeLimits,
) {
    serve_handing(listener, router, shutdown, limits, Vec::new()).await;
}

/// A connection accepted within the bound, handed to a thread that serves
/// it ([`serve_handed`]): the socket, and the permit it holds until it ends.
pub type Handed = (std::net::TcpStream, OwnedSemaphorePermit);

/// [`serve_with`], handing each admitted connection to the next of
/// `servers` in turn (threads running [`serve_handed`]), or serving it on
/// this task's runtime when there are none. Handed in turn, 4 keep-alive
/// clients land 2 and 2 on two threads; threads that each accepted from
/// the socket took them as their wake-ups fell, often all on one.
pub async fn serve_handing(
    listener: TcpListener,
    router: Router,
    shutdown: CancellationToken,
    limits: ServeLimits,
    servers: Vec<mpsc::UnboundedSender<Handed>>,
) {
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    let waiting = Arc::new(Semaphore::new(MAX_WAITING));
    let servers: Arc<[mpsc::UnboundedSender<Handed>]> = servers.into();
    let mut next = 0_usize;
    let mut connections: JoinSet<()> = JoinSet::new();
    let builder = connection_builder(limits);
    loop {
        while connections.try_join_next().is_some() {}
        let accepted = tokio::select! {
            () = shutdown.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(e) => {
                tracing::warn!(cause = %e, "http accept failed");
                // Avoids a hot loop on persistent errors such as EMFILE.
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let server = (!servers.is_empty()).then(|| {
            next = next.wrapping_add(1);
            (Arc::clone(&servers), next % servers.len())
        });
        let serve = Serve {
            builder: builder.clone(),
            router: router.clone(),
            shutdown: shutdown.clone(),
            server,
        };
        match Arc::clone(&permits).try_acquire_owned() {
            Ok(permit) => {
                if let Some(task) = serve.start(stream, permit) {
                    connections.spawn(task);
                }
            }
            // Past the bound: a place freed within the grace still takes
            // it (`control::admit`). The wait runs beside this loop, so a
            // burst past the bound is refused at once, not 100 ms each in
            // turn; at most MAX_WAITING wait, the rest are refused without.
            Err(_) => {
                let waiter = Arc::clone(&waiting).try_acquire_owned().ok();
                let permits = Arc::clone(&permits);
                connections.spawn(async move {
                    let admitted = match waiter {
                        Some(_waiter) => crate::api::control::admit(&permits).await,
                        None => None,
                    };
                    match admitted {
                        Some(permit) => {
                            if let Some(task) = serve.start(stream, permit) {
                                task.await;
                            }
                        }
                        None => refuse(stream, peer, limits).await,
                    }
                });
            }
        }
    }
    connections.shutdown().await;
}

/// How many connections past the bound may wait for a place at once
/// ([`serve_handing`]).
const MAX_WAITING: usize = 64;

/// Where an admitted connection goes: to one of the serving threads, or
/// served by a task here.
struct Serve {
    builder: http1::Builder,
    router: Router,
    shutdown: CancellationToken,
    /// The serving threads and the one whose turn it is.
    server: Option<(Arc<[mpsc::UnboundedSender<Handed>]>, usize)>,
}

impl Serve {
    /// Hands `stream` over, or returns the task that serves it here.
    fn start(
        self,
        stream: tokio::net::TcpStream,
        permit: OwnedSemaphorePermit,
    ) -> Option<impl std::future::Future<Output = ()> + Send + 'static> {
        match self.server {
            Some((servers, turn)) => {
                match stream.into_std() {
                    // A server gone (its thread ended) drops the connection.
                    Ok(stream) => {
                        let _ = servers[turn].send((stream, permit));
                    }
                    Err(e) => tracing::warn!(cause = %e, "http connection not handed over"),
                }
                None
            }
            None => Some(serve_connection(
                &self.builder,
                self.router,
                stream,
                permit,
                self.shutdown,
            )),
        }
    }
}

/// Serves the connections [`serve_handing`] hands over on `handed`, on this
/// task's runtime, until `shutdown` (each finishing its request in
/// progress) or the hand-over ends.
pub async fn serve_handed(
    mut handed: mpsc::UnboundedReceiver<Handed>,
    router: Router,
    shutdown: CancellationToken,
    limits: ServeLimits,
) {
    let builder = connection_builder(limits);
    let mut connections = JoinSet::new();
    loop {
        while connections.try_join_next().is_some() {}
        let (stream, permit) = tokio::select! {
            () = shutdown.cancelled() => break,
            next = handed.recv() => match next {
                Some(next) => next,
                None => break,
            },
        };
        match tokio::net::TcpStream::from_std(stream) {
            Ok(stream) => {
                connections.spawn(serve_connection(
                    &builder,
                    router.clone(),
                    stream,
                    permit,
                    shutdown.clone(),
                ));
            }
            Err(e) => tracing::warn!(cause = %e, "http connection not taken over"),
        }
    }
    connections.shutdown().await;
}

/// hyper's HTTP/1 settings under `limits`.
fn connection_builder(limits: ServeLimits) -> http1::Builder {
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .max_buf_size(MAX_HEAD_BYTES)
        // A client may shut its sending side once its request is out;
        // without this hyper dropped the answer of a request it had
        // carried out, a placed leg among them.
        .half_close(true);
    builder
}

/// One connection served until it ends, or, on `shutdown`, until its
/// request in progress is answered; its `permit` is given back then.
fn serve_connection(
    builder: &http1::Builder,
    router: Router,
    stream: tokio::net::TcpStream,
    permit: OwnedSemaphorePermit,
    shutdown: CancellationToken,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    let service = TowerToHyperService::new(router);
    let connection = builder.serve_connection(TokioIo::new(stream), service);
    async move {
        let mut connection = std::pin::pin!(connection);
        tokio::select! {
            result = connection.as_mut() => {
                if let Err(e) = result {
                    tracing::debug!(cause = %e, "http connection ended");
                }
            }
            () = shutdown.cancelled() => {
                connection.as_mut().graceful_shutdown();
                let _ = connection.await;
            }
        }
        drop(permit);
    }
}

/// Answers a connection past the bound with `503` and closes it, without
/// reading its request (the answer is the same whatever it asked). The
/// warning is rate limited (target [`msr_shared::logging::NETWORK`]): a
/// client may connect in a loop.
async fn refuse(mut stream: tokio::net::TcpStream, peer: SocketAddr, limits: ServeLimits) {
    tracing::warn!(
        target: msr_shared::logging::NETWORK,
        %peer,
        limit = limits.max_connections,
        "http connection refused: too many open"
    );
    let body = serde_json::json!({
        "code": "unavailable",
        "message": format!("too many http connections (at most {})", limits.max_connections),
    })
    .to_string();
    let answer = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
         retry-after: 1\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let _ = tokio::time::timeout(limits.header_timeout, stream.write_all(answer.as_bytes())).await;
}

/// Binds the HTTP listener.
///
/// # Errors
/// The OS error of `bind`.
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

#[cfg(test)]
mod tests;
