//! Safetensors checkpoints read by mmap without copying: one `model.safetensors`, or shards listed in
//! `model.safetensors.index.json`.

use crate::error::{io_error, FrontendError, Result};
use g4c_ir::DType;
use memmap2::Mmap;
use safetensors::{Dtype, SafeTensorError, SafeTensors};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Where one tensor's bytes are.
#[derive(Clone, Debug)]
pub struct TensorEntry {
    pub dtype: DType,
    pub shape: Vec<usize>,
    file: usize,
    start: usize,
    end: usize,
}

/// A borrowed view of one tensor's little-endian bytes in the mmap.
#[derive(Clone, Copy, Debug)]
pub struct TensorBytes<'a> {
    pub dtype: DType,
    pub shape: &'a [usize],
    pub bytes: &'a [u8],
}

pub struct Checkpoint {
    pub dir: PathBuf,
    files: Vec<(PathBuf, Mmap)>,
    tensors: BTreeMap<String, TensorEntry>,
    /// Tensors of element types the IR has no type for (reported only if the model needs them), by
    /// their safetensors dtype name; their bytes can still be read raw (`raw`).
    unreadable: BTreeMap<String, (String, TensorEntry)>,
}

/// A tensor of an element type the IR has no type for (e.g. compressed-tensors' I64 `weight_shape`).
#[derive(Clone, Copy, Debug)]
pub struct RawTensor<'a> {
    pub dtype: &'a str,
    pub shape: &'a [usize],
    pub bytes: &'a [u8],
}

impl Checkpoint {
    pub fn open(dir: &Path) -> Result<Checkpoint> {
        let index = dir.join("model.safetensors.index.json");
        let single = dir.join("model.safetensors");
        let shard_names: Vec<String> = if index.exists() {
            let map = read_index(&index)?;
            let shards: BTreeSet<String> = map.values().cloned().collect();
            let ckpt = Checkpoint::from_shards(dir, shards.into_iter().collect())?;
            ckpt.check_index(&index, &map)?;
            return Ok(ckpt);
        } else if single.exists() {
            vec!["model.safetensors".into()]
        } else if let Some(link) = [&index, &single].into_iter().find(|p| p.is_symlink()) {
            // `exists` follows the link: a link to nothing (or a loop of links) is not "no file".
            return Err(FrontendError::Io {
                path: link.to_path_buf(),
                message: "a symbolic link to nothing (its target is missing, or it loops)".into(),
            });
        } else {
            return Err(FrontendError::Io {
                path: dir.to_path_buf(),
                message: "no model.safetensors or model.safetensors.index.json in this directory".into(),
            });
        };
        Checkpoint::from_shards(dir, shard_names)
    }

    /// One safetensors file, whatever its name (an artifact's `weights.safetensors`).
    pub fn open_file(path: &Path) -> Result<Checkpoint> {
        let dir = path.parent().unwrap_or(Path::new("."));
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        if !path.is_file() {
            return Err(FrontendError::Io { path: path.into(), message: "no such file".into() });
        }
        Checkpoint::from_shards(dir, vec![name])
    }

    fn from_shards(dir: &Path, shard_names: Vec<String>) -> Result<Checkpoint> {
        let mut ckpt =
            Checkpoint { dir: dir.to_path_buf(), files: vec![], tensors: BTreeMap::new(), unreadable: BTreeMap::new() };
        for name in shard_names {
            let path = dir.join(&name);
            let file = g4c_util::files::open(&path).map_err(|e| io_error(&path, e))?;
            // SAFETY: the mapping is read-only; a checkpoint modified while g4c runs is outside what
            // any loader can defend against.
            let mmap = unsafe { Mmap::map(&file) }.map_err(|e| io_error(&path, e))?;
            let (header_len, metadata) =
                SafeTensors::read_metadata(&mmap).map_err(|e| safetensors_error(&path, &mmap, e))?;
            let data_start = 8 + header_len;
            let file_index = ckpt.files.len();
            for (name, info) in metadata.tensors() {
                let entry = |dtype| TensorEntry {
                    dtype,
                    shape: info.shape.clone(),
                    file: file_index,
                    start: data_start + info.data_offsets.0,
                    end: data_start + info.data_offsets.1,
                };
                let dtype = match info.dtype {
                    Dtype::F32 => DType::F32,
                    Dtype::BF16 => DType::BF16,
                    Dtype::F16 => DType::F16,
                    Dtype::I32 => DType::I32,
                    Dtype::I8 => DType::I8,
                    other => {
                        // The dtype slot is unused for these: `RawTensor` names the real one.
                        ckpt.unreadable.insert(name, (format!("{other:?}"), entry(DType::I8)));
                        continue;
                    }
                };
                let entry = entry(dtype);
                if ckpt.tensors.insert(name.clone(), entry).is_some() {
                    return Err(FrontendError::Safetensors {
                        path: path.clone(),
                        message: format!("tensor `{name}` appears in more than one shard"),
                    });
                }
            }
            ckpt.files.push((path, mmap));
        }
        Ok(ckpt)
    }

    /// That the index (`map`, read from `index`) puts each tensor the shards hold in the shard that
    /// holds it: one placed elsewhere means the shards are not the ones it was written for. Entries
    /// for tensors no shard holds, and tensors it leaves out, are let be, as transformers does (a
    /// tensor the model needs is then missing, and named so).
    fn check_index(&self, index: &Path, map: &BTreeMap<String, String>) -> Result<()> {
        let shard_of = |name: &str| {
            let e = self.tensors.get(name).or_else(|| self.unreadable.get(name).map(|(_, e)| e))?;
            self.files[e.file].0.file_name().map(|f| f.to_string_lossy().into_owned())
        };
        let mut wrong = map.iter().filter_map(|(tensor, file)| match shard_of(tensor) {
            Some(found) if found != *file => Some((tensor, file, format!("it is in {found}"))),
            _ => None,
        });
        let Some((tensor, said, found)) = wrong.next() else { return Ok(()) };
        let more = match wrong.count() {
            0 => String::new(),
            n => format!(" (and {n} more tensors)"),
        };
        Err(FrontendError::Config {
            path: index.into(),
            field: format!("weight_map.{tensor}"),
            expected: "the shard that holds the tensor".into(),
            found: format!("{said}: {found}{more}"),
        })
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(|s| s.as_str())
    }

    /// Whether the checkpoint has tensor `name`, whatever its element type.
    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name) || self.unreadable.contains_key(name)
    }

    /// The file holding tensor `name`.
    pub fn file_of(&self, name: &str) -> Option<&Path> {
        let e = self.tensors.get(name).or_else(|| self.unreadable.get(name).map(|(_, e)| e))?;
        Some(&self.files[e.file].0)
    }

    pub fn entry(&self, name: &str) -> Option<&TensorEntry> {
        self.tensors.get(name)
    }

    /// The element type of a tensor g4c cannot read, if `name` is one.
    pub fn unreadable_dtype(&self, name: &str) -> Option<&str> {
        self.unreadable.get(name).map(|(d, _)| d.as_str())
    }

    /// A tensor of a type the IR has none for, as its safetensors dtype name, shape and bytes.
    pub fn raw(&self, name: &str) -> Option<RawTensor<'_>> {
        let (dtype, e) = self.unreadable.get(name)?;
        Some(RawTensor { dtype, shape: &e.shape, bytes: &self.files[e.file].1[e.start..e.end] })
    }

    pub fn tensor(&self, name: &str) -> Option<TensorBytes<'_>> {
        let e = self.tensors.get(name)?;
        Some(TensorBytes { dtype: e.dtype, shape: &e.shape, bytes: &self.files[e.file].1[e.start..e.end] })
    }

    /// Drops the resident pages of a tensor's bytes from this process, e.g. once a backend has copied
    /// them to a device; a later read faults them back in from the file.
    pub fn release(&self, name: &str) {
        if let Some(e) = self.tensors.get(name) {
            let mmap = &self.files[e.file].1;
            // SAFETY: the map is a shared, read-only mapping of the checkpoint file, so dropped pages
            // are re-read from the file unchanged; no reference into them outlives this call's
            // caller holding them (backends call this after their copy is done).
            let _ =
                unsafe { mmap.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, e.start, e.end - e.start) };
        }
    }
}

/// The index's `weight_map`: each tensor's shard file.
fn read_index(path: &Path) -> Result<BTreeMap<String, String>> {
    let text = g4c_util::files::read_to_string(path).map_err(|e| io_error(path, e))?;
    let v: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| FrontendError::Json { path: path.into(), message: e.to_string() })?;
    let map = v.get("weight_map").and_then(|m| m.as_object()).ok_or_else(|| FrontendError::Config {
        path: path.into(),
        field: "weight_map".into(),
        expected: "an object mapping tensor names to shard files".into(),
        found: "nothing".into(),
    })?;
    let mut shards = BTreeMap::new();
    for (tensor, file) in map {
        let file =
            file.as_str().filter(|f| !f.contains('/') && !f.is_empty()).ok_or_else(|| FrontendError::Config {
                path: path.into(),
                field: format!("weight_map.{tensor}"),
                expected: "a shard file name in the same directory".into(),
                found: file.to_string(),
            })?;
        shards.insert(tensor.clone(), file.to_string());
    }
    Ok(shards)
}

fn safetensors_error(path: &Path, bytes: &[u8], e: SafeTensorError) -> FrontendError {
    let len = bytes.len();
    let message = match e {
        SafeTensorError::HeaderTooSmall | SafeTensorError::InvalidHeaderLength => {
            format!("not a safetensors file or truncated inside its header ({len} bytes)")
        }
        SafeTensorError::MetadataIncompleteBuffer => match described_size(bytes) {
            Some(size) => format!(
                "the file has {len} bytes, but its header describes {size} (truncated, or corrupt past its header)"
            ),
            None => format!(
                "file size ({len} bytes) does not match the tensors its header describes (truncated or corrupt)"
            ),
        },
        SafeTensorError::TensorInvalidInfo => match mismatched_tensor(bytes) {
            Some(found) => format!("corrupt safetensors header: {found}"),
            None => format!("corrupt safetensors header: {e}"),
        },
        SafeTensorError::InvalidOffset(ref name) => match misplaced_tensor(bytes, name) {
            Some(found) => format!("corrupt safetensors header: {found}"),
            None => format!("corrupt safetensors header: {e}"),
        },
        other => format!("corrupt safetensors header: {other}"),
    };
    FrontendError::Safetensors { path: path.into(), message }
}

/// A safetensors file's header, its tensors' entries by name (`__metadata__` left out).
fn header_entries(bytes: &[u8]) -> Option<serde_json::Map<String, serde_json::Value>> {
    let len = u64::from_le_bytes(bytes.get(..8)?.try_into().ok()?) as usize;
    let mut header: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(bytes.get(8..8 + len)?).ok()?;
    header.remove("__metadata__");
    Some(header)
}

/// The file size the header describes: its own bytes and the end of the furthest tensor.
fn described_size(bytes: &[u8]) -> Option<u64> {
    let header_len = u64::from_le_bytes(bytes.get(..8)?.try_into().ok()?);
    let ends =
        header_entries(bytes)?.values().map(|info| info["data_offsets"][1].as_u64()).collect::<Option<Vec<_>>>()?;
    8u64.checked_add(header_len)?.checked_add(ends.into_iter().max().unwrap_or(0))
}

/// Where tensor `name`'s byte range is out of place. The safetensors crate wants the ranges, in
/// order of their starts, to follow one another without gaps, and names the first one that does
/// not: after an entry removed from the header, that is the tensor after the gap.
fn misplaced_tensor(bytes: &[u8], name: &str) -> Option<String> {
    let header = header_entries(bytes)?;
    let mut ranges: Vec<(u64, u64, &str)> = header
        .iter()
        .map(|(n, info)| {
            serde_json::from_value::<[u64; 2]>(info["data_offsets"].clone()).ok().map(|[s, e]| (s, e, &n[..]))
        })
        .collect::<Option<_>>()?;
    ranges.sort();
    let mut before = 0;
    for (start, end, tensor) in ranges {
        if tensor == name {
            return Some(if end < start {
                format!("tensor `{name}`'s byte range {start}..{end} ends before it starts")
            } else if start > before {
                format!(
                    "tensor `{name}` starts at byte {start} of the data, but the tensors before it end at byte \
                     {before} (a tensor missing from the header, or a wrong offset)"
                )
            } else {
                format!("tensor `{name}`'s byte range {start}..{end} overlaps the tensors before it (they end at byte {before})")
            });
        }
        before = end;
    }
    None
}

/// The first tensor whose dtype and shape do not fit its byte range, described (the safetensors
/// crate reports that one exists, not which).
fn mismatched_tensor(bytes: &[u8]) -> Option<String> {
    let header = header_entries(bytes)?;
    header.iter().find_map(|(name, info)| {
        let dtype: Dtype = serde_json::from_value(info["dtype"].clone()).ok()?;
        let shape: Vec<u64> = serde_json::from_value(info["shape"].clone()).ok()?;
        let [start, end]: [u64; 2] = serde_json::from_value(info["data_offsets"].clone()).ok()?;
        let needed =
            shape.iter().try_fold(dtype.bitsize() as u64, |n, &d| n.checked_mul(d)).map(|bits| bits.div_ceil(8));
        let held = end.checked_sub(start);
        (needed != held).then(|| {
            format!(
                "tensor `{name}` is {dtype:?} {shape:?} ({}) but its byte range {start}..{end} holds {}",
                needed.map_or("more than 2^64 bytes".into(), |n| format!("{n} bytes")),
                held.map_or("a negative length".into(), |n| format!("{n} bytes"))
            )
        })
    })
}
