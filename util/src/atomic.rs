//! Files and directories that appear whole or not at all: written under a uniquely named temporary
//! sibling, then renamed over the destination. Readers see the old file or the complete new one, two
//! writers of the same path both leave a complete file, and an interrupted write leaves only a
//! temporary (removed when its writer is dropped).

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
        let tmp = temp_sibling(path);
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

/// A directory being filled under a temporary name; `commit` moves it into place, replacing an
/// existing directory at that path only after the new one is complete.
pub struct AtomicDir {
    tmp: Option<PathBuf>,
    path: PathBuf,
}

impl AtomicDir {
    pub fn create(path: &Path) -> io::Result<AtomicDir> {
        let tmp = temp_sibling(path);
        std::fs::create_dir_all(&tmp)?;
        Ok(AtomicDir { tmp: Some(tmp), path: path.to_path_buf() })
    }

    /// Where to write the contents until `commit`.
    pub fn path(&self) -> &Path {
        self.tmp.as_deref().expect("not committed")
    }

    pub fn commit(mut self) -> io::Result<()> {
        let tmp = self.tmp.take().expect("committed once");
        if self.path.exists() {
            let old = temp_sibling(&self.path);
            std::fs::rename(&self.path, &old)?;
            std::fs::rename(&tmp, &self.path)?;
            std::fs::remove_dir_all(&old)
        } else {
            std::fs::rename(&tmp, &self.path)
        }
    }
}

impl Drop for AtomicDir {
    fn drop(&mut self) {
        if let Some(tmp) = self.tmp.take() {
            let _ = std::fs::remove_dir_all(tmp);
        }
    }
}

/// A sibling of `path` with a name no other writer uses (process id and a counter).
fn temp_sibling(path: &Path) -> PathBuf {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    path.with_file_name(format!(
        "{TEMP_PREFIX}{}-{}-{name}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ))
}
