//! Paths and switches from the environment. An empty variable counts as unset (`G4C_CACHE_DIR=""` must not mean
//! the working directory, nor `G4C_PJRT_PLUGIN=""` a plugin named "").

use std::path::PathBuf;

/// `$name` as a path, if it is set and not empty.
pub fn path_var(name: &str) -> Option<PathBuf> {
    std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from)
}

/// Whether switch `$name` is on: set, and neither empty nor `0`.
pub fn flag_var(name: &str) -> bool {
    std::env::var_os(name).is_some_and(|v| !v.is_empty() && v != "0")
}

/// A file inside the project's Python environment (`.venv/lib/python3.*/site-packages/<relative>`,
/// where `scripts/setup` installs the PJRT plugin, NVRTC and ptxas), looked for from the working
/// directory and from every folder above the running executable.
pub fn venv_file(relative: &str) -> Option<PathBuf> {
    let mut roots: Vec<PathBuf> = std::env::current_dir().into_iter().collect();
    if let Ok(exe) = std::env::current_exe() {
        roots.extend(exe.ancestors().skip(1).map(std::path::Path::to_path_buf));
    }
    roots.iter().find_map(|root| {
        let lib = root.join(".venv/lib");
        std::fs::read_dir(&lib).ok()?.flatten().find_map(|python| {
            let file = python.path().join("site-packages").join(relative);
            file.exists().then_some(file)
        })
    })
}
