//! The IR text form: print → parse → print is identical (tiny and E2B entry points), parsing gives back
//! the same module, hand-written IR runs, and malformed text is rejected with a position.

use crate::common::{golden_dir, WeightTable};
use g4c_frontend::synth::Preset;
use g4c_frontend::{Model, Shapes};
use g4c_ir::{parse_module, print_module, verify_module, DType, Module, TensorType};
use g4c_runtime::{Interpreter, Tensor};

fn assert_round_trips(m: &Module) {
    let text = print_module(m);
    let parsed = parse_module(&text).unwrap_or_else(|e| panic!("{e}"));
    verify_module(&parsed).unwrap();
    assert_eq!(print_module(&parsed), text, "print -> parse -> print changed the text");
    // Parsing is a fixed point on parsed modules (the builder's value numbering may differ).
    assert_eq!(parse_module(&print_module(&parsed)).unwrap(), parsed);
    assert_eq!(parsed.weights, m.weights);
}

#[test]
fn tiny_entry_points_round_trip() {
    let model = Model::open(&golden_dir("tiny").join("published")).unwrap();
    for shapes in [Shapes { batch: 1, prefill_len: 8, context: 32 }, Shapes { batch: 3, prefill_len: 5, context: 9 }] {
        assert_round_trips(&model.module(&shapes).unwrap());
    }
}

#[test]
fn e2b_entry_points_round_trip() {
    // The E2B config with weight declarations derived from it (no 9 GB checkpoint needed).
    let m = Preset::E2b.declared_module(&Shapes { batch: 1, prefill_len: 128, context: 4096 }).unwrap();
    assert_round_trips(&m);
    // 15 KV-owning layers: 12 sliding + 3 full, two stored-position arrays.
    let decode = m.function("decode").unwrap();
    assert_eq!(decode.state_params().count(), 15 * 2 + 2);
    assert_eq!(
        decode.ty(decode.param("cache.l13.k").unwrap().value),
        &TensorType::new(DType::F32, [1, 1, 512 + 127, 256])
    );
    assert_eq!(decode.ty(decode.param("cache.l14.v").unwrap().value), &TensorType::new(DType::F32, [1, 1, 4096, 512]));
    assert!(decode.param("cache.l15.k").is_none(), "KV-shared layers own no cache");
    // Prefill runs the 20 KV-shared layers (15…34) on the returned token only.
    let prefill = m.function("prefill").unwrap();
    let named = |name: &str| {
        let v = (0..prefill.values.len() as u32).map(g4c_ir::ValueId).find(|&v| prefill.value_name(v) == Some(name));
        prefill.ty(v.unwrap_or_else(|| panic!("no %{name}"))).clone()
    };
    assert_eq!(named("h.l14"), TensorType::new(DType::F32, [1, 128, 1536]));
    assert_eq!(named("h.returned"), TensorType::new(DType::F32, [1, 1, 1536]));
    assert_eq!(named("l15.q"), TensorType::new(DType::F32, [1, 1, 8, 256]));
    assert_eq!(named("h.l34"), TensorType::new(DType::F32, [1, 1, 1536]));
}

#[test]
fn hand_written_ir_parses_verifies_and_runs() {
    // Writes two tokens into a 3-slot ring and scales a weight by the stored positions.
    let text = r#"
module @ring {
  weight @w : f32[3] = "w"

  func @step(
    %pos: i32[1,2],
    %slot_pos: i32[1,3] state(-1)
  ) -> (
    out: f32[1,3],
    slot_pos: i32[1,3]
  ) {
    %0 = constant {value = 3} : i32[1,2]   // ring capacity
    %slots = rem %pos, %0 : i32[1,2]
    %1 = update_slots %slot_pos, %slots, %pos {axis = 1} : i32[1,3]
    %2 = convert %1 : f32[1,3]
    %3 = weight @w : f32[3]
    %4 = broadcast %3 {dims = [1]} : f32[1,3]
    %5 = mul %2, %4 : f32[1,3]
    return %5, %1
  }
}
"#;
    let m = parse_module(text).unwrap();
    verify_module(&m).unwrap();
    let store = WeightTable(vec![("w".into(), Tensor::f32([3], vec![1.0, 10.0, 100.0]))]);
    let mut interp = Interpreter::new(std::sync::Arc::new(m), std::sync::Arc::new(store));
    let out =
        interp.call("step", vec![Tensor::i32([1, 2], vec![4, 5]), Tensor::i32([1, 3], vec![-1, -1, -1])]).unwrap();
    // Position 4 goes to slot 1 and 5 to slot 2; slot 0 stays empty (-1).
    assert_eq!(out[1].as_i32().unwrap(), &[-1, 4, 5]);
    assert_eq!(out[0].as_f32().unwrap(), &[-1.0, 40.0, 500.0]);
}

#[test]
fn malformed_text_is_rejected_with_a_position() {
    let cases = [
        (
            "module @m {\n  func @f(%x: f32[2]) -> (y: f32[2]) {\n    return %z\n  }\n}\n",
            "3:12",
            "%z is used before it is defined",
        ),
        ("module @m {\n  func @f(%x: f33[2]) -> (y: f32[2]) {\n", "2:15", "unknown element type `f33`"),
        (
            "module @m {\n  func @f(%x: f32[2]) -> (y: f32[2]) {\n    %0 = frob %x : f32[2]\n",
            "3:10",
            "unknown op `frob`",
        ),
        (
            "module @m {\n  func @f(%x: f32[2]) -> (y: f32[2]) {\n    %0 = transpose %x : f32[2]\n",
            "3:10",
            "needs attribute `perm`",
        ),
        (
            "module @m {\n  func @f(%x: f32[2]) -> (y: f32[2], z: f32[2]) {\n    return %x\n  }\n}\n",
            "3:5",
            "return has 1 value(s), the signature declares 2",
        ),
        (
            "module @m {\n  weight @w : f32[2] = \"w\"\n  func @f(%x: f32[2]) -> (y: f32[2]) {\n    return %x\n  }\n",
            "6:1",
            "expected `weight`, `func` or `}`",
        ),
    ];
    for (text, pos, needle) in cases {
        let e = parse_module(text).unwrap_err().to_string();
        assert!(e.contains(pos) && e.contains(needle), "got `{e}`, wanted {pos} and {needle:?}");
    }
}

#[test]
fn emission_passes_and_lowering_are_deterministic() {
    // Executable cache keys hash the StableHLO: any hash-order dependence would make warm runs miss.
    let shapes = Shapes { batch: 1, prefill_len: 16, context: 64 };
    let lowered = || {
        let mut m = Preset::Tiny.declared_module(&shapes).unwrap();
        let target = g4c_ir::Target::by_name("cpu").unwrap();
        g4c_passes::Pipeline::for_target(target).run_all(&mut m).unwrap();
        let mlir: Vec<String> = g4c_driver::stablehlo_programs(&m).unwrap().into_iter().map(|p| p.text).collect();
        (print_module(&m), mlir)
    };
    let first = lowered();
    for _ in 0..8 {
        assert!(lowered() == first, "emitting the same model twice gave different IR or StableHLO");
    }
}
