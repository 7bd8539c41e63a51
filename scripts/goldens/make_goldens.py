#!/usr/bin/env python3
"""Builds tiny Gemma 4 models with Hugging Face transformers and writes the golden fixtures that g4c's
numeric tests compare against (tests/goldens/). Run by hand, never in CI:

    python3 -m venv /tmp/gv && /tmp/gv/bin/pip install torch transformers==5.23.0 safetensors numpy
    /tmp/gv/bin/python scripts/goldens/make_goldens.py tests/goldens [MODEL...]

(every model of MODELS unless some are named).

For each model it writes
  hf/         the checkpoint as transformers saves it (text-only config, f32, `model.` keys)
  published/  the same weights in the published layout (multimodal config with `global_head_dim`,
              bf16, `model.language_model.` keys, dead K/V tensors on KV-shared layers, a vision tensor)
  golden.json prompts, greedy tokens, versions, and per step the "reference spread": how far
              transformers' own full forward (no cache) is from its cached decode, max |Δlogit|.
              Some steps are ill-conditioned and the reference itself is only that precise there.
              Also per step, "bf16_error" and "f16_error": how far transformers itself is from these
              f32 logits when it runs the same model in bf16 / f16 along the same tokens (teacher
              forced): the yardstick for g4c's narrow-dtype targets.
  logits.safetensors: per-step logits [N, V] per case.

A reference must be well-conditioned to be worth comparing against: random weights sometimes make
near-ties that amplify rounding, so that transformers' own two paths disagree by a lot. The script
refuses a model whose reference spread exceeds 5e-4 of its logit scale, half of the tests' tolerance
(seeds are picked by that property of the reference alone).

Weights are drawn so the checks have teeth (gemma4.md §9): embeddings with std 0.5 so the final softcap
is non-linear, norm weights from U[0.5, 2] and layer scalars from U[0.3, 1]; every value is rounded to
bf16 so the f32 and bf16 copies hold identical weights. Generation is transformers' own cached decode
(`DynamicCache`), eager attention, fp32, greedy, EOS ignored.
"""
import copy
import json
import sys
from pathlib import Path

import torch
import transformers
from safetensors.torch import save_file
from transformers import Gemma4ForCausalLM, Gemma4TextConfig

ROPE = {
    "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
    "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1000000.0},
}

S, F = "sliding_attention", "full_attention"

# gemma4.md §7: MQA 4:1, head dims 32/64, period-5 pattern, 5 KV-shared layers reading 3 and 4,
# double-wide MLP, window 4, PLE of width 8.
TINY = dict(
    vocab_size=512, vocab_size_per_layer_input=512, hidden_size=64, intermediate_size=128,
    use_double_wide_mlp=True, num_hidden_layers=10, layer_types=[S, S, S, S, F] * 2,
    num_attention_heads=4, num_key_value_heads=1, head_dim=32, global_head_dim=64,
    sliding_window=4, num_kv_shared_layers=5, hidden_size_per_layer_input=8,
    final_logit_softcapping=30.0, rope_parameters=ROPE, rms_norm_eps=1e-6,
    hidden_activation="gelu_pytorch_tanh", attention_k_eq_v=False, enable_moe_block=False,
    tie_word_embeddings=True, attention_bias=False, pad_token_id=0, bos_token_id=2, eos_token_id=1,
)

MODELS = {
    "tiny": dict(
        config=TINY,
        seed=1234,
        # shorter than, equal to and longer than the window of 4; a single-token prompt
        prompts={
            "single": [2],
            "short": [2, 17, 301],
            "window": [2, 17, 301, 45],
            "long": [2, 17, 301, 45, 99, 7, 256, 511, 3, 64, 128],
        },
        new_tokens=24,
    ),
    # GQA with 2 KV heads, a period-3 pattern, KV sources 2 (full) and 4 (sliding) that are not
    # adjacent, window 6, single-wide MLP, hidden size 48 (so sqrt(D) is not exact in bf16).
    "gqa": dict(
        config=dict(
            vocab_size=384, vocab_size_per_layer_input=384, hidden_size=48, intermediate_size=96,
            use_double_wide_mlp=False, num_hidden_layers=8, layer_types=[S, S, F, S, S, F, S, F],
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, global_head_dim=32,
            sliding_window=6, num_kv_shared_layers=3, hidden_size_per_layer_input=4,
            final_logit_softcapping=30.0, rope_parameters=ROPE, rms_norm_eps=1e-6,
            hidden_activation="gelu_pytorch_tanh", attention_k_eq_v=False, enable_moe_block=False,
            tie_word_embeddings=True, attention_bias=False, pad_token_id=0, bos_token_id=2, eos_token_id=1,
        ),
        seed=1,
        prompts={
            "single": [2],
            "short": [2, 5, 77, 301, 12],
            "window": [2, 5, 77, 301, 12, 200],
            "long": [2, 5, 77, 301, 12, 200, 31, 8, 150, 383, 64, 9, 91, 250, 4],
        },
        new_tokens=20,
    ),
    # A deep MLP (768 wide, single-wide): a prefill's down projection is deep enough for the GEMM
    # to split its contraction over blocks (split-K) in the layers that write caches (the KV-shared
    # layers run on the last token alone); hidden size and attention as the tiny model's.
    "deep": dict(
        config=dict(
            TINY, intermediate_size=768, use_double_wide_mlp=False, num_hidden_layers=4,
            layer_types=[S, F, S, F], num_kv_shared_layers=2,
        ),
        seed=21,
        prompts={
            "single": [2],
            "short": [2, 40, 301, 9],
            "long": [2, 40, 301, 9, 77, 480, 13, 256, 5, 150, 64, 333],
        },
        new_tokens=16,
    ),
    # The larger Gemma 4 models' attention: full-attention layers whose values are their keys
    # (`attention_k_eq_v`: no v_proj) with their own KV head count (`num_global_key_value_heads`),
    # GQA 4:2 on sliding layers, no PLE and no KV sharing; period-3 pattern, window 4.
    "keqv": dict(
        config=dict(
            TINY, use_double_wide_mlp=False, num_hidden_layers=6, layer_types=[S, S, F] * 2,
            num_key_value_heads=2, num_global_key_value_heads=1, attention_k_eq_v=True,
            num_kv_shared_layers=0, hidden_size_per_layer_input=0,
        ),
        seed=5,
        prompts={
            "single": [2],
            "short": [2, 33, 400, 7],
            "long": [2, 33, 400, 7, 91, 256, 18, 300, 5, 64, 127, 480],
        },
        new_tokens=16,
    ),
    # 26B-A4B's layer: beside the dense MLP, a mixture of 4 experts of which a router picks 2 per
    # token (`enable_moe_block`), with keys as values on full layers as there; no PLE, no KV sharing.
    "moe": dict(
        config=dict(
            TINY, use_double_wide_mlp=False, num_hidden_layers=4, layer_types=[S, F, S, F],
            num_key_value_heads=2, num_global_key_value_heads=1, attention_k_eq_v=True,
            num_kv_shared_layers=0, hidden_size_per_layer_input=0,
            enable_moe_block=True, num_experts=4, top_k_experts=2, moe_intermediate_size=32,
        ),
        seed=5,
        prompts={
            "single": [2],
            "short": [2, 19, 250, 7],
            "long": [2, 19, 250, 7, 88, 301, 42, 477, 6, 150, 99, 320],
        },
        new_tokens=16,
    ),
}


def bf16_exact(t):
    return t.to(torch.bfloat16).to(torch.float32)


def randomize(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in list(model.named_parameters()) + list(model.named_buffers()):
            if not p.is_floating_point() or name.endswith("inv_freq") or "embed_scale" in name:
                continue
            if "layer_scalar" in name:
                p.copy_(torch.rand(p.shape, generator=g) * 0.7 + 0.3)
            elif "norm" in name or "scale" in name:
                # Norm weights, and the MoE router's input and per-expert scales.
                p.copy_(torch.rand(p.shape, generator=g) * 1.5 + 0.5)
            elif "embed_tokens" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
            elif p.dim() in (2, 3):
                # Linear weights `[out, in]`, and experts' `[expert, out, in]`.
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5)
            p.copy_(bf16_exact(p))


@torch.no_grad()
def greedy(model, prompt, new_tokens):
    cache = transformers.DynamicCache(config=model.config)
    ids = torch.tensor([prompt])
    tokens, rows = [], []
    for _ in range(new_tokens):
        out = model(input_ids=ids, past_key_values=cache, use_cache=True)
        logits = out.logits[0, -1].float()
        token = int(torch.argmax(logits))
        tokens.append(token)
        rows.append(logits.clone())
        ids = torch.tensor([[token]])
    return tokens, torch.stack(rows)


@torch.no_grad()
def reference_spread(model, prompt, tokens, rows):
    """Per step, max |logit difference| between transformers' full forward and its cached decode."""
    full = model(input_ids=torch.tensor([prompt + tokens])).logits[0].float()
    p = len(prompt)
    return (full[p - 1 : p - 1 + len(tokens)] - rows).abs().max(dim=-1).values.tolist()


@torch.no_grad()
def narrow_dtype_error(model, dtype, prompt, tokens, rows):
    """Per step, max |logit difference| of `model` run in `dtype` (teacher forced) from the f32 rows."""
    narrow = copy.deepcopy(model).to(dtype)
    logits = narrow(input_ids=torch.tensor([prompt + tokens])).logits[0].float()
    p = len(prompt)
    return (logits[p - 1 : p - 1 + len(tokens)] - rows).abs().max(dim=-1).values.tolist()


def write_published(model, cfg, out):
    """The same weights in the layout of the published multimodal release."""
    out.mkdir(parents=True, exist_ok=True)
    text = dict({"num_global_key_value_heads": None}, **cfg, model_type="gemma4_text", dtype="bfloat16")
    config = {"architectures": ["Gemma4ForConditionalGeneration"], "model_type": "gemma4",
              "text_config": text, "tie_word_embeddings": True, "dtype": "bfloat16"}
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    tensors = {}
    for name, t in model.state_dict().items():
        if name.startswith("lm_head"):
            continue
        assert name.startswith("model."), name
        tensors["model.language_model." + name[len("model."):]] = t.to(torch.bfloat16).contiguous()
    g = torch.Generator().manual_seed(7)
    first_shared = cfg["num_hidden_layers"] - cfg["num_kv_shared_layers"]
    for i in range(first_shared, cfg["num_hidden_layers"]):
        full = cfg["layer_types"][i] == F
        hd = cfg["global_head_dim"] if full else cfg["head_dim"]
        kv = cfg["num_key_value_heads"] * hd
        for leaf, shape in (("k_proj.weight", (kv, cfg["hidden_size"])), ("v_proj.weight", (kv, cfg["hidden_size"])), ("k_norm.weight", (hd,))):
            tensors[f"model.language_model.layers.{i}.self_attn.{leaf}"] = torch.randn(shape, generator=g).to(torch.bfloat16)
    tensors["model.vision_tower.encoder.layers.0.self_attn.q_proj.weight"] = torch.zeros(8, 8, dtype=torch.bfloat16)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})


def write_golden(model, label, prompts, new_tokens, out, made_by, provenance):
    """Greedy generations of `model` from each prompt, with transformers' own disagreement along them,
    into out/golden.json and out/logits.safetensors; refuses an ill-conditioned model."""
    cases, logits = [], {}
    for case, prompt in prompts.items():
        tokens, rows = greedy(model, prompt, new_tokens)
        spread = [float(f"{x:.3g}") for x in reference_spread(model, prompt, tokens, rows)]
        narrow = {
            f"{kind}_error": [float(f"{x:.3g}") for x in narrow_dtype_error(model, dtype, prompt, tokens, rows)]
            for kind, dtype in (("bf16", torch.bfloat16), ("f16", torch.float16))
        }
        cases.append({"name": case, "prompt_ids": prompt, "generated_ids": tokens, "reference_spread": spread, **narrow})
        logits[case] = rows.contiguous()
        top2 = rows.topk(2, dim=-1).values
        margin = float((top2[:, 0] - top2[:, 1]).min())
        print(f"{label}/{case}: {len(prompt)} prompt tokens -> {tokens[:8]}... max|logit| {float(rows.abs().max()):.2f}, min top-2 margin {margin:.4f}")
    scale = max(float(r.abs().max()) for r in logits.values())
    worst = max(max(c["reference_spread"]) for c in cases)
    if worst > 5e-4 * scale:
        sys.exit(f"{label}: reference spread {worst:.1e} exceeds 5e-4 of the logit scale {scale:.1f}: pick another seed")
    save_file(logits, str(out / "logits.safetensors"))
    golden = {
        "model": label,
        "made_by": made_by,
        **provenance,
        "attention": "eager",
        "dtype": "float32",
        "decode": "greedy, DynamicCache, EOS ignored",
        "cases": cases,
    }
    (out / "golden.json").write_text(json.dumps(golden, indent=1) + "\n")


def main():
    root = Path(sys.argv[1] if len(sys.argv) > 1 else "tests/goldens")
    names = sys.argv[2:] or list(MODELS)
    for name in names:
        spec = MODELS[name]
        torch.manual_seed(spec["seed"])
        config = Gemma4TextConfig(**spec["config"])
        config._attn_implementation = "eager"
        model = Gemma4ForCausalLM(config).eval().float()
        randomize(model, spec["seed"])
        out = root / name
        model.save_pretrained(out / "hf", safe_serialization=True)
        write_published(model, spec["config"], out / "published")
        provenance = {"transformers": transformers.__version__, "torch": torch.__version__}
        write_golden(model, name, spec["prompts"], spec["new_tokens"], out, "scripts/goldens/make_goldens.py", provenance)


if __name__ == "__main__":
    main()
