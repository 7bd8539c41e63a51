//! Continuous batching (`g4c_runtime::batching`) on the tiny golden model, compiled for 8 rows:
//! every sequence, whatever runs beside it and whichever row it lands in, generates the tokens
//! transformers generated for it alone (the goldens), and a reused row's stale cache entries are
//! never seen; a fault in one call or one row ends only the sequences it touched.

use crate::common::{cuda_host_session, golden_cases, golden_dir, kernel_session, Backend, GoldenCase};
use g4c_driver::{Feedback, Session, SessionOptions};
use g4c_frontend::Shapes;
use g4c_ir::Target;
use g4c_runtime::batching::CallKind;
use g4c_runtime::{
    BatchEngine, Executor, GenerateOptions, ModelShape, SamplingParams, SequenceEvent, SequenceRequest, SequenceSink,
    StepInputs, StepOutput, Tensor,
};
use std::sync::{Arc, Mutex};

/// The tiny model in an engine of `batch` rows: prefill chunks of 4 tokens (the golden `long` prompt
/// of 11 takes three), a context of 40 positions.
pub(crate) fn engine(batch: usize) -> BatchEngine {
    let dir = golden_dir("tiny").join("published");
    let options = SessionOptions { backend: Backend::Pjrt, use_cache: false, ..Default::default() };
    let session = Session::open(&dir, options).unwrap();
    let module = session.module(&Shapes { batch, prefill_len: 4, context: 40 }).unwrap();
    let ready = session.executor(module, &Feedback::silent()).unwrap();
    BatchEngine::new(ready.executor, session.source.config.sliding_window).unwrap()
}

/// `engine`'s shapes on `target`'s CUDA kernels run by the host emulator. The module is the
/// checkpoint's as emitted (f32, 4-bit weights as ingested): the engine hands back tokens, not
/// logits, so a token is compared exactly and the target's 16-bit arithmetic would be a second,
/// unrelated difference from transformers (`cuda_kernels_on_the_host_match_the_goldens` holds the
/// logits of that path).
fn cuda_host_engine(model: &str, target: &'static Target, batch: usize) -> BatchEngine {
    session_engine(&cuda_host_session(&golden_dir(model).join("hf"), target), batch)
}

/// An engine of `batch` rows on `session`'s executor, with `engine`'s shapes, for the checkpoint's
/// module as emitted.
pub(crate) fn session_engine(session: &Session, batch: usize) -> BatchEngine {
    let module = session.source.emit(&Shapes { batch, prefill_len: 4, context: 40 }).unwrap();
    let ready = session.executor(Arc::new(module), &Feedback::silent()).unwrap();
    BatchEngine::new(ready.executor, session.source.config.sliding_window).unwrap()
}

/// Records a sequence's events; says it is gone once it has `gone_after` tokens.
#[derive(Clone, Default)]
pub(crate) struct Recorder {
    events: Arc<Mutex<Vec<SequenceEvent>>>,
    gone_after: Option<usize>,
}

impl Recorder {
    pub(crate) fn tokens(&self) -> Vec<u32> {
        let events = self.events.lock().unwrap();
        events.iter().filter_map(|e| if let SequenceEvent::Token(t, _) = e { Some(*t) } else { None }).collect()
    }

    pub(crate) fn events(&self) -> Vec<SequenceEvent> {
        self.events.lock().unwrap().clone()
    }

    pub(crate) fn cached_tokens(&self) -> usize {
        match self.events.lock().unwrap().first() {
            Some(SequenceEvent::Admitted { cached_tokens, .. }) => *cached_tokens,
            other => panic!("the first event is not Admitted: {other:?}"),
        }
    }

    fn finished(&self) -> bool {
        matches!(self.events.lock().unwrap().last(), Some(SequenceEvent::Finished(_)))
    }
}

impl SequenceSink for Recorder {
    fn send(&mut self, event: SequenceEvent) -> bool {
        self.events.lock().unwrap().push(event);
        !self.is_gone()
    }

    fn is_gone(&self) -> bool {
        self.gone_after.is_some_and(|n| self.tokens().len() >= n)
    }
}

fn greedy(prompt: &[u32], new_tokens: usize) -> SequenceRequest {
    let options = GenerateOptions { max_new_tokens: new_tokens, ignore_eos: true, ..Default::default() };
    SequenceRequest { prompt: prompt.to_vec(), options }
}

pub(crate) fn admit(engine: &mut BatchEngine, request: SequenceRequest) -> Recorder {
    let recorder = Recorder::default();
    engine.admit(request, Box::new(recorder.clone())).unwrap();
    recorder
}

/// Steps until no row holds a sequence (bounded).
pub(crate) fn drain(engine: &mut BatchEngine) {
    for _ in 0..1000 {
        if engine.step().unwrap().is_none() {
            return;
        }
    }
    panic!("the engine did not finish within 1000 steps");
}

fn case<'a>(cases: &'a [GoldenCase], name: &str) -> &'a GoldenCase {
    cases.iter().find(|c| c.name == name).unwrap()
}

/// Golden cases joining in waves, each wave 5 steps after the one before while the others run,
/// until the engine is full; then run to their ends. Asserts each finished with its golden's tokens
/// (`what`: where it ran, for the message).
pub(crate) fn assert_waves_generate_their_golden_tokens(
    engine: &mut BatchEngine,
    cases: &[GoldenCase],
    waves: &[&[&str]],
    what: &str,
) {
    let mut running = vec![];
    for wave in waves {
        for name in *wave {
            let c = case(cases, name);
            running.push((c, admit(engine, greedy(&c.prompt_ids, c.generated_ids.len()))));
        }
        for _ in 0..5 {
            engine.step().unwrap();
        }
    }
    assert_eq!(engine.occupied(), running.len(), "{what}: every row taken");
    drain(engine);
    for (c, recorder) in &running {
        assert!(recorder.finished(), "{what}, {}: {:?}", c.name, recorder.events.lock().unwrap());
        assert_eq!(recorder.tokens(), c.generated_ids, "{what}, {}", c.name);
    }
}

#[test]
fn sequences_joining_at_different_steps_each_generate_their_golden_tokens() {
    // Two of each golden case, joining in three waves while the others run.
    let waves: [&[&str]; 3] = [&["long", "single"], &["short", "window", "long"], &["single", "short", "window"]];
    assert_waves_generate_their_golden_tokens(&mut engine(8), &golden_cases("tiny"), &waves, "beside 7 others");
}

/// Batched decode and prefill through the CUDA kernels: each matvec and attention kernel over 4
/// rows at 4 different positions (two sequences join 5 steps late, so rows sit at different ring
/// slots), every row its own golden's tokens, for the f32 checkpoint and the 4-bit one.
#[test]
fn batched_cuda_kernels_on_the_host_generate_each_sequences_golden_tokens() {
    let waves: [&[&str]; 2] = [&["long", "single"], &["window", "short"]];
    for model in ["tiny", "tiny-qat"] {
        let mut engine = cuda_host_engine(model, Target::by_name("t4g").unwrap(), 4);
        let what = format!("{model} in a batch of 4 on t4g's kernels");
        assert_waves_generate_their_golden_tokens(&mut engine, &golden_cases(model), &waves, &what);
    }
}

/// The same on a t4g of one SM, where the decode step's matvecs of 4 rows stride over their
/// columns (`Tile::strided`), as E2B's batches of up to 4 do on real GPUs.
#[test]
fn batched_strided_matvecs_on_the_host_generate_each_sequences_golden_tokens() {
    let waves: [&[&str]; 2] = [&["long", "single"], &["window", "short"]];
    for model in ["tiny", "tiny-qat"] {
        let mut engine = cuda_host_engine(model, &crate::cuda::ONE_SM_T4G, 4);
        let what = format!("{model} in a batch of 4 on a one-SM t4g's kernels");
        assert_waves_generate_their_golden_tokens(&mut engine, &golden_cases(model), &waves, &what);
    }
}

#[test]
fn a_sequence_alone_and_beside_seven_others_generates_the_same_tokens() {
    let cases = golden_cases("tiny");
    let long = case(&cases, "long");
    let sampled = |seed| SequenceRequest {
        prompt: case(&cases, "short").prompt_ids.clone(),
        options: GenerateOptions {
            max_new_tokens: 20,
            ignore_eos: true,
            sampling: SamplingParams {
                temperature: 0.9,
                top_k: 40,
                top_p: 0.95,
                min_p: 0.05,
                seed,
                ..Default::default()
            },
            ..Default::default()
        },
    };
    let mut engine = engine(8);
    let alone = admit(&mut engine, greedy(&long.prompt_ids, 24));
    drain(&mut engine);
    let sampled_alone = admit(&mut engine, sampled(11));
    drain(&mut engine);

    // Six other streams, with other sampling parameters, fill the batch first; the two join later.
    let others: Vec<Recorder> = (0..6).map(|seed| admit(&mut engine, sampled(100 + seed))).collect();
    for _ in 0..3 {
        engine.step().unwrap();
    }
    let beside = admit(&mut engine, greedy(&long.prompt_ids, 24));
    let sampled_beside = admit(&mut engine, sampled(11));
    drain(&mut engine);
    assert_eq!(alone.tokens(), long.generated_ids, "alone");
    assert_eq!(beside.tokens(), alone.tokens(), "beside seven others");
    assert_eq!(sampled_beside.tokens(), sampled_alone.tokens(), "a sampled sequence beside seven others");
    let distinct: std::collections::HashSet<Vec<u32>> = others.iter().map(|r| r.tokens()).collect();
    assert!(distinct.len() > 1, "other seeds sample other tokens");
}

#[test]
fn a_reused_row_never_sees_the_previous_sequences_cache_entries() {
    let cases = golden_cases("tiny");
    let mut engine = engine(1);
    // `long` fills positions 0..34 of the only row; `single` then starts at position 0 with every
    // slot past its own still holding `long`'s keys and values (nothing is cleared).
    let first = admit(&mut engine, greedy(&case(&cases, "long").prompt_ids, 24));
    drain(&mut engine);
    assert_eq!(first.tokens(), case(&cases, "long").generated_ids);
    for name in ["single", "short"] {
        let c = case(&cases, name);
        let next = admit(&mut engine, greedy(&c.prompt_ids, c.generated_ids.len()));
        drain(&mut engine);
        assert_eq!(next.cached_tokens(), 0, "{name}: the ring no longer holds the shared prefix");
        assert_eq!(next.tokens(), c.generated_ids, "{name} in a row `long` used");
    }
}

#[test]
fn a_prompt_prefix_still_in_a_freed_row_is_not_prefilled_again() {
    let cases = golden_cases("tiny");
    let (window, long) = (case(&cases, "window"), case(&cases, "long"));
    let mut engine = engine(1);
    // `long` leaves positions 27..33 in the row's 7-slot rings: its prefix cannot be reused.
    admit(&mut engine, greedy(&long.prompt_ids, 24));
    drain(&mut engine);
    // `window`'s prompt is the first 4 tokens of `long`'s; it writes positions 0..3 again, and
    // generating one token keeps them in the rings.
    let first = admit(&mut engine, greedy(&window.prompt_ids, 1));
    drain(&mut engine);
    assert_eq!(first.cached_tokens(), 0, "positions 0..2 are no longer in the rings");
    assert_eq!(first.tokens(), window.generated_ids[..1]);
    let next = admit(&mut engine, greedy(&long.prompt_ids, 24));
    let mut prefilled = 0;
    for _ in 0..100 {
        match engine.step().unwrap() {
            Some(report) if report.call == CallKind::Prefill => prefilled += report.tokens,
            Some(_) => {}
            None => break,
        }
    }
    assert_eq!(next.cached_tokens(), 4);
    assert_eq!(prefilled, long.prompt_ids.len() - 4, "only the new part of the prompt is prefilled");
    assert_eq!(next.tokens(), long.generated_ids, "a reused prefix changes no token");
}

#[test]
fn a_sequence_whose_client_is_gone_leaves_its_row_at_the_next_step() {
    let cases = golden_cases("tiny");
    let long = case(&cases, "long");
    let mut engine = engine(1);
    let leaving = Recorder { gone_after: Some(3), ..Default::default() };
    engine.admit(greedy(&long.prompt_ids, 24), Box::new(leaving.clone())).unwrap();
    drain(&mut engine);
    assert_eq!(leaving.tokens(), long.generated_ids[..3], "no token after the client left");
    assert!(engine.has_free_row());
    let next = admit(&mut engine, greedy(&long.prompt_ids, 24));
    drain(&mut engine);
    assert_eq!(next.tokens(), long.generated_ids);
}

#[test]
fn requests_the_module_cannot_run_are_refused() {
    let mut engine = engine(1);
    let refuse = |engine: &mut BatchEngine, request: SequenceRequest, needle: &str| {
        let err = engine.admit(request, Box::new(Recorder::default())).unwrap_err().to_string();
        assert!(err.contains(needle), "{err}");
    };
    refuse(&mut engine, greedy(&[], 4), "empty");
    refuse(&mut engine, greedy(&[2, 512], 4), "outside the vocabulary");
    refuse(&mut engine, greedy(&[2; 40], 4), "no room to generate in the context of 40 positions");
    admit(&mut engine, greedy(&[2], 4));
    refuse(&mut engine, greedy(&[2], 4), "every row holds a sequence");
}

/// The tiny model's executor, with a fault: row `row`'s logits are NaN at call `nan_at` (or its
/// greedy token says so), or the call numbered `panic_at` panics.
struct Faulty {
    inner: Box<dyn Executor>,
    vocab: usize,
    calls: usize,
    nan: Option<(usize, usize)>,
    panic_at: Option<usize>,
    /// The rows `reset_row` was asked to reset, in order.
    resets: Arc<Mutex<Vec<usize>>>,
}

impl Executor for Faulty {
    fn module(&self) -> &g4c_ir::Module {
        self.inner.module()
    }

    fn reset(&mut self) -> g4c_runtime::Result<()> {
        self.inner.reset()
    }

    fn reset_row(&mut self, row: usize) -> g4c_runtime::Result<()> {
        self.resets.lock().unwrap().push(row);
        self.inner.reset_row(row)
    }

    fn step(&mut self, entry: &str, inputs: &StepInputs, output: StepOutput) -> g4c_runtime::Result<Tensor> {
        self.calls += 1;
        if self.panic_at == Some(self.calls) {
            panic!("an injected fault");
        }
        let out = self.inner.step(entry, inputs, output)?;
        let Some((row, _)) = self.nan.filter(|&(_, at)| self.calls == at) else { return Ok(out) };
        // A NaN logit, or as greedy tokens report one: token -1.
        let vocab = self.vocab;
        match output {
            StepOutput::Logits => {
                let mut values = out.as_f32().unwrap().to_vec();
                values[row * vocab + 7] = f32::NAN;
                Ok(Tensor::f32(out.shape().to_vec(), values))
            }
            StepOutput::GreedyTokens => {
                let mut ids = out.as_i32().unwrap().to_vec();
                ids[row] = -1;
                Ok(Tensor::i32(out.shape().to_vec(), ids))
            }
        }
    }
}

/// The engine over a `Faulty` executor, and the rows it was asked to reset.
fn faulty_engine(nan: Option<(usize, usize)>, panic_at: Option<usize>) -> (BatchEngine, Arc<Mutex<Vec<usize>>>) {
    let dir = golden_dir("tiny").join("published");
    let options = SessionOptions { backend: Backend::Pjrt, use_cache: false, ..Default::default() };
    let session = Session::open(&dir, options).unwrap();
    let module = session.module(&Shapes { batch: 2, prefill_len: 4, context: 40 }).unwrap();
    let inner = session.executor(module, &Feedback::silent()).unwrap().executor;
    let resets = Arc::new(Mutex::new(vec![]));
    let faulty =
        Faulty { inner, vocab: session.source.config.vocab_size, calls: 0, nan, panic_at, resets: resets.clone() };
    (BatchEngine::new(Box::new(faulty), session.source.config.sliding_window).unwrap(), resets)
}

pub(crate) fn failure(recorder: &Recorder) -> String {
    match recorder.events.lock().unwrap().last() {
        Some(SequenceEvent::Failed(message)) => message.clone(),
        other => panic!("expected a failure, found {other:?}"),
    }
}

#[test]
fn one_sequences_non_finite_logits_end_it_alone() {
    let cases = golden_cases("tiny");
    let long = case(&cases, "long");
    // Row 1's logits turn NaN at the fifth call; row 0 goes on unharmed.
    let (mut engine, resets) = faulty_engine(Some((1, 5)), None);
    let healthy = admit(&mut engine, greedy(&long.prompt_ids, 24));
    let poisoned = admit(&mut engine, greedy(&long.prompt_ids, 24));
    assert!(matches!(poisoned.events.lock().unwrap()[0], SequenceEvent::Admitted { row: 1, .. }));
    while !matches!(poisoned.events.lock().unwrap().last(), Some(SequenceEvent::Failed(_))) {
        engine.step().unwrap().expect("row 1 fails before the engine idles");
    }
    assert!(failure(&poisoned).contains("not finite"), "{}", failure(&poisoned));
    // Row 1's caches may hold NaN: they are emptied, and it takes the next sequence at once, while
    // row 0 is still generating, from scratch.
    assert_eq!(*resets.lock().unwrap(), [1], "row 1's caches, and only they, were emptied");
    assert!(engine.has_free_row());
    let next = admit(&mut engine, greedy(&long.prompt_ids, 24));
    assert_eq!(next.events.lock().unwrap()[0], SequenceEvent::Admitted { row: 1, cached_tokens: 0 });
    drain(&mut engine);
    assert_eq!(healthy.tokens(), long.generated_ids);
    assert_eq!(next.tokens(), long.generated_ids);
}

/// `Executor::reset_row` empties one row's caches and leaves the other rows' as they are, on every
/// backend: after a prompt fills rows 0 and 1 and row 1 is reset, the next call gives row 0 the
/// logits of its prompt going on and row 1 those of a row that was never filled.
#[test]
fn resetting_a_row_empties_its_caches_alone() {
    let cases = golden_cases("tiny");
    let prompt = &case(&cases, "long").prompt_ids[..4];
    let dir = golden_dir("tiny").join("hf");
    let t4g = Target::by_name("t4g").unwrap();
    for backend in [Backend::Interp, Backend::Pjrt, Backend::Plan, Backend::CudaHost] {
        let session = match backend {
            Backend::Plan | Backend::CudaHost => kernel_session(&dir, backend, t4g),
            _ => Session::open(&dir, SessionOptions { backend, use_cache: false, ..Default::default() }).unwrap(),
        };
        let module = session.source.emit(&Shapes { batch: 2, prefill_len: 4, context: 40 }).unwrap();
        let mut exec = session.executor(Arc::new(module), &Feedback::silent()).unwrap().executor;
        let shape = ModelShape::of(exec.module()).unwrap();
        // The decode call after the prefill: each row's next token at position 4.
        let mut decode_after = |prefilled: &[(usize, &[u32])], reset: Option<usize>| {
            exec.reset().unwrap();
            exec.step(&shape.prefills[0].1, &StepInputs::padded(4, prefilled, true), StepOutput::Logits).unwrap();
            if let Some(row) = reset {
                exec.reset_row(row).unwrap();
            }
            let next = StepInputs::padded(1, &[(4, &[7]), (4, &[7])], false);
            exec.step(&shape.decode, &next, StepOutput::Logits).unwrap().as_f32().unwrap().to_vec()
        };
        let reference = decode_after(&[(0, prompt), (0, &[])], None);
        let both = decode_after(&[(0, prompt), (0, prompt)], None);
        let reset = decode_after(&[(0, prompt), (0, prompt)], Some(1));
        let vocab = reference.len() / 2;
        let (row0, row1) = (..vocab, vocab..);
        assert!(both[row1.clone()] != reference[row1.clone()], "{backend:?}: the prompt in row 1 changes its logits");
        assert!(reset[row0] == reference[row0], "{backend:?}: row 0 is not left as it was");
        assert!(reset[row1.clone()] == reference[row1], "{backend:?}: row 1 is not as if never filled");
    }
}

#[test]
fn a_panicking_call_fails_the_sequences_in_it_and_the_engine_goes_on() {
    let cases = golden_cases("tiny");
    let long = case(&cases, "long");
    let (mut engine, _) = faulty_engine(None, Some(6));
    let (first, second) = (admit(&mut engine, greedy(&long.prompt_ids, 24)), admit(&mut engine, greedy(&[2], 24)));
    drain(&mut engine);
    for r in [&first, &second] {
        assert!(failure(r).contains("panicked: an injected fault"), "{}", failure(r));
    }
    let after = admit(&mut engine, greedy(&long.prompt_ids, 24));
    drain(&mut engine);
    assert_eq!(after.cached_tokens(), 0, "the caches were emptied");
    assert_eq!(after.tokens(), long.generated_ids);
}

#[test]
fn a_long_prompt_joining_is_prefilled_in_chunks_between_decode_calls() {
    let cases = golden_cases("tiny");
    let mut engine = engine(2);
    let running = admit(&mut engine, greedy(&[2], 24));
    assert_eq!(engine.step().unwrap().map(|r| r.call), Some(CallKind::Prefill));
    // `long`'s 11 tokens take three chunks of 4; the running stream gets a token between each (the
    // last call was a prefill, so a decode comes first).
    admit(&mut engine, greedy(&case(&cases, "long").prompt_ids, 24));
    let calls: Vec<(CallKind, usize)> =
        (0..6).map(|_| engine.step().unwrap().map(|r| (r.call, r.tokens)).unwrap()).collect();
    use CallKind::{Decode, Prefill};
    assert_eq!(calls, [(Decode, 1), (Prefill, 4), (Decode, 1), (Prefill, 4), (Decode, 1), (Prefill, 3)]);
    assert_eq!(running.tokens().len(), 4);
}

#[test]
fn each_row_goes_through_the_prefill_entry_point_its_own_prompt_needs() {
    // An artifact with prefill lengths 4 and 8: `long` (11 tokens) takes 8 then 4; `window` (4) takes
    // 4, as it would alone, so it waits for `long`'s first chunk instead of riding in the 8-token call.
    let cases = golden_cases("tiny");
    let (long, window) = (case(&cases, "long"), case(&cases, "window"));
    let dir = tempfile::tempdir().unwrap();
    let artifact = dir.path().join("tiny.g4c");
    let published = golden_dir("tiny").join("published");
    let out = crate::common::g4c(&[
        "compile",
        published.to_str().unwrap(),
        "-o",
        artifact.to_str().unwrap(),
        "--batch",
        "2",
        "--prefill-buckets",
        "4,8",
        "--context",
        "40",
        "-q",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let options = SessionOptions { backend: Backend::Pjrt, use_cache: false, ..Default::default() };
    let session = Session::open(&artifact, options).unwrap();
    let module = session.module(&Shapes { batch: 2, prefill_len: 8, context: 40 }).unwrap();
    let ready = session.executor(module, &Feedback::silent()).unwrap();
    let mut engine = BatchEngine::new(ready.executor, session.source.config.sliding_window).unwrap();
    let (a, b) = (admit(&mut engine, greedy(&long.prompt_ids, 24)), admit(&mut engine, greedy(&window.prompt_ids, 24)));
    let calls: Vec<(CallKind, usize)> =
        (0..2).map(|_| engine.step().unwrap().map(|r| (r.call, r.tokens)).unwrap()).collect();
    assert_eq!(calls, [(CallKind::Prefill, 8), (CallKind::Prefill, 3 + 4)]);
    drain(&mut engine);
    assert_eq!(a.tokens(), long.generated_ids);
    assert_eq!(b.tokens(), window.generated_ids);
}

/// Requests arriving at random, fresh prompts and follow-ups of finished ones (so that rows are
/// reused and follow-ups take their prefix from the caches), half of them generating to the end of
/// the context: each generates what `generate` gives it alone, on a module of one row with the same
/// shapes. The goldens pin `generate` to transformers; this pins the engine's row and prefix reuse
/// to `generate`. Drawn from `G4C_FUZZ_SEED`.
#[test]
fn requests_at_random_generate_what_they_generate_alone() {
    use proptest::prelude::Rng;
    const REQUESTS: usize = 40;
    let dir = golden_dir("tiny").join("published");
    let options = SessionOptions { backend: Backend::Pjrt, use_cache: false, ..Default::default() };
    let session = Session::open(&dir, options).unwrap();
    let executor = |batch, prefill_len, context| {
        let module = session.module(&Shapes { batch, prefill_len, context }).unwrap();
        session.executor(module, &Feedback::silent()).unwrap().executor
    };
    let mut runner = crate::common::fuzz_runner();
    let rng = runner.rng();
    let mut draw = |n: usize| (rng.next_u64() % n as u64) as usize;
    // The second context is a few times the sliding window: prompts and follow-ups wrap its ring.
    for ((prefill_len, context), batch) in [((4, 40), 2), ((4, 40), 8), ((3, 12), 3), ((3, 12), 8)] {
        let mut alone = executor(1, prefill_len, context);
        let mut engine =
            BatchEngine::new(executor(batch, prefill_len, context), session.source.config.sliding_window).unwrap();
        let mut waiting = std::collections::VecDeque::new();
        let mut admitted: Vec<(SequenceRequest, Vec<u32>, Recorder)> = vec![];
        for _ in 0..10_000 {
            let asked = admitted.len() + waiting.len();
            if asked < REQUESTS && waiting.len() < 3 && draw(2) == 0 {
                let finished: Vec<_> = admitted.iter().filter(|(_, _, r)| r.finished()).collect();
                let prompt: Vec<u32> = if !finished.is_empty() && draw(3) != 0 {
                    // The earlier prompt, (most of) its reply, and a few new tokens.
                    let (earlier, reply, _) = finished[draw(finished.len())];
                    let mut prompt = earlier.prompt.clone();
                    prompt.extend(&reply[..reply.len().saturating_sub(draw(3))]);
                    prompt.extend((0..draw(6)).map(|_| 3 + draw(500) as u32));
                    prompt.truncate(context - 1);
                    prompt
                } else {
                    std::iter::once(2).chain((1..1 + draw(context - 1)).map(|_| 3 + draw(500) as u32)).collect()
                };
                let room = context - prompt.len();
                let request = greedy(&prompt, if draw(2) == 0 { room } else { 1 + draw(room) });
                let alone = g4c_runtime::generate(alone.as_mut(), &request.prompt, &request.options, &mut |_| {});
                waiting.push_back((request, alone.unwrap().generated_ids));
            }
            while engine.has_free_row() && !waiting.is_empty() && draw(3) != 0 {
                let (request, want) = waiting.pop_front().unwrap();
                let recorder = admit(&mut engine, request.clone());
                admitted.push((request, want, recorder));
            }
            if engine.step().unwrap().is_none() && waiting.is_empty() && asked == REQUESTS {
                break;
            }
        }
        assert_eq!(admitted.len(), REQUESTS, "batch {batch}: every request was admitted");
        let reused = admitted.iter().filter(|(_, _, r)| r.cached_tokens() > 0).count();
        assert!(reused > 0, "batch {batch}: no follow-up took its prefix from the caches");
        for (request, want, recorder) in &admitted {
            let (prompt, cached) = (request.prompt.len(), recorder.cached_tokens());
            assert!(recorder.finished(), "batch {batch}: a prompt of {prompt} tokens did not finish");
            assert_eq!(&recorder.tokens(), want, "batch {batch}: a prompt of {prompt} tokens, {cached} cached");
        }
        eprintln!("batch {batch}, context {context}: {REQUESTS} requests, {reused} took a prefix from the caches");
    }
}
