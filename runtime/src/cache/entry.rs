//! The on-disk form of one cached executable: a fixed header (magic, format version, lengths, and a
//! BLAKE3 checksum of everything after it), JSON metadata, then the plugin's serialized executable.
//! A reader checks all of it before a single byte reaches the plugin: a damaged executable may load
//! and compute garbage without any error.
//!
//! ```text
//! 0   magic "G4CEXEC\n"          8 bytes
//! 8   format version             u32 LE
//! 12  metadata length            u32 LE
//! 16  body length                u64 LE
//! 24  BLAKE3(metadata ‖ body)    32 bytes
//! 56  metadata (JSON)
//! ..  body
//! ```

use std::fmt;

const MAGIC: &[u8; 8] = b"G4CEXEC\n";
const FORMAT_VERSION: u32 = 1;
const HEADER_LEN: usize = 56;

/// What an entry says about itself; `key` must match the key it was looked up by.
#[derive(Clone, Debug, PartialEq)]
pub struct EntryMeta(pub serde_json::Map<String, serde_json::Value>);

impl EntryMeta {
    pub fn str(&self, field: &str) -> &str {
        self.0.get(field).and_then(|v| v.as_str()).unwrap_or("")
    }
}

/// Why an entry cannot be used.
#[derive(Clone, Debug, PartialEq)]
pub enum EntryError {
    NotAnEntry,
    Version(u32),
    Truncated { expected: u64, found: u64 },
    Checksum,
    Metadata(String),
}

impl fmt::Display for EntryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EntryError::NotAnEntry => write!(f, "not a g4c cache entry (bad magic)"),
            EntryError::Version(v) => write!(f, "entry format {v}, this g4c reads format {FORMAT_VERSION}"),
            EntryError::Truncated { expected, found } => {
                write!(f, "truncated or padded: expected {expected} bytes, found {found}")
            }
            EntryError::Checksum => write!(f, "checksum mismatch"),
            EntryError::Metadata(m) => write!(f, "unreadable metadata: {m}"),
        }
    }
}

pub fn encode(meta: &EntryMeta, body: &[u8]) -> Vec<u8> {
    let meta = serde_json::to_vec(&meta.0).expect("JSON maps serialize");
    let mut hasher = blake3::Hasher::new();
    hasher.update(&meta);
    hasher.update(body);
    let mut out = Vec::with_capacity(HEADER_LEN + meta.len() + body.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    out.extend_from_slice(&(meta.len() as u32).to_le_bytes());
    out.extend_from_slice(&(body.len() as u64).to_le_bytes());
    out.extend_from_slice(hasher.finalize().as_bytes());
    out.extend_from_slice(&meta);
    out.extend_from_slice(body);
    out
}

/// Checks header, lengths and checksum; returns the metadata and the body.
pub fn decode(bytes: &[u8]) -> Result<(EntryMeta, &[u8]), EntryError> {
    let (meta_len, body_len) = read_header(bytes)?;
    let expected = HEADER_LEN as u64 + meta_len as u64 + body_len;
    if bytes.len() as u64 != expected {
        return Err(EntryError::Truncated { expected, found: bytes.len() as u64 });
    }
    let (meta, body) = bytes[HEADER_LEN..].split_at(meta_len);
    let mut hasher = blake3::Hasher::new();
    hasher.update(meta);
    hasher.update(body);
    if hasher.finalize().as_bytes() != &bytes[24..56] {
        return Err(EntryError::Checksum);
    }
    Ok((parse_meta(meta)?, body))
}

/// Only the metadata, from the first bytes of an entry (for listings; nothing is verified beyond the
/// header, so callers must not trust it to load an executable).
pub fn peek_meta(prefix: &[u8]) -> Result<EntryMeta, EntryError> {
    let (meta_len, _) = read_header(prefix)?;
    let meta = prefix
        .get(HEADER_LEN..HEADER_LEN + meta_len)
        .ok_or(EntryError::Truncated { expected: (HEADER_LEN + meta_len) as u64, found: prefix.len() as u64 })?;
    parse_meta(meta)
}

/// How many leading bytes `peek_meta` needs at most for metadata of up to `meta_budget` bytes.
pub const fn peek_len(meta_budget: usize) -> usize {
    HEADER_LEN + meta_budget
}

fn read_header(bytes: &[u8]) -> Result<(usize, u64), EntryError> {
    if bytes.len() < HEADER_LEN {
        return Err(if bytes.starts_with(&MAGIC[..bytes.len().min(8)]) {
            EntryError::Truncated { expected: HEADER_LEN as u64, found: bytes.len() as u64 }
        } else {
            EntryError::NotAnEntry
        });
    }
    if &bytes[..8] != MAGIC {
        return Err(EntryError::NotAnEntry);
    }
    let version = u32::from_le_bytes(bytes[8..12].try_into().unwrap());
    if version != FORMAT_VERSION {
        return Err(EntryError::Version(version));
    }
    let meta_len = u32::from_le_bytes(bytes[12..16].try_into().unwrap()) as usize;
    let body_len = u64::from_le_bytes(bytes[16..24].try_into().unwrap());
    Ok((meta_len, body_len))
}

fn parse_meta(meta: &[u8]) -> Result<EntryMeta, EntryError> {
    match serde_json::from_slice(meta) {
        Ok(serde_json::Value::Object(map)) => Ok(EntryMeta(map)),
        Ok(_) => Err(EntryError::Metadata("not a JSON object".into())),
        Err(e) => Err(EntryError::Metadata(e.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry() -> Vec<u8> {
        let meta = EntryMeta(serde_json::json!({"key": "k1", "entry": "decode"}).as_object().unwrap().clone());
        encode(&meta, b"serialized executable")
    }

    #[test]
    fn round_trips() {
        let bytes = entry();
        let (meta, body) = decode(&bytes).unwrap();
        assert_eq!(meta.str("key"), "k1");
        assert_eq!(body, b"serialized executable");
        assert_eq!(peek_meta(&bytes[..peek_len(4096).min(bytes.len())]).unwrap(), meta);
    }

    #[test]
    fn rejects_every_single_byte_flip() {
        let bytes = entry();
        for i in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 0x40;
            assert!(decode(&bad).is_err(), "flipping byte {i} went unnoticed");
        }
    }

    #[test]
    fn names_truncation_and_foreign_files() {
        let bytes = entry();
        assert!(matches!(decode(&bytes[..bytes.len() - 1]), Err(EntryError::Truncated { .. })));
        assert!(matches!(decode(&bytes[..20]), Err(EntryError::Truncated { .. })));
        assert_eq!(decode(b"not an entry at all, but long enough to have a header......"), Err(EntryError::NotAnEntry));
        let mut newer = bytes.clone();
        newer[8] = 2;
        assert_eq!(decode(&newer), Err(EntryError::Version(2)));
    }
}
