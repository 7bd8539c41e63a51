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
    /// Waits until this process holds the lock at `path` (created if absent).
    pub fn exclusive(path: &Path) -> io::Result<FileLock> {
        let file = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(path)?;
        flock(&file)?;
        Ok(FileLock { file, path: path.to_path_buf() })
    }

    /// Releases the lock and removes its file. A process that opened the file before the removal
    /// may still lock it while a newer one locks a new file: two then work at once, which costs
    /// time, never correctness (what they write is written atomically).
    pub fn release(self) {
        let _ = std::fs::remove_file(&self.path);
        drop(self.file);
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

#[cfg(not(unix))]
fn flock(_: &File) -> io::Result<()> {
    Ok(())
}
