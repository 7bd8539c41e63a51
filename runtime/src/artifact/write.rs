//! Writes an artifact directory: everything `g4c run` needs, with no reference to the checkpoint it
//! came from. The directory is assembled under a temporary name and renamed into place at the end.

use super::manifest::{EntryInfo, Manifest, ModelInfo, ShapeInfo, WeightsInfo, FORMAT_VERSION};
use super::{files, is_artifact, ProgramFormat};
use crate::backend::Program;
use crate::error::{Result, RuntimeError};
use crate::progress::{Progress, Unit};
use crate::weights::WeightStore;
use g4c_ir::{CallArg, DType, Module, ParamRole, SourceLayout, WeightDecl};
use g4c_util::atomic::{AtomicDir, AtomicFile};
use g4c_util::safetensors_writer::{write_safetensors, TensorSpec};
use serde_json::Value;
use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

/// What goes into an artifact beside its module and weights (`ArtifactDraft`).
pub struct ArtifactSource<'a> {
    /// The checkpoint directory (the files of `files::COPIED` it has are copied).
    pub model_dir: &'a Path,
    /// Every entry point's program, and where the backend keeps them.
    pub programs: &'a [Program],
    pub format: ProgramFormat,
    /// Cache files of compiled executables, by entry point (may be empty).
    pub executables: Vec<(String, PathBuf)>,
    pub executables_environment: Option<Value>,
    pub target: Value,
    pub passes: Vec<String>,
    /// What the pipeline was asked for beyond the target (`PipelineOptions::describe`).
    pub options: String,
    pub report: Value,
    pub shapes: ShapeInfo,
    /// CUDA targets: the kernels.
    pub cuda: Option<super::CudaKernels<'a>>,
}

fn io(path: &Path) -> impl Fn(std::io::Error) -> RuntimeError + '_ {
    move |e| RuntimeError::Invalid(format!("writing {}: {e}", path.display()))
}

/// Refuses an output path that holds something other than an artifact (which it would replace).
pub fn check_output_dir(out: &Path) -> Result<()> {
    let is_empty_dir = std::fs::read_dir(out).map(|mut d| d.next().is_none()).unwrap_or(false);
    if out.exists() && !is_artifact(out) && !is_empty_dir {
        return Err(RuntimeError::Invalid(format!(
            "{} exists and is not a g4c artifact; choose another output directory",
            out.display()
        )));
    }
    Ok(())
}

/// An artifact being written, in its temporary directory: the module, rebound to the artifact's
/// weights file, and the weights, the bulk of it. Neither needs what compiling for the target
/// makes, so the two may be written while that runs; `finish` adds the rest. Dropped unfinished,
/// the directory is removed.
pub struct ArtifactDraft {
    out: PathBuf,
    dir: AtomicDir,
    module: Module,
    weights: WeightsInfo,
}

impl ArtifactDraft {
    /// Starts artifact `out` from `module` (after the target's passes), with its weights from
    /// `store` (the checkpoint) in the dtype and layout the IR declares. Once `abandoned` is set
    /// (the compile beside it failed), it stops at the next weight with an error.
    pub fn begin(
        out: &Path,
        module: &Module,
        store: &dyn WeightStore,
        progress: &dyn Progress,
        abandoned: &AtomicBool,
    ) -> Result<ArtifactDraft> {
        check_output_dir(out)?;
        let dir = AtomicDir::create(out).map_err(io(out))?;
        let root = dir.path().to_path_buf();

        // Each weight under its own name, already in the declared dtype and layout (i4 values as
        // compressed-tensors packs them: safetensors has no 4-bit type).
        let mut module = module.clone();
        let used = used_weights(&module);
        module.weights.retain(|w| used.contains(w.name.as_str()));
        let originals = module.weights.clone();
        for w in &mut module.weights {
            w.source = w.name.clone();
            w.layout = if w.ty.dtype == DType::I4 { SourceLayout::PackedInt4 } else { SourceLayout::Stored };
        }
        write_file(&root.join(files::MODULE), g4c_ir::print_module(&module).as_bytes())?;
        let weights =
            write_weights(&root.join(files::WEIGHTS), &originals, &module.weights, store, progress, abandoned)?;
        Ok(ArtifactDraft { out: out.to_path_buf(), dir, module, weights })
    }

    /// Writes the rest of the artifact (programs, executables, the checkpoint's other files, the
    /// kernels, the manifest) and renames it into place.
    pub fn finish(self, src: &ArtifactSource) -> Result<Manifest> {
        let ArtifactDraft { out, dir, module, weights } = self;
        let root = dir.path().to_path_buf();
        std::fs::create_dir_all(root.join(src.format.dir)).map_err(io(&root))?;
        std::fs::create_dir_all(root.join(files::EXECUTABLES)).map_err(io(&root))?;
        let mut entries = vec![];
        for p in src.programs {
            let program = src.format.file(&p.entry);
            write_file(&root.join(&program), p.text.as_bytes())?;
            let executable = match src.executables.iter().find(|(e, _)| *e == p.entry) {
                Some((_, cache_file)) => {
                    let name = cache_file.file_name().expect("cache files have names").to_string_lossy();
                    let rel = format!("{}/{name}", files::EXECUTABLES);
                    std::fs::copy(cache_file, root.join(&rel)).map_err(io(cache_file))?;
                    Some(rel)
                }
                None => None,
            };
            entries.push(entry_info(&module, &p.entry, program, executable));
        }

        for name in files::COPIED {
            let from = src.model_dir.join(name);
            if from.exists() {
                std::fs::copy(&from, root.join(name)).map_err(io(&from))?;
            }
        }
        let config: Value = std::fs::read_to_string(src.model_dir.join(files::CONFIG))
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or(Value::Null);

        let cuda = match &src.cuda {
            Some(kernels) => Some(super::cuda::write(&root, kernels)?),
            None => None,
        };
        let mut manifest = Manifest {
            format_version: FORMAT_VERSION,
            g4c_version: crate::cache::G4C_VERSION.into(),
            created_unix: std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs()),
            target: src.target.clone(),
            backend: src.format.backend.into(),
            model: ModelInfo { source: src.model_dir.display().to_string(), config, weights },
            shapes: src.shapes.clone(),
            passes: src.passes.clone(),
            options: src.options.clone(),
            entries,
            executables_environment: src.executables_environment.clone(),
            report: src.report.clone(),
            cuda,
            digest: String::new(),
        };
        manifest.digest = manifest.content_digest();
        let text = serde_json::to_string_pretty(&manifest).expect("manifests serialize") + "\n";
        write_file(&root.join(files::MANIFEST), text.as_bytes())?;
        dir.commit().map_err(io(&out))?;
        Ok(manifest)
    }
}

/// Weights that some function reads or gathers rows of.
fn used_weights(module: &Module) -> BTreeSet<String> {
    let mut used = BTreeSet::new();
    for f in &module.functions {
        used.extend(f.weight_reads().map(|(_, n)| n.to_string()));
        for p in &f.params {
            if let ParamRole::HostGather { table, .. } = &p.role {
                used.insert(table.clone());
            }
        }
    }
    used
}

fn entry_info(module: &Module, entry: &str, program: String, executable: Option<String>) -> EntryInfo {
    let f = module.function(entry).expect("lowered from this module");
    let inputs: Vec<String> = f
        .call_args()
        .into_iter()
        .map(|a| match a {
            CallArg::Param(i) => format!("{}: {}", f.param_name(&f.params[i]), f.ty(f.params[i].value)),
            CallArg::Weight(name) => format!("@{name}: {}", module.weight(name).expect("a weight").ty),
        })
        .collect();
    let outputs = f.results.iter().map(|r| format!("{}: {}", r.name, f.ty(r.value))).collect();
    let donated = f.donations().into_iter().map(|(i, o)| format!("{} -> {}", inputs[i], f.results[o].name)).collect();
    EntryInfo { name: entry.to_string(), program, inputs, outputs, donated, executable }
}

/// Streams every weight, converted and laid out as declared (`decls`, from the store), into one
/// safetensors file as the rebound declarations say (`stored`), and hashes it.
fn write_weights(
    path: &Path,
    decls: &[WeightDecl],
    stored: &[WeightDecl],
    store: &dyn WeightStore,
    progress: &dyn Progress,
    abandoned: &AtomicBool,
) -> Result<WeightsInfo> {
    let mut specs = vec![];
    for (decl, rebound) in decls.iter().zip(stored) {
        let file_ty = rebound.source_type();
        let (dtype, elem_bytes) = match file_ty.dtype {
            DType::F32 => ("F32", 4),
            DType::BF16 => ("BF16", 2),
            DType::F16 => ("F16", 2),
            DType::I32 => ("I32", 4),
            DType::I8 => ("I8", 1),
            other => {
                return Err(RuntimeError::Invalid(format!(
                    "weight @{}: artifacts cannot store {other} weights yet",
                    decl.name
                )))
            }
        };
        // i4 values go back to compressed-tensors' offset-binary nibbles (the inverse of the load).
        let packed = rebound.layout == SourceLayout::PackedInt4;
        let mut bytes = None;
        let total = decl.ty.byte_size() as usize;
        let fill = move |start: usize, buf: &mut [u8]| -> std::io::Result<()> {
            if bytes.is_none() {
                if abandoned.load(Ordering::Relaxed) {
                    return Err(std::io::Error::other("abandoned"));
                }
                let b = store.bytes(decl).map_err(|e| std::io::Error::other(e.to_string()))?;
                bytes = Some(b);
            }
            let from = start * elem_bytes;
            buf.copy_from_slice(&bytes.as_ref().expect("just set")[from..from + buf.len()]);
            if packed {
                buf.iter_mut().for_each(|b| *b ^= 0x88);
            }
            if from + buf.len() == total {
                bytes = None;
                store.release(decl);
            }
            Ok(())
        };
        specs.push(TensorSpec {
            key: decl.name.clone(),
            dtype,
            elem_bytes,
            shape: file_ty.shape,
            fill: Box::new(fill),
        });
    }
    let tensors = specs.len();
    let mut file =
        HashingWriter { inner: AtomicFile::create(path).map_err(io(path))?, hasher: blake3::Hasher::new(), bytes: 0 };
    progress.begin("writing weights", decls.iter().map(|d| d.ty.byte_size()).sum(), Unit::Bytes);
    write_safetensors(&mut file, specs, &mut |n| progress.advance(n)).map_err(io(path))?;
    progress.end();
    let HashingWriter { inner, hasher, bytes } = file;
    inner.commit().map_err(io(path))?;
    Ok(WeightsInfo { file: files::WEIGHTS.into(), bytes, tensors, blake3: hasher.finalize().to_hex().to_string() })
}

fn write_file(path: &Path, bytes: &[u8]) -> Result<()> {
    std::fs::write(path, bytes).map_err(io(path))
}

/// Passes bytes through and hashes them on the way.
struct HashingWriter<W> {
    inner: W,
    hasher: blake3::Hasher,
    bytes: u64,
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.bytes += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}
