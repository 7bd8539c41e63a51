//! An advisory lock on a file (`flock`), released when dropped or when the process dies: processes
//! about to do the same expensive work (compile one program into one cache) take turns, so the
//! later ones find the first one's result instead of repeating it.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

pub struct FileLock {
    file: File,
    path: PathBuf,
}

impl FileLock {
    /// Waits until this process holds the lock at `path` (created if absent). The holder removes the
    /// file when it is done; a waiter that then finds its (removed) file no longer at `path` opens the
    /// new one and waits again, so two processes never both hold the lock of one path.
    pub fn exclusive(path: &Path) -> io::Result<FileLock> {
        loop {
            let file = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(path)?;
            flock(&file)?;
            if same_file(&file, path) {
                return Ok(FileLock { file, path: path.to_path_buf() });
            }
        }
    }
}

impl Drop for FileLock {
    /// Removes the file while still holding the lock (so no one can be waiting on it and then hold
    /// it), then releases the lock by closing it.
    fn drop(&mut self) {
        if same_file(&self.file, &self.path) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

#[cfg(unix)]
fn same_file(file: &File, path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (file.metadata(), std::fs::metadata(path)) {
        (Ok(a), Ok(b)) => (a.dev(), a.ino()) == (b.dev(), b.ino()),
        _ => false,
    }
}

#[cfg(unix)]
fn flock(file: &File) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    loop {
        // SAFETY: the descriptor is open for the duration of the call.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Elsewhere than Unix there is no lock: processes may compile the same program at once, which
/// costs time, never correctness (what they store is written atomically).
#[cfg(not(unix))]
fn flock(_: &File) -> io::Result<()> {
    Ok(())
}

#[cfg(not(unix))]
fn same_file(_: &File, _: &Path) -> bool {
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lock_file_is_gone_once_released() {
        let dir = std::env::temp_dir().join(format!("g4c-lock-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("x.lock");
        {
            let _held = FileLock::exclusive(&path).unwrap();
            assert!(path.exists());
        }
        assert!(!path.exists(), "dropping the lock removes its file");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
