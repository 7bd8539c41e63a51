//! Ctrl-C and SIGTERM: a command that is writing an artifact, a checkpoint or a cache entry leaves
//! its temporaries behind when a signal ends it (an artifact's can hold gigabytes, found and
//! removed only by the next write into the same directory). A thread of its own waits for either
//! signal, removes every temporary in progress and exits as the signal would have: 128 + its number.
//! `g4c serve` handles both itself (it drains its requests), so it does not take this; `g4c chat`
//! on a terminal takes Ctrl-C during a reply to stop that reply.

use signal_hook::consts::{SIGINT, SIGTERM};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

pub fn remove_temporaries_on_signal() {
    handle_signals(|_| false);
}

/// Ctrl-C while `replying` is set sets `stop` (the reply stops, the conversation goes on); at any
/// other time, and SIGTERM always, ends the program as `remove_temporaries_on_signal` does.
pub fn stop_replies_on_ctrl_c(replying: Arc<AtomicBool>, stop: Arc<AtomicBool>) {
    handle_signals(move |signal| {
        let taken = signal == SIGINT && replying.load(Ordering::SeqCst);
        if taken {
            stop.store(true, Ordering::SeqCst);
        }
        taken
    });
}

/// Waits for SIGINT and SIGTERM on a thread of its own; each goes to `take` first, and one it
/// does not take ends the program.
fn handle_signals(mut take: impl FnMut(i32) -> bool + Send + 'static) {
    let Ok(mut signals) = signal_hook::iterator::Signals::new([SIGINT, SIGTERM]) else {
        // Without the handler a signal still ends the process; the next writer cleans up.
        return;
    };
    std::thread::spawn(move || {
        for signal in signals.forever() {
            if take(signal) {
                continue;
            }
            let removed = g4c_util::atomic::remove_in_progress();
            // On a terminal, on a new line: it echoed `^C` after whatever was printed last.
            use std::io::IsTerminal;
            let newline = if std::io::stderr().is_terminal() { "\n" } else { "" };
            match removed.len() {
                0 => eprintln!("{newline}g4c: interrupted"),
                1 => eprintln!("{newline}g4c: interrupted; 1 unfinished file removed"),
                n => eprintln!("{newline}g4c: interrupted; {n} unfinished files removed"),
            }
            // `_exit`, as the signal itself would end it: no atexit handlers, whose teardown (a
            // PJRT plugin's, the CUDA driver's) may wait for the threads still running.
            signal_hook::low_level::exit(128 + signal);
        }
    });
}
