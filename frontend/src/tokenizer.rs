//! The checkpoint's `tokenizer.json`, through the `tokenizers` crate.

use crate::error::{FrontendError, Result};
use std::ops::Deref;
use std::path::Path;

pub struct TextTokenizer {
    inner: tokenizers::Tokenizer,
    /// Where it was read from, for errors that come of its content.
    path: std::path::PathBuf,
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
        Ok(Some(TextTokenizer { inner, path, bos, eos }))
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
        let enc = (self.inner.encode(text, false))
            .map_err(|e| invalid(format!("cannot tokenize the prompt with {}: {e}", self.path.display())))?;
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

/// A vocabulary token as the text it stands for: its bytes (a byte-fallback token's one byte may be
/// part of a character), or a special token, which no text spells, by its name (`<turn|>`; empty
/// where the tokenizer has none).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TokenBytes {
    Text(Vec<u8>),
    Special(String),
}

impl TextTokenizer {
    /// Every token of the vocabulary as what it decodes to, for masks over the vocabulary
    /// (structured output). Known for tokenizers that decode as Gemma's does (byte-fallback tokens
    /// `<0xHH>`, and pieces with `▁` for a space); others are an error naming their decoder.
    pub fn vocabulary_bytes(&self) -> Result<Vec<TokenBytes>> {
        let decoder = serde_json::to_value(self.inner.get_decoder()).unwrap_or_default();
        let Some(space) = byte_fallback_space(&decoder) else {
            return Err(FrontendError::Invalid {
                message: format!(
                    "structured output needs a tokenizer that decodes as Gemma's (byte fallback, `▁` for a space); this tokenizer.json's decoder is {decoder}"
                ),
            });
        };
        let added = self.inner.get_added_tokens_decoder();
        let special = |id: u32| added.get(&id).is_some_and(|t| t.special);
        // Added tokens that are not special (HTML tags in Gemma's) are text, as decoding prints them.
        let bytes = |id: u32| match self.inner.id_to_token(id) {
            Some(piece) if !special(id) && !piece.is_empty() => match byte_fallback(&piece) {
                Some(byte) => TokenBytes::Text(vec![byte]),
                None => TokenBytes::Text(piece.replace(space, " ").into_bytes()),
            },
            piece => TokenBytes::Special(piece.unwrap_or_default()),
        };
        Ok((0..self.inner.get_vocab_size(true) as u32).map(bytes).collect())
    }
}

/// The character a byte-fallback decoder (one with `ByteFallback` and a `Replace` of a character by a
/// space, as tokenizer.json writes them) turns into a space; `None` for other decoders, and for one
/// that strips the text it decodes (Llama 2's drops the first space), whose tokens are not their text.
fn byte_fallback_space(decoder: &serde_json::Value) -> Option<char> {
    fn steps(decoder: &serde_json::Value) -> Vec<serde_json::Value> {
        match (decoder["type"].as_str(), decoder["decoders"].as_array()) {
            (Some("Sequence"), Some(inner)) => inner.iter().flat_map(steps).collect(),
            _ => vec![decoder.clone()],
        }
    }
    let steps = steps(decoder);
    if steps.iter().any(|d| d["type"] == "Strip") {
        return None;
    }
    let falls_back = steps.iter().any(|d| d["type"] == "ByteFallback");
    let space = steps.iter().find_map(|d| {
        let mut pattern = d["pattern"]["String"].as_str()?.chars();
        match (d["type"].as_str(), d["content"].as_str(), pattern.next(), pattern.next()) {
            (Some("Replace"), Some(" "), Some(c), None) => Some(c),
            _ => None,
        }
    });
    space.filter(|_| falls_back)
}

/// The byte a byte-fallback piece (`<0xE2>`) stands for.
fn byte_fallback(piece: &str) -> Option<u8> {
    let hex = piece.strip_prefix("<0x")?.strip_suffix('>')?;
    (hex.len() == 2).then(|| u8::from_str_radix(hex, 16).ok()).flatten()
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

/// The most bytes a UTF-8 character has.
const MAX_CHAR_BYTES: usize = 4;

impl<T: Deref<Target = TextTokenizer>> TextStream<T> {
    pub fn new(tokenizer: T) -> TextStream<T> {
        TextStream { tokenizer, ids: vec![], prefix: 0, read: 0 }
    }

    /// The new text `id` completes, if any.
    pub fn push(&mut self, id: u32) -> Result<Option<String>> {
        self.ids.push(id);
        let given = self.tokenizer.decode(&self.ids[self.prefix..self.read])?;
        let text = self.tokenizer.decode(&self.ids[self.prefix..])?;
        // A character of up to 4 bytes may still be coming, one byte-fallback token each; past that
        // the bytes are no UTF-8 and come out as U+FFFD, as decoding gives them.
        let completing = text.ends_with('\u{FFFD}') && self.ids.len() - self.read < MAX_CHAR_BYTES;
        if text.len() <= given.len() || completing {
            return Ok(None);
        }
        let new = match text.strip_prefix(given.as_str()) {
            Some(new) => new.to_string(),
            // Bytes that are no UTF-8 turn the byte tokens decoded with them into U+FFFD too, text
            // already given among them: the new tokens' text is theirs alone.
            None => self.tokenizer.decode(&self.ids[self.read..])?,
        };
        self.prefix = self.read;
        self.read = self.ids.len();
        Ok(Some(new))
    }
}

#[cfg(test)]
mod tests {
    use super::{TextTokenizer, TokenBytes};

    fn synthetic(json: serde_json::Value) -> TextTokenizer {
        let inner = tokenizers::Tokenizer::from_bytes(json.to_string().as_bytes()).unwrap();
        TextTokenizer { inner, path: "tokenizer.json".into(), bos: Some(2), eos: Some(1) }
    }

    /// Bytes that are no UTF-8 (random weights pick them) come out as U+FFFD, as decoding gives them,
    /// and the text after them streams on.
    #[test]
    fn streamed_text_goes_on_past_bytes_that_are_no_utf8() {
        let tokenizer = synthetic(crate::synth::byte_tokenizer_json(512));
        let ids: Vec<u32> = vec![113, 113, 257, 247, 91, 474, 79, 403, 171, 0, 483, 119];
        let mut stream = tokenizer.stream();
        let streamed: String = ids.iter().filter_map(|&id| stream.push(id).unwrap()).collect();
        // `m` and `m` (ids 113) are byte tokens given before the bytes that are no UTF-8 came, which
        // decoded together with them would turn them into U+FFFD too.
        assert_eq!(streamed, format!("mm{}", tokenizer.decode(&ids[2..]).unwrap()));
        assert!(streamed.ends_with(" libas") && streamed.contains('\u{FFFD}'), "{streamed}");
        // A character of bytes split over tokens comes out whole: `é` is 0xC3 0xA9.
        let mut stream = tokenizer.stream();
        let e_acute: String = [4 + 0xC3, 4 + 0xA9].iter().filter_map(|&id| stream.push(id).unwrap()).collect();
        assert_eq!(e_acute, "é");
    }

    /// The bytes of a text's tokens, joined, are the text's: what a mask over the vocabulary
    /// (structured output) takes each token for is what decoding gives.
    #[test]
    fn vocabulary_bytes_spell_what_encoding_splits() {
        let tokenizer = synthetic(crate::synth::byte_tokenizer_json(512));
        let bytes = tokenizer.vocabulary_bytes().unwrap();
        assert_eq!(bytes.len(), 512);
        let text = "{\"é\": [1, true]} ba";
        let ids = tokenizer.encode_continuation(text).unwrap();
        assert!(ids.len() > 10 && ids.contains(&(4 + 0xC3)), "é by its bytes: {ids:?}");
        let spelled: Vec<u8> = ids
            .iter()
            .flat_map(|&id| match &bytes[id as usize] {
                TokenBytes::Text(b) => b.clone(),
                TokenBytes::Special(name) => panic!("{id} is special: {name}"),
            })
            .collect();
        assert_eq!(String::from_utf8(spelled).unwrap(), text);
        let turn_end = tokenizer.turn_end().unwrap() as usize;
        assert_eq!(
            (&bytes[1], &bytes[turn_end]),
            (&TokenBytes::Special("<eos>".into()), &TokenBytes::Special("<turn|>".into()))
        );
        // Llama 2's decoder strips the text's first space, which no token's bytes can say.
        let mut stripping = crate::synth::byte_tokenizer_json(512);
        stripping["decoder"]["decoders"].as_array_mut().unwrap().push(serde_json::json!(
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}));
        assert!(synthetic(stripping).vocabulary_bytes().is_err());
        let word_level = synthetic(crate::synth::tokenizer_json(64)).vocabulary_bytes().unwrap_err().to_string();
        assert!(word_level.contains("decodes as Gemma's") && word_level.contains("null"), "{word_level}");
    }

    #[test]
    fn streamed_text_is_the_decoded_text() {
        let json = crate::synth::tokenizer_json(64).to_string();
        let inner = tokenizers::Tokenizer::from_bytes(json.as_bytes()).unwrap();
        let tokenizer = TextTokenizer { inner, path: "tokenizer.json".into(), bos: Some(2), eos: Some(1) };
        let ids: Vec<u32> = vec![2, 10, 11, 1, 12, 40, 41, 42, 0, 13];
        let mut stream = tokenizer.stream();
        let streamed: String = ids.iter().filter_map(|&id| stream.push(id).unwrap()).collect();
        assert_eq!(streamed, tokenizer.decode(&ids).unwrap());
    }
}
