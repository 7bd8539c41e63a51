#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("{0}")]
    Invalid(String),
    #[error("interpreter: @{function}: {value} = {op}: {message}")]
    Op { function: String, value: String, op: String, message: String },
    #[error("PJRT: {0}")]
    Pjrt(String),
    #[error("weight @{name} (`{source_key}`): {message}")]
    Weight { name: String, source_key: String, message: String },
}

pub type Result<T> = std::result::Result<T, RuntimeError>;

pub(crate) fn invalid<T>(message: impl Into<String>) -> Result<T> {
    Err(RuntimeError::Invalid(message.into()))
}
