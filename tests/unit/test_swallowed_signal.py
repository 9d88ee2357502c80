"""A signal whose handler raises while a finalizer runs is dropped by Python ("Exception ignored
in ..."); the sandbox exit handlers deliver it again, so `kill PID` still stops the process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]

# the signal lands inside a weakref callback: the loop there is where its handler runs
CHILD = """
import os, signal, sys, time, weakref
signal.signal(signal.SIGINT, signal.default_int_handler)  # a background shell may pass SIG_IGN
{install}
class Box: pass
box = Box()
def finalizer(_):
    os.kill(os.getpid(), signal.{sig})
    for _ in range(100_000): pass
ref = weakref.ref(box, finalizer)
del box
time.sleep(3)
print("ran on after the signal", flush=True)
"""
INSTALL = ("from environments.sandbox.lifecycle import install_exit_handlers\n"
           "install_exit_handlers()\n")


def run_child(install: str, sig: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", CHILD.format(install=install, sig=sig)], cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                          timeout=60)


def test_without_the_hook_python_drops_the_signal():
    """The hazard itself, so the next test shows the hook, not a quiet Python."""
    done = run_child("signal.signal(signal.SIGTERM, lambda s, f: sys.exit(128 + s))", "SIGTERM")
    assert "Exception ignored" in done.stderr and "ran on after the signal" in done.stdout
    assert done.returncode == 0


# an uncaught KeyboardInterrupt ends Python by SIGINT itself, hence -2
@pytest.mark.parametrize("sig,rc", [("SIGTERM", 128 + signal.SIGTERM), ("SIGINT", -signal.SIGINT)])
def test_a_signal_swallowed_in_a_finalizer_is_delivered_again(sig, rc):
    done = run_child(INSTALL, sig)
    assert "ran on after the signal" not in done.stdout, done.stderr[-2000:]
    assert "sending it again" in done.stderr
    assert done.returncode == rc, (done.returncode, done.stderr[-2000:])
    if sig == "SIGINT":
        assert "KeyboardInterrupt" in done.stderr


def test_an_exception_with_a_signal_attribute_counts_as_that_signal():
    from environments.sandbox.lifecycle import _signal_of

    class TerminationSignal(BaseException):  # Prefect's bridge raises one shaped like this
        def __init__(self, signal: int):
            self.signal = signal

    assert _signal_of(TerminationSignal(signal.SIGTERM)) == signal.SIGTERM
    assert _signal_of(SystemExit(0)) is None and _signal_of(ValueError("x")) is None


def test_a_signal_dropped_in_an_exit_callback_does_not_cut_cleanup_short():
    """Exit callbacks report through the same hook: the process is leaving anyway, and a signal
    sent again would land in our own cleanup (close_all and its hooks)."""
    child = INSTALL + """
import atexit, os, signal, time
from environments.sandbox.lifecycle import on_exit
def slow_cleanup():
    time.sleep(0.6)
    print("cleanup done", flush=True)
on_exit(slow_cleanup)
def other_library():  # registered last, so it runs first
    os.kill(os.getpid(), signal.SIGTERM)
    for _ in range(100_000): pass
atexit.register(other_library)
"""
    done = subprocess.run([sys.executable, "-c", child], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=60)
    assert "cleanup done" in done.stdout, done.stderr[-2000:]
    assert "sending it again" not in done.stderr
