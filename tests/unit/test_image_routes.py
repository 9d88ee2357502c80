"""Which image a task gets, decided without building anything: spec identity, the prebuilt
images a row names, the pull that fails fast, and the reason a task gets when it has none."""

import subprocess

import pytest

from environments import images
from environments.env_spec import EnvSpec
from environments.records import TaskInstance
from environments.swebench_specs import prebuilt_images

pytestmark = pytest.mark.unit


def _task(**kw) -> TaskInstance:
    d = {"instance_id": "django__django-11099", "repo": "django/django", "base_commit": "a" * 40,
         "problem_statement": "x", "patch": "", "version": "3.0"}
    return TaskInstance.from_dict({**d, **kw})


def test_a_git_env_is_the_same_image_from_any_mirror_or_github():
    a = EnvSpec("o__r", "c" * 40, source="mirror:/tmp/one", repo="o/r", install="pip install -e .")
    b = EnvSpec("o__r", "c" * 40, source="mirror:/tmp/two", repo="o/r", install="pip install -e .")
    c = EnvSpec("o__r", "c" * 40, source="https://github.com/o/r.git", repo="o/r", install="pip install -e .")
    assert images._spec_id(a) == images._spec_id(b) == images._spec_id(c)
    assert images._spec_id(a) != images._spec_id(EnvSpec("o__r", "d" * 40, source="mirror:/tmp/one", repo="o/r"))


def test_prebuilt_images_a_row_names():
    assert prebuilt_images(_task(), "swe-bench-verified") == ["swebench/sweb.eval.x86_64.django_1776_django-11099:latest"]
    rebench = _task(instance_id="o__r-1", docker_image="swerebench/sweb.eval.x86_64.o_1776_r-1")
    assert prebuilt_images(rebench, "swe-rebench") == ["swerebench/sweb.eval.x86_64.o_1776_r-1"]
    assert prebuilt_images(_task(instance_id="o__r-1"), "swe-gym") == []


def test_an_unreachable_registry_is_tried_once_then_every_image_builds_offline(monkeypatch):
    calls = []

    def fake_run(cmd, **kw):
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 1, "", 'Error response from daemon: Get "https://r/v2/": dial tcp: lookup r: no such host\n')

    monkeypatch.setattr(images, "image_id", lambda ref: None)
    monkeypatch.setattr(images.subprocess, "run", fake_run)
    log: list[str] = []
    puller = images.Puller()
    assert puller.get("a/b:1", log.append) is None and puller.get("a/c:1", log.append) is None
    assert len(calls) == 1 and len(log) == 1 and "registry not reachable" in log[0] and "offline" in log[0]


def test_a_task_without_any_recipe_gets_a_reason_not_an_exception(monkeypatch):
    monkeypatch.setattr(images, "image_id", lambda ref: None)
    plain = _task(instance_id="nobody__nothing-1", repo="nobody/nothing")
    broken = _task(instance_id="o__r-2", repo="o/r", meta={"env_spec": {"name": "o", "version": "1", "pip": "x"}})
    got = images.build_images([plain, broken], progress=lambda line: None, pull=False)
    assert got.images == {}
    assert got.errors["nobody__nothing-1"].startswith("no image: no meta.env_spec, and swebench has no spec for nobody/nothing")
    assert got.errors["o__r-2"] == "no image: meta.env_spec.pip: expected a list of requirement strings"
    assert plain.no_image_reason.startswith("no image (task.image is empty")  # until the caller records it
