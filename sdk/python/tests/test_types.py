"""The SDK and the Python examples type-check under mypy --strict
(configured in pyproject.toml): the SDK's annotations are part of its API."""

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
REPO = HERE.parent.parent


def test_mypy_strict() -> None:
    files = [str(REPO / "examples" / "python" / "counter" / "counter.py"),
             str(REPO / "examples" / "python" / "chat" / "chat.py"),
             str(REPO / "e2e" / "testdata" / "pyhost" / "pyhost.py")]
    r = subprocess.run([sys.executable, "-m", "mypy", "--no-incremental", "--cache-dir", "/dev/null",
                        str(HERE / "src" / "pinnedd_sdk"), *files], cwd=HERE, capture_output=True, text=True)
    assert r.returncode == 0, f"mypy (Debian: python3-mypy):\n{r.stdout}{r.stderr}"
