#!/usr/bin/env python3
"""Quantizes the tiny golden models (tests/goldens/{tiny,gqa}/hf, made by make_goldens.py) to W4A16 with
compressed-tensors itself, saves them `pack-quantized` as the Gemma 4 QAT exports are, reloads them with
transformers (which decompresses them) and writes golden fixtures for them. Run by hand, never in CI:

    python3 -m venv /tmp/gv && /tmp/gv/bin/pip install torch transformers==5.23.0 safetensors numpy \\
        compressed-tensors==0.20.1
    /tmp/gv/bin/python scripts/goldens/make_qat_goldens.py tests/goldens [MODEL...]

For each model it writes tests/goldens/<model>-qat/:
  hf/         the quantized checkpoint as transformers saves it (text-only config, `model.` keys):
              `weight_packed` int32 [out, in/8], `weight_scale` bf16 [out, in/group], `weight_shape`
              int64, every other tensor bf16, and the `quantization_config` compressed-tensors writes
  published/  the same tensors in the published multimodal layout (`model.language_model.` keys, a
              vision tensor, the quantization_config at the top level ignoring the vision tower)
  golden.json, logits.safetensors: as make_goldens.py writes them, from the reloaded model in f32.

Quantization is compressed-tensors' own: per group of `group` inputs, scale = bf16(absmax / 7.5) (its
`calculate_qparams` on the bf16 weights) and q = clamp(round(w / scale), -8, 7) in bf16 arithmetic
(its compressor). The tiny model's PLE width is 8, so it uses groups of 8; so does the gqa model (with groups of 16 its
quantized twin is ill-conditioned), which leaves `per_layer_projection` (4 inputs, less than one packed
word) in bf16 through `ignore`, as the published export ignores its towers.

transformers' default load (f32) dequantizes exactly, (q) * f32(scale); loading with
`CompressedTensorsConfig(run_compressed=False)` instead rounds every weight to bf16 first (the scale's
type) and moves the tiny model's logits by up to 3.4: the goldens use the default load.
"""
import json
import sys
from pathlib import Path

import torch
import transformers
from compressed_tensors.compressors import ModelCompressor
from compressed_tensors.quantization import (
    QuantizationArgs,
    QuantizationConfig,
    QuantizationScheme,
    apply_quantization_config,
)
from compressed_tensors.quantization.utils import calculate_qparams
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import Gemma4ForCausalLM

sys.path.insert(0, str(Path(__file__).parent))
from make_goldens import MODELS, write_golden  # noqa: E402

# Generation lengths: the tiny model's quantized twin is ill-conditioned at its 21st step of the
# single-token prompt (transformers' own two paths differ by 1.1e-2 there), so it stops at 20.
QUANT = {
    "tiny": dict(group=8, ignore=["lm_head"], new_tokens=20),
    "gqa": dict(group=8, ignore=["lm_head", "re:.*per_layer_projection$"], new_tokens=20),
    # Groups of 32, as the published QAT checkpoints have, through the deep model's split-K GEMMs;
    # `per_layer_projection` (8 inputs) stays bf16.
    "deep": dict(group=32, ignore=["lm_head", "re:.*per_layer_projection$"], new_tokens=16),
}


def quantize(src, group, ignore):
    model = Gemma4ForCausalLM.from_pretrained(src, torch_dtype=torch.bfloat16).eval()
    args = QuantizationArgs(num_bits=4, type="int", strategy="group", group_size=group, symmetric=True, dynamic=False)
    scheme = QuantizationScheme(targets=["Linear"], weights=args)
    config = QuantizationConfig(config_groups={"group_0": scheme}, ignore=ignore, format="pack-quantized")
    apply_quantization_config(model, config)
    for _, module in model.named_modules():
        if hasattr(module, "weight_scale"):
            w = module.weight.data
            grouped = w.reshape(w.shape[0], w.shape[1] // group, group)
            scale, zero_point = calculate_qparams(grouped.amin(-1), grouped.amax(-1), args)
            module.weight_scale.data.copy_(scale.reshape(module.weight_scale.shape))
            if hasattr(module, "weight_zero_point"):
                module.weight_zero_point.data.copy_(zero_point.reshape(module.weight_zero_point.shape))
    compressor = ModelCompressor.from_pretrained_model(model, quantization_format="pack-quantized")
    compressor.compress_model(model)
    return model, compressor


def write_published(hf, out):
    """The quantized tensors in the layout of the published multimodal QAT release."""
    out.mkdir(parents=True, exist_ok=True)
    cfg = json.loads((hf / "config.json").read_text())
    quant = cfg.pop("quantization_config")
    # compressed-tensors writes ignored modules by name: rename them as the decoder's are renamed.
    renamed = ["model.language_model." + n[len("model."):] if n.startswith("model.") else n for n in quant["ignore"]]
    quant["ignore"] = renamed + ["re:model\\.vision_tower\\..*"]
    text = {k: v for k, v in cfg.items() if k not in ("architectures", "transformers_version")}
    text.update(model_type="gemma4_text", dtype="bfloat16")
    config = {"architectures": ["Gemma4ForConditionalGeneration"], "model_type": "gemma4", "text_config": text,
              "tie_word_embeddings": True, "dtype": "bfloat16", "quantization_config": quant}
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    tensors = {}
    with safe_open(hf / "model.safetensors", "pt") as f:
        for name in f.keys():
            if name.startswith("lm_head"):
                continue
            assert name.startswith("model."), name
            tensors["model.language_model." + name[len("model."):]] = f.get_tensor(name)
    tensors["model.vision_tower.encoder.layers.0.self_attn.q_proj.weight"] = torch.zeros(8, 8, dtype=torch.bfloat16)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})


def main():
    root = Path(sys.argv[1] if len(sys.argv) > 1 else "tests/goldens")
    for name in sys.argv[2:] or list(QUANT):
        q = QUANT[name]
        spec = MODELS[name]
        out = root / f"{name}-qat"
        model, compressor = quantize(root / name / "hf", q["group"], q["ignore"])
        model.save_pretrained(out / "hf", safe_serialization=True)
        compressor.update_config(out / "hf")
        write_published(out / "hf", out / "published")
        reloaded = Gemma4ForCausalLM.from_pretrained(out / "hf", torch_dtype=torch.float32).eval()
        reloaded.config._attn_implementation = "eager"
        provenance = {
            "transformers": transformers.__version__,
            "compressed_tensors": __import__("compressed_tensors").__version__,
            "torch": torch.__version__,
            "quantization": {"bits": 4, "group": q["group"], "ignore": q["ignore"]},
        }
        made_by = "scripts/goldens/make_qat_goldens.py"
        write_golden(reloaded, f"{name}-qat", spec["prompts"], q["new_tokens"], out, made_by, provenance)


if __name__ == "__main__":
    main()
