"""A registered policy as a real MLflow model: the transformers flavor, so
`mlflow.transformers.load_model("models:/swerl-agent@champion")` and `mlflow models serve` work
with no swerl code in between.

A checkpoint in the store becomes an MLflow model where it lies: its directory gets an `MLmodel`
whose weights path is the directory itself, a copy of the tokenizer (megabytes) and the
environment files, and the registered version's source is that directory. The weights are
never copied (a 7B checkpoint is 14 GB) nor even loaded: the flavor is read off a weightless
(meta-device) model. The version belongs to a LoggedModel of the evaluation's run that holds
its params and tags; its artifacts live outside MLflow (docs/MLFLOW.md: why not inside).
The base model is not in the store, so it is logged the ordinary way, a copy in MLflow.
"""

from __future__ import annotations

import importlib.metadata
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import mlflow
import yaml

TASK = "text-generation"
MLMODEL_FILES = ("MLmodel", "requirements.txt", "python_env.yaml", "conda.yaml")  # + components/tokenizer/


def pip_requirements() -> list[str]:
    """What loading the model needs, pinned to what wrote it (MLflow's own inference would load
    the model in a subprocess to find out: seconds to minutes for nothing)."""
    return [f"{p}=={importlib.metadata.version(p)}" for p in ("mlflow", "transformers", "torch", "safetensors")]


@contextmanager
def fluent_tracking(uri: str, experiment_id: str) -> Iterator[None]:
    """The fluent API's tracking and registry URI and experiment for a block: `log_model` has no
    client argument (and puts the LoggedModel in the fluent experiment, not its run's), and
    registering a `models:/m-...` source looks the LoggedModel up through it too. MLflow mirrors
    the URIs into the environment (for subprocesses): all of it is put back as it was."""
    saved = {k: os.environ.get(k) for k in ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI", "MLFLOW_EXPERIMENT_ID")}
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    os.environ["MLFLOW_EXPERIMENT_ID"] = experiment_id
    try:
        yield
    finally:
        mlflow.set_tracking_uri(None)  # back to resolving from the environment, restored here
        mlflow.set_registry_uri(None)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def log_checkpoint_model(run_id: str, checkpoint_dir: str | Path, name: str, params: dict[str, Any],
                         tags: dict[str, str]) -> Any:
    """Log `checkpoint_dir` (config.json, safetensors, tokenizer) as a LoggedModel of run `run_id`
    (inside `fluent_tracking`); returns MLflow's ModelInfo (`model_uri` models:/m-..., `model_id`)."""
    import mlflow.transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    # MLflow 3.17's memory-saving route (`transformers_model=PATH`) fails on transformers 5.x
    # (flavor_config.py reads `impl.__name__` of a task whose impl is now a string): the model is
    # loaded once and saved by MLflow instead.
    components = {"model": AutoModelForCausalLM.from_pretrained(checkpoint_dir, dtype="auto"),
                  "tokenizer": AutoTokenizer.from_pretrained(checkpoint_dir)}
    return mlflow.transformers.log_model(
        transformers_model=components, task=TASK, name=name, run_id=run_id,
        pip_requirements=pip_requirements(), params={k: str(v) for k, v in params.items()}, tags=tags)


def write_model_files(checkpoint_dir: str | Path, out: Path, source: str) -> list[str]:
    """Write into `out` the files that make `checkpoint_dir` (config.json, safetensors, tokenizer)
    an MLflow transformers model in place; `source` (the checkpoint's store URL) is recorded as
    the model's origin. Returns their paths relative to `out`."""
    import torch
    import transformers
    from mlflow.models import Model
    from mlflow.transformers.flavor_config import FlavorKey, build_flavor_config
    from mlflow.utils.environment import _process_pip_requirements, _PythonEnv

    config = transformers.AutoConfig.from_pretrained(checkpoint_dir)
    with torch.device("meta"):  # the flavor needs the model's class and dtype, not its weights
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=config.dtype)
    tokenizer = transformers.AutoTokenizer.from_pretrained(checkpoint_dir)
    pipe = transformers.pipeline(TASK, model=model, tokenizer=tokenizer, device="meta")
    flavor = build_flavor_config(pipe, None, None, True)
    flavor |= {FlavorKey.MODEL_BINARY: ".", FlavorKey.MODEL_NAME: source}  # the weights: the directory itself
    mlmodel = Model()
    mlmodel.add_flavor("transformers", transformers_version=transformers.__version__, code=None, **flavor)
    mlflow.pyfunc.add_to_model(mlmodel, loader_module="mlflow.transformers", conda_env="conda.yaml",
                               python_env="python_env.yaml")
    out.mkdir(parents=True, exist_ok=True)
    mlmodel.save(str(out / "MLmodel"))
    tokenizer.save_pretrained(out / "components" / "tokenizer")
    conda_env, requirements, _ = _process_pip_requirements([], pip_requirements=pip_requirements())
    (out / "conda.yaml").write_text(yaml.safe_dump(conda_env, default_flow_style=False))
    (out / "requirements.txt").write_text("\n".join(requirements))
    _PythonEnv.current().to_yaml(str(out / "python_env.yaml"))
    return sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())


def external_logged_model(run_id: str, experiment_id: str, name: str, params: dict[str, Any],
                          tags: dict[str, str]) -> Any:
    """A LoggedModel of run `run_id` whose artifacts are outside MLflow (a checkpoint in the store)."""
    return mlflow.create_external_model(name=name, source_run_id=run_id, experiment_id=experiment_id,
                                        params={k: str(v) for k, v in params.items()}, tags=tags)
