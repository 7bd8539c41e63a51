//! A small word-level `tokenizer.json` for the tiny preset, so the demo prints words: ids 0–3 are
//! `<pad>`, `<eos>`, `<bos>`, `<unk>` (Gemma's numbering for the first three), the last five are
//! Gemma 4's turn markers and the chat roles its template writes (`CHAT_TEMPLATE`), the rest are
//! made-up syllable words. `byte_tokenizer_json` is one of Gemma's kind (byte fallback) over the same
//! special tokens, which can spell any text: for structured output, whose grammars need that.

use serde_json::json;

pub const SPECIAL: [&str; 4] = ["<pad>", "<eos>", "<bos>", "<unk>"];

/// Gemma 4's turn markers (special tokens), then the role names its chat template writes.
const CHAT: [(&str, bool); 5] =
    [("<|turn>", true), ("<turn|>", true), ("system", false), ("user", false), ("model", false)];

/// A chat template in the form of Gemma 4's (`<|turn>ROLE\n…<turn|>\n`, the reply's turn opened at
/// the end, BOS first; `assistant` is written `model`), over the tokens above.
pub const CHAT_TEMPLATE: &str = "{{ bos_token }}{% for message in messages %}<|turn>\
{{ 'model' if message.role == 'assistant' else message.role }}\n{{ message.content | trim }}<turn|>\n\
{% endfor %}{% if add_generation_prompt %}<|turn>model\n{% endif %}";

/// The vocabulary: specials, then `vocab_size - 9` distinct words, then the chat tokens.
pub fn words(vocab_size: usize) -> Vec<String> {
    let vocab_size = vocab_size - CHAT.len();
    const ONSETS: [&str; 16] = ["b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "sh", "th"];
    const VOWELS: [&str; 6] = ["a", "e", "i", "o", "u", "ai"];
    let syllables: Vec<String> = ONSETS.iter().flat_map(|o| VOWELS.iter().map(move |v| format!("{o}{v}"))).collect();
    let mut out: Vec<String> = SPECIAL.iter().map(|s| s.to_string()).collect();
    let mut i = 0usize;
    while out.len() < vocab_size {
        let a = &syllables[i % syllables.len()];
        let word = if i < syllables.len() {
            a.clone()
        } else {
            format!("{a}{}", syllables[(i / syllables.len() - 1) % syllables.len()])
        };
        if !out.contains(&word) {
            out.push(word);
        }
        i += 1;
    }
    out.extend(CHAT.iter().map(|(t, _)| t.to_string()));
    out
}

pub fn tokenizer_json(vocab_size: usize) -> serde_json::Value {
    let words = words(vocab_size);
    let vocab: serde_json::Map<String, serde_json::Value> =
        words.iter().enumerate().map(|(i, w)| (w.clone(), json!(i))).collect();
    let specials = SPECIAL.iter().enumerate().map(|(i, s)| (i, *s));
    let turns = CHAT.iter().enumerate().filter(|(_, (_, special))| *special);
    let turns = turns.map(|(i, (s, _))| (vocab_size - CHAT.len() + i, *s));
    let added: Vec<serde_json::Value> = specials
        .chain(turns)
        .map(|(i, s)| {
            json!({"id": i, "content": s, "single_word": false, "lstrip": false, "rstrip": false,
                   "normalized": false, "special": true})
        })
        .collect();
    json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": null,
        "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"}
    })
}

/// A tokenizer of Gemma's kind (BPE with byte fallback, `▁` for a space, no merges) for the tiny
/// preset's vocabulary size: the specials and chat tokens where `tokenizer_json` has them, the 256
/// byte tokens `<0x00>`…`<0xFF>`, the printable ASCII characters, then `▁`-led syllable words
/// (which encoding never makes, as it has no merges, but the model may pick).
pub fn byte_tokenizer_json(vocab_size: usize) -> serde_json::Value {
    let bytes = (0..=255u8).map(|b| format!("<0x{b:02X}>"));
    let ascii = (b' '..=b'~').map(|c| if c == b' ' { "\u{2581}".to_string() } else { (c as char).to_string() });
    let mut pieces: Vec<String> = SPECIAL.iter().map(|s| s.to_string()).chain(bytes).chain(ascii).collect();
    let fillers = words(vocab_size).into_iter().skip(SPECIAL.len()).map(|w| format!("\u{2581}{w}"));
    pieces.extend(fillers.take(vocab_size - CHAT.len() - pieces.len()));
    pieces.extend(CHAT.iter().map(|(t, _)| t.to_string()));
    let vocab: serde_json::Map<String, serde_json::Value> =
        pieces.iter().enumerate().map(|(i, p)| (p.clone(), json!(i))).collect();
    let mut tokenizer = tokenizer_json(vocab_size);
    tokenizer["normalizer"] = json!({"type": "Replace", "pattern": {"String": " "}, "content": "\u{2581}"});
    tokenizer["pre_tokenizer"] = serde_json::Value::Null;
    tokenizer["decoder"] = json!({"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": "\u{2581}"}, "content": " "},
        {"type": "ByteFallback"},
        {"type": "Fuse"}
    ]});
    tokenizer["model"] = json!({"type": "BPE", "dropout": null, "unk_token": "<unk>",
        "continuing_subword_prefix": null, "end_of_word_suffix": null, "fuse_unk": true,
        "byte_fallback": true, "ignore_merges": false, "vocab": vocab, "merges": []});
    tokenizer
}
