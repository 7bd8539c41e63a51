//! The checkpoint's `tokenizer.json`, through the `tokenizers` crate.

use crate::error::{FrontendError, Result};
use std::ops::Deref;
use std::path::Path;

pub struct TextTokenizer {
    inner: tokenizers::Tokenizer,
    bos: Option<u32>,
    eos: Option<u32>,
}

impl TextTokenizer {
    /// Opens `DIR/tokenizer.json`; `Ok(None)` when the checkpoint has none.
    pub fn open(dir: &Path, bos: Option<u32>, eos: Option<u32>) -> Result<Option<TextTokenizer>> {
        let path = dir.join("tokenizer.json");
        if !path.exists() {
            return Ok(None);
        }
        let cannot = |message: String| FrontendError::Io {
            path: path.clone(),
            message: format!("cannot load tokenizer: {message}"),
        };
        g4c_util::files::regular(&path).map_err(|e| cannot(e.to_string()))?;
        let inner = tokenizers::Tokenizer::from_file(&path).map_err(|e| cannot(e.to_string()))?;
        Ok(Some(TextTokenizer { inner, bos, eos }))
    }

    /// Token ids of `text`, with BOS first: Gemma's tokenizer does not add it, and without it the model
    /// echoes the prompt (gemma4.md §6 item 13); text that already starts with it (a rendered chat
    /// template) keeps one. Special tokens written in the text (`<bos>`, turn markers) are those
    /// tokens. Empty text, and text the vocabulary cannot spell (it would silently become the
    /// unknown token), are errors.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let ids = self.encode_continuation(text)?;
        let bos = self.bos.filter(|&b| ids.first() != Some(&b));
        Ok(bos.into_iter().chain(ids).collect())
    }

    /// The ids of `text` that continues tokens before it (a conversation's next turn): as `encode`,
    /// without a BOS.
    pub fn encode_continuation(&self, text: &str) -> Result<Vec<u32>> {
        let invalid = |message: String| FrontendError::Invalid { message };
        if text.trim().is_empty() {
            return Err(invalid("the prompt text is empty".into()));
        }
        let enc = self.inner.encode(text, false).map_err(|e| invalid(format!("cannot tokenize the prompt: {e}")))?;
        if let Some((unk, unk_id)) = ["<unk>", "[UNK]"].iter().find_map(|&u| Some((u, self.inner.token_to_id(u)?))) {
            for (&id, &(start, end)) in enc.get_ids().iter().zip(enc.get_offsets()) {
                let piece = text.get(start..end).unwrap_or("");
                if id == unk_id && piece != unk {
                    return Err(invalid(format!(
                        "the prompt's `{piece}` is not in the vocabulary (bytes {start}..{end} of the text tokenized, a chat's as its template renders it); it would become {unk}"
                    )));
                }
            }
        }
        Ok(enc.get_ids().to_vec())
    }

    pub fn bos(&self) -> Option<u32> {
        self.bos
    }

    pub fn eos(&self) -> Option<u32> {
        self.eos
    }

    /// The text of token `id` in the vocabulary (`<bos>`), if it has one.
    pub fn token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// The id of token `text` in the vocabulary, if it is one.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.inner.token_to_id(text)
    }

    /// The token that ends a chat turn, where the vocabulary has one: Gemma 4's `<turn|>`
    /// (earlier Gemmas' `<end_of_turn>`).
    pub fn turn_end(&self) -> Option<u32> {
        ["<turn|>", "<end_of_turn>"].iter().find_map(|m| self.token_id(m))
    }

    /// Text of `ids`, special tokens skipped.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.inner.decode(ids, true).map_err(|e| FrontendError::Invalid { message: format!("cannot detokenize: {e}") })
    }
}

impl TextTokenizer {
    /// Text of ids given one at a time, as it becomes printable (`TextStream`).
    pub fn stream(&self) -> TextStream<&TextTokenizer> {
        TextStream::new(self)
    }
}

/// Detokenizes a growing sequence in constant work per token: only the ids since the last text it
/// gave are decoded, with a few before them for context (a token's text can depend on the one
/// before it, e.g. a leading space), and text is given only once it no longer ends in an incomplete
/// character (multi-token characters come out whole). As vLLM and transformers' streamers do. It
/// holds the tokenizer by reference or by `Arc` (a server's request outlives no borrow).
pub struct TextStream<T: Deref<Target = TextTokenizer>> {
    tokenizer: T,
    ids: Vec<u32>,
    /// Where the decoded window starts, and where the text given so far ends.
    prefix: usize,
    read: usize,
}

impl<T: Deref<Target = TextTokenizer>> TextStream<T> {
    pub fn new(tokenizer: T) -> TextStream<T> {
        TextStream { tokenizer, ids: vec![], prefix: 0, read: 0 }
    }

    /// The new text `id` completes, if any.
    pub fn push(&mut self, id: u32) -> Result<Option<String>> {
        self.ids.push(id);
        let given = self.tokenizer.decode(&self.ids[self.prefix..self.read])?;
        let text = self.tokenizer.decode(&self.ids[self.prefix..])?;
        if text.len() <= given.len() || text.ends_with('\u{FFFD}') || !text.is_char_boundary(given.len()) {
            return Ok(None);
        }
        self.prefix = self.read;
        self.read = self.ids.len();
        Ok(Some(text[given.len()..].to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::TextTokenizer;

    #[test]
    fn streamed_text_is_the_decoded_text() {
        let json = crate::synth::tokenizer_json(64).to_string();
        let inner = tokenizers::Tokenizer::from_bytes(json.as_bytes()).unwrap();
        let tokenizer = TextTokenizer { inner, bos: Some(2), eos: Some(1) };
        let ids: Vec<u32> = vec![2, 10, 11, 1, 12, 40, 41, 42, 0, 13];
        let mut stream = tokenizer.stream();
        let streamed: String = ids.iter().filter_map(|&id| stream.push(id).unwrap()).collect();
        assert_eq!(streamed, tokenizer.decode(&ids).unwrap());
    }
}
