"""Test-wide settings: nothing leaves the machine, and every test runs with the embedded defaults."""

import os

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
# as the CLI does (flows/cli.py): an in-process ephemeral API's first start migrates a new
# database, and on a 2-core AVX2 machine it ran past Prefect's 20 s default once
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
