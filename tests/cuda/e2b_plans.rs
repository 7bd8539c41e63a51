//! E2B's kernel plans (the real shapes, weights declared, not read): launches, tiles, regions
//! and splits per target, and their kernels compiled for every GPU class within its limits.

use super::*;

pub(super) fn e2b_plan(target: &'static Target) -> KernelPlan {
    e2b_plan_of(target, Shapes { batch: 1, prefill_len: 128, context: 4096 })
}

/// `e2b_plan` for other shapes.
fn e2b_plan_of(target: &'static Target, shapes: Shapes) -> KernelPlan {
    let mut m = g4c_frontend::synth::Preset::E2b.declared_module(&shapes).unwrap();
    Pipeline::new(target, &PipelineOptions { quantize_group: Some(32), ..Default::default() }).run_all(&mut m).unwrap();
    plan_module(&m, target).unwrap()
}

/// E2B's decode plan on t4g, W4A16 in groups of 32 (the QAT export's): every launch, its kind,
/// buffers, grid, tile and shared memory.
#[test]
fn e2b_decode_plan_on_t4g() {
    let mut plan = e2b_plan(Target::by_name("t4g").unwrap());
    plan.entries.retain(|e| e.entry == "decode");
    // Beside the other tests' snapshots (insta looks beside the source file, `tests/cuda/`).
    insta::with_settings!({ snapshot_path => "../snapshots" }, {
        insta::assert_snapshot!("e2b_w4a16_t4g_decode_plan", print_plan(&plan, false));
    });
}

/// E2B's 12288-deep down projections (the 20 layers of doubled feed-forward width) stride over
/// their 192 groups of columns on t4g, in a region past the static 48 KiB (`SharedRegion`): the
/// activations take 48 KiB and the partial sums 256 bytes more, and a T4's SM holds one block of
/// either. On h200 192 groups are less than a wave, and the region stays static.
#[test]
fn e2b_down_projections_on_t4g_stride_in_a_dynamic_region() {
    for (target, strided, region) in
        [("t4g", true, SharedRegion::Dynamic(49408)), ("h200", false, SharedRegion::Static(49152))]
    {
        let plan = e2b_plan(Target::by_name(target).unwrap());
        let down: Vec<&[KernelCall]> = (plan.entry("decode").unwrap().launches())
            .filter(|l| l.iter().any(|c| c.launch.tile.is_some_and(|t| t.k == 12288)))
            .collect();
        assert_eq!(down.len(), 20, "{target}");
        for launch in down {
            let what = format!("{target}: {}", launch[0].kernel);
            assert_eq!((launch.len(), SharedRegion::of(launch)), (1, region), "{what}");
            assert_eq!(launch[0].launch.tile.unwrap().strided, strided, "{what}");
        }
    }
}

/// A decode step of several sequences computes each sliding layer's softmax maximum and sum in its
/// weighted sum of values, as one sequence's does: a block stages one head's probabilities of one
/// sequence and computes that row's statistics alone (`staged_row_of`), where the statistics of
/// all 32 rows in each of its 256 blocks were over the preludes' budget, two launches of their own
/// each layer. On h200 the full-attention layers' too; on t4g (40 SMs) their 4096-slot rows, in 512
/// blocks, stay over the budget of what an SM's blocks recompute. And each layer's residual kernel,
/// whose blocks write 256 features of one sequence, computes that sequence's norm statistics alone
/// (`element_row_of`), which took a launch of their own each layer.
#[test]
fn e2b_batched_decode_computes_statistics_a_row_a_block() {
    for (target, sums) in [("h200", 35), ("t4g", 28)] {
        let plan = e2b_plan_of(Target::by_name(target).unwrap(), Shapes { batch: 4, prefill_len: 64, context: 4096 });
        let one_row = |c: &&KernelCall| c.launch.prelude.is_some_and(|p| p.one_row);
        let calls: Vec<&KernelCall> = plan.entry("decode").unwrap().calls.iter().filter(one_row).collect();
        let staged = calls.iter().filter(|c| matches!(c.launch.split, Some(ReduceSplit::WarpsPerExtent { .. })));
        let residual = calls.iter().filter(|c| c.kind == KernelKind::Loop && c.launch.prelude.unwrap().reductions == 3);
        assert_eq!(staged.count(), sums, "{target}: weighted sums computing their row's softmax statistics");
        assert_eq!(residual.count(), 35, "{target}: residual kernels computing their row's three norms' statistics");
    }
}

/// A decode step of 8 sequences (`g4c serve`'s default batch) stages each matvec's activations
/// once a block: every matvec of 8 rows at least 1536 deep strides over its columns, one block an
/// SM staging its 8 × 1536 or more activations (48 KiB and up, in a dynamic region) for all of
/// its groups. Unstrided, each block of a 6144-wide gate/up projection (6144 blocks, a column each)
/// staged them all: 32 GB through L2 a step. Where the blocks would still stage more than the
/// weights hold, the deep ones split their contraction over blocks (`Tile::splits`), each staging
/// a share: the down projections (6144 and 12288 deep) on every GPU, the full layers' 4096-deep
/// output projections on a100 and h200 (t4g's 64 KiB holds no 8 × 2048 share beside the partial
/// sums); a matvec deeper than the opt-in holds and not split stages a step at a time (deeper than
/// 1536 on t4g, 4096 on a100, 6144 on h200). The per-layer projection (256 deep, 8 KiB) does not
/// stride. With the blocks few, three of each layer's four kernels of norm statistics move into
/// the preludes of the matvecs reading them (the fourth would give the gate/up projection's
/// prelude two norms of 8 × 1536, over a block's budget): 397 launches on a100 and h200, 411 on
/// t4g, where there were 503 and 517.
#[test]
fn e2b_decode_of_8_sequences_stages_activations_once_a_block() {
    // Each target: the deepest contraction staged whole, the launches.
    for (target, whole_at_most, launches) in [("t4g", 1536, 411), ("a100", 4096, 397), ("h200", 6144, 397)] {
        // The shares a contraction so deep splits into.
        let splits = |depth: usize| match (target, depth) {
            (_, 6144) => 4,
            ("t4g", 12288) => 7,
            ("a100", 12288) => 5,
            ("h200", 12288) => 6,
            ("a100" | "h200", 4096) => 2,
            _ => 1,
        };
        let plan = e2b_plan_of(Target::by_name(target).unwrap(), Shapes { batch: 8, prefill_len: 64, context: 4096 });
        let decode = plan.entry("decode").unwrap();
        let mut strided = 0;
        for c in decode.calls.iter().filter(|c| matches!(c.kind, KernelKind::Matvec | KernelKind::MatvecW4)) {
            let (m, tile) =
                (g4c_passes::matvec_of(plan.kernels.function(&c.kernel).unwrap()).unwrap(), c.launch.tile.unwrap());
            let what = format!("{target}: {} ({} rows, {} deep): {tile:?}", c.kernel, m.rows, m.depth);
            assert_eq!(m.rows, 8, "{what}");
            assert_eq!(tile.strided, m.depth >= 1536, "{what}");
            assert_eq!(tile.splits, splits(m.depth), "{what}: split");
            if tile.strided {
                let stepped = tile.splits == 1 && (tile.k as usize) < m.depth;
                assert_eq!(stepped, tile.splits == 1 && m.depth > whole_at_most, "{what}: staged in steps");
                assert!(SharedRegion::of(std::slice::from_ref(c)).dynamic_bytes() > 0, "{what}: a dynamic region");
                strided += 1;
            }
        }
        assert_eq!(strided, 242 - 35, "{target}: strided matvecs");
        assert_eq!(decode.launches().count(), launches, "{target}: launches");
    }
}

/// A decode layer's projections (q, k and v; q alone where the layer reads another's cache)
/// compute the residual stream they stage (`recompute`) rather than wait for the kernel
/// materializing it, and run in its launch, one dependent launch fewer: every layer but the first
/// (whose input is the embedding). On t4g the 3 full-attention layers that compute their own keys
/// and values did not while a block took one group of 8 columns: their 640 blocks of projections
/// recomputed more than the preludes' budget for t4g's 40 SMs; 74 blocks striding over them
/// recompute it once each.
#[test]
fn e2b_projections_run_beside_the_residual_kernel() {
    for (target, layers) in [("h200", 34), ("t4g", 34)] {
        let plan = e2b_plan(Target::by_name(target).unwrap());
        let beside = plan
            .entry("decode")
            .unwrap()
            .launches()
            .filter(|l| {
                let projections: Vec<_> = l[1..].iter().filter(|c| !c.tail).collect();
                let matvecs = !projections.is_empty() && projections.iter().all(|c| c.kind == KernelKind::MatvecW4);
                l[0].kind == KernelKind::Loop && matvecs
            })
            .count();
        assert_eq!(beside, layers, "{target}: launches of the residual kernel and a layer's projections");
    }
}

/// E2B's 128-token prefill GEMMs split their contraction where their tiles leave SMs idle
/// (`gemm_splits`): 1536 wide (48 tiles of 64 × 64), 6144 deep, the down projection takes 2
/// splits on an H200's 132 SMs and 3 on a T4's 40 (where 48 blocks were two waves, the second a
/// fifth full); 256 wide (8 tiles), 1536 deep, 6 and 4 for the key and value projections, 12 and
/// 5 for the per-layer gate, whose steps are 64 deep (`STAGED_READS`), twice as many; 4096 wide
/// (128 tiles) none.
#[test]
fn e2b_prefill_gemms_split_where_tiles_leave_sms_idle() {
    for (target, want) in [("h200", [2, 6, 12, 1]), ("t4g", [3, 4, 5, 1])] {
        let plan = e2b_plan(Target::by_name(target).unwrap());
        let (prefill, kernels) = (plan.entry("prefill").unwrap(), &plan.kernels);
        let splits = |cols: usize, depth: usize, k: u32| -> Vec<u32> {
            let gemms = prefill.calls.iter().filter(|c| c.launch.tile.is_some_and(|t| t.mma.is_some() && t.k == k));
            let shaped = gemms.filter(|c| {
                let m = g4c_passes::matvec_of(kernels.function(&c.kernel).unwrap()).unwrap();
                (m.cols, m.depth) == (cols, depth)
            });
            let splits: std::collections::BTreeSet<u32> = shaped.map(|c| c.launch.tile.unwrap().splits).collect();
            splits.into_iter().collect()
        };
        let got = [splits(1536, 6144, 128), splits(256, 1536, 128), splits(256, 1536, 64), splits(4096, 1536, 128)];
        assert_eq!(
            got,
            want.map(|s| vec![s]),
            "{target}: splits of the down, key, per-layer gate and full-query products"
        );
    }
}

/// Every launch's counts of finished blocks (split GEMMs', tails') lie before every launch's partial
/// sums in the split-sums buffer: a count must start at zero, and partial sums stay where a launch
/// left them. E2B's prefill has split GEMMs of 8 tiles (32 bytes of counts) and of 64 (256 bytes):
/// laid out launch by launch from one offset, the wider one's counts began on the narrower one's
/// partial sums, and most of its tiles would never have counted to their last block.
#[test]
fn no_count_lies_where_partial_sums_were_left() {
    for target in ["h200", "t4g"] {
        let plan = e2b_plan(Target::by_name(target).unwrap());
        for e in &plan.entries {
            let (mut counts_end, mut partials_start, mut tiles) = (0, u64::MAX, std::collections::BTreeSet::new());
            for c in &e.calls {
                let Some(sums) = c.split_sums else { continue };
                let counts = match g4c_passes::split_sums_bytes(plan.kernels.function(&c.kernel).unwrap(), &c.launch) {
                    Some(bytes) => {
                        tiles.insert(c.launch.grid / c.launch.tile.unwrap().splits);
                        partials_start = partials_start.min(sums.partials);
                        bytes.counts
                    }
                    None => 4,
                };
                counts_end = counts_end.max(sums.counts + counts);
            }
            assert!(
                counts_end <= partials_start,
                "{target} @{}: counts up to {counts_end}, sums from {partials_start}",
                e.entry
            );
            if e.entry == "prefill" {
                assert!(tiles.len() > 1, "{target}: split GEMMs of {tiles:?} tiles");
            }
        }
    }
}

/// Every E2B kernel, decode and prefill, compiles for t4g, a100 and h200, within each one's shared
/// memory, and ptxas agrees with the footprints and finds no spills: for one sequence and a
/// 128-token prefill, and for `g4c serve`'s default of 8 sequences and 64-token prefills (whose
/// 512-row GEMMs spilled on t4g, see `Edges` and `STAGED_READS`); and the decode of the batch whose
/// strided matvecs take the largest dynamic regions (past 48 KiB, `SharedRegion`), which ptxas does
/// not count: 5 sequences on t4g (61,920 bytes), 4 on a100 (98,816) and 6 on h200 (74,112; deeper
/// matvecs of 2 to 4 rows split their contraction there, `Tile::splits`, into shares within 48
/// KiB).
#[test]
fn e2b_kernels_compile_and_fit_on_every_gpu_class() {
    let served = Shapes { batch: 8, prefill_len: 64, context: 4096 };
    for (target, sm, batch) in [("t4g", (7, 5), 5), ("a100", (8, 0), 4), ("h200", (9, 0), 6)] {
        let t = Target::by_name(target).unwrap();
        let limit = t.gpu.as_ref().unwrap().smem_per_block_optin;
        let mut batched = e2b_plan_of(t, Shapes { batch, ..served });
        batched.entries.retain(|e| e.entry == "decode");
        let dynamic = batched.entries[0].launches().filter(|l| SharedRegion::of(l).dynamic_bytes() > 0).count();
        assert!(dynamic > 0, "{target}: {batch} sequences' decode has no dynamic region");
        for plan in [e2b_plan(t), e2b_plan_of(t, served), batched] {
            assert_fits(&plan, (target, sm), limit);
        }
    }
}

/// `plan`'s kernels compiled for `sm` (`target`'s): each launch within `limit` bytes of shared
/// memory, whose static part ptxas finds exactly, and no spills.
fn assert_fits(plan: &KernelPlan, (target, sm): (&str, (u32, u32)), limit: u32) {
    for entry in &plan.entries {
        let program = emit_entry(plan, entry).unwrap();
        let ptx = compile_ptx(&program.source, sm, &entry.entry).unwrap_or_else(|e| panic!("{e}"));
        let cubin = assemble(&ptx, sm).unwrap_or_else(|e| panic!("{target}: {e}"));
        for (calls, symbol) in launch_symbols(entry, &program) {
            let used = cubin.kernels[symbol];
            let what = format!("{target} @{} {} ({symbol})", entry.entry, calls[0].kernel);
            assert!(launch_smem_bytes(calls) <= limit, "{what}");
            assert_eq!(used.smem_bytes, SharedRegion::of(calls).static_bytes(), "{what}: shared memory");
            assert_eq!((used.spill_stores, used.spill_loads), (0, 0), "{what}: spills");
        }
    }
}
