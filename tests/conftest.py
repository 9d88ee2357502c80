"""Test-wide settings: nothing leaves the machine, and every test runs with the embedded defaults."""

from flows.cli import set_process_defaults

set_process_defaults()


def pytest_unconfigure(config) -> None:
    """Prefect stops its ephemeral servers at interpreter exit and logs that to the stream its
    console handler captured, which pytest has closed by then: Python's logging would print a
    `--- Logging error ---` traceback for a line nobody can read. Only that is silenced."""
    import logging

    logging.raiseExceptions = False
