//! `cargo bench --bench structured_output`: what structured output costs (`g4c_runtime::constraint`)
//! on a vocabulary of Gemma 4's size (262,144 tokens: the 256 bytes, then made-up pieces of 2 to 8
//! characters of the kinds JSON is written in): indexing the vocabulary (once per model: at serve's
//! first structured request, at each `run --json-schema`), compiling a JSON schema (once per request),
//! and the mask and advance of each token, over a JSON text spelled byte by byte.

use g4c_frontend::TokenBytes;
use g4c_runtime::constraint::{Grammar, Grammars};
use std::time::Instant;

const VOCAB: usize = 262_144;

/// The vocabulary: id 0 the EOS, ids 1..=256 the bytes, then pseudo-random pieces.
fn vocabulary() -> Vec<TokenBytes> {
    let alphabet = b" abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789{}[]\":,.-_'";
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = |n: usize| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % n as u64) as usize
    };
    let mut tokens = vec![TokenBytes::Special("<eos>".into())];
    tokens.extend((0..=255u8).map(|b| TokenBytes::Text(vec![b])));
    while tokens.len() < VOCAB {
        let len = 2 + next(7);
        tokens.push(TokenBytes::Text((0..len).map(|_| alphabet[next(alphabet.len())]).collect()));
    }
    tokens
}

fn main() {
    let tokens = vocabulary();
    let started = Instant::now();
    let grammars = Grammars::new(&tokens, VOCAB, 0).expect("indexes");
    println!("index a vocabulary of {VOCAB} tokens: {:.2} s", started.elapsed().as_secs_f64());
    let schema = serde_json::json!({"type": "object", "properties": {
        "name": {"type": "string"}, "age": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string"}}
    }, "required": ["name", "age", "tags"]});
    let started = Instant::now();
    let mut constraint = grammars.constraint(&Grammar::JsonSchema(schema), &[0]).expect("compiles");
    println!("compile a JSON schema: {:.1} ms", started.elapsed().as_secs_f64() * 1e3);
    let text = br#"{"name": "Alice Smith", "age": 42, "tags": ["x", "y"]}"#;
    let mut logits = vec![0f32; VOCAB];
    let started = Instant::now();
    for &byte in text {
        logits.fill(0.0);
        constraint.mask(&mut logits).expect("masks");
        constraint.consume(byte as u32 + 1).expect("the text follows the schema");
    }
    let per_token = started.elapsed().as_secs_f64() / text.len() as f64;
    println!("mask and advance: {:.3} ms per token ({} tokens)", per_token * 1e3, text.len());
}
