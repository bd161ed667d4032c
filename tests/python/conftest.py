"""pytest setup for the Python module's tests: ctest runs them with PYTHONPATH=<build>/python."""
import numpy as np
import pytest


@pytest.fixture
def rng():
    return np.random.default_rng(0)
