"""The contract tests run once per backend through the `store` fixture of tests/conftest.py."""
