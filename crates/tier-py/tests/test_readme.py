"""The README's Python example, run as it is written there."""

import pathlib
import re

README = pathlib.Path(__file__).resolve().parents[3] / "README.md"


def test_the_readme_python_example_runs() -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert blocks, "the README has no Python example"
    for block in blocks:
        exec(compile(block, str(README), "exec"), {})
