"""A pytest plugin copied into the synthesis container (loaded with `-p swerl_trace`).

Two jobs, each switched on by its environment variable:
- `SWERL_TRACE_OUT`: per test node id, its duration and the (file, first line) of every code
  object under the project root that was *called* (a profile hook: far cheaper than line
  tracing). Calls outside any test (imports, collection) are recorded under "<import>" /
  "<between>": synthesis leaves those functions alone. Tests that open a socket, start a thread
  or a subprocess, or sleep are listed under "timing": they depend on the scheduler.
- `SWERL_PARAMS_OUT`: for each failing parametrised test, `repr()` of its parameters, so a
  problem statement can turn `assert f(x) == y` into a runnable reproduction.
Standard library and pytest only: it runs inside the project's own Python.
"""

import json
import os
import sys
import threading
import time

import pytest

_ROOT = os.environ.get("SWERL_TRACE_ROOT", "/testbed").rstrip("/") + "/"
_TRACE_OUT = os.environ.get("SWERL_TRACE_OUT")
_PARAMS_OUT = os.environ.get("SWERL_PARAMS_OUT")
_calls = {}
_durations = {}  # node id -> seconds in setup + call + teardown
_params = {}
_current = ["<import>"]
_timing = {}  # node id -> {"socket", "thread", "subprocess", "sleep"}
_keys = {}  # code object -> (relative path, first line), a timing kind (str), or None
_STDLIB = os.path.dirname(os.__file__) + "/"
# standard-library entry points (file, function) whose use makes a test timing-dependent
_TIMING = {("socket.py", "__init__"): "socket", ("socket.py", "socketpair"): "socket",
           ("socket.py", "create_connection"): "socket", ("threading.py", "start"): "thread",
           ("subprocess.py", "__init__"): "subprocess"}


def _classify(code):
    name = code.co_filename
    if name.startswith(_ROOT):
        return (name[len(_ROOT):], code.co_firstlineno)
    if name.startswith(_STDLIB):
        return _TIMING.get((name[len(_STDLIB):], code.co_name))
    return None


def _profile(frame, event, arg):
    if event == "c_call":
        if arg is time.sleep:
            _timing.setdefault(_current[0], set()).add("sleep")
        return
    if event != "call":
        return
    code = frame.f_code
    key = _keys.get(code, 0)
    if key == 0:
        key = _keys[code] = _classify(code)
    if key is None:
        return
    if isinstance(key, str):
        _timing.setdefault(_current[0], set()).add(key)
        return
    bucket = _calls.get(_current[0])
    if bucket is None:
        bucket = _calls[_current[0]] = set()
    bucket.add(key)


if _TRACE_OUT:
    sys.setprofile(_profile)
    threading.setprofile(_profile)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _current[0] = item.nodeid
    yield
    _current[0] = "<between>"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    _durations[item.nodeid] = _durations.get(item.nodeid, 0.0) + report.duration
    if _PARAMS_OUT and report.failed and hasattr(item, "callspec"):
        try:
            _params[item.nodeid] = {k: repr(v)[:300] for k, v in item.callspec.params.items()}
        except Exception:  # a repr that raises must not break the run
            pass


def pytest_unconfigure(config):
    if _TRACE_OUT:
        sys.setprofile(None)
        threading.setprofile(None)
        with open(_TRACE_OUT, "w") as fh:
            json.dump({"calls": {test: sorted(keys) for test, keys in _calls.items()},
                       "durations": _durations,
                       "timing": {test: sorted(kinds) for test, kinds in _timing.items()}}, fh)
    if _PARAMS_OUT:
        with open(_PARAMS_OUT, "w") as fh:
            json.dump(_params, fh)
