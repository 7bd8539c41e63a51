//! Reading what should be a file. A FIFO or a device in its place would block `open` or never end,
//! so anything but a regular file (or a link to one) is refused before it is opened.

use std::fs::File;
use std::io;
use std::path::Path;

/// `Ok` if `path` is a regular file; else an error saying what it is.
pub fn regular(path: &Path) -> io::Result<()> {
    let kind = std::fs::metadata(path)?.file_type();
    if kind.is_file() {
        return Ok(());
    }
    let what = if kind.is_dir() { "a directory" } else { "a FIFO, socket or device" };
    Err(io::Error::new(io::ErrorKind::InvalidInput, format!("expected a regular file, found {what}")))
}

pub fn open(path: &Path) -> io::Result<File> {
    regular(path)?;
    File::open(path)
}

pub fn read_to_string(path: &Path) -> io::Result<String> {
    regular(path)?;
    std::fs::read_to_string(path)
}

pub fn read(path: &Path) -> io::Result<Vec<u8>> {
    regular(path)?;
    std::fs::read(path)
}
