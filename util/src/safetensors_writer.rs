//! A streaming safetensors writer: the header is computed from shapes alone, then each tensor's bytes
//! are produced and written chunk by chunk, so a 9 GB checkpoint (synthetic, or an artifact's weights)
//! never sits in memory.

use std::io::{self, Write};

/// Fills a buffer with a tensor's next elements as little-endian bytes; called with the index of the
/// first element the buffer holds.
pub type Filler<'a> = Box<dyn FnMut(usize, &mut [u8]) -> io::Result<()> + 'a>;

/// One tensor to write: its key, safetensors dtype name, shape, and a function that fills a buffer
/// with the next elements' little-endian bytes (called with the element offset it starts at).
pub struct TensorSpec<'a> {
    pub key: String,
    pub dtype: &'static str,
    pub elem_bytes: usize,
    pub shape: Vec<usize>,
    pub fill: Filler<'a>,
}

const CHUNK_ELEMS: usize = 1 << 20;

/// Writes `tensors` in order; `on_written` hears of every chunk's bytes (for progress bars).
pub fn write_safetensors(
    out: &mut impl Write,
    tensors: Vec<TensorSpec<'_>>,
    on_written: &mut dyn FnMut(u64),
) -> io::Result<()> {
    let mut header = serde_json::Map::new();
    header.insert("__metadata__".into(), serde_json::json!({"format": "pt"}));
    let mut offset = 0usize;
    for t in &tensors {
        let len = t.shape.iter().product::<usize>() * t.elem_bytes;
        header.insert(
            t.key.clone(),
            serde_json::json!({"dtype": t.dtype, "shape": t.shape, "data_offsets": [offset, offset + len]}),
        );
        offset += len;
    }
    let mut header = serde_json::to_vec(&header)?;
    // Pad with spaces so tensor data starts 8-byte aligned, as the reference writer does.
    while header.len() % 8 != 0 {
        header.push(b' ');
    }
    out.write_all(&(header.len() as u64).to_le_bytes())?;
    out.write_all(&header)?;
    let mut buf = Vec::new();
    for mut t in tensors {
        let n: usize = t.shape.iter().product();
        let mut start = 0;
        while start < n {
            let count = CHUNK_ELEMS.min(n - start);
            buf.resize(count * t.elem_bytes, 0);
            (t.fill)(start, &mut buf)?;
            out.write_all(&buf)?;
            on_written(buf.len() as u64);
            start += count;
        }
    }
    out.flush()
}
