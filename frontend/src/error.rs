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
    #[error("checkpoint {dir}: {} tensor problem(s): {}", problems.len(), problems.join("; "))]
    Tensors { dir: PathBuf, problems: Vec<String> },
}

pub type Result<T> = std::result::Result<T, FrontendError>;

pub(crate) fn io_error(path: &std::path::Path, e: std::io::Error) -> FrontendError {
    FrontendError::Io { path: path.to_path_buf(), message: e.to_string() }
}
