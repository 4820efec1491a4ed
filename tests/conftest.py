import pytest

from fa4_inductor.kernels import switches


@pytest.fixture(autouse=True)
def fresh_switches():
    """The kernels read the environment once (`switches.current()`): each test reads it afresh, after
    its fixtures set variables, and leaves no state behind. A test that sets one mid-way calls
    `switches.reset()` after it."""
    switches.reset()
    yield
    switches.reset()
