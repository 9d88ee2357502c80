"""A run's resolved config, kept beside the run, so a command pointed at a run id rebuilds that
run's config instead of a default preset's.

The pipeline writes `runs/{run_id}/config.yaml` (and the same file as an MLflow artifact of the
run's parent run); `swerl report RUN_ID`, `swerl evaluate --run RUN_ID` and `swerl promote
--run-id RUN_ID` read it back. A `--preset` that names another preset than the run's is refused:
a run is one config, and another preset's eval set, seed and stage count in it would mix two
runs' numbers in one record (`--set` still changes single knobs on top of the run's config).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from swerl.config import (ConfigError, SwerlConfig, config_from_dict, dump_config, flat_params, load_config,
                          parse_override)
from swerl.paths import state_dir
from swerl.store import open_store

CONFIG_FILE = "config.yaml"


def config_key(run_id: str) -> str:
    return f"runs/{run_id}/{CONFIG_FILE}"


def lookup_config(overrides: list[str]) -> SwerlConfig:
    """The config that says where to look for a run: the defaults plus the `storage.*` overrides
    (a run in another store is found by naming that store, whatever its preset)."""
    storage = dict(parse_override(o) for o in overrides if o.strip().startswith("storage."))
    return config_from_dict({"storage": {k.split(".", 1)[1]: v for k, v in storage.items()}}, "--set storage.*")


def read_stored_config(run_id: str, overrides: list[str]) -> str | None:
    """The resolved YAML run `run_id` stored, or None when it has none (or does not exist)."""
    store = open_store(lookup_config(overrides).storage)
    key = config_key(run_id)
    return store.get_text(key) if store.exists(key) else None


def stored_preset(config_yaml: str) -> str:
    return str((yaml.safe_load(config_yaml) or {}).get("preset", "custom"))


def local_config_file(run_id: str, config_yaml: str) -> Path:
    """A local copy of a run's stored config, as a preset file `load_config` reads (overrides
    then apply on top of it exactly as on a preset)."""
    path = state_dir() / "runs" / run_id / CONFIG_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.is_file() or path.read_text() != config_yaml:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(config_yaml)
        tmp.replace(path)
    return path


@dataclass(frozen=True)
class RunChoice:
    """Which config a command pointed at a run uses, and a warning for the user (or "")."""

    preset: str  # a preset name, or the local copy of the run's stored config
    from_run: bool
    warning: str = ""


def choose_preset(run_id: str | None, preset: str | None, overrides: list[str],
                  default: str = "smoke") -> RunChoice:
    """The run's stored config (a `--preset` naming another preset is a ConfigError); `default`
    when there is no run to read."""
    stored = read_stored_config(run_id, overrides) if run_id else None
    if stored is None:
        if preset is None and run_id:
            return _preset_of_run_id(run_id, overrides)
        return RunChoice(preset or default, from_run=False)
    theirs = stored_preset(stored)
    if preset is not None and Path(preset).stem != theirs:
        raise ConfigError(f"run {run_id} was made with preset {theirs!r}, not {preset!r}: drop --preset to use "
                          "the run's own config (--set changes single values), or drop --run for a new run")
    local = local_config_file(run_id, stored)
    warning = _stored_differs(run_id, preset, local, overrides) if preset is not None else ""
    return RunChoice(str(local), from_run=True, warning=warning)


def _stored_differs(run_id: str, preset: str, local: Path, overrides: list[str], shown: int = 6) -> str:
    """A notice when `--preset P --run R` runs R's stored config and it is not P's file: a value
    pinned by an earlier `--set`, or a preset edited since the run, would otherwise act unseen."""
    try:
        ours, theirs = flat_params(load_config(preset, overrides)), flat_params(load_config(str(local), overrides))
    except ConfigError:
        return ""  # the overrides' own error is raised where the config is built
    diff = [k for k in sorted(ours.keys() | theirs.keys()) if ours.get(k) != theirs.get(k)]
    if not diff:
        return ""
    listed = ", ".join(f"{k}: {theirs.get(k, '(unset)')} (preset file: {ours.get(k, '(unset)')})" for k in diff[:shown])
    more = f", and {len(diff) - shown} more" if len(diff) > shown else ""
    return (f"run {run_id} runs its stored config ({config_key(run_id)}), which differs from preset {preset!r} in "
            f"{len(diff)} value(s): {listed}{more}; --set KEY=VALUE changes one")


def _preset_of_run_id(run_id: str, overrides: list[str]) -> RunChoice:
    """A run that stored no config (made before runs did): the preset its default id names."""
    from swerl.config import CONFIG_DIR

    named = [p.stem for p in CONFIG_DIR.glob("*.yaml") if run_id.startswith(p.stem + "-")]
    where = f"{config_key(run_id)} in {lookup_config(overrides).storage.uri}"
    if not named:
        raise ConfigError(f"run {run_id} has no stored config ({where}): pass --preset, and "
                          "--set storage.uri=... if the run is in another store")
    preset = max(named, key=len)
    return RunChoice(preset, from_run=False,
                     warning=f"run {run_id} has no stored config ({where}); using preset {preset!r}, which its id names")


def save_run_config(store, run_id: str, cfg: SwerlConfig, overwrite: bool) -> str | None:
    """Store the run's resolved config; returns the YAML when it was written (None: unchanged,
    or kept because `overwrite` is off)."""
    text = dump_config(cfg)
    key = config_key(run_id)
    if store.exists(key) and (not overwrite or store.get_text(key) == text):
        return None
    store.put_text(key, text)
    return text
