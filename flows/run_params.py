"""The pipeline flow's parameters as one typed model, so Prefect renders a form for it (the preset
as a choice, the common knobs as typed fields) and refuses a wrong-typed value before a run starts.

Each field left empty keeps the preset's value; a set field becomes one `--set` override, in
front of the free-form `overrides` (which still win: anything the form lacks stays reachable).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from swerl.config import CONFIG_DIR, DEFAULT_PRESET, load_config

PRESETS = tuple(sorted(p.stem for p in CONFIG_DIR.glob("*.yaml")))
PresetName = Literal[PRESETS]  # type: ignore[valid-type]  # the presets in configs/, read at import


class PipelineParams(BaseModel):
    """One pipeline run: a preset of configs/ and what to change in it."""

    model_config = ConfigDict(extra="forbid")

    preset: PresetName = Field(DEFAULT_PRESET, description="the preset in configs/ the run starts from")
    config_file: str | None = Field(None, description="a YAML preset file on the worker, used instead of `preset`")
    seed: int | None = Field(None, ge=0, description="the run's seed (empty: the preset's)")
    rollout_backend: Literal["hf", "openai", "vllm"] | None = Field(
        None, description="inference backend of the policy (empty: the preset's)")
    model: str | None = Field(None, description="base model: 'default', a hub id, a path or a models:/ URI")
    dapo_iterations: int | None = Field(None, ge=1, description="iterations of every DAPO stage")
    eval_runs: int | None = Field(None, ge=1, description="independent evaluation runs (Pass@1 +- SEM)")
    rft: bool | None = Field(None, description="run rejection fine-tuning (empty: the preset's)")
    dapo: bool | None = Field(None, description="run DAPO (empty: the preset's)")
    overrides: list[str] = Field(default_factory=list,
                                 description="more KEY=VALUE config overrides, e.g. dapo.stages.0.eps_high=0.3")
    run_id: str | None = Field(None, description="the run to resume (empty: derived from the resolved config)")

    @property
    def base(self) -> str:
        """What `load_config` starts from: the config file when one is given, else the preset."""
        return self.config_file or self.preset

    def all_overrides(self) -> list[str]:
        """The typed fields as config overrides, then the free-form ones."""
        typed = {"seed": self.seed, "rollout.backend": self.rollout_backend, "rollout.model": self.model,
                 "eval.runs": self.eval_runs, "rft.enabled": self.rft, "dapo.enabled": self.dapo}
        out = [f"{k}={_yaml(v)}" for k, v in typed.items() if v is not None]
        if self.dapo_iterations is not None:
            stages = load_config(self.base, self.overrides).dapo.stages
            out += [f"dapo.stages.{i}.iterations={self.dapo_iterations}" for i in range(len(stages))]
        return out + list(self.overrides)


def _yaml(value: object) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)
