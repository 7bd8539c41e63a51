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
    fn read(r: &Reader) -> Result<SamplingDefaults> {
        let number = |field: &str, expected: &str, ok: fn(f64) -> bool| -> Result<Option<f32>> {
            match r.get(field) {
                None => Ok(None),
                Some(_) => match r.float(field, None)? {
                    x if ok(x) => Ok(Some(x as f32)),
                    x => Err(r.bad(field, expected.into(), x.to_string())),
                },
            }
        };
        let top_k = match r.get("top_k") {
            None => None,
            Some(_) => Some(r.usize("top_k", None)?),
        };
        Ok(SamplingDefaults {
            temperature: number("temperature", "a number >= 0", |x| x >= 0.0 && x.is_finite())?,
            top_k,
            top_p: number("top_p", "a number in (0, 1]", |x| x > 0.0 && x <= 1.0)?,
            min_p: number("min_p", "a number in [0, 1]", |x| (0.0..=1.0).contains(&x))?,
            repetition_penalty: number("repetition_penalty", "a number > 0", |x| x > 0.0 && x.is_finite())?,
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
        assert!(GenerationConfig::read(tempfile::tempdir().unwrap().path(), 300).unwrap().is_none());
    }

    #[test]
    fn defaults_out_of_range_are_errors_naming_the_field() {
        for (json, field) in [
            (r#"{"top_p": 0}"#, "top_p"),
            (r#"{"temperature": -1}"#, "temperature"),
            (r#"{"top_k": 2.5}"#, "top_k"),
            (r#"{"repetition_penalty": 0}"#, "repetition_penalty"),
            (r#"{"min_p": "x"}"#, "min_p"),
            (r#"{"eos_token_id": 400}"#, "eos_token_id"),
            ("[1]", "(top level)"),
        ] {
            let e = read(json).unwrap_err().to_string();
            assert!(e.contains(field) && e.contains("generation_config.json"), "{json}: {e}");
        }
    }
}
