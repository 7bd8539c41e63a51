use crate::ui::with_feedback;
use anyhow::{bail, Context, Result};
use clap::Args;
use g4c_driver::Session;
use g4c_runtime::eval::{perplexity, score, Divergence};
use safetensors::{Dtype, SafeTensors};
use serde_json::json;
use std::path::{Path, PathBuf};

#[derive(Args)]
// `eval` scores a checkpoint, never an artifact: the shared flags' help says what they mean here.
#[command(mut_arg("backend", |a| a.help("Execution backend (default: pjrt)")))]
#[command(mut_arg("target", |a| a.help("Target whose pass pipeline prepares the IR (see `g4c targets`; default `cpu`); with `--backend interp` and a narrower target the interpreter emulates its rounding")))]
pub struct EvalArgs {
    /// Checkpoint directory
    pub model_dir: PathBuf,
    /// The token sequence to score: a file of token ids (separated by commas or whitespace)
    #[arg(long, value_name = "FILE", conflicts_with = "text", required_unless_present = "text")]
    pub ids: Option<PathBuf>,
    /// The text to score, tokenized with the checkpoint's tokenizer.json (BOS is added)
    #[arg(long, value_name = "FILE")]
    pub text: Option<PathBuf>,
    /// Compare with the logits another run saved (`--save-logits`) or transformers wrote: a
    /// safetensors file with F32 `logits` [N, vocab] (and I32 `ids` [N], checked when present)
    #[arg(long, value_name = "FILE")]
    pub reference: Option<PathBuf>,
    /// Write this run's logits there, as --reference reads them
    #[arg(long, value_name = "FILE")]
    pub save_logits: Option<PathBuf>,
    /// Tokens per scoring call (the sequence goes through in chunks; caches carry between them)
    #[arg(long, default_value_t = 128, value_parser = super::sizes::positions)]
    pub chunk: usize,
    #[command(flatten)]
    pub execution: super::ExecutionArgs,
    /// Print one JSON object instead of the summary: the perplexity and, with --reference, the KL
    /// divergence's mean, p99 and max, top-1 agreement, and the largest logit difference at every
    /// position
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: EvalArgs) -> Result<()> {
    // Before scoring, not after: a path that cannot be written would lose the run.
    if let Some(path) = &args.save_logits {
        super::check_output("--save-logits", path)?;
    }
    let session = Session::open(&args.model_dir, args.execution.session_options(&args.model_dir)?)?;
    let ids: Vec<u32> = match (&args.ids, &args.text) {
        (Some(path), _) => {
            let text = g4c_util::files::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
            let ids = ids_in_file(&text).with_context(|| format!("--ids {}", path.display()))?;
            let vocab = session.source.config.vocab_size;
            if let Some((i, id)) = ids.iter().enumerate().find(|(_, &id)| id as usize >= vocab) {
                bail!("--ids {}: token {i} is {id}, outside the vocabulary (0..{vocab})", path.display());
            }
            ids
        }
        (None, Some(path)) => {
            let Some(tokenizer) = &session.source.tokenizer else {
                bail!("--text needs {}/tokenizer.json, which does not exist; use --ids", args.model_dir.display())
            };
            let text = g4c_util::files::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
            tokenizer.encode(&text).with_context(|| format!("--text {}", path.display()))?
        }
        (None, None) => unreachable!("clap requires --ids or --text"),
    };
    if ids.len() < 2 {
        bail!("the sequence has {} token(s); scoring needs at least 2", ids.len());
    }
    let chunk = args.chunk.min(ids.len());
    let module = session.source.scoring_module(chunk, ids.len())?;
    let mut ready = with_feedback(|feedback| session.executor(module, feedback))?;
    let logits = score(ready.executor.as_mut(), &ids)?;
    let ppl = perplexity(&logits, &ids);
    if let Some(path) = &args.save_logits {
        super::write_logits(path, &logits, session.source.config.vocab_size, Some(&ids))?;
    }
    let divergence = match &args.reference {
        Some(path) => Some(Divergence::of(&logits, &read_reference(path, &ids)?)?),
        None => None,
    };
    let target = session.source.target.name;
    if args.json {
        let mut out = json!({
            "model": args.model_dir.display().to_string(), "target": target, "backend": session.backend.name(),
            "quantize": session.source.options.quantize(), "tokens": ids.len(), "perplexity": ppl,
        });
        if let Some(d) = &divergence {
            out["reference"] = json!({
                "kl_mean": d.kl_mean(), "kl_p99": d.kl_p99(), "kl_max": d.kl_max(),
                "top1_agreement": d.top1_agreement(), "max_abs_logit_diff": d.max_abs_diff,
            });
        }
        return super::write_stdout(&format!("{out}\n"));
    }
    // The target names the pipeline (its dtypes); the backend is what ran it (for pjrt, the plugin's
    // platform, which may be the CPU emulating a TPU's arithmetic).
    let backend = session.backend.name();
    let mut text = format!(
        "{}: {} tokens, target {target}, backend {backend}, perplexity {ppl:.6}\n",
        args.model_dir.display(),
        ids.len()
    );
    if let Some(d) = &divergence {
        let worst = d.max_abs_diff.iter().copied().fold(0.0, f32::max);
        text += &format!(
            "vs reference: KL mean {:.3e}, p99 {:.3e}, max {:.3e}; top-1 agreement {:.1}%; max |Δlogit| {worst:.4}\n",
            d.kl_mean(),
            d.kl_p99(),
            d.kl_max(),
            100.0 * d.top1_agreement()
        );
    }
    super::write_stdout(&text)
}

/// The reference logits `[N][vocab]` of `path`; its `ids`, when it has them, must be `ids`.
fn read_reference(path: &Path, ids: &[u32]) -> Result<Vec<Vec<f32>>> {
    let bytes = g4c_util::files::read(path).with_context(|| format!("reading {}", path.display()))?;
    let st = SafeTensors::deserialize(&bytes).with_context(|| format!("{}: not a safetensors file", path.display()))?;
    let logits = st.tensor("logits").with_context(|| format!("{}: no `logits` tensor", path.display()))?;
    let [n, vocab] = logits.shape()[..] else {
        bail!("{}: `logits` is {:?}, expected F32 [N, vocab]", path.display(), logits.shape())
    };
    if logits.dtype() != Dtype::F32 || n != ids.len() {
        bail!(
            "{}: `logits` is {:?} {:?}, expected F32 [{}, vocab]",
            path.display(),
            logits.dtype(),
            logits.shape(),
            ids.len()
        );
    }
    if let Ok(theirs) = st.tensor("ids") {
        let theirs: Vec<u32> =
            theirs.data().chunks_exact(4).map(|b| i32::from_le_bytes(b.try_into().unwrap()) as u32).collect();
        if theirs != ids {
            bail!("{}: its `ids` are not the sequence scored here", path.display());
        }
    }
    let values: Vec<f32> = logits.data().chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect();
    // A divergence from NaN logits would read as perfect agreement (every comparison false).
    if let Some(i) = values.iter().position(|x| !x.is_finite()) {
        let (row, column) = (i / vocab.max(1), i % vocab.max(1));
        bail!("{}: `logits` [{row}, {column}] is {}, expected a finite number", path.display(), values[i]);
    }
    Ok(values.chunks(vocab.max(1)).map(|r| r.to_vec()).collect())
}

/// The token ids of an `--ids` file: whitespace, a comma or both between two ids; an empty entry
/// (two commas with nothing between, a comma at the end) is an error, as in `--prompt-ids`.
fn ids_in_file(text: &str) -> Result<Vec<u32>> {
    let mut ids = vec![];
    for entry in text.split(',') {
        let words: Vec<&str> = entry.split_whitespace().collect();
        if words.is_empty() && !text.trim().is_empty() {
            bail!("entry {} is empty (two commas with no id between, or a comma at the end)", ids.len() + 1);
        }
        for word in words {
            ids.push(
                word.parse::<u32>()
                    .with_context(|| format!("`{word}` is not a token id (expected a non-negative integer)"))?,
            );
        }
    }
    Ok(ids)
}
