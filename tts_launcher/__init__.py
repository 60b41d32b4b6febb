"""The launcher: one package that starts and keeps tritonserver, the front door and the gateway.

``python -m tts_launcher`` (``make serve``, and the container's entrypoint) is its command
line. ``environment``: the wheel's tritonserver and what it needs; ``admin_key``: the admin key;
``commands``: command lines and ports; ``children``: the children, restarts and drain
(``restarts``: the backoff policy and a kept child);
``stub_healing``: self-healing of dead or hung stubs; ``healthcheck``: the container's and
the Deployment's readiness probe (``python -m tts_launcher.healthcheck``). Tests and
benchmarks start the same pieces from Python with ``tests/support/processes.py``.
"""
