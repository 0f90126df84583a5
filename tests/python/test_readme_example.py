"""Runs the README's Python example (a paged KV cache in torch tensors, one extend and one decode
step compared with SDPA) exactly as printed, so the documented example cannot rot. Needs torch;
on a machine without a GPU it runs the CPU path of the example (torch_native)."""

import pathlib
import re

import pytest

torch = pytest.importorskip("torch")

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"


def readme_python_example():
    text = README.read_text()
    section = text[text.index("## Python"):]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert blocks, "README.md: no python block under '## Python'"
    return blocks[0]


def test_readme_example_runs_and_matches_sdpa(capsys):
    code = readme_python_example()
    assert "ak.MHAKVPool.wrap" in code and '"decode"' in code and "scaled_dot_product_attention" in code
    exec(compile(code, str(README), "exec"), {"__name__": "readme_example"})
    out = capsys.readouterr().out
    assert "extend: max |out - sdpa|" in out and "decode: max |out - sdpa|" in out
