//! A small word-level `tokenizer.json` for the tiny preset, so the demo prints words: ids 0–3 are
//! `<pad>`, `<eos>`, `<bos>`, `<unk>` (Gemma's numbering for the first three), the last five are
//! Gemma 4's turn markers and the chat roles its template writes (`CHAT_TEMPLATE`), the rest are
//! made-up syllable words.

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
