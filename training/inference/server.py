"""A small OpenAI-compatible completions server around the hf backend.

It lets the CPU stack run rollouts against a separate inference process exactly as a GPU stack
runs them against ``vllm serve``: the same client, the same wire format (token-id prompts,
``logprobs``, ``return_tokens_as_token_ids``). Requests that arrive within a few milliseconds of
each other are decoded as one batch, which is most of the speed on CPU.

Every request field is either honoured or refused with a 400: a silently dropped ``top_k`` or
``n`` would change the sampling distribution without anyone noticing.

    python -m training.inference.server --model PATH --port N --host 127.0.0.1
"""

from __future__ import annotations

import argparse
import json
import queue
import threading
import time
import uuid
from concurrent.futures import Future
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from training.inference.base import Completion, SamplingParams

# request field -> the only value(s) we accept, for OpenAI fields we do not implement
MUST_BE = {"n": (1,), "best_of": (None, 1), "stream": (False,), "echo": (False,),
           "presence_penalty": (0, 0.0), "frequency_penalty": (0, 0.0), "stop": (None, [], ""),
           "logit_bias": (None, {}), "suffix": (None, ""), "logprobs": (None, 0)}
HONOURED = {"model", "prompt", "max_tokens", "temperature", "top_p", "top_k", "min_p",
            "repetition_penalty", "seed", "stop_token_ids", "return_tokens_as_token_ids",
            "return_token_ids", "skip_special_tokens", "user"}


class RequestError(ValueError):
    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


@dataclass
class Request:
    prompts: list[list[int]]
    sampling: SamplingParams
    want_logprobs: bool
    ids_as_tokens: bool
    return_token_ids: bool
    skip_special_tokens: bool


def _is_ids(x: Any) -> bool:
    return isinstance(x, list) and bool(x) and all(isinstance(t, int) and not isinstance(t, bool) for t in x)


def parse_request(body: dict[str, Any], served_name: str, vocab_size: int) -> Request:
    unknown = sorted(set(body) - HONOURED - set(MUST_BE))
    if unknown:
        raise RequestError(f"unsupported request fields: {', '.join(unknown)}")
    for key, allowed in MUST_BE.items():
        if key in body and body[key] not in allowed:
            raise RequestError(f"{key}={body[key]!r} is not supported here (allowed: {list(allowed)})")
    if body.get("model") not in (None, served_name):
        raise RequestError(f"model {body['model']!r} is not served here (serving {served_name!r})", 404)
    prompt = body.get("prompt")
    if _is_ids(prompt):
        prompts = [prompt]
    elif isinstance(prompt, list) and prompt and all(_is_ids(p) for p in prompt):
        prompts = prompt
    else:
        raise RequestError("prompt must be a non-empty list of token ids, or a list of such lists")
    if any(not 0 <= t < vocab_size for p in prompts for t in p):
        raise RequestError(f"prompt holds token ids outside [0, {vocab_size})")
    try:
        sp = SamplingParams(
            temperature=float(body.get("temperature", 1.0)),
            top_p=float(body.get("top_p", 1.0)),
            top_k=int(body.get("top_k", -1)),
            min_p=float(body.get("min_p", 0.0)),
            repetition_penalty=float(body.get("repetition_penalty", 1.0)),
            max_new_tokens=int(body.get("max_tokens", 16)),
            stop_token_ids=tuple(body.get("stop_token_ids") or ()),
            seed=body.get("seed"),
        )
    except (TypeError, ValueError) as err:
        raise RequestError(str(err)) from None
    return Request(prompts, sp, body.get("logprobs") is not None,
                   bool(body.get("return_tokens_as_token_ids", False)),
                   bool(body.get("return_token_ids", False)),
                   bool(body.get("skip_special_tokens", True)))


def render_choice(index: int, c: Completion, req: Request, tokenizer: Any) -> dict[str, Any]:
    choice: dict[str, Any] = {
        "index": index,
        "text": tokenizer.decode(c.token_ids, skip_special_tokens=req.skip_special_tokens),
        "finish_reason": c.finish_reason,
        "logprobs": None,
    }
    if req.want_logprobs:
        if req.ids_as_tokens:
            tokens = [f"token_id:{t}" for t in c.token_ids]
        else:
            tokens = [tokenizer.decode([t]) for t in c.token_ids]
        offsets, pos = [], 0
        for t in c.token_ids:
            offsets.append(pos)
            pos += len(tokenizer.decode([t]))
        choice["logprobs"] = {"tokens": tokens, "token_logprobs": list(c.logprobs),
                              "top_logprobs": None, "text_offset": offsets}
    if req.return_token_ids:
        choice["token_ids"] = list(c.token_ids)
    return choice


@dataclass
class _Pending:
    prompts: list[list[int]]
    sampling: SamplingParams
    future: Future = field(default_factory=Future)


class Batcher:
    """Groups requests arriving within ``window_s`` into one ``generate`` call.

    Only requests with identical sampling settings share a batch. Seeds are per prompt
    (``seed + j`` for a request's j-th prompt) and the hf backend draws each seeded row from its
    own generator, so a seeded request gets the same tokens whatever else is in its batch.
    """

    def __init__(self, backend: Any, window_s: float = 0.005, max_batch: int = 32):
        self.backend, self.window_s, self.max_batch = backend, window_s, max_batch
        self.stats = {"requests": 0, "batches": 0}  # seen by /health; shows batching works
        self._q: queue.Queue[_Pending | None] = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name="swerl-batcher", daemon=True)
        self._thread.start()

    def submit(self, prompts: list[list[int]], sampling: SamplingParams) -> list[Completion]:
        item = _Pending(prompts, sampling)
        self._q.put(item)
        return item.future.result()

    def close(self) -> None:
        self._q.put(None)
        self._thread.join(timeout=30)

    def _collect(self, first: _Pending) -> tuple[list[_Pending], bool]:
        items, n = [first], len(first.prompts)
        deadline = time.monotonic() + self.window_s
        while n < self.max_batch:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                item = self._q.get(timeout=left)
            except queue.Empty:
                break
            if item is None:
                return items, True
            items.append(item)
            n += len(item.prompts)
        return items, False

    def _loop(self) -> None:
        stop = False
        while not stop:
            first = self._q.get()
            if first is None:
                return
            items, stop = self._collect(first)
            groups: dict[SamplingParams, list[_Pending]] = {}
            for it in items:
                groups.setdefault(it.sampling.with_(seed=None), []).append(it)
            for group in groups.values():
                self._run(group)

    def _run(self, group: list[_Pending]) -> None:
        prompts = [p for it in group for p in it.prompts]
        self.stats["requests"] += len(group)
        self.stats["batches"] += 1
        seeds = [None if it.sampling.seed is None else it.sampling.seed + j
                 for it in group for j in range(len(it.prompts))]
        try:
            comps = self.backend.generate_rows(prompts, group[0].sampling.with_(seed=None), seeds)
        except Exception as err:  # handed to every waiting request, which answers 500
            for it in group:
                it.future.set_exception(err)
            return
        start = 0
        for it in group:
            it.future.set_result(comps[start:start + len(it.prompts)])
            start += len(it.prompts)


@dataclass
class ServerState:
    backend: Any
    batcher: Batcher
    served_name: str
    vocab_size: int


class Handler(BaseHTTPRequestHandler):
    """The routes; `state` is bound per server by `make_handler`."""

    protocol_version = "HTTP/1.1"
    state: ServerState

    def log_message(self, fmt: str, *args: Any) -> None:  # keep test output quiet
        pass

    def _send(self, status: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, status: int, message: str) -> None:
        kind = "invalid_request_error" if status < 500 else "server_error"
        self._send(status, {"error": {"message": message, "type": kind, "code": status}})

    def _body(self) -> dict[str, Any]:
        n = int(self.headers.get("Content-Length") or 0)
        try:
            body = json.loads(self.rfile.read(n) or b"{}")
        except json.JSONDecodeError as err:
            raise RequestError(f"body is not JSON: {err}") from None
        if not isinstance(body, dict):
            raise RequestError("body must be a JSON object")
        return body

    def do_GET(self) -> None:
        if self.path == "/health":
            self._send(200, {"status": "ok", **self.state.batcher.stats})
        elif self.path == "/v1/models":
            self._send(200, {"object": "list", "data": [{
                "id": self.state.served_name, "object": "model", "owned_by": "swerl",
                "policy_version": self.state.backend.policy_version}]})
        else:
            self._error(404, f"no route {self.path}")

    def do_POST(self) -> None:
        try:
            if self.path == "/v1/completions":
                self._send(200, self._complete(self._body()))
            elif self.path == "/swerl/load_weights":
                body = self._body()
                if not isinstance(body.get("path"), str):
                    raise RequestError("load_weights needs {\"path\": checkpoint_dir}")
                self.state.backend.load_weights(body["path"])
                self._send(200, {"policy_version": self.state.backend.policy_version})
            else:
                self._error(404, f"no route {self.path}")
        except RequestError as err:
            self._error(err.status, str(err))
        except Exception as err:  # noqa: BLE001 - reported to the client, not swallowed
            self._error(500, f"{err.__class__.__name__}: {err}")

    def _complete(self, body: dict[str, Any]) -> dict[str, Any]:
        req = parse_request(body, self.state.served_name, self.state.vocab_size)
        comps = self.state.batcher.submit(req.prompts, req.sampling)
        tok = self.state.backend.tokenizer
        choices = [render_choice(i, c, req, tok) for i, c in enumerate(comps)]
        n_prompt = sum(len(p) for p in req.prompts)
        n_out = sum(len(c.token_ids) for c in comps)
        return {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion",
                "created": int(time.time()), "model": self.state.served_name, "choices": choices,
                "usage": {"prompt_tokens": n_prompt, "completion_tokens": n_out,
                          "total_tokens": n_prompt + n_out}}



def make_handler(state: ServerState) -> type[BaseHTTPRequestHandler]:
    return type("BoundHandler", (Handler,), {"state": state})


def serve(backend: Any, host: str = "127.0.0.1", port: int = 8000, served_name: str = "swerl",
          window_s: float = 0.005, max_batch: int = 32) -> tuple[ThreadingHTTPServer, Batcher]:
    """Bind (port 0 picks a free one) and return the server; the caller runs serve_forever."""
    batcher = Batcher(backend, window_s, max_batch)
    vocab = len(backend.tokenizer)
    state = ServerState(backend, batcher, served_name, vocab)
    httpd = ThreadingHTTPServer((host, port), make_handler(state))
    httpd.daemon_threads = True
    return httpd, batcher


def main(argv: list[str] | None = None) -> None:
    from training.inference.hf import HFBackend

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="default", help="'default', a local HF dir, or a hub id")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    ap.add_argument("--dtype", default="float32", choices=["auto", "float32", "bfloat16", "float16"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None,
                    help="torch threads while decoding (default: half the cores)")
    ap.add_argument("--served-model-name", default=None, help="default: the --model argument")
    ap.add_argument("--batch-window-ms", type=float, default=5.0)
    ap.add_argument("--max-batch", type=int, default=32)
    args = ap.parse_args(argv)

    backend = HFBackend(args.model, dtype=args.dtype, seed=args.seed,
                        max_batch_size=args.max_batch, threads=args.threads)
    httpd, batcher = serve(backend, args.host, args.port, args.served_model_name or args.model,
                           args.batch_window_ms / 1000, args.max_batch)
    host, port = httpd.server_address[:2]
    print(f"swerl inference server listening on http://{host}:{port}", flush=True)
    try:
        httpd.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        httpd.server_close()
        batcher.close()
        backend.close()


if __name__ == "__main__":
    main()
