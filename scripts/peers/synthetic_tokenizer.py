#!/usr/bin/env python3
"""Writes a tokenizer that llama.cpp's converter accepts beside a synthetic checkpoint (g4c synth
makes none at E2B size): a byte-fallback BPE of exactly the config's vocab_size tokens (<pad>, <eos>,
<bos>, <unk>, the 256 byte tokens, "▁" and "▁▁" with the one merge that makes it, since llama.cpp
refuses a BPE vocabulary without merges, then <unusedN>) and a tokenizer_config.json naming
PreTrainedTokenizerFast. Text through it is bytes; the benchmark only needs the shapes right.

    python scripts/peers/synthetic_tokenizer.py DIR
"""
import json
import sys
from pathlib import Path

d = Path(sys.argv[1])
config = json.loads((d / "config.json").read_text())
vocab_size = config.get("text_config", config)["vocab_size"]
names = ["<pad>", "<eos>", "<bos>", "<unk>"] + [f"<0x{b:02X}>" for b in range(256)] + ["\u2581", "\u2581\u2581"]
names += [f"<unused{i}>" for i in range(vocab_size - len(names))]
special = [{"id": i, "content": n, "single_word": False, "lstrip": False, "rstrip": False,
            "normalized": False, "special": True} for i, n in enumerate(names[:4])]
tokenizer = {
    "version": "1.0",
    "truncation": None,
    "padding": None,
    "added_tokens": special,
    "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"},
    "pre_tokenizer": None,
    "post_processor": None,
    "decoder": {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
        {"type": "ByteFallback"},
        {"type": "Fuse"},
    ]},
    "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
              "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
              "vocab": {n: i for i, n in enumerate(names)}, "merges": [["\u2581", "\u2581"]]},
}
(d / "tokenizer.json").write_text(json.dumps(tokenizer))
(d / "tokenizer_config.json").write_text(json.dumps({
    "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<bos>", "eos_token": "<eos>",
    "unk_token": "<unk>", "pad_token": "<pad>", "add_bos_token": True,
}))
print(f"{d}: tokenizer of {vocab_size} tokens")
