#!/usr/bin/python3
"""Executes the notebooks of notebooks/ top to bottom; any error (a failed assert included) fails.

    /usr/bin/python3 scripts/run_notebooks.py [--build DIR] [--write] [NOTEBOOK ...]

Each notebook runs in a fresh kernel (Debian's python3 kernel), in notebooks/, with relgrad
imported from DIR/python (default: build/python, where the build puts the module). --write saves
the outputs into the notebooks, as they are committed; without it nothing is written. Prints
each notebook's time; the notebooks are written to take under a minute each here.
"""
import argparse
import os
import pathlib
import sys
import time

import nbclient
import nbformat

ROOT = pathlib.Path(__file__).resolve().parent.parent


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--build", default=str(ROOT / "build"), help="the build directory (default: build)")
    parser.add_argument("--write", action="store_true", help="save the outputs into the notebooks")
    parser.add_argument("--timeout", type=int, default=600, help="seconds any one cell may take")
    parser.add_argument("notebooks", nargs="*", help="default: every notebooks/*.ipynb")
    args = parser.parse_args()

    module_dir = pathlib.Path(args.build).resolve() / "python"
    if not (module_dir / "relgrad").is_dir():
        print(f"run_notebooks: no Python module in {module_dir}; build with RELGRAD_PYTHON on", file=sys.stderr)
        return 2
    os.environ["RELGRAD_PYTHONPATH"] = str(module_dir)  # read by each notebook's first cell
    os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")  # the kernel's debugger: no frozen-modules notice
    notebooks = [pathlib.Path(n) for n in args.notebooks] or sorted((ROOT / "notebooks").glob("*.ipynb"))
    if not notebooks:
        print("run_notebooks: no notebooks found", file=sys.stderr)
        return 2

    failed, total = [], time.time()
    for path in notebooks:
        notebook = nbformat.read(path, as_version=4)
        start = time.time()
        client = nbclient.NotebookClient(notebook, timeout=args.timeout, kernel_name="python3",
                                         resources={"metadata": {"path": str(path.resolve().parent)}})
        try:
            client.execute()
            status = "ok"
        except nbclient.exceptions.CellExecutionError as error:
            status = "FAILED"
            failed.append(path.name)
            print(str(error).strip(), file=sys.stderr)
        print(f"{path.name}: {status} in {time.time() - start:.1f} s", flush=True)
        if args.write and status == "ok":
            nbformat.write(notebook, path)
    print(f"{len(notebooks) - len(failed)} of {len(notebooks)} notebooks ran in {time.time() - total:.1f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
