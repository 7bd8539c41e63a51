"""Drives `g4c serve` with the official `openai` client (tests/serve.rs runs it with .venv's Python).

usage: openai_client.py SCENARIO BASE_URL MODEL
Prints one JSON object of what the client saw; the Rust test asserts on it.
"""
import json
import sys
import threading

import openai

scenario, base_url, model = sys.argv[1:4]
client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=120)
messages = [{"role": "system", "content": "ba de fi"}, {"role": "user", "content": "ko lu ma ne"}]


def chat(stream, **kw):
    kw.setdefault("max_tokens", 8)
    kw.setdefault("temperature", 0)
    if not stream:
        r = client.chat.completions.create(model=model, messages=kw.pop("messages", messages), **kw)
        c = r.choices[0]
        return {"text": c.message.content, "role": c.message.role, "finish": c.finish_reason,
                "usage": r.usage.model_dump(), "object": r.object}
    chunks = list(client.chat.completions.create(
        model=model, messages=kw.pop("messages", messages), stream=True,
        stream_options={"include_usage": True}, **kw))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    roles = [c.choices[0].delta.role for c in chunks if c.choices and c.choices[0].delta.role]
    usage = [c.usage.model_dump() for c in chunks if c.usage]
    return {"text": text, "role": roles[0] if roles else None, "finish": finish[-1] if finish else None,
            "usage": usage[-1] if usage else None, "chunks": len(chunks), "object": chunks[0].object}


def completion(stream, **kw):
    kw.setdefault("max_tokens", 6)
    kw.setdefault("temperature", 0)
    prompt = kw.pop("prompt", "ba de fi")
    extra = {"return_token_ids": True}
    if not stream:
        r = client.completions.create(model=model, prompt=prompt, extra_body=extra, **kw)
        c = r.choices[0]
        return {"text": c.text, "finish": c.finish_reason, "usage": r.usage.model_dump(),
                "ids": c.model_extra.get("token_ids"), "prompt_ids": c.model_extra.get("prompt_token_ids")}
    chunks = list(client.completions.create(model=model, prompt=prompt, stream=True, extra_body=extra,
                                             stream_options={"include_usage": True}, **kw))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    ids = [i for c in chunks if c.choices for i in (c.choices[0].model_extra.get("token_ids") or [])]
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    usage = [c.usage.model_dump() for c in chunks if c.usage]
    return {"text": text, "finish": finish[-1] if finish else None, "usage": usage[-1] if usage else None,
            "ids": ids}


def basic():
    out = {"models": [m.id for m in client.models.list().data]}
    out["chat"] = chat(False)
    out["chat_stream"] = chat(True)
    out["completion"] = completion(False)
    out["completion_stream"] = completion(True)
    out["completion_ids_prompt"] = completion(False, prompt=[2, 17, 301])
    try:
        chat(False, n=129)
        out["n129"] = "accepted"
    except openai.BadRequestError as e:
        out["n129"] = {"status": e.status_code, "error": e.body}
    try:
        client.chat.completions.create(model="no-such-model", messages=messages)
        out["wrong_model"] = "accepted"
    except openai.NotFoundError as e:
        out["wrong_model"] = {"status": e.status_code, "error": e.body}
    return out


def concurrent():
    """Eight streams at once, four greedy and four sampled with their own seeds, each asked twice:
    once while the other seven run and once alone."""
    params = [dict(temperature=0)] * 4 + [dict(temperature=0.9, top_p=0.9, seed=s) for s in range(4)]
    for p in params[4:]:
        p["extra_body"] = {"top_k": 50}
    prompts = [[{"role": "user", "content": w}] for w in ["ba", "de fi", "ko lu ma", "ne po", "ba", "ba", "ri su", "ta"]]
    together = [None] * 8

    def one(i):
        together[i] = chat(True, messages=prompts[i], max_tokens=12, **params[i])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    alone = [chat(True, messages=prompts[i], max_tokens=12, **params[i]) for i in range(8)]
    return {"together": together, "alone": alone}


def choices_of(kind, stream, **kw):
    """Every choice of one request (`n`, a completion's list of prompts), by index: text, finish
    reason, token ids, its prompt's ids; and the usage."""
    kw.setdefault("temperature", 0.9)
    kw.setdefault("max_tokens", 8)
    extra = {"return_token_ids": True, "top_k": 50}
    create = client.chat.completions.create if kind == "chat" else client.completions.create
    where = {"messages": messages} if kind == "chat" else {"prompt": kw.pop("prompt", "ba de fi")}
    if stream:
        where["stream_options"] = {"include_usage": True}
    r = create(model=model, stream=stream, extra_body=extra, **where, **kw)
    chunks = list(r) if stream else [r]
    n = kw.get("n", 1) * (len(where["prompt"]) if isinstance(where.get("prompt"), list) else 1)
    out = [{"text": "", "finish": None, "ids": [], "roles": 0, "prompt_ids": None} for _ in range(n)]
    usage = None
    for c in chunks:
        usage = c.usage.model_dump() if c.usage else usage
        for ch in c.choices:
            o = out[ch.index]
            if kind == "chat" and stream:
                o["text"] += ch.delta.content or ""
                o["roles"] += 1 if ch.delta.role else 0
            elif kind == "chat":
                o["text"] += ch.message.content
            else:
                o["text"] += ch.text
            o["ids"] += ch.model_extra.get("token_ids") or []
            o["prompt_ids"] = ch.model_extra.get("prompt_token_ids") or o["prompt_ids"]
            o["finish"] = ch.finish_reason or o["finish"]
    return {"choices": out, "usage": usage}


def choices():
    """`n` choices: sampled with `seed`, choice i is what `seed + i` samples alone (as vLLM)."""
    out = {}
    for kind in ["chat", "completion"]:
        for stream in [False, True]:
            name = f"{kind}{'_stream' if stream else ''}"
            out[name] = choices_of(kind, stream, n=3, seed=7)
            out[name + "_alone"] = [choices_of(kind, stream, seed=7 + i) for i in range(3)]
    out["greedy"] = choices_of("chat", False, n=2, temperature=0)
    out["stop"] = choices_of("completion", True, n=4, seed=3, stop=["n"], max_tokens=12)
    # A list of prompts: each with its `n` choices, as if asked alone.
    prompts = ["ba de fi", "ko lu", "ma"]
    for stream in [False, True]:
        name = f"prompts{'_stream' if stream else ''}"
        out[name] = choices_of("completion", stream, n=2, seed=7, prompt=prompts)
        out[name + "_alone"] = [choices_of("completion", stream, n=2, seed=7, prompt=p) for p in prompts]
    return out


def shared_prefix():
    """Two chats with one system prompt, one after the other: the second finds it cached."""
    system = {"role": "system", "content": "ba de fi ko lu"}
    first = chat(False, messages=[system, {"role": "user", "content": "ma"}], max_tokens=2)
    second = chat(False, messages=[system, {"role": "user", "content": "ne po"}], max_tokens=2)
    return {"first": first, "second": second}


scenarios = {"basic": basic, "concurrent": concurrent, "shared_prefix": shared_prefix, "choices": choices}
print(json.dumps(scenarios[scenario]()))
