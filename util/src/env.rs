//! Paths from the environment. An empty variable counts as unset (`G4C_CACHE_DIR=""` must not mean
//! the working directory, nor `G4C_PJRT_PLUGIN=""` a plugin named "").

use std::path::PathBuf;

/// `$name` as a path, if it is set and not empty.
pub fn path_var(name: &str) -> Option<PathBuf> {
    std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from)
}
