#!/usr/bin/python3
"""The figures of docs/figures/ are what scripts/make_figures.py draws from the code today.

The script is run into a temporary folder with this build's relgrad module, and every SVG it
writes must be, byte for byte, the one committed in docs/figures/. Fails, naming the figure and
the command that regenerates it, when a committed figure differs, when one the script draws is
not committed, or when a committed one is no longer drawn. ctest runs it as docs.figures:

    /usr/bin/python3 tests/docs/test_figures.py --build build
"""
import argparse
import difflib
import os
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "scripts", "make_figures.py")
FIGURES = os.path.join(REPO, "docs", "figures")


def svg_files(folder):
    return sorted(name for name in os.listdir(folder) if name.endswith(".svg")) if os.path.isdir(folder) else []


def first_difference(committed, drawn):
    """the first lines where two SVG texts part, as a short unified diff"""
    diff = difflib.unified_diff(committed.splitlines(), drawn.splitlines(), "committed", "drawn now", n=1,
                                lineterm="")
    return "\n".join(line[:160] for line in list(diff)[:12])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--build", default=os.path.join(REPO, "build"),
                        help="the build folder whose python/ holds the relgrad module")
    args = parser.parse_args()
    build = os.path.abspath(args.build)
    regenerate = f"{sys.executable} scripts/make_figures.py --build {build}"

    with tempfile.TemporaryDirectory(prefix="relgrad-figures-") as out:
        done = subprocess.run([sys.executable, SCRIPT, "--build", build, "--out", out], capture_output=True,
                              text=True, check=False)
        if done.returncode != 0:
            print(f"FAIL: scripts/make_figures.py exited with {done.returncode}:\n{done.stdout}{done.stderr}")
            return 1
        drawn = svg_files(out)
        committed = svg_files(FIGURES)
        if not drawn:
            print("FAIL: scripts/make_figures.py wrote no SVG file")
            return 1
        failures = []
        for name in drawn:
            path = os.path.join(FIGURES, name)
            with open(os.path.join(out, name), "rb") as f:
                new = f.read()
            if name not in committed:
                failures.append(f"docs/figures/{name} is missing: the script draws it but it is not committed")
                continue
            with open(path, "rb") as f:
                old = f.read()
            if old != new:
                failures.append(f"docs/figures/{name} differs from what the script draws now:\n"
                                + first_difference(old.decode(errors="replace"), new.decode(errors="replace")))
        for name in committed:
            if name not in drawn:
                failures.append(f"docs/figures/{name} is committed but the script no longer draws it (remove it)")

    for failure in failures:
        print("FAIL: " + failure)
    if failures:
        print(f"\nRegenerate the figures with:\n    {regenerate}\nthen look at them before committing.")
        return 1
    print(f"{len(drawn)} figures, each the same bytes as docs/figures/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
