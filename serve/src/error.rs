//! Errors as OpenAI's API returns them: an HTTP status and `{"error": {message, type, param, code}}`.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

#[derive(Clone, Debug, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// OpenAI's `type`: `invalid_request_error`, `rate_limit_error`, …
    pub kind: &'static str,
    /// The request field at fault, if one is.
    pub param: Option<String>,
    pub code: Option<&'static str>,
}

impl ApiError {
    /// A `400`: the request is malformed or asks for something the server cannot do.
    pub fn invalid(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: None,
            code: None,
        }
    }

    /// A `400` about field `param`.
    pub fn param(param: &str, message: impl Into<String>) -> ApiError {
        ApiError { param: Some(param.into()), ..ApiError::invalid(message) }
    }

    /// A field asking for something this server does not do: refused rather than ignored.
    pub fn unsupported(param: &str, what: &str) -> ApiError {
        ApiError::param(param, format!("`{param}`: {what} is not supported by this server"))
    }

    pub fn with_code(self, code: &'static str) -> ApiError {
        ApiError { code: Some(code), ..self }
    }

    /// A `405`: an endpoint asked with a method it does not take.
    pub fn method_not_allowed() -> ApiError {
        ApiError {
            status: StatusCode::METHOD_NOT_ALLOWED,
            code: Some("method_not_allowed"),
            ..ApiError::invalid(
                "this endpoint does not take that method (completions take POST; models, health and metrics GET)",
            )
        }
    }

    /// The request's body could not be read: too large (`413`), or broken on the wire.
    pub fn unread_body(rejected: axum::extract::rejection::BytesRejection) -> ApiError {
        let message = match rejected.status() {
            StatusCode::PAYLOAD_TOO_LARGE => {
                format!("the body is larger than this server reads ({} MiB)", crate::routes::MAX_BODY_BYTES >> 20)
            }
            _ => rejected.body_text(),
        };
        ApiError { status: rejected.status(), ..ApiError::invalid(message) }
    }

    /// A `429` with `Retry-After`: the queue is full.
    pub fn busy(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::TOO_MANY_REQUESTS,
            message: message.into(),
            kind: "rate_limit_error",
            param: None,
            code: Some("rate_limit_exceeded"),
        }
    }

    pub fn not_found(message: impl Into<String>, code: &'static str) -> ApiError {
        ApiError {
            status: StatusCode::NOT_FOUND,
            kind: "not_found_error",
            code: Some(code),
            ..ApiError::invalid(message)
        }
    }

    /// A `503`: the server is stopping, or its engine has stopped.
    pub fn unavailable(message: impl Into<String>) -> ApiError {
        ApiError { status: StatusCode::SERVICE_UNAVAILABLE, kind: "service_unavailable", ..ApiError::invalid(message) }
    }

    /// A `500`: generation failed.
    pub fn server(message: impl Into<String>) -> ApiError {
        ApiError { status: StatusCode::INTERNAL_SERVER_ERROR, kind: "server_error", ..ApiError::invalid(message) }
    }

    pub fn body(&self) -> serde_json::Value {
        json!({"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}})
    }
}

/// Seconds a client told `429` should wait before trying again.
pub const RETRY_AFTER_SECONDS: u32 = 1;

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, axum::Json(self.body())).into_response();
        if self.status == StatusCode::TOO_MANY_REQUESTS {
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECONDS));
        }
        response
    }
}
