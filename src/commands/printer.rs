//! Generated tokens streamed to stdout as they come (`run`, `chat`).

use g4c_frontend::{TextStream, TextTokenizer};
use std::io::Write;

/// Streams generated tokens to stdout: text when there is a tokenizer, else ids.
pub struct StreamPrinter<'t> {
    text: Option<TextStream<&'t TextTokenizer>>,
    enabled: bool,
    printed: usize,
    /// The first write that failed (stdout full, a device that refuses it): printing stops there
    /// and `finish` reports it.
    failed: Option<std::io::Error>,
}

impl<'t> StreamPrinter<'t> {
    pub fn new(tokenizer: Option<&'t TextTokenizer>, enabled: bool) -> Self {
        StreamPrinter { text: tokenizer.map(TextTokenizer::stream), enabled, printed: 0, failed: None }
    }

    pub fn push(&mut self, token: u32) {
        if !self.enabled || self.failed.is_some() {
            return;
        }
        let mut out = std::io::stdout().lock();
        let written = match &mut self.text {
            Some(stream) => match stream.push(token) {
                Ok(Some(new)) => write!(out, "{new}"),
                _ => Ok(()),
            },
            None => write!(out, "{}{token}", if self.printed > 0 { " " } else { "" }),
        };
        self.printed += 1;
        self.failed = written.and_then(|()| out.flush()).err();
    }

    /// Ends the line; an error if a write failed, but for a reader gone (`| head`), which is no
    /// error of ours.
    pub fn finish(self) -> anyhow::Result<()> {
        if !self.enabled {
            return Ok(());
        }
        let failed = self.failed.or_else(|| writeln!(std::io::stdout()).err());
        match failed {
            Some(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(anyhow::anyhow!("writing to stdout: {e}")),
            _ => Ok(()),
        }
    }
}
