//! Matrix products on the host emulator (and the GPU test) against the interpreter: modules of
//! several 4-bit or 16-bit products (`Products`), split GEMMs, deep and 16-bit matvecs.

use super::*;

/// A 4-bit matvec of 40 columns (5 blocks of 8, on h200) whose depth, 2304, is 288 words: more
/// than the block's 256 threads, so 32 of them take a second word in the same trip (and the rest
/// skip it); on the host emulator against the interpreter, for h200: f32 weights (dequantized value
/// by value), bf16 and f16 ones (in pairs), and f16 weights of bf16 scales as t4g has them, here
/// scales of about 1e-7 that f16 can not hold (value by value again). One 6144 deep (E2B's down
/// projection), 768 words: a thread's first trip of 2 loaded ahead of the staging, its third in
/// the loop. And one 12544 deep, more than a block stages at once (12288 activations in 48 KB):
/// two steps, the second of 32 words, none ahead. The tiny models' matvecs are one word per
/// thread or less.
#[test]
fn a_packed_matvec_deeper_than_its_block_computes_what_the_module_does() {
    for (weight, scale, magnitude) in
        [("f32", "f32", 0.01), ("bf16", "bf16", 0.01), ("f16", "f16", 0.01), ("f16", "bf16", 1e-7)]
    {
        assert_deep_packed_matvec_agrees(weight, scale, magnitude, 2304);
    }
    assert_deep_packed_matvec_agrees("bf16", "bf16", 0.01, 6144);
    assert_deep_packed_matvec_agrees("bf16", "bf16", 0.01, 12544);
}

/// A module whose decode is one matvec of 40 columns, `depth` deep, of a 4-bit weight `q` in groups
/// of 32 (scales `s` of type `scale_type`) dequantized to `t`, by the activations `x` times the
/// token id.
pub(super) fn deep_matvec_module(t: &str, scale_type: &str, depth: usize) -> String {
    Products { entry: "decode", rows: 1, cols: 40, depth, products: 1, four_bit: true }.module(t, scale_type)
}

/// A module whose entry `entry` multiplies `rows` activations (`x` times the token ids) by
/// `products` weights (`q0`, `q1`, …) of `cols` columns each, `depth` deep, its result the
/// products side by side: 4-bit weights in groups of 32 (`four_bit`), else weights as they are.
#[derive(Clone, Copy)]
pub(super) struct Products {
    pub(super) entry: &'static str,
    pub(super) rows: usize,
    pub(super) cols: usize,
    pub(super) depth: usize,
    pub(super) products: usize,
    pub(super) four_bit: bool,
}

impl Products {
    /// The module, its weights of type `t`: 4-bit ones dequantized to `t` by scales (`s0`, `s1`, …)
    /// of type `scale_type`.
    fn module(&self, t: &str, scale_type: &str) -> String {
        let Products { entry, rows: r, cols: c, depth: d, products, four_bit } = *self;
        let mut weights = format!("  weight @x : f32[{r}, {d}] = \"x\"\n");
        let mut body = format!(
            "    %x = weight @x : f32[{r},{d}]\n    %id = convert %ids : f32[1,{r}]\n    %id.r = reshape %id : f32[{r}]\n    \
             %ids.wide = broadcast %id.r {{dims = [0]}} : f32[{r},{d}]\n    %a.f32 = mul %x, %ids.wide : f32[{r},{d}]\n    \
             %a = convert %a.f32 : {t}[{r},{d}]\n"
        );
        for j in 0..products {
            if four_bit {
                weights += &format!(
                    "  weight @q{j} : i4[{c}, {d}] = \"q{j}\"\n  weight @s{j} : {scale_type}[{c}, {}] = \"s{j}\"\n",
                    d / 32
                );
                body += &format!(
                    "    %q{j} = weight @q{j} : i4[{c},{d}]\n    %s{j} = weight @s{j} : {scale_type}[{c},{}]\n    \
                     %w{j} = dequantize %q{j}, %s{j} {{group = 32}} : {t}[{c},{d}]\n",
                    d / 32
                );
            } else {
                weights += &format!("  weight @q{j} : {t}[{c}, {d}] = \"q{j}\"\n");
                body += &format!("    %w{j} = weight @q{j} : {t}[{c},{d}]\n");
            }
            body += &format!(
                "    %y{j}.t = dot_general %a, %w{j} {{lhs_batch = [], rhs_batch = [], lhs_contract = [1], rhs_contract = [1]}} : {t}[{r},{c}]\n    \
                 %y{j} = convert %y{j}.t : f32[{r},{c}]\n"
            );
        }
        let all = c * products;
        let result = match products {
            1 => "%y0".to_string(),
            _ => {
                let ys: Vec<String> = (0..products).map(|j| format!("%y{j}")).collect();
                body += &format!("    %y = concat {} {{axis = 1}} : f32[{r},{all}]\n", ys.join(", "));
                "%y".to_string()
            }
        };
        format!(
            "module @w4 {{\n{weights}  func @{entry}(\n    %ids: i32[1,{r}] token_ids,\n    %pos: i32[1,{r}] positions\n  ) -> (\n    \
             logits: f32[{r},{all}] logits\n  ) {{\n{body}    return {result}\n  }}\n}}\n"
        )
    }

    /// The weights of `module`: pseudo-random, as `product_outputs` says.
    fn weights(&self, (t, scale_type): (&str, &str), magnitude: f32) -> Vec<(String, g4c_runtime::Tensor)> {
        let Products { rows, cols, depth, products, four_bit, .. } = *self;
        let mut seed = 7u64;
        let mut next = move || {
            seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            (seed >> 33) as u32
        };
        let s_dtype: g4c_ir::DType = scale_type.parse().unwrap();
        let mut weights = Vec::new();
        for j in 0..products {
            if !four_bit {
                // The 4-bit weights' values: integers from -8 to 7 times `magnitude` to twice that.
                let w = (0..cols * depth)
                    .map(|_| ((next() % 16) as f32 - 8.0) * magnitude * (1.0 + (next() % 100) as f32 * 0.01))
                    .collect();
                let w = g4c_runtime::Tensor::f32([cols, depth], w);
                let dtype: g4c_ir::DType = t.parse().unwrap();
                let bytes = g4c_runtime::tensor::convert_float_bytes(g4c_ir::DType::F32, dtype, &w.to_bytes()).unwrap();
                let w = g4c_ir::TensorType::new(dtype, [cols, depth]);
                weights.push((format!("q{j}"), g4c_runtime::Tensor::from_bytes(w, &bytes).unwrap()));
                continue;
            }
            let nibbles: Vec<u8> = (0..cols * depth / 2).map(|_| next() as u8).collect();
            let q = g4c_ir::TensorType::new(g4c_ir::DType::I4, [cols, depth]);
            weights.push((format!("q{j}"), g4c_runtime::Tensor::from_bytes(q, &nibbles).unwrap()));
            let s = (0..cols * depth / 32).map(|_| magnitude * (1.0 + (next() % 100) as f32 * 0.01)).collect();
            let s = g4c_runtime::Tensor::f32([cols, depth / 32], s);
            let bytes = g4c_runtime::tensor::convert_float_bytes(g4c_ir::DType::F32, s_dtype, &s.to_bytes()).unwrap();
            let s = g4c_ir::TensorType::new(s_dtype, [cols, depth / 32]);
            weights.push((format!("s{j}"), g4c_runtime::Tensor::from_bytes(s, &bytes).unwrap()));
        }
        let x = (0..rows * depth).map(|_| (next() % 2001) as f32 / 1000.0 - 1.0).collect();
        weights.push(("x".into(), g4c_runtime::Tensor::f32([rows, depth], x)));
        weights
    }
}

/// A packed matvec `depth` deep (in groups of 32) whose weight is of type `t` and its scales (from
/// `magnitude` to twice that) of type `scale_type`, on the host emulator against the interpreter.
fn assert_deep_packed_matvec_agrees(t: &str, scale_type: &str, magnitude: f32, depth: usize) {
    let product = Products { entry: "decode", rows: 1, cols: 40, depth, products: 1, four_bit: true };
    let h200 = Target::by_name("h200").unwrap();
    let (plan, want, got) = product_outputs(product, (t, scale_type), magnitude, h200, emulator);
    let kinds: Vec<&str> = plan.entries[0].calls.iter().map(|c| c.kind.name()).collect();
    assert!(kinds.contains(&"matvec_w4"), "{kinds:?}");
    let tile = plan.entries[0].calls.iter().find_map(|c| c.launch.tile).unwrap();
    assert!(tile.packed, "{tile:?}");
    assert_eq!((tile.k as usize) < depth, depth > 12288, "{tile:?}");
    assert_products_agree(&format!("{t} of {scale_type} scales"), t, magnitude, &got, &want);
}

/// Matvecs whose blocks stride over their groups of columns (`Tile::strided`), planned for a t4g
/// of one SM (two blocks at once) with 44 columns: 6 groups of 8, the last of 4, so one block takes
/// groups 0, 2 and 4, the other 1, 3 and 5. 4-bit ones of f16 weights and bf16 scales (t4g's QAT
/// weights): 2304 deep (a thread's words in one trip), 6144 (two trips: the second loaded in the
/// loop, for the block's current group), GELU(gate)·up's two products 6144 deep (three trips), and
/// in a dynamic region past 48 KiB, for one block at a time, 12288 deep (E2B's down projections: 48
/// KiB of activations and the partial sums after them), 2 rows 6144 deep (as `g4c serve` batches
/// two sequences) and 8 rows 1536 deep (a batch of 8, one block an SM); staged a step of 1536 or
/// 6144 at a time where 64 KiB does not hold the whole contraction, each step once for all the
/// block's groups: 8 rows 2304 deep (a step and a shorter one), 8 rows 6144 deep and 2 rows of
/// two products 12288 deep; and a 16-bit one. On the host emulator against the interpreter.
#[test]
fn a_strided_matvec_computes_what_the_module_does() {
    assert_strided_matvecs_agree(emulator);
}

/// `a_strided_matvec_computes_what_the_module_does`'s cases, on `device`.
pub(super) fn assert_strided_matvecs_agree<D: Device + 'static>(device: fn(&[DeviceProgram]) -> D) {
    // Rows, depth, products, 4-bit.
    let cases = [
        (1, 2304, 1, true),
        (1, 6144, 1, true),
        (1, 6144, 2, true),
        (1, 12288, 1, true),
        (2, 6144, 1, true),
        (8, 1536, 1, true),
        (8, 2304, 1, true),
        (8, 6144, 1, true),
        (2, 12288, 2, true),
        (1, 1536, 1, false),
    ];
    for (rows, depth, products, four_bit) in cases {
        let product = Products { entry: "decode", rows, cols: 44, depth, products, four_bit };
        let scales = if four_bit { "bf16" } else { "f16" };
        let (plan, want, got) = product_outputs(product, ("f16", scales), 0.01, &ONE_SM_T4G, device);
        let what = format!(
            "{rows} rows, {depth} deep, {products} products, {}: {}",
            if four_bit { "4-bit" } else { "16-bit" },
            print_plan(&plan, false)
        );
        let call = &plan.entries[0].calls[0];
        let tile = call.launch.tile.unwrap_or_else(|| panic!("{what}"));
        let dynamic = SharedRegion::of(std::slice::from_ref(call)).dynamic_bytes() > 0;
        assert_eq!(dynamic, rows * depth > 6144, "{what}: a dynamic region");
        // 64 KiB of f32 activations: more are staged a step at a time.
        assert_eq!((tile.k as usize) < depth, rows * depth > 16384, "{what}: staged in steps");
        // The SM holds one block with a region past 48 KiB, two with the others.
        let grid = if dynamic { 1 } else { 2 };
        assert!(tile.strided && tile.packed == four_bit && call.launch.grid == grid, "{what}");
        assert_products_agree(&what, "f16", 0.01, &got, &want);
    }
}

/// A strided 4-bit matvec whose blocks together would stage more activations than its weights
/// hold splits its contraction over them (`Tile::splits`): each block stages its share once for
/// all of its groups and leaves their partial sums in the split-sums buffer, and the last of the
/// blocks taking the same groups adds them up and applies the epilogue. Planned for a t4g of four
/// SMs (one block an SM at 8 rows): 8 rows 6144 deep in 4 shares of 1536 (a block taking all 22
/// groups of its share), 8 rows 4640 deep in 3 (1568, 1568 and 1504), and 2 rows of two products
/// 12288 deep (a kernel each, side by side in one launch, each in 2 shares of 2 blocks, each block
/// every other group). Each runs twice, other inputs first: the counts must start the second run
/// at zero again. On the host emulator against the interpreter.
#[test]
fn a_split_matvec_computes_what_the_module_does() {
    assert_split_matvecs_agree(emulator);
}

/// `a_split_matvec_computes_what_the_module_does`'s cases, on `device`.
pub(super) fn assert_split_matvecs_agree<D: Device + 'static>(device: fn(&[DeviceProgram]) -> D) {
    // Rows, depth, products; the shares and the grid.
    let cases = [(8, 6144, 1, 4, 4), (8, 4640, 1, 3, 3), (2, 12288, 2, 2, 4)];
    for (rows, depth, products, splits, grid) in cases {
        let product = Products { entry: "decode", rows, cols: 44, depth, products, four_bit: true };
        let (plan, want, got) = product_outputs(product, ("f16", "bf16"), 0.01, &FOUR_SM_T4G, device);
        let what = format!("{rows} rows, {depth} deep, {products} products: {}", print_plan(&plan, false));
        let call = &plan.entries[0].calls[0];
        let tile = call.launch.tile.unwrap_or_else(|| panic!("{what}"));
        assert!(tile.strided && tile.splits == splits && call.launch.grid == grid, "{what}");
        assert!(call.split_sums.is_some(), "{what}: no split sums");
        assert_products_agree(&what, "f16", 0.01, &got, &want);
    }
}

/// A t4g of four SMs, where a matvec of E2B's depths but few columns splits its contraction.
static FOUR_SM_T4G: std::sync::LazyLock<Target> = std::sync::LazyLock::new(|| {
    let mut t = Target::by_name("t4g").unwrap().clone();
    t.gpu.as_mut().unwrap().sm_count = 4;
    t
});

/// A kernel of a thread per element whose blocks each lie in one row (4 rows of 512, blocks of
/// 256) computes that row's statistics alone in its prelude (`Prelude::one_row`), the second (a sum
/// of squares about the row's maximum) reading the first: on the host emulator, whose blocks see
/// NaN wherever their shared memory was not written, against the interpreter.
#[test]
fn a_row_normalized_in_blocks_of_one_row_computes_what_the_module_does() {
    let (rows, len) = (4, 512);
    let text = format!(
        "module @rows {{\n  weight @x : f32[{rows}, {len}] = \"x\"\n  func @decode(\n    %ids: i32[1,{rows}] token_ids,\n    \
         %pos: i32[1,{rows}] positions\n  ) -> (\n    logits: f32[{rows},{len}] logits\n  ) {{\n    \
         %x = weight @x : f32[{rows},{len}]\n    %id = convert %ids : f32[1,{rows}]\n    %id.r = reshape %id : f32[{rows}]\n    \
         %ids.wide = broadcast %id.r {{dims = [0]}} : f32[{rows},{len}]\n    %a = mul %x, %ids.wide : f32[{rows},{len}]\n    \
         %m = reduce %a {{kind = max, axes = [1]}} : f32[{rows}]\n    %mb = broadcast %m {{dims = [0]}} : f32[{rows},{len}]\n    \
         %c = sub %a, %mb : f32[{rows},{len}]\n    %sq = mul %c, %c : f32[{rows},{len}]\n    \
         %ss = reduce %sq {{kind = sum, axes = [1]}} : f32[{rows}]\n    %n = constant {{value = {len}.0}} : f32[{rows}]\n    \
         %ms = div %ss, %n : f32[{rows}]\n    %r = rsqrt %ms : f32[{rows}]\n    \
         %rb = broadcast %r {{dims = [0]}} : f32[{rows},{len}]\n    %y = mul %c, %rb : f32[{rows},{len}]\n    \
         return %y\n  }}\n}}\n"
    );
    let x = (0..rows * len).map(|i| ((i * 7919) % 2001) as f32 / 1000.0 - 1.0).collect();
    let weights = vec![("x".to_string(), g4c_runtime::Tensor::f32([rows, len], x))];
    for target in ["h200", "t4g"] {
        let target = Target::by_name(target).unwrap();
        let (plan, want, got) = module_outputs((&text, "decode", rows), weights.clone(), target, emulator);
        let what = print_plan(&plan, false);
        let calls = &plan.entries[0].calls;
        assert_eq!(calls.len(), 1, "{what}");
        let prelude = calls[0].launch.prelude.unwrap_or_else(|| panic!("{what}"));
        assert!(prelude.one_row && prelude.reductions == 2 && calls[0].launch.grid == 8, "{what}");
        let scale = want.iter().fold(0f32, |m, x| m.max(x.abs()));
        for (i, (a, b)) in got.iter().zip(&want).enumerate() {
            assert!((a - b).abs() <= 1e-5 * scale, "{what}: output {i}: {a} where the interpreter computes {b}");
        }
    }
}

/// A kernel whose prelude computes its blocks' rows alone (`Prelude::one_row`) is not made a tail
/// (`tails`), which would run all its blocks' elements on one block: the norm of a 4-row matvec's
/// 256 outputs a row (4 blocks, a row each), which reads nothing but the matvec's output. On the
/// host emulator against the interpreter.
#[test]
fn a_kernel_of_a_row_a_block_is_not_a_tail() {
    let product = Products { entry: "decode", rows: 4, cols: 256, depth: 256, products: 1, four_bit: false };
    let norm = "    %sq = mul %y0, %y0 : f32[4,256]\n    %ss = reduce %sq {kind = sum, axes = [1]} : f32[4]\n    \
                %n = constant {value = 256.0} : f32[4]\n    %ms = div %ss, %n : f32[4]\n    %r = rsqrt %ms : f32[4]\n    \
                %rb = broadcast %r {dims = [0]} : f32[4,256]\n    %out = mul %y0, %rb : f32[4,256]\n    return %out\n";
    let text = product.module("bf16", "bf16").replace("    return %y0\n", norm);
    let weights = product.weights(("bf16", "bf16"), 0.01);
    let h200 = Target::by_name("h200").unwrap();
    let (plan, want, got) = module_outputs((&text, "decode", 4), weights, h200, emulator);
    let what = print_plan(&plan, false);
    let calls = &plan.entries[0].calls;
    let norm = calls.iter().find(|c| c.launch.prelude.is_some_and(|p| p.one_row)).unwrap_or_else(|| panic!("{what}"));
    assert!(!norm.tail && norm.launch.grid == 4, "{what}");
    assert_products_agree(&what, "bf16", 0.01, &got, &want);
}

/// A prefill GEMM of few tiles splits its contraction over blocks (`Tile::splits`), whose partial
/// sums the last block of each tile adds (`add_split_sums`): on the host emulator, against the
/// interpreter, for h200 in bf16 and t4g in f16 (each 8 blocks a tile), through two launches (the split sums' counts start the second at zero again).
#[test]
fn a_split_gemm_computes_what_the_module_does() {
    for (target, t) in [("h200", "bf16"), ("t4g", "f16")] {
        assert_split_gemm_agrees(target, t, emulator);
    }
}

/// `a_split_gemm_computes_what_the_module_does`'s case for `target` in `t`, on `device`: one
/// product, then two side by side in one launch (concatenated: each product a GEMM kernel of its
/// own, which no template could compute inside the concatenation), each its own part of the split
/// sums (checked in the plan: the host runs blocks one after another, so parts that overlapped
/// would not race there).
pub(super) fn assert_split_gemm_agrees<D: Device + 'static>(
    target: &'static str,
    t: &str,
    device: fn(&[DeviceProgram]) -> D,
) {
    for products in [1, 2] {
        let product = Products { entry: "prefill", rows: 64, cols: 256, depth: 2048, products, four_bit: true };
        let (plan, want, got) = product_outputs(product, (t, t), 0.01, Target::by_name(target).unwrap(), device);
        let launch = plan.entries[0].launches().next().unwrap();
        let what = format!("{target}, {t}, {products} products: {}", print_plan(&plan, false));
        assert_eq!(launch.len(), products, "{what}");
        // The calls' parts of the split sums, which the host runs one after another, do not
        // overlap, and the counts come before every partial sum.
        let first_partial = launch.iter().filter_map(|c| c.split_sums).map(|s| s.partials).min().unwrap_or(0);
        let (mut counts_end, mut end) = (0, first_partial);
        for call in launch {
            let tile = call.launch.tile.unwrap();
            assert!(tile.splits > 1, "{what}");
            assert_eq!(
                call.launch.grid,
                4 * tile.splits,
                "{what}: 4 tiles of 64 x 64, each over {} blocks",
                tile.splits
            );
            let sums = call.split_sums.unwrap_or_else(|| panic!("{what}: no split sums"));
            let kernel = plan.kernels.function(&call.kernel).unwrap();
            let bytes = g4c_passes::split_sums_bytes(kernel, &call.launch).unwrap();
            assert!(sums.counts >= counts_end && sums.partials >= end, "{what}");
            (counts_end, end) = (sums.counts + bytes.counts, sums.partials + bytes.partials);
            assert!(counts_end <= first_partial, "{what}");
            let g4c_ir::plan::Slot::Scratch(b) = sums.buffer else { panic!("{what}: split sums in a parameter") };
            assert!(plan.entries[0].buffers[b] >= end, "{what}");
        }
        assert_products_agree(&what, t, 0.01, &got, &want);
    }
}

/// A prefill GEMM whose rows, columns and depth each end in a partial tile (70 rows, 72 columns,
/// 160 deep: tiles of 64 × 64 × 128) reads inside its operands and stages 0 past them, for 4-bit
/// and 16-bit weights; one of whole tiles reads at its indices unclamped (`Edges`). On the host
/// emulator, against the interpreter, for h200 in bf16 and t4g in f16.
#[test]
fn a_gemm_of_partial_tiles_computes_what_the_module_does() {
    for (target, t) in [("h200", "bf16"), ("t4g", "f16")] {
        let gpu = Target::by_name(target).unwrap();
        let source = |product: Products| {
            let plan = plan_module(&g4c_ir::parse_module(&product.module(t, t)).unwrap(), gpu).unwrap();
            g4c_driver::cuda_programs(&plan, gpu, false).unwrap().programs.remove(0).source
        };
        for four_bit in [true, false] {
            let product = Products { entry: "prefill", rows: 70, cols: 72, depth: 160, products: 1, four_bit };
            let (plan, want, got) = product_outputs(product, (t, t), 0.01, gpu, emulator);
            let what = format!("{target}, {t}, 4-bit {four_bit}: {}", print_plan(&plan, false));
            let tile = plan.entries[0].calls[0].launch.tile.unwrap_or_else(|| panic!("{what}: no tile"));
            assert_eq!((tile.rows, tile.cols, tile.k, tile.mma.is_some()), (64, 64, 128, true), "{what}");
            // Every edge is tested (the outputs check the depth's alone: rows and columns past
            // the edge only feed outputs that are not stored).
            let edges = source(product);
            let tests = ["r < 70 && kk < 160;", "n < 72 && kk < 160;"];
            assert!(tests.iter().all(|t| edges.contains(t)), "{what}: the edges are not all tested: {edges}");
            assert_products_agree(&what, t, 0.01, &got, &want);
        }
        for four_bit in [true, false] {
            let whole = source(Products { entry: "prefill", rows: 64, cols: 128, depth: 256, products: 1, four_bit });
            let tested = whole.contains("bool within");
            assert!(whole.contains("g4c_gemm") && !tested, "{target}: whole tiles test an edge: {whole}");
        }
    }
}

/// The host emulator, for `product_outputs`.
fn emulator(programs: &[DeviceProgram]) -> Emulator {
    Emulator::new(programs).unwrap()
}

/// `product`'s module, its weights of type `t` and its scales (from `magnitude` to twice that) of
/// type `scale_type` (weights as they are: the 4-bit values times such scales), planned for
/// `target`: the plan, then its output from the interpreter and from the plan's kernels on
/// `device` (their second run).
fn product_outputs<D: Device + 'static>(
    product: Products,
    (t, scale_type): (&str, &str),
    magnitude: f32,
    target: &'static Target,
    device: fn(&[DeviceProgram]) -> D,
) -> (KernelPlan, Vec<f32>, Vec<f32>) {
    let text = product.module(t, scale_type);
    let weights = product.weights((t, scale_type), magnitude);
    module_outputs((&text, product.entry, product.rows), weights, target, device)
}

/// The outputs of `entry` of the module `text` (whose `rows` token ids scale its inputs, as
/// `Products::module`'s do) over `weights`, from the interpreter and from `target`'s kernels on
/// `device`, and the plan.
fn module_outputs<D: Device + 'static>(
    (text, entry, rows): (&str, &str, usize),
    weights: Vec<(String, g4c_runtime::Tensor)>,
    target: &'static Target,
    device: fn(&[DeviceProgram]) -> D,
) -> (KernelPlan, Vec<f32>, Vec<f32>) {
    use g4c_runtime::backend::cuda::DeviceExecutor;
    use g4c_runtime::{Executor, StepInputs, StepOutput};
    use std::sync::Arc;
    let module = Arc::new(g4c_ir::parse_module(text).unwrap());
    g4c_ir::verify_module(&module).unwrap();
    let store: Arc<dyn g4c_runtime::WeightStore> = Arc::new(WeightTable(weights));
    let plan = Arc::new(plan_module(&module, target).unwrap());
    // PTX and a cubin for a GPU, which runs those; the host emulator compiles the CUDA C itself.
    let for_a_gpu = std::any::TypeId::of::<D>() != std::any::TypeId::of::<Emulator>();
    let programs = g4c_driver::cuda_programs(&plan, target, for_a_gpu).unwrap().programs;
    let device = device(&programs);
    let mut device = DeviceExecutor::new(module.clone(), plan.clone(), &programs, store.clone(), device).unwrap();
    let mut interp = g4c_runtime::InterpExecutor::new(g4c_runtime::Interpreter::new(module, store));
    let output = |exec: &mut dyn Executor, first_id: u32| {
        let ids: Vec<u32> = (0..rows as u32).map(|r| first_id + r % 5).collect();
        exec.reset().unwrap();
        let inputs = StepInputs::padded(rows, &[(0, &ids[..])], false);
        exec.step(entry, &inputs, StepOutput::Logits).unwrap().as_f32().unwrap().to_vec()
    };
    let want = output(&mut interp, 3);
    // Other ids first, so that a second run that wrote nothing would leave the wrong outputs.
    output(&mut device, 4);
    let got = output(&mut device, 3);
    (Arc::unwrap_or_clone(plan), want, got)
}

/// `got` within rounding of `want`, products of weights of type `t` whose scales start at
/// `magnitude`, summed in another order: f32 within 1e-5 of the outputs' scale, a 16-bit output
/// one rounding either way.
fn assert_products_agree(what: &str, t: &str, magnitude: f32, got: &[f32], want: &[f32]) {
    let scale = want.iter().fold(0f32, |m, x| m.max(x.abs()));
    assert!(scale > 50.0 * magnitude, "{what}: the products are not all near zero: {want:?}");
    for (i, (a, b)) in got.iter().zip(want).enumerate() {
        let tolerance = match t {
            "f32" => 1e-5 * scale,
            _ => 2f32.powi(-7) * b.abs().max(1e-3 * scale),
        };
        assert!((a - b).abs() <= tolerance, "{what}: output {i}: {a} where the interpreter computes {b}");
    }
}

/// The 16-bit matvec on the host emulator against the interpreter: bf16 (h200) and f16 (t4g)
/// weights read 8 at a time, rows 1536 deep (6 vectors a lane) and 1544 (193 vectors: lane 0 takes
/// a seventh, and the others run theirs one by one); 3 rows (a short prefill) too.
#[test]
fn a_16_bit_matvec_computes_what_the_module_does() {
    for (target, t) in [("h200", "bf16"), ("t4g", "f16")] {
        for (rows, depth) in [(1, 1536), (1, 1544), (3, 1544)] {
            let entry = if rows == 1 { "decode" } else { "prefill" };
            let product = Products { entry, rows, cols: 40, depth, products: 1, four_bit: false };
            let (plan, want, got) = product_outputs(product, (t, t), 0.01, Target::by_name(target).unwrap(), emulator);
            let kinds: Vec<&str> = plan.entries[0].calls.iter().map(|c| c.kind.name()).collect();
            assert_eq!(kinds, ["matvec"], "{target}");
            assert_products_agree(&format!("{target}, {t}, {rows} x {depth}"), t, 0.01, &got, &want);
        }
    }
}

/// `product`'s module in bf16 (bf16 scales, if 4-bit), planned for h200.
pub(super) fn bf16_plan_for_h200(product: Products) -> (KernelPlan, &'static Target) {
    let module = g4c_ir::parse_module(&product.module("bf16", "bf16")).unwrap();
    let target = Target::by_name("h200").unwrap();
    (plan_module(&module, target).unwrap(), target)
}
