"""A guide's examples run as written: its one ``bash`` block (curl against the gateway) and
its one ``python`` block (the client against Triton), ports substituted."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.support.paths import ROOT


def run_guide(name: str, server, gateway, folder: Path) -> str:
    """Run docs/``name``'s curl in ``folder`` and its Python; the Python's output."""
    guide = (ROOT / "docs" / name).read_text()
    (curl,) = re.findall(r"```bash\n(.*?)```", guide, re.S)
    (code,) = re.findall(r"```python\n(.*?)```", guide, re.S)
    curl = curl.replace("localhost:8080", gateway.url.split("//", 1)[1])
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", curl], cwd=folder, timeout=120)
    assert done.returncode == 0, f"{name}: its curl failed"
    code = code.replace("localhost:8001", f"localhost:{server.grpc_port}")
    ran = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr[-2000:]
    return ran.stdout
