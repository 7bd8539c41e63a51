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
                "ids": c.model_extra.get("token_ids"), "prompt_ids": r.model_extra.get("prompt_token_ids")}
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
        chat(False, n=2)
        out["n2"] = "accepted"
    except openai.BadRequestError as e:
        out["n2"] = {"status": e.status_code, "error": e.body}
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


def shared_prefix():
    """Two chats with one system prompt, one after the other: the second finds it cached."""
    system = {"role": "system", "content": "ba de fi ko lu"}
    first = chat(False, messages=[system, {"role": "user", "content": "ma"}], max_tokens=2)
    second = chat(False, messages=[system, {"role": "user", "content": "ne po"}], max_tokens=2)
    return {"first": first, "second": second}


print(json.dumps({"basic": basic, "concurrent": concurrent, "shared_prefix": shared_prefix}[scenario]()))
