"""A registered policy as a real MLflow model: the transformers flavor, logged from the HF
checkpoint directory, so `mlflow.transformers.load_model("models:/swerl-agent@champion")` and
`mlflow models serve` work with no swerl code in between.

Only registered versions are logged (one or two per run), not every checkpoint; the weights are
read from the local copy the evaluation already holds, never downloaded again. MLflow keeps its
own copy in the artifact store (the same object store, under `mlflow/`): the price of a model
MLflow tools load alone (docs/MLFLOW.md: the sizes, and what would avoid it).
"""

from __future__ import annotations

import importlib.metadata
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import mlflow

TASK = "text-generation"


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
