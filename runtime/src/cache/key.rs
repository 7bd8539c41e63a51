//! What a cached executable depends on, split in two so that a miss can say why:
//! - the *program*: the target, the entry point, the program text the backend compiles (StableHLO for
//!   PJRT: the IR after the target's passes, as this g4c lowers it) and the compile options;
//! - the *environment*: the g4c version, the backend, and whatever the backend's compiled code
//!   depends on (for PJRT: the plugin binary's hash, its C API version and platform, and the host
//!   CPU's features). A serialized executable from another plugin build can load and return garbage
//!   with no error (toolchain.md), so none of this may be left out.

use crate::error::{Result, RuntimeError};
use serde_json::Value;
use std::io::Read;
use std::path::Path;

pub const G4C_VERSION: &str = env!("CARGO_PKG_VERSION");

/// The machine, backend and compiler an executable is compiled for, as named fields.
#[derive(Clone, Debug, PartialEq)]
pub struct Environment {
    fields: Vec<(String, String)>,
}

impl Environment {
    /// The environment of `backend`, described by its own `fields` (after the g4c version and the
    /// backend's name).
    pub fn new(backend: &str, fields: Vec<(&str, String)>) -> Environment {
        let mut all = vec![("g4c_version".to_string(), G4C_VERSION.to_string()), ("backend".into(), backend.into())];
        all.extend(fields.into_iter().map(|(k, v)| (k.to_string(), v)));
        Environment { fields: all }
    }

    pub fn digest(&self) -> String {
        let mut h = blake3::Hasher::new();
        for (_, value) in &self.fields {
            h.update(value.as_bytes());
            h.update(&[0]);
        }
        h.finalize().to_hex().to_string()
    }

    pub fn to_json(&self) -> Value {
        Value::Object(self.fields.iter().map(|(k, v)| (k.clone(), Value::from(v.as_str()))).collect())
    }

    /// The fields of `meta` (an entry's metadata) that differ from this environment, as
    /// "plugin_hash 1a2b3c4d… → 5e6f7a8b…".
    pub fn differences(&self, meta: &serde_json::Map<String, Value>) -> Vec<String> {
        let mut out = vec![];
        for (field, ours) in &self.fields {
            let theirs = meta.get(field).and_then(Value::as_str).unwrap_or("?");
            if theirs != ours {
                out.push(format!("{field} {} → {}", short(theirs), short(ours)));
            }
        }
        out
    }
}

/// The content key of one compiled entry point.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProgramKey(pub String);

impl ProgramKey {
    pub fn new(target: &str, entry: &str, options: &[u8], program: &str) -> ProgramKey {
        let mut h = blake3::Hasher::new();
        for part in [target.as_bytes(), entry.as_bytes(), options, program.as_bytes()] {
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

fn short(s: &str) -> String {
    if s.len() > 16 && s.bytes().all(|b| b.is_ascii_hexdigit()) {
        format!("{}…", &s[..12])
    } else {
        s.to_string()
    }
}
