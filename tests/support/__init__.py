"""Helpers and shared fixtures for the tests: imported by test modules, never a test module itself.

Test modules import from here (and from the project), never from `conftest.py` or from
another `tests/test_*.py`; `tests/test_support_layout.py` checks that. `conftest.py` only
makes the fixtures of `tests.support.fixtures` available to pytest.
"""
