//! The checkpoint's `tokenizer.json`, through the `tokenizers` crate.

use crate::error::{FrontendError, Result};
use std::path::Path;

pub struct TextTokenizer {
    inner: tokenizers::Tokenizer,
    bos: Option<u32>,
}

impl TextTokenizer {
    /// Opens `DIR/tokenizer.json`; `Ok(None)` when the checkpoint has none.
    pub fn open(dir: &Path, bos: Option<u32>) -> Result<Option<TextTokenizer>> {
        let path = dir.join("tokenizer.json");
        if !path.exists() {
            return Ok(None);
        }
        let inner = tokenizers::Tokenizer::from_file(&path)
            .map_err(|e| FrontendError::Io { path: path.clone(), message: format!("cannot load tokenizer: {e}") })?;
        Ok(Some(TextTokenizer { inner, bos }))
    }

    /// Token ids of `text`, with BOS first: Gemma's tokenizer does not add it, and without it the model
    /// echoes the prompt (gemma4.md §6 item 13).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let enc = self
            .inner
            .encode(text, false)
            .map_err(|e| FrontendError::Invalid { message: format!("cannot tokenize the prompt: {e}") })?;
        Ok(self.bos.into_iter().chain(enc.get_ids().iter().copied()).collect())
    }

    /// Text of `ids`, special tokens skipped.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.inner.decode(ids, true).map_err(|e| FrontendError::Invalid { message: format!("cannot detokenize: {e}") })
    }
}
