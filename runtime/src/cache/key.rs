//! What a cached executable depends on, split in two so that a miss can say why:
//! - the *program*: the target, the entry point, its StableHLO (the IR after the target's passes, as
//!   this g4c lowers it) and the compile options;
//! - the *environment*: the g4c version, the plugin binary's hash, its PJRT C API version and
//!   platform, and the host CPU's features. A serialized executable from another plugin build can load
//!   and return garbage with no error (toolchain.md), so none of this may be left out.

use crate::error::{Result, RuntimeError};
use crate::pjrt::{Client, COMPILE_OPTIONS};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

pub const G4C_VERSION: &str = env!("CARGO_PKG_VERSION");

/// The machine and plugin an executable is compiled for.
#[derive(Clone, Debug, PartialEq)]
pub struct Environment {
    pub g4c_version: String,
    pub plugin_hash: String,
    pub api_version: String,
    pub platform: String,
    pub cpu_features: String,
}

impl Environment {
    pub fn of(client: &Client) -> Result<Environment> {
        let (major, minor) = client.api().version();
        Ok(Environment {
            g4c_version: G4C_VERSION.into(),
            plugin_hash: plugin_hash(&client.api().path)?,
            api_version: format!("{major}.{minor}"),
            platform: client.platform_name()?,
            cpu_features: cpu_features_hash(),
        })
    }

    pub fn digest(&self) -> String {
        let mut h = blake3::Hasher::new();
        for field in self.fields() {
            h.update(field.as_bytes());
            h.update(&[0]);
        }
        h.finalize().to_hex().to_string()
    }

    pub fn to_json(&self) -> Value {
        json!({
            "g4c_version": self.g4c_version,
            "plugin_hash": self.plugin_hash,
            "api_version": self.api_version,
            "platform": self.platform,
            "cpu_features": self.cpu_features,
        })
    }

    /// The fields of `meta` (an entry's metadata) that differ from this environment, as
    /// "plugin_hash 1a2b3c4d… → 5e6f7a8b…".
    pub fn differences(&self, meta: &serde_json::Map<String, Value>) -> Vec<String> {
        let mine = self.to_json();
        let mut out = vec![];
        for (field, value) in mine.as_object().unwrap() {
            let theirs = meta.get(field).and_then(Value::as_str).unwrap_or("?");
            let ours = value.as_str().unwrap_or("");
            if theirs != ours {
                out.push(format!("{field} {} → {}", short(theirs), short(ours)));
            }
        }
        out
    }

    fn fields(&self) -> [&str; 5] {
        [&self.g4c_version, &self.plugin_hash, &self.api_version, &self.platform, &self.cpu_features]
    }
}

/// The content key of one compiled entry point.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProgramKey(pub String);

impl ProgramKey {
    pub fn new(target: &str, entry: &str, mlir: &str) -> ProgramKey {
        let mut h = blake3::Hasher::new();
        for part in [target.as_bytes(), entry.as_bytes(), &COMPILE_OPTIONS, mlir.as_bytes()] {
            h.update(&(part.len() as u64).to_le_bytes());
            h.update(part);
        }
        ProgramKey(h.finalize().to_hex().to_string())
    }
}

/// The name of the file holding `program` compiled for the environment with digest `env`: every
/// environment's entries of one program share the prefix, so a miss can find them and say what differs.
pub fn file_name(program: &ProgramKey, env_digest: &str) -> String {
    format!("{}-{}.{}", &program.0[..32], &env_digest[..16], super::EXTENSION)
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

/// BLAKE3 of a file's contents, read in large blocks (a PJRT plugin is a few hundred MB).
pub fn file_hash(path: &Path) -> Result<String> {
    let io = |e: std::io::Error| RuntimeError::Invalid(format!("reading {} to hash it: {e}", path.display()));
    let mut file = std::fs::File::open(path).map_err(io)?;
    let mut hasher = blake3::Hasher::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf).map_err(io)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hasher.finalize().to_hex().to_string())
}

/// A hash of the host CPU's architecture and feature flags (`/proc/cpuinfo`): an executable compiled
/// for AVX-512 must not be loaded on a machine without it.
fn cpu_features_hash() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let flags = cpuinfo.lines().find(|l| l.starts_with("flags") || l.starts_with("Features")).unwrap_or("");
    let mut h = blake3::Hasher::new();
    h.update(std::env::consts::ARCH.as_bytes());
    h.update(flags.as_bytes());
    h.finalize().to_hex().to_string()
}

fn short(s: &str) -> String {
    if s.len() > 16 && s.bytes().all(|b| b.is_ascii_hexdigit()) {
        format!("{}…", &s[..12])
    } else {
        s.to_string()
    }
}
