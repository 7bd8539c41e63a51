use anyhow::{bail, Result};
use clap::{Args, Subcommand};
use g4c_runtime::cache::ExecutableCache;

#[derive(Args)]
pub struct CacheArgs {
    #[command(subcommand)]
    pub action: CacheAction,
}

#[derive(Subcommand)]
pub enum CacheAction {
    /// List the cached executables (in $G4C_CACHE_DIR, default ~/.cache/g4c)
    Ls,
    /// Remove every cached executable
    Clear,
    /// Read every entry in full, check its header and checksum, and remove those that fail
    Verify,
}

pub fn run(args: CacheArgs) -> Result<()> {
    let cache = ExecutableCache::user()?;
    match args.action {
        CacheAction::Ls => {
            let entries = cache.list()?;
            let mut out = format!("{}: {} entries\n", cache.dir().display(), entries.len());
            for e in &entries {
                let name = e.path.file_name().unwrap_or_default().to_string_lossy();
                let size = format!("{:.1} MB", e.bytes as f64 / 1e6);
                match &e.meta {
                    Ok(m) => {
                        out += &format!(
                            "{name}  {size:>9}  @{:<8} {:<8} {}  (plugin {}…)\n",
                            m.str("entry"),
                            m.str("target"),
                            m.str("model"),
                            m.str("plugin_hash").get(..12).unwrap_or("?"),
                        )
                    }
                    Err(error) => out += &format!("{name}  {size:>9}  unreadable: {error}\n"),
                }
            }
            super::write_stdout(&out)
        }
        CacheAction::Clear => {
            let (files, bytes) = cache.clear()?;
            super::write_stdout(&format!(
                "removed {files} files ({:.1} MB) from {}\n",
                bytes as f64 / 1e6,
                cache.dir().display()
            ))
        }
        CacheAction::Verify => {
            let (good, bad) = cache.verify()?;
            for miss in &bad {
                eprintln!("g4c: {miss}");
            }
            if !bad.is_empty() {
                bail!("{} of {} cache entries failed verification (removed)", bad.len(), good + bad.len());
            }
            super::write_stdout(&format!("{good} entries verified in {}\n", cache.dir().display()))
        }
    }
}
