//! What the CLI tells the user besides its output: warnings (always), progress bars and step notes
//! (unless `--quiet`), details (with `-v`). Progress bars are drawn only when stderr is a terminal, so
//! piped and logged runs stay clean.

use g4c_driver::Feedback;
use g4c_runtime::backend::pjrt::{CompileEvent, Provenance};
use g4c_runtime::cache::Miss;
use g4c_runtime::{Progress, Unit};
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::thread::ThreadId;

#[derive(Clone, Copy, Debug, Default)]
pub struct Ui {
    pub quiet: bool,
    pub verbose: bool,
}

static UI: OnceLock<Ui> = OnceLock::new();

pub fn init(ui: Ui) {
    let _ = UI.set(ui);
}

pub fn ui() -> Ui {
    UI.get().copied().unwrap_or_default()
}

impl Ui {
    pub fn warn(&self, message: &str) {
        eprintln!("g4c: warning: {message}");
    }

    /// A note on what a step did (`compiled decode in 21.3 s`); hidden by `--quiet`.
    pub fn note(&self, message: &str) {
        if !self.quiet {
            eprintln!("g4c: {message}");
        }
    }

    /// Detail for `-v`.
    pub fn detail(&self, message: &str) {
        if self.verbose && !self.quiet {
            eprintln!("g4c: {message}");
        }
    }

    pub fn progress(&self) -> Bars {
        let target = if self.quiet { ProgressDrawTarget::hidden() } else { ProgressDrawTarget::stderr() };
        Bars { bars: MultiProgress::with_draw_target(target), running: Mutex::new(HashMap::new()) }
    }

    /// Tells the user what happened to an entry point's executable: corrupt cache entries and
    /// executables that could not be cached always, a compile for another environment as a note,
    /// the rest with `-v`.
    pub fn compile_event(&self, event: &CompileEvent) {
        const WAIT_WORTH_SAYING: f64 = 0.5;
        // A corrupt entry in an artifact stays (artifacts are read only), so a later run may load
        // the executable compiled in its place from the user's cache.
        let instead = match &event.provenance {
            Provenance::Loaded(path) => format!("loading @{} from {} instead", event.entry, path.display()),
            Provenance::Compiled(..) => format!("compiling @{} again", event.entry),
        };
        for corrupt in &event.corrupt {
            self.warn(&format!("{corrupt}; {instead}"));
        }
        if let Some(error) = &event.not_stored {
            self.warn(&format!("@{} was compiled but not cached: {error}", event.entry));
        }
        // Another process held the program's turn to compile (its lock in the cache).
        if event.waited >= WAIT_WORTH_SAYING {
            self.note(&format!(
                "@{}: waited {:.1} s for another g4c compiling it into the same cache",
                event.entry, event.waited
            ));
        }
        match &event.provenance {
            Provenance::Loaded(path) => {
                self.detail(&format!("@{}: loaded from {} in {:.2} s", event.entry, path.display(), event.seconds))
            }
            Provenance::Compiled(miss @ Miss::OtherEnvironment(_), _) => {
                self.note(&format!("@{}: {miss}; compiled for this one in {:.1} s", event.entry, event.seconds))
            }
            Provenance::Compiled(miss, _) => {
                self.detail(&format!("@{}: {miss}; compiled in {:.1} s", event.entry, event.seconds))
            }
        }
    }
}

/// Runs `f` with the driver's feedback drawn by this UI: progress bars and compile events.
pub fn with_feedback<T>(f: impl FnOnce(&Feedback) -> T) -> T {
    let bars = ui().progress();
    let on_compile = |e: &CompileEvent| bars.suspend(|| ui().compile_event(e));
    f(&Feedback { progress: &bars, on_compile: &on_compile })
}

/// Progress bars on stderr (indicatif hides them when stderr is not a terminal): one for each
/// thread with a step under way (`g4c compile` writes an artifact's weights while it compiles),
/// one above the other.
pub struct Bars {
    bars: MultiProgress,
    running: Mutex<HashMap<ThreadId, ProgressBar>>,
}

impl Progress for Bars {
    fn begin(&self, what: &str, total: u64, unit: Unit) {
        let template = match unit {
            Unit::Bytes => "{msg:>18} [{bar:30}] {bytes}/{total_bytes} ({bytes_per_sec}, {eta})",
            Unit::Items => "{msg:>18} [{bar:30}] {pos}/{len} ({elapsed})",
        };
        let style = ProgressStyle::with_template(template).expect("valid template").progress_chars("=> ");
        let bar = self.bars.add(ProgressBar::new(total).with_style(style).with_message(what.to_string()));
        bar.enable_steady_tick(std::time::Duration::from_millis(200));
        if let Some(before) = self.running.lock().unwrap().insert(std::thread::current().id(), bar) {
            before.finish_and_clear();
        }
    }

    fn advance(&self, done: u64) {
        let bar = self.running.lock().unwrap().get(&std::thread::current().id()).cloned();
        if let Some(bar) = bar {
            bar.inc(done);
        }
    }

    fn end(&self) {
        if let Some(bar) = self.running.lock().unwrap().remove(&std::thread::current().id()) {
            bar.finish_and_clear();
        }
    }
}

impl Bars {
    /// Runs `f` (which writes to stderr) with the bars cleared, drawing them again after.
    pub fn suspend<T>(&self, f: impl FnOnce() -> T) -> T {
        self.bars.suspend(f)
    }
}

/// A step that failed before its end leaves no bar drawn.
impl Drop for Bars {
    fn drop(&mut self) {
        for (_, bar) in self.running.get_mut().unwrap().drain() {
            bar.finish_and_clear();
        }
    }
}
