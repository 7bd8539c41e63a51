#!/usr/bin/env python3
"""Golden fixtures for a quantized LM head (`g4c --quantize w4a16:g8+head`): the tiny W4A16 model
(tests/goldens/tiny-qat, made by make_qat_goldens.py) with its head, tied to the embedding table,
replaced by a 4-bit copy of that table. Run by hand, never in CI, in the venv make_qat_goldens.py
names:

    /tmp/gv/bin/python scripts/goldens/make_head_goldens.py tests/goldens

It writes tests/goldens/tiny-qat-head/golden.json and logits.safetensors (as make_goldens.py writes
them); the checkpoint is tiny-qat's, whose head g4c quantizes at load.

The head's copy is quantized by compressed-tensors' own functions, as make_qat_goldens.py quantizes
the linears: per group of 8 inputs of the bf16 table, scale = bf16(absmax / 7.5) (`calculate_qparams`)
and q = clamp(round(w / scale), -8, 7) (`quantize`), dequantized exactly in f32, q * f32(scale), as
transformers' default load dequantizes the linears. The embedding lookup keeps the table as it is:
only the head is untied and replaced.

Generation stops after 17 tokens: at the 18th step of the `window` prompt transformers' own two
paths differ by 1.0e-2, past the script's 5e-4 of the logit scale.
"""
import sys
from pathlib import Path

import torch
import transformers
from compressed_tensors.quantization import QuantizationArgs
from compressed_tensors.quantization.lifecycle.forward import quantize
from compressed_tensors.quantization.utils import calculate_qparams
from transformers import Gemma4ForCausalLM

sys.path.insert(0, str(Path(__file__).parent))
from make_goldens import MODELS, write_golden  # noqa: E402
from make_qat_goldens import QUANT  # noqa: E402

NEW_TOKENS = 17


def quantized_head(table, group):
    """The 4-bit copy of `table` ([vocab, hidden], bf16 values) in groups of `group` inputs, in f32."""
    args = QuantizationArgs(num_bits=4, type="int", strategy="group", group_size=group, symmetric=True, dynamic=False)
    w = table.to(torch.bfloat16)
    grouped = w.reshape(w.shape[0], w.shape[1] // group, group)
    scale, zero_point = calculate_qparams(grouped.amin(-1), grouped.amax(-1), args)
    q = quantize(x=w, scale=scale, zero_point=zero_point, args=args)
    assert q.abs().max() <= 8 and torch.equal(q, q.round()), "4-bit integers"
    per_value = scale.to(torch.float32).repeat_interleave(group, dim=1)
    return q.to(torch.float32) * per_value


def main():
    root = Path(sys.argv[1] if len(sys.argv) > 1 else "tests/goldens")
    name = "tiny"
    q = QUANT[name]
    model = Gemma4ForCausalLM.from_pretrained(root / f"{name}-qat" / "hf", torch_dtype=torch.float32).eval()
    model.config._attn_implementation = "eager"
    table = model.model.embed_tokens.weight.data
    assert model.lm_head.weight.data_ptr() == table.data_ptr(), "the head is tied to the embedding table"
    head = quantized_head(table, q["group"])
    model.lm_head.weight = torch.nn.Parameter(head, requires_grad=False)
    assert model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr()
    print(f"head: max |w - q·s| {float((head - table).abs().max()):.4f} over max |w| {float(table.abs().max()):.3f}")
    provenance = {
        "transformers": transformers.__version__,
        "compressed_tensors": __import__("compressed_tensors").__version__,
        "torch": torch.__version__,
        "quantization": {"bits": 4, "group": q["group"], "ignore": [], "head": "4-bit copy of embed_tokens"},
        "checkpoint": f"tests/goldens/{name}-qat",
    }
    out = root / f"{name}-qat-head"
    out.mkdir(parents=True, exist_ok=True)
    made_by = "scripts/goldens/make_head_goldens.py"
    write_golden(model, f"{name}-qat-head", MODELS[name]["prompts"], NEW_TOKENS, out, made_by, provenance)


if __name__ == "__main__":
    main()
