//! Which web pages may call the server from a browser: CORS, answered as vLLM's and llama.cpp's
//! servers answer it (any origin by default), or for a list of origins, or for none.

use axum::http::HeaderValue;
use tower_http::cors::{AllowHeaders, AllowOrigin, Any, CorsLayer};

#[derive(Clone, Debug, PartialEq)]
pub enum AllowedOrigins {
    Any,
    List(Vec<HeaderValue>),
    /// No CORS headers: browsers keep pages of other origins from reading the replies.
    None,
}

impl AllowedOrigins {
    /// `*`, `none`, or origins separated by commas (`https://example.com,http://localhost:3000`).
    pub fn parse(text: &str) -> Result<AllowedOrigins, String> {
        match text.trim() {
            "*" => return Ok(AllowedOrigins::Any),
            "none" => return Ok(AllowedOrigins::None),
            _ => {}
        }
        let origins = text.split(',').map(str::trim).map(|origin| {
            let scheme = origin.split_once("://").map(|(scheme, _)| scheme);
            match (scheme, HeaderValue::from_str(origin)) {
                (Some("http" | "https"), Ok(value)) if !origin.ends_with('/') => Ok(value),
                _ => Err(format!("expected `*`, `none` or origins like `http://localhost:3000`, found `{origin}`")),
            }
        });
        Ok(AllowedOrigins::List(origins.collect::<Result<_, _>>()?))
    }

    /// The layer that answers preflight requests and marks the replies, if any origin is allowed.
    pub fn layer(&self) -> Option<CorsLayer> {
        // The headers a preflight asks for are echoed, not answered with `*`: the Fetch standard
        // never lets `*` cover `Authorization`, which OpenAI's JavaScript client always sends.
        let layer = CorsLayer::new().allow_methods(Any).allow_headers(AllowHeaders::mirror_request());
        match self {
            AllowedOrigins::Any => Some(layer.allow_origin(Any)),
            AllowedOrigins::List(origins) => Some(layer.allow_origin(AllowOrigin::list(origins.clone()))),
            AllowedOrigins::None => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::AllowedOrigins;

    #[test]
    fn origins_parse_or_are_refused() {
        assert_eq!(AllowedOrigins::parse("*"), Ok(AllowedOrigins::Any));
        assert_eq!(AllowedOrigins::parse("none"), Ok(AllowedOrigins::None));
        let list = AllowedOrigins::parse("https://a.example, http://localhost:3000").unwrap();
        assert!(matches!(&list, AllowedOrigins::List(o) if o.len() == 2), "{list:?}");
        // Each with the entry named as refused.
        let bad = [
            ("", ""),
            ("localhost:3000", "localhost:3000"),
            ("http://a.example/", "http://a.example/"),
            ("ftp://a.example", "ftp://a.example"),
            ("http://a.example,", ""),
        ];
        for (list, entry) in bad {
            let error = AllowedOrigins::parse(list).unwrap_err();
            assert!(error.contains(&format!("found `{entry}`")), "{list}: {error}");
        }
    }
}
