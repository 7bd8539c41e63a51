//! Files and directories that appear whole or not at all: written under a uniquely named temporary
//! sibling, then renamed over the destination. Readers see the old file or the complete new one, two
//! writers of the same path both leave a complete file, and an interrupted write leaves only a
//! temporary: removed when its writer is dropped or fails, when the process is interrupted
//! (`remove_in_progress`, which the CLI calls on Ctrl-C and SIGTERM; `ScratchDir`s go then too),
//! and, when the process was killed outright, by the next writer into the same directory
//! (`remove_stale_temporaries`).

use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Temporary files start with this, so caches can skip and clean them; g4c's own prefix, so that
/// no other program's temporaries are taken for ours.
pub const TEMP_PREFIX: &str = ".g4c-tmp-";

/// The temporaries this process is writing, by the id of each one's guard (`InProgress`).
static IN_PROGRESS: Mutex<Vec<(u64, PathBuf)>> = Mutex::new(Vec::new());

/// A temporary file or directory being written, which an interrupted process removes on its way
/// out (`remove_in_progress`). Dropping the guard forgets it: its owner removes or keeps it.
pub struct InProgress {
    id: u64,
    path: PathBuf,
}

impl InProgress {
    pub fn new(path: PathBuf) -> InProgress {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let id = NEXT.fetch_add(1, Ordering::Relaxed);
        IN_PROGRESS.lock().unwrap_or_else(|e| e.into_inner()).push((id, path.clone()));
        InProgress { id, path }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for InProgress {
    fn drop(&mut self) {
        IN_PROGRESS.lock().unwrap_or_else(|e| e.into_inner()).retain(|(id, _)| *id != self.id);
    }
}

/// Removes every temporary in progress (files or directories) and returns them: for a process
/// about to exit on a signal, whose writers will not get to drop theirs. The writers may go on
/// writing into what was removed until the process exits; none is committed.
pub fn remove_in_progress() -> Vec<PathBuf> {
    let paths: Vec<PathBuf> =
        IN_PROGRESS.lock().unwrap_or_else(|e| e.into_inner()).drain(..).map(|(_, path)| path).collect();
    for p in &paths {
        let _ = if p.is_dir() { std::fs::remove_dir_all(p) } else { std::fs::remove_file(p) };
    }
    paths
}

/// A directory of the system's temporary directory, named `prefix…`, for what a command needs only
/// while it runs (executables staged for an artifact, the host emulator's builds): removed when
/// dropped, and, like the temporaries above, when the process is interrupted.
pub struct ScratchDir {
    dir: tempfile::TempDir,
    _in_progress: InProgress,
}

impl ScratchDir {
    pub fn new(prefix: &str) -> io::Result<ScratchDir> {
        let dir = tempfile::Builder::new().prefix(prefix).tempdir()?;
        let in_progress = InProgress::new(dir.path().to_path_buf());
        Ok(ScratchDir { dir, _in_progress: in_progress })
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

pub fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut file = AtomicFile::create(path)?;
    file.write_all(bytes)?;
    file.commit()
}

/// A file being written; `commit` renames it into place, dropping it uncommitted removes it.
pub struct AtomicFile {
    file: Option<io::BufWriter<File>>,
    tmp: InProgress,
    path: PathBuf,
}

/// Whether a file can be written at `path`: its directory exists, and the path is free or a regular
/// file. Anything else there (a directory, a symlink, a FIFO, a device such as `/dev/full`) would be
/// replaced by the rename, not written through, so it is refused.
pub fn check_destination(path: &Path) -> io::Result<()> {
    let refuse = |what: String| Err(io::Error::new(io::ErrorKind::InvalidInput, what));
    let parent = parent_of(path);
    match std::fs::metadata(parent) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => return refuse(format!("{}: {} is not a directory", path.display(), parent.display())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return refuse(format!("{}: the directory {} does not exist", path.display(), parent.display()))
        }
        Err(e) => return Err(e),
    }
    let kind = match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_file() => return Ok(()),
        Ok(m) if m.is_dir() => return refuse(format!("{} is a directory", path.display())),
        Ok(m) if m.file_type().is_symlink() => "a symbolic link",
        Ok(_) => "a FIFO, socket or device",
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    refuse(format!(
        "{} is {kind}, which the written file would replace (g4c writes regular files only)",
        path.display()
    ))
}

impl AtomicFile {
    pub fn create(path: &Path) -> io::Result<AtomicFile> {
        check_destination(path)?;
        remove_stale_temporaries(parent_of(path));
        let tmp = InProgress::new(temp_sibling(path));
        let file = io::BufWriter::with_capacity(1 << 20, File::create(tmp.path())?);
        Ok(AtomicFile { file: Some(file), tmp, path: path.to_path_buf() })
    }

    pub fn commit(mut self) -> io::Result<()> {
        let file = self.file.take().expect("committed once");
        let done = file
            .into_inner()
            .map_err(|e| e.into_error())
            .and_then(|f| f.sync_all())
            .and_then(|()| std::fs::rename(self.tmp.path(), &self.path));
        if done.is_err() {
            let _ = std::fs::remove_file(self.tmp.path());
        }
        done
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
            let _ = std::fs::remove_file(self.tmp.path());
        }
    }
}

/// A directory being filled under a temporary name; `commit` moves it into place, replacing an
/// existing directory at that path only after the new one is complete.
pub struct AtomicDir {
    /// The temporary: the new directory until `commit`, the old one it replaced after.
    tmp: Option<InProgress>,
    path: PathBuf,
}

impl AtomicDir {
    pub fn create(path: &Path) -> io::Result<AtomicDir> {
        remove_stale_temporaries(parent_of(path));
        let tmp = InProgress::new(temp_sibling(path));
        std::fs::create_dir_all(tmp.path())?;
        Ok(AtomicDir { tmp: Some(tmp), path: path.to_path_buf() })
    }

    /// Where to write the contents until `commit`.
    pub fn path(&self) -> &Path {
        self.tmp.as_ref().expect("not committed").path()
    }

    /// Moves the directory into place. An existing one is swapped with it in one step where the
    /// filesystem can (Linux `RENAME_EXCHANGE`), so the path never stops existing, then removed.
    pub fn commit(mut self) -> io::Result<()> {
        let tmp = self.tmp.as_ref().expect("committed once").path().to_path_buf();
        // What is left to remove once the new directory is in place: the old one, if any.
        let old = if !self.path.exists() {
            std::fs::rename(&tmp, &self.path)?;
            None
        } else if exchange(&tmp, &self.path).is_ok() {
            Some(tmp)
        } else {
            // No exchange here (another OS, or a filesystem without it): two renames, with a moment
            // between them where the path does not exist.
            let old = temp_sibling(&self.path);
            std::fs::rename(&self.path, &old)?;
            if let Err(e) = std::fs::rename(&tmp, &self.path) {
                let _ = std::fs::rename(&old, &self.path);
                return Err(e);
            }
            Some(old)
        };
        // Dropping `self` removes it.
        self.tmp = old.map(InProgress::new);
        Ok(())
    }
}

impl Drop for AtomicDir {
    fn drop(&mut self) {
        if let Some(tmp) = self.tmp.take() {
            let _ = std::fs::remove_dir_all(tmp.path());
        }
    }
}

/// Swaps two paths in one step.
#[cfg(target_os = "linux")]
fn exchange(a: &Path, b: &Path) -> io::Result<()> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    let c =
        |p: &Path| CString::new(p.as_os_str().as_bytes()).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e));
    let (a, b) = (c(a)?, c(b)?);
    // SAFETY: both are valid NUL-terminated paths that outlive the call.
    let rc = unsafe { libc::renameat2(libc::AT_FDCWD, a.as_ptr(), libc::AT_FDCWD, b.as_ptr(), libc::RENAME_EXCHANGE) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(not(target_os = "linux"))]
fn exchange(_: &Path, _: &Path) -> io::Result<()> {
    Err(io::Error::new(io::ErrorKind::Unsupported, "no atomic exchange of paths here"))
}

fn parent_of(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// Temporaries in `dir` whose writing process is gone: it was killed before it could remove them.
/// A temporary is named after its writer's process id, which is taken to be in this machine's (and
/// this PID namespace's) process table: writers in other containers or on other hosts sharing the
/// directory are not told apart from dead ones. Elsewhere than Unix none is judged stale.
pub fn stale_temporaries(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else { return vec![] };
    entries.flatten().map(|e| e.path()).filter(|p| writer_of(p).is_some_and(|pid| !process_exists(pid))).collect()
}

/// Removes `stale_temporaries(dir)` (files or directories); returns those it removed.
pub fn remove_stale_temporaries(dir: &Path) -> Vec<PathBuf> {
    stale_temporaries(dir)
        .into_iter()
        .filter(|p| if p.is_dir() { std::fs::remove_dir_all(p) } else { std::fs::remove_file(p) }.is_ok())
        .collect()
}

/// The process id in a temporary's name (`PREFIX PID-COUNTER-NAME`, as `temp_sibling` makes it).
fn writer_of(path: &Path) -> Option<u32> {
    let name = path.file_name()?.to_str()?;
    let mut parts = name.strip_prefix(TEMP_PREFIX)?.splitn(3, '-');
    let (pid, counter, rest) = (parts.next()?, parts.next()?, parts.next()?);
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    (digits(counter) && !rest.is_empty()).then_some(())?;
    pid.parse().ok().filter(|_| digits(pid))
}

/// Whether a process with this id runs (`kill(pid, 0)`: no signal is sent; a process of another user
/// answers "not permitted", which still means it exists, also where `/proc` hides it).
#[cfg(unix)]
fn process_exists(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else { return false };
    // SAFETY: signal 0 only checks whether the process could be signalled.
    let signalled = unsafe { libc::kill(pid, 0) } == 0;
    signalled || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

#[cfg(not(unix))]
fn process_exists(_: u32) -> bool {
    true
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

#[cfg(test)]
mod tests {
    use super::*;

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> =
            std::fs::read_dir(dir).unwrap().flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
        v.sort();
        v
    }

    #[test]
    fn a_failed_commit_leaves_no_temporary() {
        let dir = std::env::temp_dir().join(format!("g4c-atomic-commit-{}", std::process::id()));
        let target = dir.join("occupied");
        std::fs::create_dir_all(target.join("inside")).unwrap();
        assert!(write_atomic(&target, b"bytes").is_err(), "a file cannot replace a non-empty directory");
        assert_eq!(names(&dir), ["occupied"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn temporaries_of_dead_writers_are_removed_by_the_next_writer() {
        let dir = std::env::temp_dir().join(format!("g4c-atomic-stale-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // Above Linux's largest pid_max (2^22): no process has this id.
        let dead = dir.join(format!("{TEMP_PREFIX}4194305-0-artifact"));
        std::fs::create_dir_all(dead.join("executables")).unwrap();
        let live = dir.join(format!("{TEMP_PREFIX}{}-99-logits", std::process::id()));
        std::fs::write(&live, b"being written").unwrap();
        assert_eq!(stale_temporaries(&dir), [dead]);
        write_atomic(&dir.join("logits"), b"done").unwrap();
        assert_eq!(names(&dir), [format!("{TEMP_PREFIX}{}-99-logits", std::process::id()), "logits".into()]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_directory_is_replaced_whole() {
        let dir = std::env::temp_dir().join(format!("g4c-atomic-dir-{}", std::process::id()));
        let out = dir.join("out");
        for content in ["old", "new"] {
            let staged = AtomicDir::create(&out).unwrap();
            std::fs::write(staged.path().join(content), content).unwrap();
            staged.commit().unwrap();
        }
        assert_eq!(names(&out), ["new"]);
        assert_eq!(names(&dir), ["out"], "no temporary is left");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
