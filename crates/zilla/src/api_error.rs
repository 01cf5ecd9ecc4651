//! api_error: the admin API's error value (HTTP status + one clipped line), shared by
//! the daemon's handlers and the HTTP serving layer, so neither imports the other.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;

use crate::api::ErrorBody;

/// An API error: HTTP status plus a one-line message.
#[derive(Debug)]
pub struct ApiError(pub StatusCode, pub String);

impl ApiError {
    pub fn bad(msg: impl Into<String>) -> Self {
        ApiError(StatusCode::BAD_REQUEST, msg.into())
    }
    pub fn not_found(msg: impl Into<String>) -> Self {
        ApiError(StatusCode::NOT_FOUND, msg.into())
    }
}

impl From<zilla_core::Error> for ApiError {
    fn from(e: zilla_core::Error) -> Self {
        use zilla_core::Error as E;
        let status = match &e {
            E::InvalidArgument(_) => StatusCode::BAD_REQUEST,
            E::NotFound(_) => StatusCode::NOT_FOUND,
            E::Exists(_) | E::Busy(_) => StatusCode::CONFLICT,
            E::ReadOnly(_) => StatusCode::FORBIDDEN,
            E::NoSpace | E::NoSpaceFor(_) => StatusCode::INSUFFICIENT_STORAGE,
            E::Shutdown => StatusCode::SERVICE_UNAVAILABLE,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        ApiError(status, e.to_string())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.0, Json(ErrorBody { error: crate::clip::clip_message(&self.1) })).into_response()
    }
}

/// Run an engine call for pool `pool` on the blocking pool: a broken invariant in it
/// (or in a thread it starts) is recorded as a stop while working for that pool.
pub async fn blocking_for<T: Send + 'static>(
    pool: impl Into<String>,
    f: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    let pool: String = pool.into();
    blocking(move || {
        let _w = zilla_core::env::WorkingForPool::enter(&pool);
        f()
    })
    .await
}

/// Run an engine call on the blocking pool. (A panic stops the daemon in the panic hook
/// before it could get here; the 500 remains for embedders without that hook.)
pub async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    match tokio::task::spawn_blocking(f).await {
        Ok(r) => r,
        Err(e) => {
            let msg = match e.try_into_panic() {
                Ok(p) => p
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| p.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "panic".into()),
                Err(e) => e.to_string(),
            };
            tracing::error!("engine call panicked: {msg}");
            Err(ApiError(StatusCode::INTERNAL_SERVER_ERROR, format!("internal error in the storage engine: {msg}")))
        }
    }
}
