//! The request fields that ask for structured output, as OpenAI's, vLLM's and llama.cpp's servers
//! name them, read into one `Grammar` (`g4c_runtime::constraint`):
//! - OpenAI's `response_format`: `{"type": "json_object"}`, or `{"type": "json_schema",
//!   "json_schema": {"schema": …}}` (`{"type": "text"}` asks for nothing);
//! - vLLM's `structured_outputs` (`json`, `regex`, `choice`, `grammar`, `json_object`) and the older
//!   `guided_json`, `guided_regex`, `guided_choice`, `guided_grammar`;
//! - llama.cpp's `json_schema`, and its `response_format` with the `schema` beside the type.
//!
//! Grammars are in llguidance's Lark syntax, as vLLM's `guidance` backend takes them; GBNF (vLLM's
//! other backends', llama.cpp's `grammar`) is refused by name.

use crate::error::ApiError;
use g4c_runtime::constraint::Grammar;
use serde_json::{json, Value};

/// The grammar `body` (a request object) asks its text to follow, with the field that asked; an
/// error if it asks in more than one field, or in a malformed one.
pub fn requested(body: &Value) -> Result<Option<(&'static str, Grammar)>, ApiError> {
    let mut asked = vec![];
    let given = |field: &str| body.get(field).filter(|v| !v.is_null());
    if let Some(v) = given("response_format") {
        asked.extend(response_format(v)?.map(|g| ("response_format", g)));
    }
    for field in ["guided_json", "json_schema"] {
        if let Some(v) = given(field) {
            asked.push((field, Grammar::JsonSchema(schema(field, v)?)));
        }
    }
    if let Some(v) = given("guided_regex") {
        asked.push(("guided_regex", Grammar::Regex(text("guided_regex", v)?)));
    }
    if let Some(v) = given("guided_choice") {
        asked.push(("guided_choice", Grammar::Choice(choices("guided_choice", v)?)));
    }
    if let Some(v) = given("guided_grammar") {
        asked.push(("guided_grammar", lark("guided_grammar", v)?));
    }
    if let Some(v) = given("structured_outputs") {
        asked.push(("structured_outputs", structured_outputs(v)?));
    }
    match asked.len() {
        0 | 1 => Ok(asked.pop()),
        _ => {
            let fields: Vec<&str> = asked.iter().map(|(f, _)| *f).collect();
            Err(ApiError::param(fields[1], format!("give one structured output, not {}", fields.join(" and "))))
        }
    }
}

/// OpenAI's `response_format`, and llama.cpp's, which may give the schema beside the type.
fn response_format(v: &Value) -> Result<Option<Grammar>, ApiError> {
    let field = "response_format";
    let beside = v.get("schema").filter(|s| !s.is_null());
    match v.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => match beside {
            Some(s) => Ok(Some(Grammar::JsonSchema(schema("response_format.schema", s)?))),
            None => Ok(Some(Grammar::JsonSchema(json!({"type": "object"})))),
        },
        Some("json_schema") => match v.get("json_schema").and_then(|s| s.get("schema")).or(beside) {
            Some(s) => Ok(Some(Grammar::JsonSchema(schema("response_format.json_schema.schema", s)?))),
            None => Err(ApiError::param(field, "`response_format.json_schema.schema` is required")),
        },
        _ => Err(ApiError::param(
            field,
            format!("`response_format`: expected a `type` of \"text\", \"json_object\" or \"json_schema\", found {v}"),
        )),
    }
}

/// vLLM's `structured_outputs`: one of its kinds, and options that ask for no other text.
fn structured_outputs(v: &Value) -> Result<Grammar, ApiError> {
    let field = "structured_outputs";
    let Some(object) = v.as_object() else {
        return Err(ApiError::param(field, format!("`{field}`: expected an object, found {v}")));
    };
    let mut asked = vec![];
    for (key, v) in object.iter().filter(|(_, v)| !v.is_null()) {
        let path = format!("{field}.{key}");
        let grammar = match key.as_str() {
            "json" => Grammar::JsonSchema(schema(&path, v)?),
            "json_object" if v == &Value::Bool(false) => continue,
            "json_object" => Grammar::JsonSchema(json!({"type": "object"})),
            "regex" => Grammar::Regex(text(&path, v)?),
            "choice" => Grammar::Choice(choices(&path, v)?),
            "grammar" => lark(&path, v)?,
            // JSON is written one way here whatever these say; the others pick vLLM's backend.
            "disable_any_whitespace" | "disable_fallback" | "_backend" | "_backend_was_auto" => continue,
            "disable_additional_properties" if v == &Value::Bool(false) => continue,
            _ => return Err(ApiError::param(field, format!("`{path}` is not supported by this server"))),
        };
        asked.push(grammar);
    }
    // As vLLM, which refuses `structured_outputs` that ask for no kind, or for two.
    match asked.len() {
        1 => Ok(asked.remove(0)),
        n => Err(ApiError::param(
            field,
            format!("`{field}`: give one of `json`, `json_object`, `regex`, `choice`, `grammar`, found {n}"),
        )),
    }
}

/// The top-level field of `path` (`structured_outputs.json`), which OpenAI's `param` names.
fn param(path: &str) -> &str {
    path.split('.').next().unwrap_or(path)
}

/// A JSON schema: an object, or (vLLM's `guided_json`) its JSON text.
fn schema(path: &str, v: &Value) -> Result<Value, ApiError> {
    let parsed = match v {
        Value::String(s) => serde_json::from_str(s)
            .map_err(|e| ApiError::param(param(path), format!("`{path}`: the schema is not JSON: {e}")))?,
        v => v.clone(),
    };
    match parsed {
        schema @ (Value::Object(_) | Value::Bool(true)) => Ok(schema),
        other => {
            Err(ApiError::param(param(path), format!("`{path}`: expected a JSON schema (an object), found {other}")))
        }
    }
}

/// A grammar in llguidance's Lark syntax (vLLM's `guidance` backend's); GBNF is refused by name.
fn lark(path: &str, v: &Value) -> Result<Grammar, ApiError> {
    let grammar = text(path, v)?;
    // GBNF's rules read `name ::= …`; a Lark grammar's are `name: …` (`::=` may be in its strings).
    let gbnf_rule = |line: &str| {
        line.split_once("::=").is_some_and(|(name, _)| {
            let name = name.trim();
            !name.is_empty() && name.chars().all(|c| c.is_alphanumeric() || c == '_' || c == '-')
        })
    };
    if grammar.lines().any(gbnf_rule) {
        let message = format!("`{path}`: expected a grammar in Lark syntax (`start: …`); GBNF (`::=`) is not read");
        return Err(ApiError::param(param(path), message));
    }
    Ok(Grammar::Lark(grammar))
}

fn text(path: &str, v: &Value) -> Result<String, ApiError> {
    match v.as_str() {
        Some(s) if !s.is_empty() => Ok(s.to_string()),
        _ => Err(ApiError::param(param(path), format!("`{path}`: expected a non-empty string, found {v}"))),
    }
}

fn choices(path: &str, v: &Value) -> Result<Vec<String>, ApiError> {
    let strings: Option<Vec<String>> =
        v.as_array().and_then(|a| a.iter().map(|c| c.as_str().map(String::from)).collect());
    match strings {
        Some(c) if !c.is_empty() && c.iter().all(|s| !s.is_empty()) => Ok(c),
        _ => Err(ApiError::param(param(path), format!("`{path}`: expected a list of non-empty strings, found {v}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::requested;
    use g4c_runtime::constraint::Grammar;
    use serde_json::json;

    #[test]
    fn each_servers_spelling_reads_as_one_grammar() {
        let object = Grammar::JsonSchema(json!({"type": "object"}));
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        for (body, expected) in [
            (json!({"response_format": {"type": "text"}}), None),
            (json!({"response_format": {"type": "json_object"}}), Some(("response_format", object.clone()))),
            (
                json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}),
                Some(("response_format", Grammar::JsonSchema(schema.clone()))),
            ),
            (json!({"guided_json": schema.to_string()}), Some(("guided_json", Grammar::JsonSchema(schema.clone())))),
            (json!({"json_schema": schema}), Some(("json_schema", Grammar::JsonSchema(schema.clone())))),
            (json!({"guided_regex": "[a-z]+"}), Some(("guided_regex", Grammar::Regex("[a-z]+".into())))),
            (
                json!({"structured_outputs": {"choice": ["yes", "no"], "disable_fallback": true}}),
                Some(("structured_outputs", Grammar::Choice(vec!["yes".into(), "no".into()]))),
            ),
            (json!({"structured_outputs": {"json_object": true}}), Some(("structured_outputs", object.clone()))),
            // llama.cpp's: the schema beside the type.
            (
                json!({"response_format": {"type": "json_object", "schema": schema}}),
                Some(("response_format", Grammar::JsonSchema(schema.clone()))),
            ),
            (
                json!({"response_format": {"type": "json_schema", "schema": schema}}),
                Some(("response_format", Grammar::JsonSchema(schema.clone()))),
            ),
            (json!({"guided_grammar": "start: \"a\""}), Some(("guided_grammar", Grammar::Lark("start: \"a\"".into())))),
            (
                json!({"guided_grammar": "start: \"x ::= y\""}),
                Some(("guided_grammar", Grammar::Lark("start: \"x ::= y\"".into()))),
            ),
            (json!({"guided_json": null}), None),
        ] {
            assert_eq!(requested(&body).unwrap(), expected, "{body}");
        }
    }

    #[test]
    fn malformed_or_several_are_400s_naming_the_field() {
        for (body, param) in [
            (json!({"response_format": {"type": "yaml"}}), "response_format"),
            (json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}), "response_format"),
            (json!({"guided_json": "{not json"}), "guided_json"),
            (json!({"guided_json": 3}), "guided_json"),
            (json!({"guided_choice": []}), "guided_choice"),
            (json!({"guided_regex": ""}), "guided_regex"),
            (json!({"structured_outputs": {"regex": "a", "choice": ["b"]}}), "structured_outputs"),
            (json!({"guided_regex": "a", "response_format": {"type": "json_object"}}), "guided_regex"),
            (json!({"guided_grammar": "root ::= \"a\""}), "guided_grammar"),
            (json!({"guided_grammar": "start: x\nx-y ::= \"a\""}), "guided_grammar"),
            (json!({"structured_outputs": {"grammar": "root ::= \"a\""}}), "structured_outputs"),
            (json!({"structured_outputs": {"structural_tag": "{}"}}), "structured_outputs"),
            (json!({"structured_outputs": {}}), "structured_outputs"),
            (json!({"structured_outputs": {"json_object": false}}), "structured_outputs"),
            (json!({"response_format": "json"}), "response_format"),
        ] {
            let e = requested(&body).unwrap_err();
            assert_eq!((e.status.as_u16(), e.param.as_deref()), (400, Some(param)), "{body}: {}", e.message);
            assert!(!e.message.contains("null"), "{body}: {}", e.message);
        }
    }
}
