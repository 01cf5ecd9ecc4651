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
