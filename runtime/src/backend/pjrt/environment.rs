//! What an executable compiled by a PJRT plugin depends on besides its program: the plugin binary,
//! its C API version and platform, and the host CPU's features (an executable compiled for AVX-512
//! must not be loaded on a machine without it).

use super::Client;
use crate::cache::{file_hash, Environment};
use crate::error::Result;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

pub fn environment(client: &Client) -> Result<Environment> {
    let (major, minor) = client.api().version();
    Ok(Environment::new(
        "pjrt",
        vec![
            ("plugin_hash", plugin_hash(&client.api().path)?),
            ("api_version", format!("{major}.{minor}")),
            ("platform", client.platform_name()?),
            ("cpu_features", cpu_features_hash()),
        ],
    ))
}

/// `file_hash` of a loaded plugin, once per process: a plugin cannot change under a process that
/// has it loaded, and hashing a few hundred MB for every compiler is wasted work.
fn plugin_hash(path: &Path) -> Result<String> {
    static HASHES: Mutex<BTreeMap<PathBuf, String>> = Mutex::new(BTreeMap::new());
    if let Some(hash) = HASHES.lock().unwrap().get(path) {
        return Ok(hash.clone());
    }
    let hash = file_hash(path)?;
    HASHES.lock().unwrap().insert(path.to_path_buf(), hash.clone());
    Ok(hash)
}

/// A hash of the host CPU's architecture and feature flags (`/proc/cpuinfo`).
fn cpu_features_hash() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let flags = cpuinfo.lines().find(|l| l.starts_with("flags") || l.starts_with("Features")).unwrap_or("");
    let mut h = blake3::Hasher::new();
    h.update(std::env::consts::ARCH.as_bytes());
    h.update(flags.as_bytes());
    h.finalize().to_hex().to_string()
}
