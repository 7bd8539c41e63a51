//! Structured output: a sequence's text kept to a grammar (a JSON schema, a regular expression, a
//! choice of strings, a Lark grammar), as vLLM's and llama.cpp's servers keep it with llguidance.
//! Before each pick, every token that cannot continue text the grammar allows has its logit set to
//! -inf; where the grammar may end, the sequence's own ends (EOS, its stop tokens) are allowed, and
//! once the grammar is complete, nothing else is. Special tokens are no text: only a Lark grammar
//! names them (`<turn|>`).

use crate::error::{Result, RuntimeError};
use g4c_frontend::{TextTokenizer, TokenBytes};
use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use std::sync::Arc;
use toktrie::{ApproximateTokEnv, TokRxInfo, TokTrie};

/// What a sequence's text must match.
#[derive(Clone, Debug, PartialEq)]
pub enum Grammar {
    /// A JSON value this JSON schema accepts (`{"type": "object"}`: any object, OpenAI's `json_object`).
    JsonSchema(serde_json::Value),
    /// A regular expression (Rust's `regex` syntax) the whole text matches.
    Regex(String),
    /// Exactly one of these strings.
    Choice(Vec<String>),
    /// A grammar in llguidance's Lark syntax.
    Lark(String),
}

impl Grammar {
    fn top_level(&self) -> std::result::Result<TopLevelGrammar, String> {
        Ok(match self {
            Grammar::JsonSchema(schema) => TopLevelGrammar::from_json_schema(formatted(schema)),
            Grammar::Regex(regex) => TopLevelGrammar::from_regex(regex),
            Grammar::Choice(choices) if choices.is_empty() => return Err("no choice to make".into()),
            Grammar::Choice(choices) => {
                let escaped: Vec<String> = choices.iter().map(|c| regex::escape(c)).collect();
                TopLevelGrammar::from_regex(&format!("(?:{})", escaped.join("|")))
            }
            Grammar::Lark(lark) => TopLevelGrammar::from_lark(lark.clone()),
        })
    }
}

/// `schema` with JSON written one way, as Python's `json.dumps` writes it (`, ` and `: `, no other
/// whitespace), unless it says how (llguidance's `x-guidance`): where any whitespace is allowed, a
/// model may write it forever and never end the value. `oneOf` is taken as `anyOf` (llguidance
/// refuses it otherwise), as Pydantic's tagged unions need.
fn formatted(schema: &serde_json::Value) -> serde_json::Value {
    let mut schema = match schema {
        serde_json::Value::Bool(true) => serde_json::json!({}),
        other => other.clone(),
    };
    if let Some(object) = schema.as_object_mut() {
        object.entry("x-guidance").or_insert_with(|| {
            serde_json::json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": ",
                               "coerce_one_of": true})
        });
    }
    schema
}

/// Grammars compiled against one model's vocabulary. Made once per model: indexing a vocabulary of
/// 262,144 tokens takes a moment.
pub struct Grammars {
    factory: ParserFactory,
    /// The id the grammar's end stands for (any of a sequence's ends is allowed where it is).
    eos: u32,
}

impl Grammars {
    /// For a model of `vocab` logits whose tokens are `tokens` (ids past them are special tokens
    /// named `<[ID]>`) and whose end of sequence is `eos`.
    pub fn new(tokens: &[TokenBytes], vocab: usize, eos: u32) -> std::result::Result<Grammars, String> {
        if eos as usize >= vocab {
            return Err(format!("the end-of-sequence id {eos} is outside the vocabulary (0..{vocab})"));
        }
        // A special token is its name after toktrie's marker byte, which no text contains.
        let special = |name: &str| [&[TokTrie::SPECIAL_TOKEN_MARKER][..], name.as_bytes()].concat();
        let words: Vec<Vec<u8>> = (0..vocab)
            .map(|id| match tokens.get(id) {
                Some(TokenBytes::Text(bytes)) => bytes.clone(),
                Some(TokenBytes::Special(name)) if !name.is_empty() => special(name),
                _ => special(&format!("<[{id}]>")),
            })
            .collect();
        let info = TokRxInfo::new(vocab as u32, eos);
        let env = Arc::new(ApproximateTokEnv::new(TokTrie::from(&info, &words)));
        let mut factory = ParserFactory::new_simple(&(env as toktrie::TokEnv)).map_err(one_line)?;
        // A grammar's warnings are not the server's log.
        factory.quiet();
        Ok(Grammars { factory, eos })
    }

    /// For a model of `vocab` logits with `tokenizer`'s vocabulary, ending at the first of `eos_ids`.
    pub fn of_tokenizer(
        tokenizer: &TextTokenizer,
        vocab: usize,
        eos_ids: &[u32],
    ) -> std::result::Result<Grammars, String> {
        let tokens = tokenizer.vocabulary_bytes().map_err(|e| e.to_string())?;
        let eos = *eos_ids.first().ok_or("structured output needs the model's EOS token; its config names none")?;
        Grammars::new(&tokens, vocab, eos)
    }

    /// A sequence's constraint to `grammar`, for a sequence that ends at any of `ends`
    /// (`GenerateOptions::ends`); an error says why the grammar does not compile.
    pub fn constraint(&self, grammar: &Grammar, ends: &[u32]) -> std::result::Result<Constraint, String> {
        let parser = self.factory.create_parser(grammar.top_level()?).map_err(one_line)?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(one_line(e));
        }
        Ok(Constraint { matcher, eos: self.eos, ends: ends.to_vec() })
    }
}

/// One sequence's place in its grammar.
pub struct Constraint {
    matcher: Matcher,
    eos: u32,
    ends: Vec<u32>,
}

impl Constraint {
    /// Sets the logit of every token the grammar does not allow next to -inf; an error if it allows
    /// none of the vocabulary.
    pub fn mask(&mut self, logits: &mut [f32]) -> Result<()> {
        let mut allowed = self.matcher.compute_mask_or_eos().map_err(|e| match e.to_string() {
            // llguidance's word for a state no token of the vocabulary continues.
            e if e.starts_with("NoExtensionBias") => failed(NO_TOKEN),
            e => failed(e),
        })?;
        // Where the grammar may end, the sequence's own ends stand for its end (EOS only if it is one).
        if allowed.is_allowed(self.eos) {
            allowed.disallow_token(self.eos);
            let size = allowed.len();
            for &id in self.ends.iter().filter(|&&id| (id as usize) < size) {
                allowed.allow_token(id);
            }
        }
        let mut grammar_allows_any = false;
        for (id, logit) in logits.iter_mut().enumerate() {
            if id < allowed.len() && allowed.is_allowed(id as u32) {
                grammar_allows_any = true;
            } else {
                *logit = f32::NEG_INFINITY;
            }
        }
        match (grammar_allows_any, logits.iter().any(|l| l.is_finite())) {
            (_, true) => Ok(()),
            (false, false) => Err(failed(NO_TOKEN)),
            // The grammar allows some, but the penalties had ruled those out.
            (true, false) => Err(failed(RULED_OUT)),
        }
    }

    /// Moves past `token`, the sequence's next; an end of the sequence ends it, whatever the grammar.
    pub fn consume(&mut self, token: u32) -> Result<()> {
        if self.ends.contains(&token) {
            return Ok(());
        }
        self.matcher.consume_token(token).map_err(failed)
    }
}

const NO_TOKEN: &str = "the grammar allows no token of the vocabulary here";
const RULED_OUT: &str =
    "the tokens the grammar allows here are ruled out by allowed_token_ids, bad_words or min_tokens";

fn failed(e: impl std::fmt::Display) -> RuntimeError {
    RuntimeError::Invalid(format!("structured output: {}", one_line(e)))
}

/// An llguidance error in one line: its first, and the reason of a regex error, whose other lines
/// draw where it is (`error: unclosed group` below a caret).
fn one_line(e: impl std::fmt::Display) -> String {
    let text = e.to_string();
    let mut lines = text.lines().map(str::trim);
    let first = lines.next().unwrap_or_default();
    // A place in llguidance's own rewriting of the grammar (`at 1(8): `) means nothing to the user.
    let first = match first.strip_prefix("at ").and_then(|rest| rest.split_once("): ")) {
        Some((_, reason)) => reason.to_string(),
        None => first.to_string(),
    };
    lines.filter_map(|l| l.strip_prefix("error: ")).fold(first, |line, reason| format!("{line} {reason}"))
}

impl Clone for Constraint {
    fn clone(&self) -> Self {
        Constraint { matcher: self.matcher.deep_clone(), eos: self.eos, ends: self.ends.clone() }
    }
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constraint").field("eos", &self.eos).field("ends", &self.ends).finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::{Grammar, Grammars};
    use g4c_frontend::TokenBytes::{self, Special, Text};

    /// Ids 0 `<eos>`, 1 `a`, 2 `b`, 3 `ab`, 4 `"`, 5 a turn end; 6 and 7 past the tokenizer's.
    fn vocabulary() -> Vec<TokenBytes> {
        let text = |t: &str| Text(t.as_bytes().to_vec());
        vec![Special("<eos>".into()), text("a"), text("b"), text("ab"), text("\""), Special("<turn|>".into())]
    }

    fn allowed(c: &mut super::Constraint) -> Vec<usize> {
        let mut logits = vec![0.0; 8];
        c.mask(&mut logits).unwrap();
        (0..8).filter(|&i| logits[i] == 0.0).collect()
    }

    #[test]
    fn the_mask_allows_what_continues_the_grammar_then_only_the_sequences_ends() {
        let grammars = Grammars::new(&vocabulary(), 8, 0).unwrap();
        let mut c = grammars.constraint(&Grammar::Choice(vec!["ab".into(), "b".into()]), &[0, 5]).unwrap();
        assert_eq!(allowed(&mut c), [1, 2, 3]);
        c.consume(1).unwrap();
        assert_eq!(allowed(&mut c), [2], "after `a`, only `b`");
        c.consume(2).unwrap();
        assert_eq!(allowed(&mut c), [0, 5], "complete: EOS or the turn's end");
        assert!(c.consume(4).is_err(), "a token the grammar refuses");
        let mut c = grammars.constraint(&Grammar::Regex("a+".into()), &[0]).unwrap();
        c.consume(1).unwrap();
        assert_eq!(allowed(&mut c), [0, 1], "more `a` or the end; `ab` would not match");
        let mut c = grammars.constraint(&Grammar::Choice(vec!["b".into()]), &[5]).unwrap();
        c.consume(2).unwrap();
        assert_eq!(allowed(&mut c), [5], "EOS is no end of this sequence (it ignores EOS): the stop id is");
        let mut c = grammars.constraint(&Grammar::Lark("start: \"a\" <turn|> \"b\"".into()), &[0]).unwrap();
        c.consume(1).unwrap();
        assert_eq!(allowed(&mut c), [5], "a Lark grammar names a special token");
    }

    #[test]
    fn a_grammar_the_vocabulary_cannot_spell_or_that_does_not_compile_is_an_error() {
        let grammars = Grammars::new(&vocabulary(), 8, 0).unwrap();
        let mut c = grammars.constraint(&Grammar::Regex("z".into()), &[0]).unwrap();
        let e = c.mask(&mut [0.0; 8]).unwrap_err().to_string();
        assert!(e.contains("allows no token"), "{e}");
        let e = grammars.constraint(&Grammar::Regex("(a".into()), &[0]).unwrap_err();
        assert!(e.contains("regex parse error: unclosed group") && !e.contains('\n'), "{e}");
        assert!(e.starts_with("invalid regex"), "no place in llguidance's rewriting: {e}");
        assert!(grammars.constraint(&Grammar::JsonSchema(serde_json::json!({"type": 5})), &[0]).is_err());
        assert!(grammars.constraint(&Grammar::Choice(vec![]), &[0]).is_err());
        // Branches llguidance cannot prove disjoint, as Pydantic's unions can be.
        let one_of = serde_json::json!({"oneOf": [{"type": "string"}, {"type": "string", "maxLength": 3}]});
        assert!(grammars.constraint(&Grammar::JsonSchema(one_of), &[0]).is_ok(), "oneOf taken as anyOf");
        assert!(Grammars::new(&vocabulary(), 8, 8).is_err(), "EOS outside the vocabulary");
    }
}
