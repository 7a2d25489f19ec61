"""unit tests: see tests/conftest.py for what each layer holds."""
