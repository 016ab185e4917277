"""The documentation's Python examples run as written: every ```python block of README.md and
docs/python.md, and of docs/dask.md where Dask is installed. A line `# prints: TEXT` in a
block is a line the block must print (after stripping), in that order among its output."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
PAGES = ["README.md", "docs/python.md"]
DASK_PAGE = "docs/dask.md"


def python_blocks(page):
    """The ```python blocks of `page` (a path from the repository root), in order."""
    return re.findall(r"^```python\n(.*?)^```", (ROOT / page).read_text(), re.S | re.M)


def blocks_of(pages):
    return [
        pytest.param(page, k, block, id=f"{page}-{k}")
        for page in pages
        if (ROOT / page).exists()
        for k, block in enumerate(python_blocks(page))
    ]


def run_block(page, k, block, capsys, name):
    """Runs `block` and checks its `# prints:` lines against what it printed."""
    capsys.readouterr()
    exec(compile(block, f"{page} (python block {k})", "exec"), {"__name__": name})
    printed = [line.strip() for line in capsys.readouterr().out.splitlines()]
    shown = [line.strip()[len("# prints:"):].strip() for line in block.splitlines()
             if line.strip().startswith("# prints:")]
    rest = iter(printed)
    for want in shown:
        assert any(line == want for line in rest), (
            f"{page}, python block {k}: printed {printed}; the page shows {shown}")


def test_pages_have_their_examples():
    if not (ROOT / "README.md").exists():
        pytest.skip("not run from a source checkout")
    counts = {page: len(python_blocks(page)) for page in PAGES + [DASK_PAGE]}
    assert counts["README.md"] >= 1 and counts["docs/python.md"] >= 2 and counts[DASK_PAGE] >= 1, counts
    for page in PAGES + [DASK_PAGE]:
        assert "# prints:" in "".join(python_blocks(page)), f"{page}: no example shows its output"


@pytest.mark.parametrize("page, k, block", blocks_of(PAGES))
def test_python_example_runs(page, k, block, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run_block(page, k, block, capsys, "__doc__")


@pytest.mark.filterwarnings("ignore:Port 8787 is already in use")
@pytest.mark.parametrize("page, k, block", blocks_of([DASK_PAGE]))
def test_dask_example_runs(page, k, block, capsys, tmp_path, monkeypatch):
    for module in ["dask", "dask.dataframe", "distributed", "pandas", "pyarrow"]:
        pytest.importorskip(module)
    monkeypatch.chdir(tmp_path)
    # The example starts its cluster under `if __name__ == "__main__":`.
    run_block(page, k, block, capsys, "__main__")
