#!/usr/bin/env python3
"""Per-kernel SASS instruction counts of a CUDA object or cubin, without a GPU.

The CUDA toolkit on the development machine has no cuobjdump; PyPI's nvidia-cuda-cuobjdump and
nvidia-cuda-nvdisasm wheels have it and the disassembler it runs. The first run downloads both
(pip download, no install) and unpacks them into .deps/sasstools (git-ignored). Session 47 used it to count the FP8 kernel's instructions per key block.

  scripts/sass_counts.py OBJ [--kernel SUBSTRING] [--arch sm_90a] [--top 30] [--ops MUFU,F2FP]
  scripts/sass_counts.py OBJ --diff OTHER_OBJ --ops MUFU,F2FP,PRMT   # the same kernels, two builds

OBJ: a .o from the CUDA build (e.g. build/cuda/src/CMakeFiles/attnkit.dir/backends/fa3/kernels/
prefill_sm90_hd128.cu.o) or a .cubin. Counts are static (each instruction of the listing once),
by opcode without modifiers (MUFU.EX2 -> MUFU), predicated instructions and the NOP padding at
the end of each kernel included. A kernel only in the --diff object counts 0 on the left.
"""
import argparse
import collections
import glob
import os
import re
import subprocess
import sys
import tempfile
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOLS = os.path.join(ROOT, ".deps", "sasstools")
WHEEL_VERSION = "13.5.37"  # pinned: another release may list the same code differently


def cuobjdump():
    found = glob.glob(os.path.join(TOOLS, "**", "bin", "cuobjdump"), recursive=True)
    if not found or not glob.glob(os.path.join(TOOLS, "**", "bin", "nvdisasm"), recursive=True):
        os.makedirs(TOOLS, exist_ok=True)
        with tempfile.TemporaryDirectory() as tmp:
            subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                            "--dest", tmp, f"nvidia-cuda-cuobjdump=={WHEEL_VERSION}",
                            f"nvidia-cuda-nvdisasm=={WHEEL_VERSION}"], check=True)
            for wheel in glob.glob(os.path.join(tmp, "*.whl")):
                zipfile.ZipFile(wheel).extractall(TOOLS)
        found = glob.glob(os.path.join(TOOLS, "**", "bin", "cuobjdump"), recursive=True)
        if not found:
            sys.exit("sass_counts: no cuobjdump in the nvidia-cuda-cuobjdump wheel")
    for tool in glob.glob(os.path.join(TOOLS, "**", "bin", "*"), recursive=True):
        os.chmod(tool, 0o755)
    return found[0]


def counts(path, arch):
    """{kernel: Counter(opcode)} of the `arch` code in `path`."""
    run = subprocess.run([cuobjdump(), "-sass", path], capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit(f"sass_counts: cuobjdump -sass {path} failed: {run.stderr.strip()}")
    sass = run.stdout
    result, kernel, current_arch, arches = {}, None, None, set()
    for line in sass.splitlines():
        m = re.search(r"code for (sm_\w+)", line)
        if m:
            current_arch = m.group(1)
            arches.add(current_arch)
        m = re.search(r"Function : (\S+)", line)
        if m:
            kernel = m.group(1) if current_arch == arch else None
            if kernel:
                result.setdefault(kernel, collections.Counter())
            continue
        if kernel and re.match(r"\s*/\*[0-9a-f]{4,}\*/\s+[A-Z@]", line):
            op = re.sub(r"^@!?U?P\w+\s+", "", line.split("*/", 1)[1].strip())
            result[kernel][re.split(r"[\s;.]", op)[0]] += 1
    if not result:
        sys.exit(f"sass_counts: no {arch} code in {path} (it has: {', '.join(sorted(arches))})")
    return result


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("obj")
    ap.add_argument("--diff", help="a second object: print both counts side by side")
    ap.add_argument("--kernel", default="", help="only kernels whose mangled name contains this")
    ap.add_argument("--arch", default="sm_90a")
    ap.add_argument("--top", type=int, default=20, help="opcodes per kernel (without --ops)")
    ap.add_argument("--ops", default="", help="comma-separated opcodes to print")
    args = ap.parse_args()
    a = counts(args.obj, args.arch)
    b = counts(args.diff, args.arch) if args.diff else None
    ops = [o for o in args.ops.split(",") if o]
    kernels = [k for k in a if args.kernel in k]
    if b is not None:
        kernels += [k for k in b if args.kernel in k and k not in a]
    if not kernels:
        sys.exit(f"sass_counts: no kernel name contains '{args.kernel}'")
    for kernel in kernels:
        c = a.get(kernel, collections.Counter())
        if b is None:
            shown = ops or [op for op, _ in c.most_common(args.top)]
            print(f"{kernel}: {sum(c.values())} instructions; " +
                  ", ".join(f"{op} {c[op]}" for op in shown))
        else:
            d = b.get(kernel, collections.Counter())
            shown = ops or [op for op, _ in (c + d).most_common(args.top)]
            print(f"{kernel}: {sum(c.values())} -> {sum(d.values())}; " +
                  ", ".join(f"{op} {c[op]} -> {d[op]}" for op in shown))


if __name__ == "__main__":
    main()
