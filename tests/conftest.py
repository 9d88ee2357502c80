"""Test-wide settings: nothing leaves the machine, and every test runs with the embedded defaults."""

from flows.cli import set_process_defaults

set_process_defaults()
