use crate::ui::ui;
use anyhow::{bail, Result};
use clap::{Args, Subcommand};
use g4c_runtime::cache::{ExecutableCache, Miss};

#[derive(Args)]
pub struct CacheArgs {
    #[command(subcommand)]
    pub action: CacheAction,
}

#[derive(Subcommand)]
pub enum CacheAction {
    /// List the cached executables (in executables/ under $G4C_CACHE_DIR, default $XDG_CACHE_HOME/g4c,
    /// else ~/.cache/g4c)
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
            let temporaries = cache.temporaries();
            let mut out = format!("{}: {}\n", cache.dir().display(), super::count(entries.len(), "entry", "entries"));
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
            for (path, stale) in temporaries {
                let name = path.file_name().unwrap_or_default().to_string_lossy();
                out += &format!(
                    "{name}  temporary, {}\n",
                    if stale { "its writer is gone (cache verify removes it)" } else { "being written" }
                );
            }
            super::write_stdout(&out)
        }
        CacheAction::Clear => {
            let (files, bytes) = cache.clear()?;
            super::write_stdout(&format!(
                "removed {} ({}) from {}\n",
                super::count(files, "file", "files"),
                super::fmt_bytes(bytes),
                cache.dir().display()
            ))
        }
        CacheAction::Verify => {
            let verified = cache.verify()?;
            let (good, bad) = (verified.good, &verified.bad);
            for path in &verified.stale_removed {
                ui().note(&format!("removed {}, a temporary whose writer is gone", path.display()));
            }
            for miss in bad {
                eprintln!("g4c: {miss}");
            }
            if !bad.is_empty() {
                let removed = bad.iter().filter(|m| matches!(m, Miss::Corrupt { removed: true, .. })).count();
                bail!(
                    "{} of {} cache entries failed verification ({removed} removed, {} could not be)",
                    bad.len(),
                    good + bad.len(),
                    bad.len() - removed
                );
            }
            super::write_stdout(&format!(
                "{} verified in {}\n",
                super::count(good, "entry", "entries"),
                cache.dir().display()
            ))
        }
    }
}
