#!/usr/bin/env python3
"""Teacher-forced scoring references for `g4c eval` (tests/goldens/<model>/eval/), made with
transformers 5.23 in f32 (eager attention) on the tiny golden models. Run by hand, never in CI:

    /tmp/gv/bin/python scripts/goldens/make_eval_goldens.py tests/goldens

For each model it writes eval/:
  ids.txt                 a token sequence (64 ids: BOS, then a fixed pseudo-random walk over the vocab)
  reference.safetensors   `logits` F32 [N, vocab]: transformers' full forward over the sequence, row i the
                          logits that predict token i + 1; `ids` I32 [N]
  eval.json               the perplexity of the sequence under those logits (computed in float64) and
                          the versions used
"""
import json
import sys
from pathlib import Path

import torch
import transformers
from safetensors.torch import save_file
from transformers import Gemma4ForCausalLM

LENGTH = 64


def sequence(vocab, seed):
    ids, x = [2], seed
    for _ in range(LENGTH - 1):
        x = (x * 1103515245 + 12345) % (1 << 31)
        ids.append(4 + x % (vocab - 4))
    return ids


def main():
    root = Path(sys.argv[1] if len(sys.argv) > 1 else "tests/goldens")
    for name, seed in (("tiny", 11),):
        model = Gemma4ForCausalLM.from_pretrained(root / name / "hf", torch_dtype=torch.float32).eval()
        model.config._attn_implementation = "eager"
        ids = sequence(model.config.vocab_size, seed)
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids])).logits[0].float()
        nll = torch.nn.functional.cross_entropy(logits[:-1].double(), torch.tensor(ids[1:]), reduction="mean")
        out = root / name / "eval"
        out.mkdir(parents=True, exist_ok=True)
        (out / "ids.txt").write_text(",".join(map(str, ids)) + "\n")
        save_file({"logits": logits.contiguous(), "ids": torch.tensor(ids, dtype=torch.int32)}, str(out / "reference.safetensors"))
        meta = {"made_by": "scripts/goldens/make_eval_goldens.py", "transformers": transformers.__version__,
                "torch": torch.__version__, "attention": "eager", "dtype": "float32", "tokens": len(ids),
                "perplexity": float(torch.exp(nll))}
        (out / "eval.json").write_text(json.dumps(meta, indent=1) + "\n")
        print(name, meta["perplexity"])


if __name__ == "__main__":
    main()
