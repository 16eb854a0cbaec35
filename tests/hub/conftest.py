"""Fixtures of the hub tests: one REAL JupyterHub per session (tests/hubutil.py builds it).

The `hub` and `clean_hub` fixtures themselves are in tests/conftest.py, shared with
tests/ui/ (JupyterLab's sidebar behind the same Hub).
"""
