//! A small word-level `tokenizer.json` for the tiny preset, so the demo prints words: ids 0–3 are
//! `<pad>`, `<eos>`, `<bos>`, `<unk>` (Gemma's numbering for the first three), the rest are made-up
//! syllable words.

use serde_json::json;

pub const SPECIAL: [&str; 4] = ["<pad>", "<eos>", "<bos>", "<unk>"];

/// The vocabulary: specials, then `vocab_size - 4` distinct words.
pub fn words(vocab_size: usize) -> Vec<String> {
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
    out
}

pub fn tokenizer_json(vocab_size: usize) -> serde_json::Value {
    let words = words(vocab_size);
    let vocab: serde_json::Map<String, serde_json::Value> =
        words.iter().enumerate().map(|(i, w)| (w.clone(), json!(i))).collect();
    let added: Vec<serde_json::Value> = SPECIAL
        .iter()
        .enumerate()
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
