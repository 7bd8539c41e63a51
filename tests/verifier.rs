//! The verifier names the function, the value, the op and the mismatch.

use g4c_ir::{parse_module, verify_module};

fn problems(body: &str) -> String {
    let text = format!(
        "module @m {{\n  weight @w : bf16[4,8] = \"w\"\n  func @f(\n    %x: f32[2,8],\n    %ids: i32[2,3],\n    %cache: f32[2,5,8] state(0)\n  ) -> (\n    cache: f32[2,5,8]\n  ) {{\n{body}\n    return %cache\n  }}\n}}\n"
    );
    let m = parse_module(&text).unwrap_or_else(|e| panic!("{e}"));
    verify_module(&m).expect_err("verification should fail").to_string()
}

#[test]
fn rejects_ill_typed_ops() {
    let cases = [
        ("    %0 = add %x, %ids : f32[2,8]", "%0 = add: `add` operands differ: f32[2,8] vs i32[2,3]"),
        ("    %0 = weight @w : f32[4,8]", "%0 = weight: result type is f32[4,8], op produces bf16[4,8]"),
        ("    %0 = weight @nope : f32[4,8]", "no weight named @nope"),
        (
            "    %0 = dot_general %x, %x {lhs_batch = [], rhs_batch = [], lhs_contract = [1], rhs_contract = [0]} : f32[2,8]",
            "lhs dim 1 (8) != rhs dim 0 (2)",
        ),
        ("    %0 = reshape %x : f32[3,5]", "reshape f32[2,8] to f32[3,5] changes the element count"),
        ("    %0 = transpose %x {perm = [0, 0]} : f32[2,8]", "not a permutation"),
        ("    %0 = broadcast %x {dims = [0, 1]} : f32[2,4,8]", "input dim 1 (8) does not fit result dim 1 (4)"),
        ("    %0 = slice %x {start = [0, 4], limit = [2, 9]} : f32[2,5]", "slice [4, 9) out of range for dim 1"),
        ("    %0 = update_slots %cache, %ids, %x {axis = 1} : f32[2,5,8]", "update_slots updates must be f32[2,3,8], found f32[2,8]"),
        ("    %0 = exp %ids : i32[2,3]", "`exp` does not accept i32[2,3]"),
        ("    %0 = reduce %x {kind = sum, axes = [2]} : f32[2]", "reduce axes [2]: 2 out of range for rank 2"),
    ];
    for (body, needle) in cases {
        let msg = problems(body);
        assert!(msg.contains("@f:") && msg.contains(needle), "got `{msg}`, wanted {needle:?}");
    }
}

#[test]
fn accepts_well_typed_gather_and_reports_every_problem() {
    let msg = problems(
        "    %0 = gather %x, %ids : f32[2,3,8]\n    %1 = add %x, %ids : f32[2,8]\n    %2 = neg %ids : f32[2,3]",
    );
    assert!(msg.contains("2 problem(s)"), "{msg}");
    assert!(!msg.contains("%0 = gather"), "{msg}");
}

#[test]
fn state_must_come_back_with_the_same_type() {
    let text = "module @m {\n  func @f(%s: f32[2] state(0)) -> (t: f32[2]) {\n    return %s\n  }\n}\n";
    let msg = verify_module(&parse_module(text).unwrap()).unwrap_err().to_string();
    assert!(msg.contains("state %s has no result of the same name"), "{msg}");
}

#[test]
fn greedy_tokens_are_one_i32_per_row_of_logits() {
    let module = |greedy: &str| {
        format!(
            "module @m {{\n  func @f(%l: f32[2,5], %g: {greedy}) -> (logits: f32[2,5] logits, greedy: {greedy} greedy_tokens) {{\n    return %l, %g\n  }}\n}}\n"
        )
    };
    assert!(verify_module(&parse_module(&module("i32[2]")).unwrap()).is_ok());
    for (greedy, found) in [("f32[2]", "found f32[2]"), ("i32[2,5]", "found i32[2,5]"), ("i32[5]", "found i32[5]")] {
        let msg = verify_module(&parse_module(&module(greedy)).unwrap()).unwrap_err().to_string();
        assert!(msg.contains("`greedy_tokens` must be i32[2]") && msg.contains(found), "{msg}");
    }
    let alone = "module @m {\n  func @f(%g: i32[2]) -> (greedy: i32[2] greedy_tokens) {\n    return %g\n  }\n}\n";
    let msg = verify_module(&parse_module(alone).unwrap()).unwrap_err().to_string();
    assert!(msg.contains("`greedy_tokens` without a `logits` result"), "{msg}");
}
