"""orchestration.retry_delay_s is the first retry's delay; later retries back off from it."""

import pytest

from tasks.retry import retry_delays

pytestmark = pytest.mark.unit


def test_retry_delay_is_the_first_of_an_exponential_backoff():
    assert retry_delays(5.0)(3) == [5.0, 10.0, 20.0]
    assert retry_delays(0.0)(2) == [0.0, 0.0]
