"""relgrad.explore: the explorer's view of trained runs inside a notebook (docs/explorer.md).

The view is the page `relgrad explore RUN_DIR --export FILE --prompt TEXT` writes, with its data
inside, shown in an <iframe> of its own so that its script and style leave the notebook's alone.
"""
import html

from ._relgrad import _explorer_page


class ExplorerView:
    """The explorer's page for some runs and prompts: Jupyter shows it inline; save() writes it."""

    def __init__(self, page, height):
        self.html = page
        self.height = height

    def _repr_html_(self):
        return (f'<iframe srcdoc="{html.escape(self.html, quote=True)}" '
                f'style="width: 100%; height: {self.height}px; border: 1px solid #ddd"></iframe>')

    def save(self, path):
        """Writes the page as one HTML file that opens with no server and no network."""
        with open(path, "w", encoding="utf-8") as f:
            f.write(self.html)


def explore(runs, prompt=None, prompts=(), height=1200):
    """The explorer's view of one run directory (or a list of them) for `prompt` and `prompts`.

    >>> relgrad.explore("runs/quickstart", prompt="4 5 9 6 7 4")   # in a notebook: the view
    """
    run_dirs = [runs] if isinstance(runs, str) else list(runs)
    asked = ([prompt] if prompt is not None else []) + list(prompts)
    if not asked:
        raise ValueError("explore: give a prompt to show (prompt=TEXT or prompts=[...])")
    return ExplorerView(_explorer_page([str(d) for d in run_dirs], asked), height)
