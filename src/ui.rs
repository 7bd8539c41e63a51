//! What the CLI tells the user besides its output: warnings (always), progress bars and step notes
//! (unless `--quiet`), details (with `-v`). Progress bars are drawn only when stderr is a terminal, so
//! piped and logged runs stay clean.

use g4c_driver::Feedback;
use g4c_runtime::backend::pjrt::{CompileEvent, Provenance};
use g4c_runtime::cache::Miss;
use g4c_runtime::{Progress, Unit};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::sync::{Mutex, OnceLock};

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
        Bars { hidden: self.quiet, bar: Mutex::new(None) }
    }

    /// Tells the user what happened to an entry point's executable: corrupt cache entries and
    /// executables that could not be cached always, a compile for another environment as a note,
    /// the rest with `-v`.
    pub fn compile_event(&self, event: &CompileEvent) {
        for corrupt in &event.corrupt {
            self.warn(&format!("{corrupt}; compiling @{} again", event.entry));
        }
        if let Some(error) = &event.not_stored {
            self.warn(&format!("@{} was compiled but not cached: {error}", event.entry));
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
    let on_compile = |e: &CompileEvent| ui().compile_event(e);
    f(&Feedback { progress: &bars, on_compile: &on_compile })
}

/// Progress bars on stderr (indicatif hides them when stderr is not a terminal).
pub struct Bars {
    hidden: bool,
    bar: Mutex<Option<ProgressBar>>,
}

impl Progress for Bars {
    fn begin(&self, what: &str, total: u64, unit: Unit) {
        let target = if self.hidden { ProgressDrawTarget::hidden() } else { ProgressDrawTarget::stderr() };
        let template = match unit {
            Unit::Bytes => "{msg:>18} [{bar:30}] {bytes}/{total_bytes} ({bytes_per_sec}, {eta})",
            Unit::Items => "{msg:>18} [{bar:30}] {pos}/{len} ({elapsed})",
        };
        let style = ProgressStyle::with_template(template).expect("valid template").progress_chars("=> ");
        let bar = ProgressBar::with_draw_target(Some(total), target).with_style(style).with_message(what.to_string());
        bar.enable_steady_tick(std::time::Duration::from_millis(200));
        *self.bar.lock().unwrap() = Some(bar);
    }

    fn advance(&self, done: u64) {
        if let Some(bar) = &*self.bar.lock().unwrap() {
            bar.inc(done);
        }
    }

    fn end(&self) {
        if let Some(bar) = self.bar.lock().unwrap().take() {
            bar.finish_and_clear();
        }
    }
}
