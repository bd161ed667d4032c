"""draw(tensor): the graph that backward() will walk, as a Graphviz picture.

Boxes are tensors (shape and dtype; values and gradients on request), ellipses the ops that made
them; an arrow goes from each input to its op and from the op to its output. Leaves that require
a gradient are shaded: backward ends there. In a notebook the Graph shows itself as SVG.
"""
import html
import shutil
import subprocess

import numpy as np


class Graph:
    """A graph in Graphviz's DOT language; .svg() renders it, .save(path) writes .svg/.png/.pdf/.dot."""

    def __init__(self, source):
        self.source = source

    def render(self, fmt):
        dot = shutil.which("dot")
        if dot is None:
            raise RuntimeError("draw: Graphviz's 'dot' program is not installed (Debian package: graphviz)")
        done = subprocess.run([dot, "-T" + fmt], input=self.source.encode(), capture_output=True, check=False)
        if done.returncode != 0:
            raise RuntimeError("draw: dot failed: " + done.stderr.decode(errors="replace").strip())
        return done.stdout

    def svg(self):
        return self.render("svg").decode()

    def _repr_svg_(self):
        return self.svg()

    def save(self, path):
        fmt = str(path).rsplit(".", 1)[-1]
        if fmt not in ("svg", "png", "pdf", "dot"):
            raise ValueError(f"draw: save to .svg, .png, .pdf or .dot, not '{path}'")
        with open(path, "wb") as out:
            out.write(self.source.encode() if fmt == "dot" else self.render(fmt))


def _values(tensor, max_elements):
    array = np.asarray(tensor)
    flat = array.reshape(-1)
    text = np.array2string(flat[:max_elements], precision=4, separator=", ", suppress_small=True)
    if flat.size > max_elements:
        text = text[:-1] + ", ...]"
    return text


def draw(root, values=False, grads=False, max_elements=6, rankdir="LR"):
    """The graph behind `root`: every tensor it was computed from, and the ops between them.

    values / grads: print each tensor's first max_elements values / gradient entries (the
    gradients are those left by the last backward pass: call root.backward(retain_graph=True)
    first to see them on the graph).
    """
    from . import Tensor

    if not isinstance(root, Tensor):
        raise TypeError("draw: expected a relgrad.Tensor, got " + type(root).__name__)
    lines = [f"digraph relgrad {{ rankdir={rankdir}; node [fontname=Helvetica, fontsize=10];"]
    seen_tensors, seen_nodes = set(), set()
    stack = [root]
    while stack:
        tensor = stack.pop()
        if tensor._id in seen_tensors:
            continue
        seen_tensors.add(tensor._id)
        rows = [f"{list(tensor.shape)} {tensor.dtype.name}"]
        if values and tensor.device == "cpu":
            rows.append("data " + _values(tensor.detach(), max_elements))
        if grads and tensor.grad is not None and tensor.device == "cpu":
            rows.append("grad " + _values(tensor.grad, max_elements))
        label = "|".join(html.escape(row).replace("|", "\\|").replace("{", "\\{").replace("}", "\\}") for row in rows)
        style = ', style=filled, fillcolor="#dde8f6"' if tensor.is_leaf and tensor.requires_grad else ""
        lines.append(f't{tensor._id} [shape=record, label="{{{label}}}"{style}];')
        node = tensor.grad_fn
        if node is None:
            continue
        if node._id not in seen_nodes:
            seen_nodes.add(node._id)
            lines.append(f'n{node._id} [shape=ellipse, label="{html.escape(node.name)}"];')
            if node.released:
                lines.append(f'n{node._id} [style=dashed, xlabel="freed by backward()"];')
            for source in node.inputs:
                if source is None or not source.requires_grad:
                    continue
                lines.append(f"t{source._id} -> n{node._id};")
                stack.append(source)
        lines.append(f"n{node._id} -> t{tensor._id};")
    lines.append("}")
    return Graph("\n".join(lines))
