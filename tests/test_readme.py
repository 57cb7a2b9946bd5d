"""The README's Python examples run (those that need no trained run directory)."""

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_python_blocks_run():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    runnable = [b for b in blocks if "runs/" not in b]
    assert runnable
    for block in runnable:
        exec(compile(block, str(README), "exec"), {})
