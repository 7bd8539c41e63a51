//! Generated tokens streamed to stdout as they come (`run`, `chat`).

use g4c_frontend::{TextStream, TextTokenizer};
use std::io::Write;

/// Streams generated tokens to stdout: text when there is a tokenizer, else ids.
pub struct StreamPrinter<'t> {
    text: Option<TextStream<&'t TextTokenizer>>,
    enabled: bool,
    printed: usize,
}

impl<'t> StreamPrinter<'t> {
    pub fn new(tokenizer: Option<&'t TextTokenizer>, enabled: bool) -> Self {
        StreamPrinter { text: tokenizer.map(TextTokenizer::stream), enabled, printed: 0 }
    }

    pub fn push(&mut self, token: u32) {
        if !self.enabled {
            return;
        }
        let mut out = std::io::stdout().lock();
        match &mut self.text {
            Some(stream) => {
                if let Ok(Some(new)) = stream.push(token) {
                    let _ = write!(out, "{new}");
                }
            }
            None => {
                let _ = write!(out, "{}{token}", if self.printed > 0 { " " } else { "" });
            }
        }
        self.printed += 1;
        let _ = out.flush();
    }

    pub fn finish(&self) {
        if self.enabled {
            // A reader gone (`| head`) is no error of ours.
            let _ = writeln!(std::io::stdout());
        }
    }
}
