#!/usr/bin/env python3
"""Greedy generations under a logit bias and repetition, frequency and presence penalties, for `g4c
run --logit-bias/--repetition-penalty/--frequency-penalty/--presence-penalty`, and under vLLM's
`allowed_token_ids`, `bad_words` (as token sequences) and `min_tokens`, for serve's batching engine
(tests/goldens/tiny/penalties.json).
Run by hand, never in CI, in the venv make_goldens.py names:

    /tmp/gv/bin/python scripts/goldens/make_penalty_goldens.py tests/goldens

The model is the tiny golden model (hf/), f32, eager attention, decoded with a DynamicCache as
make_goldens.py's `greedy` does, EOS ignored. Before each argmax the logits go through
- transformers' own `SequenceBiasLogitsProcessor` with one-token sequences (OpenAI's `logit_bias`,
  which vLLM applies before the penalties), then
- transformers' own `RepetitionPenaltyLogitsProcessor` (over the prompt and the reply so far), then
- OpenAI's frequency and presence penalties as vLLM applies them after it (`apply_penalties`):
  logit -= frequency * count + presence * (count > 0), counting the reply's tokens only; transformers
  has no processor for these, so this script writes them from that formula.
Before all of these, for the last three cases, transformers' own `PrefixConstrainedLogitsProcessor`
(the allowed tokens, whatever the prefix), `NoBadWordsLogitsProcessor` (which matches a word's
first tokens against the prompt too, where vLLM matches the reply's alone: the case is one where
they agree) and `MinNewTokensLengthLogitsProcessor` (a stop id kept back until the reply has
`min_tokens`); generation then stops at the first stop id it picks.

Each case records, per step, the margin between the two largest penalized logits: g4c computes the
logits in its own order of operations, so a case is only worth comparing where no step is a near-tie
(the script refuses a margin under 1e-3), and only if its penalties change the tokens (the script
refuses a case that generates what plain greedy decoding does, and a biased one that generates the
same with the bias applied after the repetition penalty).
"""
import json
import sys
from pathlib import Path

import torch
import transformers
from transformers import Gemma4ForCausalLM
from transformers.generation.logits_process import (
    MinNewTokensLengthLogitsProcessor,
    NoBadWordsLogitsProcessor,
    PrefixConstrainedLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    SequenceBiasLogitsProcessor,
)

NEW_TOKENS = 24
# name: (prompt, repetition, frequency, presence, logit bias {id: bias})
CASES = {
    "repetition": ([2, 10, 20, 30, 10, 20, 30], 1.5, 0.0, 0.0, {}),
    "frequency_presence": ([2, 10, 20, 30, 10, 20, 30], 1.0, 2.0, 1.5, {}),
    "all_three": ([2, 17, 301, 44], 1.3, 0.5, -0.3, {}),
    # Token 20 is in the prompt: biased first, then penalized (as vLLM orders them), it is chosen
    # where the other order would not choose it.
    "logit_bias": ([2, 10, 20, 30, 10, 20, 30], 2.0, 0.0, 0.0, {382: -100.0, 20: 10.0}),
}
ALLOWED_PROMPT = [2, 17, 301, 44]
ALLOWED = [10, 17, 20, 30, 44, 301, 382]
MIN_TOKENS_PROMPT = [2, 11, 12]
MIN_TOKENS = 6


@torch.no_grad()
def penalized_greedy(model, prompt, repetition, frequency, presence, bias, bias_last=False, allowed=None,
                     stop_ids=(), min_tokens=0, bad_words=None):
    cache = transformers.DynamicCache(config=model.config)
    only = PrefixConstrainedLogitsProcessor(lambda batch, ids: allowed, num_beams=1) if allowed else None
    least = MinNewTokensLengthLogitsProcessor(len(prompt), min_tokens, list(stop_ids)) if min_tokens else None
    banned = NoBadWordsLogitsProcessor(bad_words, eos_token_id=None) if bad_words else None
    biased = SequenceBiasLogitsProcessor([[[i], b] for i, b in bias.items()]) if bias else None
    repeat = RepetitionPenaltyLogitsProcessor(repetition) if repetition != 1.0 else None
    ids = torch.tensor([prompt])
    seen = list(prompt)
    tokens, margins = [], []
    for _ in range(NEW_TOKENS):
        logits = model(input_ids=ids, past_key_values=cache, use_cache=True).logits[:, -1].float()
        if only is not None:
            logits = only(torch.tensor([seen]), logits)
        if banned is not None:
            logits = banned(torch.tensor([seen]), logits)
        if least is not None:
            logits = least(torch.tensor([seen]), logits)
        if biased is not None and not bias_last:
            logits = biased(torch.tensor([seen]), logits)
        if repeat is not None:
            logits = repeat(torch.tensor([seen]), logits)
        if biased is not None and bias_last:
            logits = biased(torch.tensor([seen]), logits)
        counts = torch.bincount(torch.tensor(tokens, dtype=torch.long), minlength=logits.shape[-1]).float()
        logits = logits[0] - frequency * counts - presence * (counts > 0).float()
        top2 = logits.topk(2).values
        token = int(torch.argmax(logits))
        tokens.append(token)
        seen.append(token)
        margins.append(float(f"{float(top2[0] - top2[1]):.3g}"))
        if token in stop_ids:
            break
        ids = torch.tensor([[token]])
    return tokens, margins


def plain_case(name, prompt, tokens, margins, **extra):
    if min(margins) < 1e-3:
        sys.exit(f"{name}: a near-tie ({min(margins)}) among the logits: change the case")
    return {"name": name, "prompt_ids": prompt, "repetition_penalty": 1.0, "frequency_penalty": 0.0,
            "presence_penalty": 0.0, "logit_bias": {}, **extra, "generated_ids": tokens, "top2_margin": margins}


def allowed_case(model):
    tokens, margins = penalized_greedy(model, ALLOWED_PROMPT, 1.0, 0.0, 0.0, {}, allowed=ALLOWED)
    plain, _ = penalized_greedy(model, ALLOWED_PROMPT, 1.0, 0.0, 0.0, {})
    print(f"allowed_token_ids: {tokens} (plain {plain}) min margin {min(margins)}")
    if all(t in ALLOWED for t in plain):
        sys.exit("allowed_token_ids: plain decoding keeps to the allowed tokens already: change the list")
    return plain_case("allowed_token_ids", ALLOWED_PROMPT, tokens, margins, allowed_token_ids=ALLOWED)


def bad_words_case(model):
    prompt = ALLOWED_PROMPT
    plain, _ = penalized_greedy(model, prompt, 1.0, 0.0, 0.0, {})
    # One word of one token (the plain reply's third), then one of two: a pair of the reply that
    # banning the first word leaves, its first token not the prompt's last.
    single = [plain[2]]
    once, _ = penalized_greedy(model, prompt, 1.0, 0.0, 0.0, {}, bad_words=[single])
    at = next(i for i in range(4, len(once) - 1) if once[i] != prompt[-1])
    words = [single, once[at:at + 2]]
    tokens, margins = penalized_greedy(model, prompt, 1.0, 0.0, 0.0, {}, bad_words=words)
    print(f"bad_words {words}: {tokens} (plain {plain}) min margin {min(margins)}")
    if tokens[:at + 1] != once[:at + 1] or tokens[at + 1] == once[at + 1]:
        sys.exit("bad_words: the pair is not where it was banned: change the case")
    return plain_case("bad_words", prompt, tokens, margins, bad_words=words)


def min_tokens_case(model):
    plain, _ = penalized_greedy(model, MIN_TOKENS_PROMPT, 1.0, 0.0, 0.0, {})
    # The stop id: one of the plain reply's tokens that would end it before `min_tokens` and, kept back
    # until then, ends it at the first token it may: keeping it back one token more or less would
    # change the tokens.
    for stop in plain[:MIN_TOKENS]:
        tokens, margins = penalized_greedy(model, MIN_TOKENS_PROMPT, 1.0, 0.0, 0.0, {}, stop_ids=[stop],
                                           min_tokens=MIN_TOKENS)
        if len(tokens) == MIN_TOKENS + 1:
            print(f"min_tokens: stop {stop}: {tokens} (plain {plain}) min margin {min(margins)}")
            return plain_case("min_tokens", MIN_TOKENS_PROMPT, tokens, margins, stop_ids=[stop],
                              min_tokens=MIN_TOKENS)
    sys.exit("min_tokens: no stop id of the plain reply ends the kept-back one at once: change the case")


def main():
    root = Path(sys.argv[1] if len(sys.argv) > 1 else "tests/goldens")
    model = Gemma4ForCausalLM.from_pretrained(root / "tiny" / "hf", dtype=torch.float32).eval()
    model.config._attn_implementation = "eager"
    cases = []
    for name, (prompt, repetition, frequency, presence, bias) in CASES.items():
        tokens, margins = penalized_greedy(model, prompt, repetition, frequency, presence, bias)
        print(f"{name}: {tokens} min margin {min(margins)}")
        plain, _ = penalized_greedy(model, prompt, 1.0, 0.0, 0.0, {})
        if plain == tokens:
            sys.exit(f"{name}: the penalties change no token: make them stronger")
        if bias and repetition != 1.0:
            swapped, _ = penalized_greedy(model, prompt, repetition, frequency, presence, bias, bias_last=True)
            if swapped == tokens:
                sys.exit(f"{name}: biasing after the repetition penalty changes no token: change the case")
        if min(margins) < 1e-3:
            sys.exit(f"{name}: a near-tie ({min(margins)}) among the penalized logits: change the case")
        cases.append({"name": name, "prompt_ids": prompt, "repetition_penalty": repetition,
                      "frequency_penalty": frequency, "presence_penalty": presence,
                      "logit_bias": {str(i): b for i, b in bias.items()},
                      "generated_ids": tokens, "top2_margin": margins})
    cases.append(allowed_case(model))
    cases.append(bad_words_case(model))
    cases.append(min_tokens_case(model))
    golden = {"model": "tiny", "made_by": "scripts/goldens/make_penalty_goldens.py",
              "transformers": transformers.__version__, "torch": torch.__version__, "attention": "eager",
              "dtype": "float32", "decode": "greedy over penalized logits, DynamicCache, EOS ignored",
              "cases": cases}
    (root / "tiny" / "penalties.json").write_text(json.dumps(golden, indent=1) + "\n")


if __name__ == "__main__":
    main()
