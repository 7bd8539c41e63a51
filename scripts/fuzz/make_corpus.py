#!/usr/bin/env python3
"""Writes the seed inputs of the fuzz targets (tests/fuzz.rs) into tests/fuzz/<target>/seed-*.

Seeds are small valid inputs that reach deep into each parser: the modules of the filetests, the golden
models' configs (multimodal, text-only, pack-quantized), a small safetensors file and its index, an
artifact manifest, a cache entry and `g4c serve`'s request bodies. Inputs that once failed are kept beside them as crash-* files
(written by the fuzz run itself). Run from the repository root; needs only the standard library and a
built g4c (for the manifest): `python3 scripts/fuzz/make_corpus.py`.
"""
import glob
import json
import os
import struct
import subprocess
import tempfile

ROOT = "tests/fuzz"


def write(target, name, data):
    os.makedirs(f"{ROOT}/{target}", exist_ok=True)
    with open(f"{ROOT}/{target}/seed-{name}", "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def ir_text():
    for path in sorted(glob.glob("tests/filetests/*/*.g4c")):
        blocks, current = [], None
        for line in open(path).read().splitlines():
            if line.startswith("module "):
                current = [line]
            elif current is not None:
                current.append(line)
                if line == "}":
                    blocks.append("\n".join(current) + "\n")
                    current = None
        stem = os.path.splitext(os.path.basename(path))[0]
        for i, block in enumerate(blocks):
            write("ir_text", f"{stem}-{i}.g4c", block)


def safetensors_file(tensors):
    """tensors: [(name, dtype, shape, bytes)] -> a safetensors file."""
    header, data = {"__metadata__": {"format": "pt"}}, b""
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header, separators=(",", ":")).encode()
    return struct.pack("<Q", len(text)) + text + data


SMALL = [
    ("model.language_model.norm.weight", "BF16", [4], struct.pack("<4H", 0x3F80, 0x4000, 0xBF80, 0)),
    ("model.language_model.embed_tokens.weight", "F32", [2, 2], struct.pack("<4f", 1, -2, 0.5, 3)),
    ("model.language_model.layers.0.mlp.up_proj.weight_packed", "I32", [2, 1], struct.pack("<2i", 0x12345678, -1)),
    ("model.language_model.layers.0.mlp.up_proj.weight_scale", "F16", [2, 1], struct.pack("<2H", 0x3C00, 0x3800)),
]


def checkpoints():
    shard = safetensors_file(SMALL)
    write("safetensors", "small.safetensors", shard)
    index = {"metadata": {"total_size": 40}, "weight_map": {n: "model-00001-of-00001.safetensors" for n, *_ in SMALL}}
    write("index", "index.json", json.dumps(index, indent=2))


def configs():
    for model in ["tiny", "gqa", "tiny-qat"]:
        for layout in ["hf", "published"]:
            write("config", f"{model}-{layout}.json", open(f"tests/goldens/{model}/{layout}/config.json").read())


def manifest():
    with tempfile.TemporaryDirectory() as tmp:
        out = f"{tmp}/artifact"
        env = dict(os.environ, G4C_CACHE_DIR=f"{tmp}/cache")
        subprocess.run(["target/release/g4c", "-q", "compile", "tests/goldens/tiny/published", "-o", out,
                        "--prefill-len", "4", "--context", "16"], check=True, env=env, stdout=subprocess.DEVNULL)
        write("manifest", "tiny.json", open(f"{out}/manifest.json").read())
        entry = sorted(glob.glob(f"{out}/executables/*.g4cx"))[0]
        data = open(entry, "rb").read()
        write("cache_entry", "header.bin", data[:4096])


def server_requests():
    user = [{"role": "user", "content": "ba de fi"}]
    bodies = {
        "chat.json": {"model": "tiny", "messages": [{"role": "system", "content": "ko lu"}, *user], "max_tokens": 8,
                      "temperature": 0.7, "top_p": 0.9, "top_k": 40, "seed": 3, "stop": ["ba", 17],
                      "stream": True, "stream_options": {"include_usage": True}},
        "chat-parts.json": {"messages": [{"role": "user", "content": [{"type": "text", "text": "ma ne"}]},
                                         {"role": "assistant", "content": None}], "n": 1, "logprobs": False},
        "completion-text.json": {"prompt": "ba de", "max_tokens": 4, "stop": "fi", "return_token_ids": True},
        "completion-ids.json": {"prompt": [[2, 17, 301]], "max_completion_tokens": 3, "ignore_eos": True,
                                "stop_token_ids": [5]},
    }
    for name, body in bodies.items():
        write("server_request", name, json.dumps(body, indent=1))


if __name__ == "__main__":
    ir_text()
    checkpoints()
    configs()
    manifest()
    server_requests()
