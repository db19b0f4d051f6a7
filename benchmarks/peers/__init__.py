"""Other serving engines run beside Quire in the benchmarks, each from its own venv."""
