//! Generated ids to released text, with stop strings: text is released as it becomes printable,
//! except a tail that could still grow into a stop string (held back until it cannot); a stop string
//! ends the text before it, as in OpenAI's API and vLLM.

use g4c_frontend::{TextStream, TextTokenizer};
use std::sync::Arc;

/// Which strings end the text, and how.
#[derive(Clone, Debug, Default)]
pub struct StopStrings {
    pub stops: Vec<String>,
    /// Tokens that come before a stop string counts (vLLM's `min_tokens`).
    pub min_tokens: usize,
    /// The text keeps the stop string that ended it (vLLM's `include_stop_str_in_output`).
    pub keep: bool,
}

pub struct StopText {
    stream: Option<TextStream<Arc<TextTokenizer>>>,
    rule: StopStrings,
    text: String,
    /// Bytes of `text` released so far.
    released: usize,
    /// The stop string generated, once one is (nothing after it is text).
    stopped: Option<String>,
    /// Tokens pushed so far.
    pushed: usize,
}

impl StopText {
    /// Text from `tokenizer` (none: no text, only ids) ending at the first of `rule`'s stops that
    /// ends in the text of a token after its first `min_tokens`.
    pub fn new(tokenizer: Option<Arc<TextTokenizer>>, rule: StopStrings) -> StopText {
        let stream = tokenizer.map(TextStream::new);
        StopText { stream, rule, text: String::new(), released: 0, stopped: None, pushed: 0 }
    }

    /// Whether a stop string has been generated (nothing after it is text).
    pub fn stopped(&self) -> bool {
        self.stopped.is_some()
    }

    /// The stop string generated, if one was.
    pub fn stop_string(&self) -> Option<&str> {
        self.stopped.as_deref()
    }

    /// Adds generated token `id`; returns the text it releases (possibly empty).
    pub fn push(&mut self, id: u32) -> Result<String, String> {
        let Some(stream) = self.stream.as_mut() else { return Ok(String::new()) };
        if self.stopped.is_some() {
            return Ok(String::new());
        }
        self.pushed += 1;
        let Some(piece) = stream.push(id).map_err(|e| e.to_string())? else { return Ok(String::new()) };
        // A stop string may begin in text held back before this piece.
        let from = self.released;
        self.text += &piece;
        let stops = &self.rule.stops;
        // As vLLM: a stop string counts once it ends in a token after the first `min_tokens`.
        let counts = self.pushed > self.rule.min_tokens;
        let found = stops.iter().filter_map(|s| self.text[from..].find(s.as_str()).map(|i| (from + i, s)));
        if let Some((at, stop)) = found.filter(|_| counts).min_by_key(|&(at, _)| at) {
            let end = if self.rule.keep { at + stop.len() } else { at };
            self.stopped = Some(stop.clone());
            self.text.truncate(end);
            return Ok(self.release(end));
        }
        let held = stops.iter().map(|s| partial_suffix(&self.text[from..], s)).max().unwrap_or(0);
        Ok(self.release(self.text.len() - held))
    }

    /// The text held back, once no token follows.
    pub fn finish(&mut self) -> String {
        self.release(self.text.len())
    }

    fn release(&mut self, upto: usize) -> String {
        let out = self.text[self.released..upto].to_string();
        self.released = upto;
        out
    }
}

/// The length of the longest suffix of `text` that is a proper prefix of `stop`.
fn partial_suffix(text: &str, stop: &str) -> usize {
    (1..stop.len().min(text.len() + 1))
        .rev()
        .find(|&k| stop.is_char_boundary(k) && text.ends_with(&stop[..k]))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::{partial_suffix, StopStrings, StopText};
    use g4c_frontend::TextTokenizer;
    use std::sync::Arc;

    fn tokenizer() -> Arc<TextTokenizer> {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("tokenizer.json"), g4c_frontend::synth::tokenizer_json(64).to_string()).unwrap();
        Arc::new(TextTokenizer::open(dir.path(), Some(2), Some(1)).unwrap().unwrap())
    }

    /// Releases `words` one token each; returns what was released and whether it stopped.
    fn run(stops: &[&str], words: &[&str]) -> (String, bool) {
        run_with(StopStrings { stops: stops.iter().map(|s| s.to_string()).collect(), ..Default::default() }, words)
    }

    fn run_with(rule: StopStrings, words: &[&str]) -> (String, bool) {
        let t = tokenizer();
        let mut text = StopText::new(Some(t.clone()), rule);
        let mut out = String::new();
        for w in words {
            out += &text.push(t.token_id(w).unwrap()).unwrap();
        }
        out += &text.finish();
        (out, text.stopped())
    }

    #[test]
    fn text_ends_before_the_first_stop_string_even_across_tokens() {
        assert_eq!(run(&[], &["ba", "be", "bi"]), ("ba be bi".into(), false));
        assert_eq!(run(&["be"], &["ba", "be", "bi"]), ("ba ".into(), true));
        // "a b" spans the end of one token and the start of the next.
        assert_eq!(run(&["a b"], &["ba", "be", "bi"]), ("b".into(), true));
        assert_eq!(run(&["zz", "e b"], &["ba", "be", "bi"]), ("ba b".into(), true));
        assert_eq!(run(&["bax"], &["ba", "be"]), ("ba be".into(), false), "a partial match is released at the end");
    }

    #[test]
    fn a_stop_string_can_be_kept_and_counts_only_after_the_least_number_of_tokens() {
        let rule = |stop: &str, min_tokens, keep| StopStrings { stops: vec![stop.into()], min_tokens, keep };
        let words = ["ba", "be", "bi", "bo"];
        assert_eq!(run_with(rule("e b", 0, true), &words), ("ba be b".into(), true));
        assert_eq!(run_with(rule("bi", 3, false), &words), ("ba be bi bo".into(), false), "ends in the 3rd token");
        assert_eq!(run_with(rule("bi", 2, false), &words), ("ba be ".into(), true), "ends in the 3rd, after 2");
        // Begun in the 3rd token's text, ended in the 4th's: it counts after 3.
        assert_eq!(run_with(rule("i b", 3, false), &words), ("ba be b".into(), true));
    }

    #[test]
    fn held_back_text_is_a_partial_stop_string() {
        assert_eq!(partial_suffix("ab", "bc"), 1);
        assert_eq!(partial_suffix("ab", "abc"), 2);
        assert_eq!(partial_suffix("ab", "ab"), 0, "a whole stop string is found, not held");
        assert_eq!(partial_suffix("aé", "éx"), 2);
        assert_eq!(partial_suffix("", "x"), 0);
    }
}
