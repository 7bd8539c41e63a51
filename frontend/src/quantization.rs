//! A checkpoint's `quantization_config` in the compressed-tensors `pack-quantized` format, what the
//! Gemma 4 QAT exports use (gemma4.md §5.1): linear weights as 4-bit symmetric integers in groups
//! along their input dimension, activations left alone (W4A16). Whatever else the format allows and
//! g4c does not run (zero points, other widths, other strategies, activation quantization) is refused
//! with the field that says so, never loaded as a wrong model.

use crate::config::{kind_of, Reader};
use crate::error::Result;
use serde_json::Value;

/// How the linear weights of a checkpoint are quantized.
#[derive(Clone, Debug, PartialEq)]
pub struct WeightQuantization {
    /// Inputs sharing one scale.
    pub group_size: usize,
    /// Modules left in float: names, or patterns (`re:…`, matched from the start of the name).
    ignore: Vec<Ignore>,
}

#[derive(Clone, Debug)]
enum Ignore {
    Name(String),
    Pattern(regex::Regex),
}

impl PartialEq for Ignore {
    fn eq(&self, other: &Ignore) -> bool {
        match (self, other) {
            (Ignore::Name(a), Ignore::Name(b)) => a == b,
            (Ignore::Pattern(a), Ignore::Pattern(b)) => a.as_str() == b.as_str(),
            _ => false,
        }
    }
}

impl WeightQuantization {
    /// The `quantization_config` of a `config.json` (`top` is its top-level object), if it has one.
    pub(crate) fn from_config(top: &Reader) -> Result<Option<WeightQuantization>> {
        if top.get("quantization_config").is_none() {
            return Ok(None);
        }
        let r = top.child("quantization_config")?;
        let field_is = |field: &str, want: &str, default: Option<&str>| -> Result<()> {
            let found = r.string(field, default)?;
            if found != want {
                return Err(r.bad(
                    field,
                    format!("\"{want}\" (g4c runs W4A16 checkpoints in compressed-tensors' pack-quantized format)"),
                    format!("\"{found}\""),
                ));
            }
            Ok(())
        };
        field_is("quant_method", "compressed-tensors", None)?;
        field_is("format", "pack-quantized", None)?;
        field_is("quantization_status", "compressed", Some("compressed"))?;
        if let Some(v) = r.get("kv_cache_scheme") {
            return Err(r.bad("kv_cache_scheme", "null (no KV-cache quantization)".into(), kind_of(v)));
        }
        for (field, what) in [("transform_config", "no weight transforms"), ("sparsity_config", "no sparsity")] {
            if let Some(v) = r.get(field).filter(|v| v.as_object().is_none_or(|o| !o.is_empty())) {
                return Err(r.bad(field, format!("{{}} ({what})"), kind_of(v)));
            }
        }
        let groups = r.child("config_groups")?;
        let mut names = groups.obj.keys();
        let (Some(name), None) = (names.next(), names.next()) else {
            return Err(r.bad("config_groups", "exactly one group".into(), format!("{} groups", groups.obj.len())));
        };
        let g = groups.child(name)?;
        if g.get("targets") != Some(&serde_json::json!(["Linear"])) {
            let found = g.get("targets").map_or("nothing".into(), kind_of);
            return Err(g.bad("targets", "[\"Linear\"]".into(), found));
        }
        for activations in ["input_activations", "output_activations"] {
            if let Some(v) = g.get(activations) {
                return Err(g.bad(activations, "null (W4A16: activations are not quantized)".into(), kind_of(v)));
            }
        }
        let w = g.child("weights")?;
        let bits = w.usize("num_bits", None)?;
        if bits != 4 {
            return Err(w.bad("num_bits", "4".into(), bits.to_string()));
        }
        let kind = w.string("type", Some("int"))?;
        if kind != "int" {
            return Err(w.bad("type", "\"int\"".into(), format!("\"{kind}\"")));
        }
        let strategy = w.string("strategy", None)?;
        if strategy != "group" {
            return Err(w.bad(
                "strategy",
                "\"group\" (one scale per group of inputs)".into(),
                format!("\"{strategy}\""),
            ));
        }
        if !w.bool("symmetric", true)? {
            return Err(w.bad("symmetric", "true (g4c has no zero points)".into(), "false".into()));
        }
        if w.bool("dynamic", false)? {
            return Err(w.bad("dynamic", "false".into(), "true".into()));
        }
        if let Some(v) = w.get("actorder") {
            return Err(w.bad("actorder", "null (columns in their own order)".into(), kind_of(v)));
        }
        let group_size = w.positive("group_size", None)?;
        let ignore = match r.get("ignore") {
            None => vec![],
            Some(Value::Array(items)) => items
                .iter()
                .enumerate()
                .map(|(i, v)| {
                    let text =
                        v.as_str().ok_or_else(|| r.bad(&format!("ignore[{i}]"), "a string".into(), kind_of(v)))?;
                    match text.strip_prefix("re:") {
                        Some(pattern) => {
                            regex::Regex::new(&format!("^(?:{pattern})")).map(Ignore::Pattern).map_err(|e| {
                                // The regex crate draws the error over several lines; errors here are one.
                                let found = e.to_string().split_whitespace().collect::<Vec<_>>().join(" ");
                                r.bad(&format!("ignore[{i}]"), "a valid pattern".into(), found)
                            })
                        }
                        None => Ok(Ignore::Name(text.to_string())),
                    }
                })
                .collect::<Result<_>>()?,
            Some(v) => return Err(r.bad("ignore", "a list of module names".into(), kind_of(v))),
        };
        Ok(Some(WeightQuantization { group_size, ignore }))
    }

    /// Whether linear module `name` (e.g. `model.language_model.layers.0.mlp.up_proj`) is quantized.
    pub fn quantizes(&self, name: &str) -> bool {
        !self.ignore.iter().any(|i| match i {
            Ignore::Name(n) => n == name,
            Ignore::Pattern(p) => p.is_match(name),
        })
    }
}
