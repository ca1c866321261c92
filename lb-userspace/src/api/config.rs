//! The configuration through the API: read it (`GET /v1/config`, JSON in the TOML's shape, or
//! the file's own text), and change services and backends (`PUT`/`DELETE /v1/services/NAME`,
//! `.../backends/IP:PORT`, a batch applied all or none at `POST /v1/config/changes`). Every
//! write takes `If-Match: VERSION` (refused with 412 when the configuration moved on),
//! `If-None-Match: *` (create only) and `?dry_run=true` (validated and diffed, nothing
//! applied). Admin endpoints: they answer with the whole configuration and change it.

use axum::{
    Json, Router,
    body::Bytes,
    extract::{Path, Query, State, rejection::QueryRejection},
    http::{HeaderMap, StatusCode, header},
    response::{IntoResponse, Response},
    routing::{get, post, put},
};
use serde::Deserialize;

use super::{ApiState, RequestError, blocking, error, request_error};
use crate::{config::edit::Change, model::ConfigReply};

/// A change of the configuration asked through the API.
#[derive(Debug, Clone)]
pub struct ChangeRequest {
    pub changes: Vec<Change>,
    /// `If-Match`: the version the change is made to (a change to another is refused).
    pub if_match: Option<String>,
    /// Validate and diff only.
    pub dry_run: bool,
    /// Who asks ("cli", "api", with "token" when one authorized it), for events and status.
    pub who: String,
}

/// The configuration endpoints (behind the admin check).
pub fn routes() -> Router<ApiState> {
    Router::new()
        .route("/v1/config", get(show))
        .route("/v1/config/changes", post(batch))
        .route(
            "/v1/services/{service}",
            put(put_service).delete(delete_service),
        )
        .route(
            "/v1/services/{service}/backends/{backend}",
            put(put_backend).delete(delete_backend),
        )
}

/// The media type of the file's own text.
const TOML: &str = "application/toml";

/// `GET /v1/config`: JSON (`version`, `path`, `config`), or with `Accept: application/toml`
/// the file as it is (comments and all). `lb.api_token` is never shown.
async fn show(State(state): State<ApiState>, headers: HeaderMap) -> Response {
    let toml = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.contains(TOML));
    let answer = blocking(&state, move |c| {
        let (version, path, text) = c.config()?;
        let redacted = crate::config::edit::redacted(&text);
        let etag = [(header::ETAG, version.etag())];
        if toml {
            let kind = [(header::CONTENT_TYPE, "application/toml; charset=utf-8")];
            return Ok((etag, kind, redacted).into_response());
        }
        let table: toml::Table = toml::from_str(&redacted)
            .map_err(|e| RequestError::Failed(anyhow::anyhow!("the running file: {e}")))?;
        let config = serde_json::to_value(table)
            .map_err(|e| RequestError::Failed(anyhow::anyhow!("the running file: {e}")))?;
        let reply = ConfigReply {
            version: version.0,
            path,
            config,
        };
        Ok((etag, Json(reply)).into_response())
    });
    answer.await.unwrap_or_else(request_error)
}

#[derive(Debug, Deserialize)]
struct WriteQuery {
    #[serde(default)]
    dry_run: bool,
}

/// Who asks, from the request's headers.
fn who(headers: &HeaderMap) -> String {
    let cli = headers
        .get(header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ua| ua.starts_with("lb-cli/"));
    let token = headers.contains_key(header::AUTHORIZATION);
    let who = if cli { "cli" } else { "api" };
    if token {
        format!("{who}, token")
    } else {
        who.to_owned()
    }
}

fn header_text(headers: &HeaderMap, name: header::HeaderName) -> Option<String> {
    headers
        .get(name)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
}

/// Parses a JSON body; an empty body is `empty`.
fn json_body<T: serde::de::DeserializeOwned>(
    body: &Bytes,
    empty: Option<T>,
) -> Result<T, RequestError> {
    if body.iter().all(u8::is_ascii_whitespace)
        && let Some(empty) = empty
    {
        return Ok(empty);
    }
    serde_json::from_slice(body).map_err(|e| RequestError::Invalid(vec![format!("body: {e}")]))
}

/// Runs `changes` as the request asks and answers with the result (its ETag: the version now).
async fn write(
    state: ApiState,
    headers: HeaderMap,
    query: Result<Query<WriteQuery>, QueryRejection>,
    changes: Vec<Change>,
) -> Response {
    let Query(q) = match query {
        Ok(q) => q,
        Err(e) => return error(StatusCode::BAD_REQUEST, &e.body_text()),
    };
    let req = ChangeRequest {
        changes,
        if_match: header_text(&headers, header::IF_MATCH),
        dry_run: q.dry_run,
        who: who(&headers),
    };
    match blocking(&state, move |c| c.change(req)).await {
        Ok(reply) => {
            let etag = format!("\"{}\"", reply.version);
            ([(header::ETAG, etag)], Json(reply)).into_response()
        }
        Err(e) => request_error(e),
    }
}

/// `If-None-Match: *`: the request creates, and is refused if the thing exists.
fn create_only(headers: &HeaderMap) -> bool {
    header_text(headers, header::IF_NONE_MATCH).is_some_and(|v| v.trim() == "*")
}

async fn put_service(
    State(state): State<ApiState>,
    Path(service): Path<String>,
    headers: HeaderMap,
    query: Result<Query<WriteQuery>, QueryRejection>,
    body: Bytes,
) -> Response {
    let body = match json_body(&body, None) {
        Ok(b) => b,
        Err(e) => return request_error(e),
    };
    let change = Change::PutService {
        service,
        body,
        create_only: create_only(&headers),
    };
    write(state, headers, query, vec![change]).await
}

async fn delete_service(
    State(state): State<ApiState>,
    Path(service): Path<String>,
    headers: HeaderMap,
    query: Result<Query<WriteQuery>, QueryRejection>,
) -> Response {
    write(
        state,
        headers,
        query,
        vec![Change::DeleteService { service }],
    )
    .await
}

async fn put_backend(
    State(state): State<ApiState>,
    Path((service, backend)): Path<(String, String)>,
    headers: HeaderMap,
    query: Result<Query<WriteQuery>, QueryRejection>,
    body: Bytes,
) -> Response {
    let body = match json_body(&body, Some(serde_json::json!({}))) {
        Ok(b) => b,
        Err(e) => return request_error(e),
    };
    let change = Change::PutBackend {
        service,
        backend,
        body,
        create_only: create_only(&headers),
    };
    write(state, headers, query, vec![change]).await
}

async fn delete_backend(
    State(state): State<ApiState>,
    Path((service, backend)): Path<(String, String)>,
    headers: HeaderMap,
    query: Result<Query<WriteQuery>, QueryRejection>,
) -> Response {
    let change = Change::DeleteBackend { service, backend };
    write(state, headers, query, vec![change]).await
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Batch {
    changes: Vec<Change>,
}

/// `POST /v1/config/changes` with `{"changes": [...]}`: every change, or none.
async fn batch(
    State(state): State<ApiState>,
    headers: HeaderMap,
    query: Result<Query<WriteQuery>, QueryRejection>,
    body: Bytes,
) -> Response {
    let batch: Batch = match json_body(&body, None) {
        Ok(b) => b,
        Err(e) => return request_error(e),
    };
    if batch.changes.is_empty() {
        return error(StatusCode::BAD_REQUEST, "changes: at least one change");
    }
    write(state, headers, query, batch.changes).await
}
