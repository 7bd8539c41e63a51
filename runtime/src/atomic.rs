//! Files that appear whole or not at all: written under a uniquely named temporary sibling, then
//! renamed over the destination. Readers see the old file or the complete new one, two writers of the
//! same path both leave a complete file, and an interrupted write leaves only a temporary to clean.

use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Temporary files start with this, so caches can skip and clean them.
pub const TEMP_PREFIX: &str = ".tmp-";

pub fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut file = AtomicFile::create(path)?;
    file.write_all(bytes)?;
    file.commit()
}

/// A file being written; `commit` renames it into place, dropping it uncommitted removes it.
pub struct AtomicFile {
    file: Option<io::BufWriter<File>>,
    tmp: PathBuf,
    path: PathBuf,
}

impl AtomicFile {
    pub fn create(path: &Path) -> io::Result<AtomicFile> {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let unique = format!("{TEMP_PREFIX}{}-{}-{name}", std::process::id(), COUNTER.fetch_add(1, Ordering::Relaxed));
        let tmp = path.with_file_name(unique);
        let file = io::BufWriter::with_capacity(1 << 20, File::create(&tmp)?);
        Ok(AtomicFile { file: Some(file), tmp, path: path.to_path_buf() })
    }

    pub fn commit(mut self) -> io::Result<()> {
        let file = self.file.take().expect("committed once");
        file.into_inner().map_err(|e| e.into_error())?.sync_all()?;
        std::fs::rename(&self.tmp, &self.path)
    }
}

impl Write for AtomicFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.file.as_mut().expect("not committed").write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.file.as_mut().expect("not committed").flush()
    }
}

impl Drop for AtomicFile {
    fn drop(&mut self) {
        if self.file.take().is_some() {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}
