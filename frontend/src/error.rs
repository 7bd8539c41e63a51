//! Frontend errors. Each renders as one line naming the file, tensor or field, what was expected and
//! what was found.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum FrontendError {
    #[error("{path}: {message}")]
    Io { path: PathBuf, message: String },
    #[error("{path}: invalid JSON: {message}")]
    Json { path: PathBuf, message: String },
    #[error("{path}: field `{field}`: expected {expected}, found {found}")]
    Config { path: PathBuf, field: String, expected: String, found: String },
    #[error("{path}: unsupported model: {message}")]
    Unsupported { path: PathBuf, message: String },
    #[error("{path}: {message}")]
    Safetensors { path: PathBuf, message: String },
    #[error("{message}")]
    Invalid { message: String },
    #[error("checkpoint {dir}: {}", summarize(problems))]
    Tensors { dir: PathBuf, problems: Vec<String> },
}

pub type Result<T> = std::result::Result<T, FrontendError>;

/// The first few problems and how many more: a config that does not describe the checkpoint makes
/// every tensor a problem, and one line of thousands of them helps no one.
fn summarize(problems: &[String]) -> String {
    const SHOWN: usize = 5;
    let mut text = match problems.len() {
        1 => "1 tensor problem: ".to_string(),
        n => format!("{n} tensor problems: "),
    };
    text += &problems[..problems.len().min(SHOWN)].join("; ");
    if problems.len() > SHOWN {
        text += &format!("; and {} more", problems.len() - SHOWN);
        if problems.iter().filter(|p| p.contains("has shape")).count() > SHOWN {
            text += " (does config.json describe this checkpoint?)";
        }
    }
    text
}

pub(crate) fn io_error(path: &std::path::Path, e: std::io::Error) -> FrontendError {
    FrontendError::Io { path: path.to_path_buf(), message: e.to_string() }
}
