"""The small HTTP calls the load generator, the output capture and the served cells share: a POST,
a JSON GET, the served model's name, and a server's own tokenization of a text or a chat.

httpx only, imported lazily.
"""

from __future__ import annotations

from typing import Any

from adapters.contract.openai_api import ServerApi, completion_body


def post(url: str, path: str, headers: dict | None = None, timeout_s: float = 30.0) -> None:
    import httpx

    httpx.post(url.rstrip("/") + path, headers=headers, timeout=timeout_s, trust_env=False).raise_for_status()


def get_json(url: str, path: str, headers: dict | None = None, timeout_s: float = 10.0) -> Any:
    import httpx

    r = httpx.get(url.rstrip("/") + path, headers=headers, timeout=timeout_s, trust_env=False)
    r.raise_for_status()
    return r.json()


def served_model_name(url: str, headers: dict | None = None) -> str | None:
    """The first model id GET /v1/models lists (what an already-running server expects in `model`)."""
    data = get_json(url, "/v1/models", headers).get("data") or []
    return data[0].get("id") if data else None


def chat_prompt_tokens(url: str, api: ServerApi, messages: list[dict], model: str | None = None,
                       headers: dict | None = None, timeout_s: float = 60.0) -> tuple[list[int] | None, int | None, str]:
    """How the server renders a chat's messages: (its prompt ids where it can say, its prompt token count,
    how it was asked). A server whose tokenizer endpoint takes messages (vLLM's /tokenize, the same
    renderer as its chat endpoint) gives the ids without running the model; any other gives the count
    in the usage of a one-token, non-streamed /v1/chat/completions (one prefill)."""
    import httpx

    if api.chat_tokenize and api.tokenize_path:
        r = httpx.post(url.rstrip("/") + api.tokenize_path, json={"model": model, "messages": messages,
                       "add_generation_prompt": True}, headers=headers, timeout=timeout_s, trust_env=False)
        r.raise_for_status()
        ids = r.json().get("tokens")
        return ids, len(ids), api.tokenize_path
    body = completion_body(api, messages, 1, 0, False, model, ignore_eos=False)
    r = httpx.post(url.rstrip("/") + "/v1/chat/completions", json=body, headers=headers, timeout=timeout_s,
                   trust_env=False)
    r.raise_for_status()
    return None, (r.json().get("usage") or {}).get("prompt_tokens"), "the usage of a 1-token /v1/chat/completions"


def tokenize_remote(url: str, api: ServerApi, text: str, model: str | None = None,
                    headers: dict | None = None, timeout_s: float = 30.0) -> list[int] | None:
    """The server's own tokenization of a text prompt, where it has a tokenizer endpoint."""
    import httpx

    if not api.tokenize_path:
        return None
    body = {"input": text} if api.tokenize_path == "/extras/tokenize" else {"prompt": text, "model": model}
    try:
        r = httpx.post(url.rstrip("/") + api.tokenize_path, json=body, headers=headers, timeout=timeout_s,
                       trust_env=False)
    except httpx.HTTPError:
        return None
    return r.json().get("tokens") if r.status_code == 200 else None
