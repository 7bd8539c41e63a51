//! Pinned IR of the tiny model's entry points (tests/snapshots/). After an intended change, review
//! `INSTA_UPDATE=always cargo test --test g4c snapshots` with `git diff`.

use crate::common::golden_dir;
use g4c_frontend::{Model, Shapes};

fn tiny_ir(entry: &str) -> String {
    let model = Model::open(&golden_dir("tiny").join("published")).unwrap();
    let mut m = model.module(&Shapes { batch: 1, prefill_len: 4, context: 12 }).unwrap();
    m.functions.retain(|f| f.name == entry);
    g4c_ir::print_module(&m)
}

#[test]
fn tiny_prefill_ir() {
    insta::assert_snapshot!("tiny_prefill", tiny_ir("prefill"));
}

#[test]
fn tiny_decode_ir() {
    insta::assert_snapshot!("tiny_decode", tiny_ir("decode"));
}
