"""Triton glue. ``adapter`` imports ``triton_python_backend_utils`` and is imported only
inside a Python-backend stub (or under the tests' fake); ``model_config`` reads config.pbtxt
files and is usable anywhere."""
