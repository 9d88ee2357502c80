"""The synthesis trace plugin in a real pytest run (a subprocess on the host, no container):
which tests depend on the scheduler, and the baseline that leaves them out."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import environments.curation as curation
from environments.curation.runner import Baseline, Trace

pytestmark = pytest.mark.unit

TESTS = '''
import socket, subprocess, sys, threading, time

from lib import double

def test_plain():
    assert double(2) == 4

def test_socket():
    a, b = socket.socketpair()
    a.close(); b.close()

def test_thread():
    t = threading.Thread(target=double, args=(1,))
    t.start(); t.join()

def test_sleep():
    time.sleep(0.001)

def test_subprocess():
    subprocess.run([sys.executable, "-c", "pass"], check=True)
'''


def test_trace_marks_tests_that_use_sockets_threads_subprocesses_or_sleep(tmp_path):
    project, plugdir = tmp_path / "project", tmp_path / "plugin"
    project.mkdir()
    plugdir.mkdir()
    (project / "lib.py").write_text("def double(x):\n    return 2 * x\n")
    (project / "test_timing.py").write_text(TESTS)
    shutil.copy(Path(curation.__file__).parent / "trace_plugin.py", plugdir / "swerl_trace.py")  # as the runner does
    out = tmp_path / "calls.json"
    env = {**os.environ, "PYTHONPATH": str(plugdir), "SWERL_TRACE_ROOT": str(project), "SWERL_TRACE_OUT": str(out)}
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "swerl_trace", "-p", "no:cacheprovider",
                          "test_timing.py"], cwd=project, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    raw = json.loads(out.read_text())
    timing = raw["timing"]
    assert "test_timing.py::test_plain" not in timing
    assert timing["test_timing.py::test_socket"] == ["socket"]
    assert timing["test_timing.py::test_thread"] == ["thread"]
    assert timing["test_timing.py::test_sleep"] == ["sleep"]
    assert "subprocess" in timing["test_timing.py::test_subprocess"]
    # the call trace itself still works: both tests that call the library are seen calling it
    assert ["lib.py", 1] in raw["calls"]["test_timing.py::test_plain"]
    assert ["lib.py", 1] in raw["calls"]["test_timing.py::test_thread"]


def test_baseline_without_timing_keeps_only_tests_whose_verdict_is_the_codes():
    base = Baseline(["t.py::a", "t.py::b", "t.py::c"], ["t.py::flaky"], ["t.py::net"], [1.0, 2.0])
    trace = Trace({}, {}, 1.0, {"t.py::b": ["socket", "thread"], "t.py::c": [], "t.py::net": ["socket"]})
    kept = base.without_timing(trace)
    assert kept.tests == ["t.py::a", "t.py::c"] and kept.timing == ["t.py::b"]
    assert (kept.flaky, kept.failing, kept.duration_s) == (["t.py::flaky"], ["t.py::net"], 2.0)
