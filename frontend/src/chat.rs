//! The checkpoint's chat template: `chat_template.jinja`, else the `chat_template` of
//! `tokenizer_config.json`, rendered by minijinja as transformers' `apply_chat_template` renders it
//! with Jinja2: blocks trimmed (`trim_blocks`, `lstrip_blocks`), loop controls, `tojson`, Python
//! string methods (minijinja-contrib's pycompat) and `raise_exception`.

use crate::error::{FrontendError, Result};
use crate::tokenizer::TextTokenizer;
use minijinja::{context, Environment, Error, ErrorKind};
use serde::Serialize;
use std::path::{Path, PathBuf};

/// One message of a conversation, as the template reads it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

pub struct ChatTemplate {
    env: Environment<'static>,
    /// Where it came from, for messages.
    path: PathBuf,
    bos_token: String,
    eos_token: String,
}

impl ChatTemplate {
    /// The template of checkpoint (or artifact) `dir`; `Ok(None)` when it has none.
    pub fn open(dir: &Path, tokenizer: &TextTokenizer) -> Result<Option<ChatTemplate>> {
        let Some((path, source)) = template_source(dir)? else { return Ok(None) };
        // As transformers' environment: blocks trimmed, `break`/`continue`, `tojson`, Python methods.
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_filter("tojson", tojson);
        env.add_function("raise_exception", |message: String| -> std::result::Result<String, Error> {
            Err(Error::new(ErrorKind::InvalidOperation, message))
        });
        env.add_template_owned("chat", source)
            .map_err(|e| FrontendError::Io { path: path.clone(), message: format!("invalid chat template: {e}") })?;
        let token = |id: Option<u32>| id.and_then(|id| tokenizer.token(id)).unwrap_or_default();
        Ok(Some(ChatTemplate { env, path, bos_token: token(tokenizer.bos()), eos_token: token(tokenizer.eos()) }))
    }

    /// The prompt text of `messages`, ending with the header of the model's reply.
    pub fn render(&self, messages: &[ChatMessage]) -> Result<String> {
        let template = self.env.get_template("chat").expect("added in open");
        let ctx = context! {
            messages => messages,
            add_generation_prompt => true,
            bos_token => &self.bos_token,
            eos_token => &self.eos_token,
        };
        let text = template.render(ctx).map_err(|e| FrontendError::Invalid {
            message: format!(
                "the chat template ({}) cannot render these messages: {}",
                self.path.display(),
                detail(&e)
            ),
        })?;
        if text.trim().is_empty() {
            let message = format!("the chat template ({}) renders these messages as empty text", self.path.display());
            return Err(FrontendError::Invalid { message });
        }
        Ok(text)
    }
}

/// The template's path and text: `chat_template.jinja`, else `tokenizer_config.json`'s
/// `chat_template` (a string, or a list of named templates of which `default` is taken).
fn template_source(dir: &Path) -> Result<Option<(PathBuf, String)>> {
    let read = |path: &Path| {
        g4c_util::files::regular(path)
            .and_then(|_| std::fs::read_to_string(path))
            .map_err(|e| FrontendError::Io { path: path.into(), message: e.to_string() })
    };
    let jinja = dir.join("chat_template.jinja");
    if jinja.exists() {
        return Ok(Some((jinja.clone(), read(&jinja)?)));
    }
    let config = dir.join("tokenizer_config.json");
    if !config.exists() {
        return Ok(None);
    }
    let value: serde_json::Value = serde_json::from_str(&read(&config)?)
        .map_err(|e| FrontendError::Json { path: config.clone(), message: e.to_string() })?;
    let bad = |found: &serde_json::Value| FrontendError::Config {
        path: config.clone(),
        field: "chat_template".into(),
        expected: "a string, or a list of {name, template} with a `default`".into(),
        found: crate::config::kind_of(found),
    };
    match &value["chat_template"] {
        serde_json::Value::Null => Ok(None),
        serde_json::Value::String(text) => Ok(Some((config.clone(), text.clone()))),
        serde_json::Value::Array(named) => {
            let default = named.iter().find(|t| t["name"] == "default").ok_or_else(|| bad(&value["chat_template"]))?;
            match default["template"].as_str() {
                Some(text) => Ok(Some((config.clone(), text.to_string()))),
                None => Err(bad(&default["template"])),
            }
        }
        other => Err(bad(other)),
    }
}

/// transformers' `tojson`: `json.dumps(value, ensure_ascii=False)`, so with Python's separators
/// (`", "`, `": "`), keys in their order, and not HTML-escaped.
fn tojson(value: minijinja::Value) -> std::result::Result<minijinja::Value, Error> {
    struct Python;
    impl serde_json::ser::Formatter for Python {
        fn begin_array_value<W: ?Sized + std::io::Write>(&mut self, w: &mut W, first: bool) -> std::io::Result<()> {
            w.write_all(if first { b"" } else { b", " })
        }
        fn begin_object_key<W: ?Sized + std::io::Write>(&mut self, w: &mut W, first: bool) -> std::io::Result<()> {
            w.write_all(if first { b"" } else { b", " })
        }
        fn begin_object_value<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
            w.write_all(b": ")
        }
    }
    let mut out = vec![];
    serde::Serialize::serialize(&value, &mut serde_json::Serializer::with_formatter(&mut out, Python))
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    Ok(minijinja::Value::from_safe_string(String::from_utf8(out).expect("serde_json writes UTF-8")))
}

/// A template error with the cause minijinja keeps apart (the message `raise_exception` was given).
fn detail(e: &Error) -> String {
    match e.detail() {
        Some(detail) => detail.to_string(),
        None => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::{ChatMessage, ChatTemplate};
    use crate::synth::tokenizer_json;
    use crate::TextTokenizer;

    fn tiny(dir: &std::path::Path, files: &[(&str, &str)]) -> (TextTokenizer, Option<ChatTemplate>) {
        std::fs::write(dir.join("tokenizer.json"), tokenizer_json(64).to_string()).unwrap();
        for (name, text) in files {
            std::fs::write(dir.join(name), text).unwrap();
        }
        let tokenizer = TextTokenizer::open(dir, Some(2), Some(1)).unwrap().unwrap();
        let template = ChatTemplate::open(dir, &tokenizer).unwrap();
        (tokenizer, template)
    }

    fn message(role: &str, content: &str) -> ChatMessage {
        ChatMessage { role: role.into(), content: content.into() }
    }

    #[test]
    fn the_synthetic_template_renders_gemma_turns_with_one_bos() {
        let dir = tempfile::tempdir().unwrap();
        let (tokenizer, template) = tiny(dir.path(), &[("chat_template.jinja", crate::synth::CHAT_TEMPLATE)]);
        let messages = [message("system", "ba"), message("user", " de fi "), message("assistant", "ko")];
        let text = template.unwrap().render(&messages).unwrap();
        assert_eq!(
            text,
            "<bos><|turn>system\nba<turn|>\n<|turn>user\nde fi<turn|>\n<|turn>model\nko<turn|>\n<|turn>model\n"
        );
        let ids = tokenizer.encode(&text).unwrap();
        let (turn, end) = (tokenizer.token_id("<|turn>").unwrap(), tokenizer.token_id("<turn|>").unwrap());
        let word = |w: &str| tokenizer.token_id(w).unwrap();
        assert_eq!(&ids[..6], [2, turn, word("system"), word("ba"), end, turn], "one BOS, the markers as tokens");
        assert_eq!(ids.iter().filter(|&&i| i == 2).count(), 1);
    }

    #[test]
    fn a_template_in_tokenizer_config_and_its_raise_exception_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let source =
            "{% if messages[0].role != 'user' %}{{ raise_exception('roles must start with user') }}{% endif %}\
                      {{ bos_token }}{{ messages[0].content.strip() }}";
        let config = serde_json::json!({ "chat_template": [{"name": "default", "template": source}] }).to_string();
        let (_, template) = tiny(dir.path(), &[("tokenizer_config.json", &config)]);
        let template = template.unwrap();
        assert_eq!(template.render(&[message("user", " ba ")]).unwrap(), "<bos>ba");
        let err = template.render(&[message("system", "ba")]).unwrap_err().to_string();
        assert!(err.contains("roles must start with user") && err.contains("tokenizer_config.json"), "{err}");
    }

    #[test]
    fn a_template_that_renders_nothing_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let (_, template) = tiny(dir.path(), &[("chat_template.jinja", "{% if false %}x{% endif %}\n")]);
        let err = template.unwrap().render(&[message("user", "ba")]).unwrap_err().to_string();
        assert!(err.contains("chat_template.jinja") && err.contains("renders these messages as empty text"), "{err}");
    }

    #[test]
    fn blocks_are_trimmed_and_loop_controls_and_tojson_work_as_in_transformers() {
        let dir = tempfile::tempdir().unwrap();
        // What transformers 5.23 (`_compile_jinja_template`, Jinja2) renders for this, checked there:
        // no blank lines from the tags, and `tojson` as Python's `json.dumps`.
        let source = "{% for m in messages %}\n  {% if m.role == 'stop' %}{% break %}{% endif %}\n<{{ m.content }}>\n{% endfor %}{{ messages[0] | tojson }}";
        let (_, template) = tiny(dir.path(), &[("chat_template.jinja", source)]);
        let messages = [message("user", "a"), message("user", "b"), message("stop", "c")];
        assert_eq!(template.unwrap().render(&messages).unwrap(), "<a>\n<b>\n{\"role\": \"user\", \"content\": \"a\"}");
    }

    #[test]
    fn no_template_is_none_and_a_broken_one_names_its_file() {
        let dir = tempfile::tempdir().unwrap();
        assert!(tiny(dir.path(), &[]).1.is_none());
        std::fs::write(dir.path().join("chat_template.jinja"), "{% for %}").unwrap();
        let tokenizer = TextTokenizer::open(dir.path(), Some(2), Some(1)).unwrap().unwrap();
        let err = ChatTemplate::open(dir.path(), &tokenizer).err().unwrap().to_string();
        assert!(err.contains("chat_template.jinja: invalid chat template"), "{err}");
    }
}
