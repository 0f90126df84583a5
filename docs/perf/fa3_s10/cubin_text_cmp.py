#!/usr/bin/env python3
"""Session 10 (reviewer fp8rev): compare the per-kernel ELF sections of two cubins byte for byte
(for machines without cuobjdump / nvdisasm). Kernels are matched by mangled name; --map A=B
rewrites a regex in the first cubin's names (e.g. a template argument appended later).

  nvcc ... -cubin -o old.cubin src/backends/fa3/kernels/prefill_sm90_hd128.cu   (at the old commit)
  nvcc ... -cubin -o new.cubin src/backends/fa3/kernels/prefill_sm90_hd128.cu
  python3 docs/perf/fa3_s10/cubin_text_cmp.py old.cubin new.cubin \
      --map '(prefill_sm90_fp8_kernelI(?:Lb[01]E){4}Li(?:128|192)E)E=\\1Li0EE'

Prints SAME / DIFF per .text / .nv.info / .nv.constant0 section; exit status 1 if a .text differs
or is missing. (.nv.info may differ in symbol indices only when the file has more kernels.)
"""
import argparse, re, struct, sys


def sections(path):
    b = open(path, "rb").read()
    shoff, = struct.unpack_from("<Q", b, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", b, 0x3A)
    hdr = [struct.unpack_from("<IIQQQQIIQQ", b, shoff + i * shentsize) for i in range(shnum)]
    strtab = hdr[shstrndx][4]
    out = {}
    for name_off, typ, _, _, off, size, *_ in hdr:
        name = b[strtab + name_off:b.index(b"\0", strtab + name_off)].decode()
        out[name] = b[off:off + size] if typ != 8 else ("nobits", size)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("old"); ap.add_argument("new")
    ap.add_argument("--map", action="append", default=[], help="REGEX=REPLACEMENT on old names")
    a = ap.parse_args()
    old, new = sections(a.old), sections(a.new)
    bad = 0
    for k in sorted(old):
        if not re.match(r"\.(text|nv\.info\.|nv\.constant0)", k):
            continue
        k2 = k
        for m in a.map:
            pat, rep = m.split("=", 1)
            k2 = re.sub(pat, rep, k2)
        if k2 not in new:
            print("MISSING", k2); bad |= k.startswith(".text"); continue
        same = old[k] == new[k2]
        print("SAME" if same else "DIFF", k)
        bad |= (not same) and k.startswith(".text")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
