//! Emits the IR of a Gemma 4 text decoder: the `prefill` and `decode` entry points over one set of
//! weights and one set of cache state.
//!
//! The entry points, in the roles of `g4c_ir::abi` (every backend honours them):
//! - `prefill(ids: token_ids i32[B,T], pos: positions i32[B,T], last: last_index i32[B], state...)
//!   -> (logits: f32[B,V], state...)` runs T tokens per sequence at absolute positions `pos` (`-1`
//!   marks padding) and returns the logits of token `last[b]` of each sequence. A module may also
//!   have `prefill_{T}` entry points for shorter lengths T (same state shapes), so that short prompts
//!   are not padded to the longest.
//! - `decode(ids: token_ids i32[B,1], pos: positions i32[B,1], state...) -> (logits: f32[B,V], state...)`.
//! - State: `cache.l{L}.k` / `cache.l{L}.v: f32[B, Hkv, S, d]` (`kv_cache(L, k|v)`) for every
//!   KV-owning layer L, and `cache.{sliding,full}.pos: i32[B, S]` (`slot_positions(kind)`), the
//!   absolute position held by each slot (`-1` = empty). Full layers hold `S = context` slots; sliding
//!   layers are rings of `window + T - 1` slots (capped at `context`) so that one prefill call never
//!   overwrites a key its own queries still need.

mod attention;
mod experts;
mod layer;
mod nn;

use crate::config::{AttentionKind, Gemma4Config};
use crate::error::{FrontendError, Result};
use attention::{ring_slots, rope_tables, visibility, RopeTables};
use g4c_ir::{
    BinaryOp, DType, FunctionBuilder, KvPart, Module, ParamRole, ResultRole, TensorType, ValueId, WeightDecl,
};
use nn::Graph;
use std::collections::HashMap;

/// Static shapes of one compiled model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shapes {
    pub batch: usize,
    /// Tokens per sequence in one `prefill` call.
    pub prefill_len: usize,
    /// Positions a sequence may reach (prompt plus generated tokens).
    pub context: usize,
}

impl Shapes {
    pub fn cache_len(&self, cfg: &Gemma4Config, kind: AttentionKind) -> usize {
        match kind {
            AttentionKind::Full => self.context,
            AttentionKind::Sliding => (cfg.sliding_window + self.prefill_len - 1).min(self.context),
        }
    }

    fn check(&self, cfg: &Gemma4Config) -> Result<()> {
        let bad = |message: String| Err(FrontendError::Invalid { message });
        if self.batch == 0 || self.prefill_len == 0 {
            return bad(format!("batch ({}) and prefill length ({}) must be at least 1", self.batch, self.prefill_len));
        }
        if self.prefill_len > self.context {
            return bad(format!(
                "prefill length {} exceeds the context of {} positions",
                self.prefill_len, self.context
            ));
        }
        if self.context > cfg.max_position_embeddings {
            return bad(format!(
                "context of {} positions exceeds the model's max_position_embeddings ({})",
                self.context, cfg.max_position_embeddings
            ));
        }
        Ok(())
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Entry {
    /// Prefill of this many tokens per sequence.
    Prefill(usize),
    /// Scoring of `Shapes::prefill_len` tokens per sequence: the logits of every position, for
    /// teacher-forced evaluation (`g4c eval`).
    Score,
    Decode,
}

impl Entry {
    /// `prefill` for the longest prefill (`Shapes::prefill_len`), `prefill_{T}` for shorter ones.
    pub fn name(self, shapes: &Shapes) -> String {
        match self {
            Entry::Prefill(t) if t == shapes.prefill_len => "prefill".into(),
            Entry::Prefill(t) => format!("prefill_{t}"),
            Entry::Score => "score".into(),
            Entry::Decode => "decode".into(),
        }
    }
}

/// Builds the module: `prefill` (of `shapes.prefill_len` tokens) and `decode`.
pub fn emit_module(cfg: &Gemma4Config, weights: Vec<WeightDecl>, shapes: &Shapes) -> Result<Module> {
    emit_module_with_prefills(cfg, weights, shapes, &[])
}

/// Builds the module with one more prefill entry point, `prefill_{T}`, per length in `shorter`
/// (each below `shapes.prefill_len`, which sizes the sliding rings all of them share), so that short
/// prompts are not padded to the longest length.
pub fn emit_module_with_prefills(
    cfg: &Gemma4Config,
    weights: Vec<WeightDecl>,
    shapes: &Shapes,
    shorter: &[usize],
) -> Result<Module> {
    shapes.check(cfg)?;
    if let Some(&bad) = shorter.iter().find(|&&t| t == 0 || t >= shapes.prefill_len) {
        return Err(FrontendError::Invalid {
            message: format!("extra prefill length {bad} must be between 1 and {}", shapes.prefill_len - 1),
        });
    }
    let mut module = Module::new("gemma4_text");
    module.weights = weights;
    let mut lengths: Vec<usize> = shorter.iter().copied().chain([shapes.prefill_len]).collect();
    lengths.sort_unstable();
    lengths.dedup();
    let entries = lengths.into_iter().map(Entry::Prefill).chain([Entry::Decode]);
    for entry in entries {
        let f = emit_entry(cfg, &module.weights, shapes, entry);
        module.functions.push(f);
    }
    Ok(module)
}

/// Builds the scoring module: one entry point, `score`, that runs `shapes.prefill_len` tokens per
/// sequence and returns the logits of every one, `f32[B, T, V]`; longer sequences go through it in
/// chunks, the caches carrying what came before.
pub fn emit_scoring_module(cfg: &Gemma4Config, weights: Vec<WeightDecl>, shapes: &Shapes) -> Result<Module> {
    shapes.check(cfg)?;
    let mut module = Module::new("gemma4_text");
    module.weights = weights;
    let f = emit_entry(cfg, &module.weights, shapes, Entry::Score);
    module.functions.push(f);
    Ok(module)
}

fn emit_entry(cfg: &Gemma4Config, weights: &[WeightDecl], shapes: &Shapes, entry: Entry) -> g4c_ir::Function {
    let b = shapes.batch;
    let t = match entry {
        Entry::Prefill(t) => t,
        Entry::Score => shapes.prefill_len,
        Entry::Decode => 1,
    };
    let mut g = Graph::new(FunctionBuilder::new(entry.name(shapes), weights));
    let ids = g.b.param("ids", TensorType::new(DType::I32, [b, t]), ParamRole::TokenIds);
    let pos = g.b.param("pos", TensorType::new(DType::I32, [b, t]), ParamRole::Positions);
    let last = matches!(entry, Entry::Prefill(_))
        .then(|| g.b.param("last", TensorType::new(DType::I32, [b]), ParamRole::LastIndex));
    let mut cx = StepContext::declare_state(&mut g, cfg, shapes, pos);

    // Embedding scaled by √D. transformers rounds the scale to the dtype the model runs in (39.25 for
    // √1536 in bf16); this IR computes in f32, and dtype legalization rounds the constant with the
    // multiply when a target computes in a narrower type.
    let h = g.embedding_rows("embed_tokens", ids);
    let h = g.b.binary_scalar(BinaryOp::Mul, h, (cfg.hidden_size as f64).sqrt());
    let mut h = g.b.name(h, "h.embed");
    cx.ple = per_layer_inputs(&mut g, cfg, ids, h);

    // Prefill returns the logits of one token per sequence (`last[b]`). Layers that write no cache
    // (the trailing KV-shared ones) change nothing but that token's hidden state, and every op in a
    // layer except attention is row by row, while attention reads only the caches. So from the first
    // of them on, only row `last[b]` is carried: same logits, far fewer rows (E2B: 20 of 35 layers).
    let layers = cfg.num_layers();
    let narrow_at = (0..layers).rev().take_while(|&l| !cfg.layers[l].owns_kv(l)).last().unwrap_or(layers);
    let rows = last.map(|last| returned_rows(&mut g, last, b, t));
    for l in 0..layers {
        if let (true, Some(rows)) = (l == narrow_at, rows) {
            h = pick_rows(&mut g, h, rows);
            h = g.b.name(h, "h.returned");
            cx = cx.narrow_to(&mut g, cfg, rows);
        }
        h = layer::decoder_layer(&mut g, cfg, l, h, &mut cx);
    }
    if let (true, Some(rows)) = (narrow_at == layers, rows) {
        h = pick_rows(&mut g, h, rows);
    }
    // The hidden states whose logits are returned: one token per sequence (`[B, 1, D]` by now), or
    // every token for scoring (`[B, T, D]`).
    let h = match entry {
        Entry::Score => h,
        _ => g.b.reshape(h, &[b, cfg.hidden_size]),
    };
    let h = g.rms_norm(h, Some("norm"), cfg.rms_norm_eps);
    let head = if cfg.tie_word_embeddings { "embed_tokens" } else { "lm_head" };
    let mut logits = g.linear(h, head);
    if let Some(cap) = cfg.final_logit_softcapping {
        logits = g.softcap(logits, cap);
    }
    let logits = g.b.name(logits, "logits");

    let mut results = vec![("logits", logits, ResultRole::Logits)];
    if entry != Entry::Score {
        let greedy = g.b.greedy_tokens(logits);
        let greedy = g.b.name(greedy, "greedy");
        results.push(("greedy", greedy, ResultRole::GreedyTokens));
    }
    results.extend(cx.state_results.iter().map(|(n, v)| (n.as_str(), *v, ResultRole::NextState)));
    g.b.finish(results)
}

/// The index of token `last[b]` of every sequence among the `B·T` rows of a `[B, T, …]` value.
fn returned_rows(g: &mut Graph, last: ValueId, b: usize, t: usize) -> ValueId {
    let first = g.b.iota(0, TensorType::new(DType::I32, [b]));
    let first = g.b.binary_scalar(BinaryOp::Mul, first, t as f64);
    g.b.binary(BinaryOp::Add, first, last)
}

/// Rows `rows` (from `returned_rows`) of `x: [B, T, …]`, as `[B, 1, …]`. A gather, not a one-hot
/// matmul: it moves values exactly whatever type a target computes matmuls in.
fn pick_rows(g: &mut Graph, x: ValueId, rows: ValueId) -> ValueId {
    let shape = g.b.shape(x);
    let flat: Vec<usize> = [shape[0] * shape[1]].into_iter().chain(shape[2..].iter().copied()).collect();
    let flat = g.b.reshape(x, &flat);
    let picked = g.b.gather(flat, rows);
    let out: Vec<usize> = [shape[0], 1].into_iter().chain(shape[2..].iter().copied()).collect();
    g.b.reshape(picked, &out)
}

/// PLE (gemma4.md §3.2): `(RMS_P(reshape(h0·Wᵀ·D^-½)) + reshape(E_ple[ids]·√P))·2^-½`, `[B, T, L, P]`.
fn per_layer_inputs(g: &mut Graph, cfg: &Gemma4Config, ids: ValueId, h0: ValueId) -> Option<ValueId> {
    let p = cfg.per_layer_input_size;
    if p == 0 {
        return None;
    }
    let [b, t] = g.b.shape(ids)[..] else { unreachable!() };
    let layers = cfg.num_layers();
    let tok = g.embedding_rows("embed_tokens_per_layer", ids);
    let tok = g.b.binary_scalar(BinaryOp::Mul, tok, (p as f64).sqrt());
    let tok = g.b.reshape(tok, &[b, t, layers, p]);
    let ctx = g.linear(h0, "per_layer_model_projection");
    let ctx = g.b.binary_scalar(BinaryOp::Mul, ctx, (cfg.hidden_size as f64).powf(-0.5));
    let ctx = g.b.reshape(ctx, &[b, t, layers, p]);
    let ctx = g.rms_norm(ctx, Some("per_layer_projection_norm"), cfg.rms_norm_eps);
    let sum = g.b.binary(BinaryOp::Add, ctx, tok);
    let ple = g.b.binary_scalar(BinaryOp::Mul, sum, 0.5f64.sqrt());
    Some(g.b.name(ple, "ple"))
}

/// Per-call values shared by the layers of one entry point.
pub struct StepContext {
    pos: ValueId,
    pos_f32: ValueId,
    kinds: HashMap<AttentionKind, KindState>,
    rope: HashMap<(AttentionKind, usize), RopeTables>,
    caches: HashMap<usize, (ValueId, ValueId)>,
    ple: Option<ValueId>,
    state_results: Vec<(String, ValueId)>,
}

/// Slot bookkeeping of the caches of one attention kind.
struct KindState {
    slots: ValueId,
    /// Positions held by the slots once this call's tokens are written.
    stored: ValueId,
    visible: ValueId,
}

impl StepContext {
    /// Declares the state parameters (slot positions per kind, then K/V per KV-owning layer) and
    /// computes this call's slot writes and visibility masks.
    fn declare_state(g: &mut Graph, cfg: &Gemma4Config, shapes: &Shapes, pos: ValueId) -> StepContext {
        let b = shapes.batch;
        let pos_f32 = g.b.convert(pos, DType::F32);
        let pos_f32 = g.b.name(pos_f32, "pos.f32");
        let mut kinds = HashMap::new();
        let mut state_results = Vec::new();
        let mut caches = HashMap::new();
        for &kind in AttentionKind::ALL {
            if !cfg.kv_layers().any(|l| cfg.layers[l].kind == kind) {
                continue;
            }
            let cap = shapes.cache_len(cfg, kind);
            let name = format!("cache.{}.pos", kind.name());
            let stored = g.b.param(&name, TensorType::new(DType::I32, [b, cap]), ParamRole::SlotPositions(kind));
            let slots = ring_slots(g, pos, cap);
            let slots = g.b.name(slots, &format!("{}.slots", kind.name()));
            let stored = g.b.update_slots(stored, slots, pos, 1);
            let stored = g.b.name(stored, &format!("{name}.next"));
            let window = (kind == AttentionKind::Sliding).then_some(cfg.sliding_window);
            let visible = visibility(g, pos, stored, window);
            let visible = g.b.name(visible, &format!("{}.visible", kind.name()));
            state_results.push((name, stored));
            kinds.insert(kind, KindState { slots, stored, visible });
        }
        for l in cfg.kv_layers() {
            let spec = &cfg.layers[l];
            let ty =
                TensorType::new(DType::F32, [b, spec.num_kv_heads, shapes.cache_len(cfg, spec.kind), spec.head_dim]);
            let [k, v] = [KvPart::Key, KvPart::Value].map(|part| {
                let name = format!("cache.l{l}.{}", part.name());
                g.b.param(&name, ty.clone(), ParamRole::KvCache { layer: l, part })
            });
            caches.insert(l, (k, v));
        }
        StepContext { pos, pos_f32, kinds, rope: HashMap::new(), caches, ple: None, state_results }
    }

    /// The context for queries at rows `rows` only (see `returned_rows`), after every cache write:
    /// their positions, visibility masks, RoPE tables and per-layer inputs. Layers run in it must not
    /// write caches.
    fn narrow_to(self, g: &mut Graph, cfg: &Gemma4Config, rows: ValueId) -> StepContext {
        let pos = pick_rows(g, self.pos, rows);
        let mut kinds = self.kinds;
        // In a fixed order: the IR must not depend on hash order (cache keys hash its lowering).
        for &kind in AttentionKind::ALL {
            if let Some(k) = kinds.remove(&kind) {
                let window = (kind == AttentionKind::Sliding).then_some(cfg.sliding_window);
                let visible = visibility(g, pos, k.stored, window);
                kinds.insert(kind, KindState { visible, ..k });
            }
        }
        let ple = self.ple.map(|ple| pick_rows(g, ple, rows));
        let pos_f32 = g.b.convert(pos, DType::F32);
        StepContext {
            pos,
            pos_f32,
            kinds,
            rope: HashMap::new(),
            caches: self.caches,
            ple,
            state_results: self.state_results,
        }
    }

    fn rope(&mut self, g: &mut Graph, cfg: &Gemma4Config, kind: AttentionKind, head_dim: usize) -> RopeTables {
        if let Some(t) = self.rope.get(&(kind, head_dim)) {
            return *t;
        }
        let tables = rope_tables(g, self.pos_f32, &cfg.rope(kind).inv_freq(head_dim));
        let prefix = format!("rope.{}.d{head_dim}", kind.name());
        let tables = RopeTables {
            cos: g.b.name(tables.cos, &format!("{prefix}.cos")),
            sin: g.b.name(tables.sin, &format!("{prefix}.sin")),
        };
        self.rope.insert((kind, head_dim), tables);
        tables
    }

    /// Stores this call's keys/values (`[B, Hkv, T, d]`) into layer `l`'s cache, before attending.
    fn write_kv(&mut self, g: &mut Graph, l: usize, kind: AttentionKind, k: ValueId, v: ValueId) {
        let slots = self.kinds[&kind].slots;
        let (k_cache, v_cache) = self.caches[&l];
        let k = g.b.update_slots(k_cache, slots, k, 2);
        let v = g.b.update_slots(v_cache, slots, v, 2);
        let k = g.b.name(k, &format!("cache.l{l}.k.next"));
        let v = g.b.name(v, &format!("cache.l{l}.v.next"));
        self.caches.insert(l, (k, v));
        self.state_results.push((format!("cache.l{l}.k"), k));
        self.state_results.push((format!("cache.l{l}.v"), v));
    }

    fn kv(&self, layer: usize) -> (ValueId, ValueId) {
        self.caches[&layer]
    }

    fn visible(&self, kind: AttentionKind) -> ValueId {
        self.kinds[&kind].visible
    }

    /// Layer `l`'s slice of the per-layer embeddings, `[B, T, P]`.
    fn per_layer_input(&self, g: &mut Graph, l: usize) -> Option<ValueId> {
        let ple = self.ple?;
        let [b, t, _, p] = g.b.shape(ple)[..] else { unreachable!() };
        let slice = g.b.slice_axis(ple, 2, l, l + 1);
        Some(g.b.reshape(slice, &[b, t, p]))
    }
}
