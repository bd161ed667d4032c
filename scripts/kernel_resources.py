#!/usr/bin/python3
"""What each CUDA kernel of engine/backend/cuda/ costs a GPU's multiprocessor, read from the
compiler without a GPU: nvcc compiles each .cu file to PTX for one architecture (sm_90 by
default, the H100/H200), ptxas assembles it with -v, and a markdown table is printed, a row per
kernel:

- registers per thread (more than 64 limits how many warps a multiprocessor holds at once);
- stack frame bytes per thread: arrays indexed at run time live there, in local memory (device
  memory behind the L1 cache), so every access is a memory access; 0 is the goal of a hot kernel;
- spill stores and loads: registers ptxas ran out of;
- static shared memory (dynamic shared memory is set at launch and not counted);
- tensor-core instructions (mma), fragment loads from shared memory (ldmatrix) and scalar fused
  multiply-adds (fma) in the kernel's PTX, as written (not as executed: a loop's body counts once).

A row per kernel template, with the range over its instantiations (--each: a row for each).

    /usr/bin/python3 scripts/kernel_resources.py [--arch sm_90] [--nvcc nvcc] [--each] [--tensor-cores KERNEL]

Exit status 2 when nvcc or ptxas is missing, 1 when a file does not compile or a kernel named by
--tensor-cores uses no mma (or, in a bfloat16 or float16 instance, no ldmatrix) or has a stack
frame or spills. docs/performance.md ("On a GPU") carries the table."""
import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def demangled(names):
    """The kernels' names as C++ writes them, without namespaces and parameter lists."""
    out = subprocess.run(["c++filt", "--no-params"], input="\n".join(names), capture_output=True, text=True,
                         check=True).stdout
    short = []
    for name in out.splitlines():
        name = re.sub(r"(\w+::|\(anonymous namespace\)::)", "", name)  # namespaces
        name = re.sub(r"^void ", "", name)  # the return type
        # an enum template argument, (MmaInputs)1, by its enumerator's name
        name = re.sub(r"\(MmaInputs\)(\d)", lambda m: ["tf32", "bfloat16", "float16"][int(m.group(1))], name)
        short.append(name)
    return short


def ptx_entries(ptx):
    """{mangled kernel name: its PTX body}."""
    parts = re.split(r"^(?:\.visible )?\.entry (\w+)\(", ptx, flags=re.M)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts), 2)}


def resources(ptxas_output):
    """{mangled kernel name: {registers, stack, spill_stores, spill_loads, shared}} from ptxas -v."""
    kernels, current = {}, None
    for line in ptxas_output.splitlines():
        if m := re.search(r"Compiling entry function '(\w+)'", line):
            current = kernels.setdefault(m.group(1), {"shared": 0})
        elif current is None:
            continue
        elif m := re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line):
            current.update(stack=int(m.group(1)), spill_stores=int(m.group(2)), spill_loads=int(m.group(3)))
        elif m := re.search(r"Used (\d+) registers", line):
            current["registers"] = int(m.group(1))
            if s := re.search(r"(\d+) bytes smem", line):
                current["shared"] = int(s.group(1))
    return kernels


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", default="sm_90", help="the GPU architecture (default sm_90)")
    parser.add_argument("--nvcc", default="nvcc")
    parser.add_argument("--each", action="store_true",
                        help="a row per instantiation (default: a row per kernel template, with ranges)")
    parser.add_argument("--tensor-cores", action="append", default=[], metavar="KERNEL",
                        help="a kernel template that must, in every instantiation, use mma and have no stack "
                             "frame and no spills (exit status 1 otherwise); may be repeated")
    args = parser.parse_args()
    for tool in (args.nvcc, "ptxas", "c++filt"):
        if not shutil.which(tool):
            print(f"kernel_resources: {tool} is not on PATH", file=sys.stderr)
            sys.exit(2)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for source in sorted(glob.glob(os.path.join(ROOT, "engine/backend/cuda/*.cu"))):
            ptx_path = os.path.join(tmp, os.path.basename(source) + ".ptx")
            compiled = subprocess.run([args.nvcc, "-std=c++17", "-O3", "-DNDEBUG", "-DRELGRAD_HAVE_CUDA", "-I" + ROOT,
                                       "--expt-relaxed-constexpr", f"-arch={args.arch}", "-ptx", source, "-o", ptx_path],
                                      capture_output=True, text=True)
            assembled = compiled.returncode == 0 and subprocess.run(
                ["ptxas", f"-arch={args.arch}", "-v", ptx_path, "-o", os.devnull], capture_output=True, text=True)
            if not assembled or assembled.returncode != 0:
                print(f"kernel_resources: {os.path.relpath(source, ROOT)} does not compile:\n"
                      + (compiled.stderr if compiled.returncode else assembled.stderr), file=sys.stderr)
                sys.exit(1)
            with open(ptx_path) as f:
                bodies = ptx_entries(f.read())
            found = resources(assembled.stderr)
            names = sorted(found)
            for mangled, name in zip(names, demangled(names)):
                body = bodies.get(mangled, "")
                rows.append((os.path.basename(source), name, found[mangled], len(re.findall(r"\bmma\.", body)),
                             len(re.findall(r"\bldmatrix\.", body)), len(re.findall(r"\bfma\.", body))))
    failures = []
    for required in args.tensor_cores:
        instances = [(name, r, mma, ldmatrix) for _, name, r, mma, ldmatrix, _ in rows
                     if re.sub(r"<.*", "", name) == required]
        if not instances:
            failures.append(f"{required}: no such kernel")
        for name, r, mma, ldmatrix in instances:
            sixteen_bit = re.search(r"<(bfloat16|float16)\b", name) is not None
            if mma == 0 or (sixteen_bit and ldmatrix == 0) or r["stack"] or r["spill_stores"] or r["spill_loads"]:
                failures.append(f"{name}: {mma} mma, {ldmatrix} ldmatrix, {r['stack']} bytes of stack frame, "
                                f"{r['spill_stores']}/{r['spill_loads']} bytes of spills (expected mma, "
                                f"{'ldmatrix, ' if sixteen_bit else ''}0, 0/0)")
    if not args.each:  # a row per kernel template: the range over its instantiations
        groups = {}
        for source, name, r, mma, ldmatrix, fma in rows:
            groups.setdefault((source, re.sub(r"<.*", "", name)), []).append((r, mma, ldmatrix, fma))
        rows = []
        for (source, name), members in groups.items():
            def span(values):
                return f"{min(values)}" if min(values) == max(values) else f"{min(values)}-{max(values)}"
            merged = {key: span([r[key] for r, *_ in members])
                      for key in ("registers", "stack", "spill_stores", "spill_loads", "shared")}
            rows.append((source, f"{name} (x{len(members)})" if len(members) > 1 else name, merged,
                         *(span([member[i] for member in members]) for i in (1, 2, 3))))
    print(f"| file | kernel ({args.arch}) | registers | stack frame (bytes) | spills (stores/loads, bytes) "
          "| static shared (bytes) | mma | ldmatrix | fma |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for source, name, r, mma, ldmatrix, fma in rows:
        print(f"| {source} | `{name}` | {r['registers']} | {r['stack']} | {r['spill_stores']}/{r['spill_loads']} "
              f"| {r['shared']} | {mma} | {ldmatrix} | {fma} |")
    for failure in failures:
        print(f"kernel_resources: {failure}", file=sys.stderr)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
