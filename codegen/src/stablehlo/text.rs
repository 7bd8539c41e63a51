//! MLIR spellings of IR types and literals.

use g4c_ir::{DType, Literal, TensorType};

/// MLIR's spelling of an element type: the IR's own name, except predicates (`i1`).
pub fn element_type(dtype: DType) -> &'static str {
    match dtype {
        DType::Bool => "i1",
        d => d.name(),
    }
}

/// `tensor<2x3xf32>`, `tensor<f32>` for scalars.
pub fn tensor_type(ty: &TensorType) -> String {
    let mut s = String::from("tensor<");
    for d in &ty.shape {
        s.push_str(&format!("{d}x"));
    }
    s.push_str(element_type(ty.dtype));
    s.push('>');
    s
}

/// Little-endian bytes of one element of `dtype` holding `v` (rounded to nearest even).
fn element_bytes(dtype: DType, v: f64) -> Vec<u8> {
    match dtype {
        DType::F32 => (v as f32).to_le_bytes().to_vec(),
        DType::BF16 => half::bf16::from_f64(v).to_le_bytes().to_vec(),
        DType::F16 => half::f16::from_f64(v).to_le_bytes().to_vec(),
        DType::I32 => (v as i32).to_le_bytes().to_vec(),
        DType::I8 | DType::I4 => vec![v as i8 as u8],
        DType::Bool => vec![(v != 0.0) as u8],
    }
}

/// A `dense<"0x…">` attribute: the raw little-endian bytes, exact for every value (inf and NaN too).
/// One element's bytes make a splat.
pub fn dense_attr(lit: &Literal, ty: &TensorType) -> String {
    let values: Vec<f64> = match lit {
        Literal::Splat(v) => vec![*v],
        Literal::Dense(vs) => vs.clone(),
    };
    if ty.dtype == DType::Bool {
        // MLIR stores i1 elements bit-packed, so spell predicates out instead of as raw bytes, in
        // lists nested as the shape (MLIR takes a flat list only for rank 1).
        let words: Vec<&str> = values.iter().map(|v| if *v != 0.0 { "true" } else { "false" }).collect();
        let body = match lit {
            Literal::Splat(_) => words[0].to_string(),
            Literal::Dense(_) if ty.numel() == 0 => String::new(),
            Literal::Dense(_) => nested(&words, &ty.shape),
        };
        return format!("dense<{body}> : {}", tensor_type(ty));
    }
    let mut hex = String::with_capacity(2 + values.len() * 8);
    hex.push_str("0x");
    for v in values {
        for b in element_bytes(ty.dtype, v) {
            hex.push_str(&format!("{b:02X}"));
        }
    }
    format!("dense<\"{hex}\"> : {}", tensor_type(ty))
}

/// `items` (row-major) as lists nested like `shape`: `[[a, b], [c, d]]` for `[2, 2]`.
fn nested(items: &[&str], shape: &[usize]) -> String {
    match shape {
        [] => items[0].to_string(),
        [_, rest @ ..] => {
            let inner: usize = rest.iter().product();
            let parts: Vec<String> = items.chunks(inner.max(1)).map(|c| nested(c, rest)).collect();
            format!("[{}]", parts.join(", "))
        }
    }
}

pub fn i64_array(values: &[usize]) -> String {
    let items: Vec<String> = values.iter().map(|v| v.to_string()).collect();
    format!("array<i64: {}>", items.join(", "))
}

pub fn int_list(values: &[usize]) -> String {
    let items: Vec<String> = values.iter().map(|v| v.to_string()).collect();
    format!("[{}]", items.join(", "))
}
