//! `generation_config.json`, optional beside `config.json`: more end-of-sequence ids, and the
//! sampling defaults the model ships with (Gemma 3's were `top_k` 64, `top_p` 0.95), which vLLM's server
//! applies to a request that does not set them, and so does `g4c serve`.

use crate::config::{kind_of, Reader};
use crate::error::{io_error, FrontendError, Result};
use serde_json::Value;
use std::path::Path;

/// What `generation_config.json` says.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GenerationConfig {
    pub eos_token_ids: Vec<u32>,
    pub sampling: SamplingDefaults,
}

/// Sampling parameters the model's authors chose; `None` where the file says nothing.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SamplingDefaults {
    pub temperature: Option<f32>,
    /// 0: all tokens.
    pub top_k: Option<usize>,
    pub top_p: Option<f32>,
    pub min_p: Option<f32>,
    pub repetition_penalty: Option<f32>,
}

impl GenerationConfig {
    /// `DIR/generation_config.json`, if there is one; its token ids must be in the vocabulary.
    pub fn read(dir: &Path, vocab_size: usize) -> Result<Option<GenerationConfig>> {
        let path = dir.join("generation_config.json");
        // Optional: absent is fine, anything else there must be readable.
        if path.symlink_metadata().is_err() {
            return Ok(None);
        }
        let text = g4c_util::files::read_to_string(&path).map_err(|e| io_error(&path, e))?;
        let v: Value = serde_json::from_str(&text)
            .map_err(|e| FrontendError::Json { path: path.clone(), message: e.to_string() })?;
        let Some(obj) = v.as_object().cloned() else {
            return Err(FrontendError::Config {
                path,
                field: "(top level)".into(),
                expected: "a JSON object".into(),
                found: kind_of(&v),
            });
        };
        let r = Reader { path, prefix: String::new(), obj };
        let eos_token_ids = r.token_ids("eos_token_id")?;
        r.in_vocabulary("eos_token_id", &eos_token_ids, vocab_size)?;
        Ok(Some(GenerationConfig { eos_token_ids, sampling: SamplingDefaults::read(&r)? }))
    }
}

impl SamplingDefaults {
    /// The fields' types only: their ranges are `SamplingParams::check`'s, which `serve`, the one
    /// command that applies them, runs on them at start.
    fn read(r: &Reader) -> Result<SamplingDefaults> {
        let number = |field: &str| -> Result<Option<f32>> { Ok(r.optional_number(field)?.map(|x| x as f32)) };
        let top_k = match r.get("top_k") {
            None => None,
            Some(_) => Some(r.usize("top_k", None)?),
        };
        Ok(SamplingDefaults {
            temperature: number("temperature")?,
            top_k,
            top_p: number("top_p")?,
            min_p: number("min_p")?,
            repetition_penalty: number("repetition_penalty")?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::{GenerationConfig, SamplingDefaults};

    fn read(json: &str) -> crate::Result<Option<GenerationConfig>> {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("generation_config.json"), json).unwrap();
        GenerationConfig::read(dir.path(), 300)
    }

    #[test]
    fn gemma_sampling_defaults_and_eos_ids_are_read() {
        let g = read(r#"{"do_sample": true, "eos_token_id": [1, 106], "top_k": 64, "top_p": 0.95}"#).unwrap().unwrap();
        assert_eq!(g.eos_token_ids, [1, 106]);
        let expected = SamplingDefaults { top_k: Some(64), top_p: Some(0.95), ..Default::default() };
        assert_eq!(g.sampling, expected);
        assert_eq!(read("{}").unwrap().unwrap(), GenerationConfig::default());
        // Greedy and min-p off are defaults, not errors; a null is no default.
        let g = read(r#"{"temperature": 0, "min_p": 0.0, "top_p": null}"#).unwrap().unwrap();
        assert_eq!(g.sampling, SamplingDefaults { temperature: Some(0.0), min_p: Some(0.0), ..Default::default() });
        assert!(GenerationConfig::read(tempfile::tempdir().unwrap().path(), 300).unwrap().is_none());
    }

    #[test]
    fn defaults_of_the_wrong_type_are_errors_naming_the_field() {
        for (json, field) in [
            (r#"{"top_k": 2.5}"#, "top_k"),
            (r#"{"min_p": "x"}"#, "min_p"),
            (r#"{"temperature": [1]}"#, "temperature"),
            (r#"{"eos_token_id": 400}"#, "eos_token_id"),
            ("[1]", "(top level)"),
        ] {
            let e = read(json).unwrap_err().to_string();
            assert!(e.contains(field) && e.contains("generation_config.json"), "{json}: {e}");
        }
    }
}
