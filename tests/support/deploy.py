"""The tools that check the deployment files, from their own venv (`make deploy-venv`)."""

from __future__ import annotations

import pytest

from tests.support.paths import ROOT

DEPLOY_TOOLS = ROOT / ".venv-deploy" / "bin"


def deploy_tool(name: str) -> str:
    path = DEPLOY_TOOLS / name
    if not path.exists():  # `make test` builds it (Makefile deploy-venv)
        pytest.fail(f"needs {path}: run make deploy-venv")
    return str(path)
