#!/usr/bin/env python3
"""Writes the inline-PTX wrappers of wgmma.mma_async m64nNkK with f32 accumulators, A from shared
memory (SS) or from registers (RS), for one operand family:

  16bit: src/cuda/sm90/wgmma_sm90.cuh, m64nNk16, bf16 / f16 operands (kBf16), B K- or MN-major
         (kTransB); the functions are wgmma_ss / wgmma_rs.
  e4m3:  src/cuda/sm90/wgmma_fp8_sm90.cuh, m64nNk32, e4m3 x e4m3 operands, both K-major (8-bit
         wgmma has no transpose); the functions are wgmma_ss_e4m3 / wgmma_rs_e4m3.

  python3 scripts/gen/gen_wgmma_sm90.py 16bit > src/cuda/sm90/wgmma_sm90.cuh
  python3 scripts/gen/gen_wgmma_sm90.py e4m3 > src/cuda/sm90/wgmma_fp8_sm90.cuh
  scripts/format.sh   # the checked-in e4m3 header is clang-formatted
"""

import sys

FAMILIES = {
    "16bit": {
        "header": "wgmma_sm90.cuh",
        "k": 16,
        # QK^T: N = key tile (80: d 256); 256: MLA decode P V (A = P). PV: N = head dim.
        "ss_n": (64, 80, 128, 256),
        "rs_n": (64, 128, 256),
        "suffix": "",
        "template": "template <bool kBf16, int kTransB>\n",
        "targs": "<kBf16, kTransB>",
        "dispatch_params": "int kN, bool kBf16, int kTransB",
        # One asm body per N, written once as a macro of the PTX type (TY) and invoked per type;
        # the trans-b immediate is the template argument itself (an "n" operand), so kTransB
        # needs no branch of its own.
        "types": (("kBf16", "bf16"), (None, "f16")),
        "trans": "kTransB",
        "doc": """// wgmma.mma_async m64nNk16, f32 accumulators, bf16 / f16 operands (sm_90a). One warpgroup (128
// threads) issues each call; d is this thread's N/2 accumulators in the PTX "D fragment" order
// (d[4j + 0..1]: row 16 * warp + lane / 4, cols 8j + 2 * (lane % 4) + 0..1; d[4j + 2..3]: row + 8).
//   wgmma_ss: A [64 x 16] and B [16 x N] from shared-memory descriptors.
//   wgmma_rs: A from registers (4 x 32-bit: the m16n8k16-style A fragment of this warp's 16 rows).
// scale_d = 0 overwrites d (d = A*B), 1 accumulates. kTransB = 1: B is MN-major (N contiguous).
// Each function's asm is written once, as a macro of the PTX type (bf16 / f16; #undef'd after
// use), with kTransB passed as an immediate ("n") operand.
// The caller brackets calls with wgmma_fence() / wgmma_commit() / wgmma_wait<N>() (sm90_primitives.cuh).""",
    },
    "e4m3": {
        "header": "wgmma_fp8_sm90.cuh",
        "k": 32,
        # QK^T: N = key block (192: the FP8 kernel's 192-key blocks; 64: the first half of a causal
        # diagonal block, prefill_sm90_fp8.cuh Fa3Params::fp8_half_diag).
        "ss_n": (64, 128, 192),
        # PV: N = head dim (136: + 8 columns of ones, the row sum); 64 / 72: the two column chunks
        # of the promoted P V (prefill_sm90_fp8.cuh, kPromote: d 0..63, then d 64..127 + ones).
        "rs_n": (64, 72, 128, 136),
        # RS with scale-d 0 and write-only accumulators (wgmma_rs_e4m3_zero): the first k-step of
        # a promoted chunk, so the compiler sees no read of the temporary's previous value.
        "rs_zero_n": (64, 72),
        "suffix": "_e4m3",
        "template": "",
        "targs": "",
        "dispatch_params": "int kN",
        "types": ((None, "e4m3"),),
        "trans": None,
        "doc": """// wgmma.mma_async m64nNk32, f32 accumulators, e4m3 x e4m3 operands (sm_90a). One warpgroup (128
// threads) issues each call; d is this thread's N/2 accumulators in the PTX "D fragment" order
// (d[4j + 0..1]: row 16 * warp + lane / 4, cols 8j + 2 * (lane % 4) + 0..1; d[4j + 2..3]: row + 8).
// 8-bit operands are K-major on both sides (the transpose immediates exist only for 16-bit types).
//   wgmma_ss_e4m3: A [64 x 32] and B [32 x N] from shared-memory descriptors.
//   wgmma_rs_e4m3: A from registers (4 x 32-bit, 4 consecutive k per register: reg 0 row lane / 4,
//     k 4 (lane % 4) + 0..3; reg 1 row + 8; regs 2, 3 the same at k + 16).
// scale_d = 0 overwrites d (d = A*B), 1 accumulates. wgmma_rs_e4m3_zero: scale-d 0 with d
// write-only for the compiler (no live range of d before the call). The caller brackets calls
// with wgmma_fence() / wgmma_commit() / wgmma_wait<N>() (sm90_primitives.cuh).""",
    },
}


def operands(n_acc, first):
    return ", ".join(f"%{first + i}" for i in range(n_acc))


def acc_constraints(n_acc, zero=False):
    c = "=f" if zero else "+f"
    return ", ".join(f'"{c}"(d[{i}])' for i in range(n_acc))


def asm(n, k, ty, trans, rs, zero=False):
    """One wgmma call: SS (A descriptor) or RS (A in 4 registers). ty: the PTX type, or a macro
    parameter name (TY) pasted as a string. trans None: no immediates; else the name of the
    trans-b template argument, passed as an "n" (immediate) operand after the inputs.
    zero: scale-d 0 (d = A*B) with write-only ("=f") accumulators."""
    n_acc = n // 2
    a = n_acc
    pred = a + 5 if rs else a + 2
    a_ops = f"{{%{a}, %{a + 1}, %{a + 2}, %{a + 3}}}, %{a + 4}" if rs else f"%{a}, %{a + 1}"
    imm = "p, 1, 1" + ("" if trans is None else (f", %{pred + 1}" if rs else f", 0, %{pred + 1}"))
    scale = '"n"(0)' if zero else '"r"(scale_d)'
    inputs = (f'"r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), {scale}' if rs else
              f'"l"(desc_a), "l"(desc_b), {scale}')
    if trans is not None:
        inputs += f', "n"({trans})'
    op = (f"wgmma.mma_async.sync.aligned.m64n{n}k{k}.f32.{ty}.{ty} " if ty.islower() else
          f'wgmma.mma_async.sync.aligned.m64n{n}k{k}.f32." {ty} "." {ty} " ')
    return f'''  asm volatile(
      "{{\\n"
      ".reg .pred p;\\n"
      "setp.ne.b32 p, %{pred}, 0;\\n"
      "{op}"
      "{{{operands(n_acc, 0)}}}, "
      "{a_ops}, {imm};\\n"
      "}}\\n"
      : {acc_constraints(n_acc, zero)}
      : {inputs})'''


def macro_name(kind, sfx, n):
    return f"ATTNKIT_SM90_WGMMA_{kind.upper()}{sfx.upper()}_M64N{n}"


def macro(f, kind, n, rs):
    """The asm body of one (kind, N) as a macro of the PTX type; None with a single type."""
    if len(f["types"]) == 1:
        return None
    text = f"#define {macro_name(kind, f['suffix'], n)}(TY)" + " \\\n" + \
        " \\\n".join(asm(n, f["k"], "TY", f["trans"], rs).split("\n"))
    return text


def body(f, kind, n, rs, zero=False):
    if len(f["types"]) == 1:
        return asm(n, f["k"], f["types"][0][1], f["trans"], rs, zero) + ";"
    out = []
    for cond, ty in f["types"]:
        head = (f"  if constexpr ({cond}) {{" if not out else
                "  } else {" if cond is None else f"  }} else if constexpr ({cond}) {{")
        out.append(f'{head}\n    {macro_name(kind, f["suffix"], n)}("{ty}");')
    out.append("  }")
    return "\n".join(out)


def main(family):
    f = FAMILIES[family]
    sfx, tmpl, targs = f["suffix"], f["template"], f["targs"]
    arg = "" if family == "16bit" else " e4m3"
    print(f"""// GENERATED by scripts/gen/gen_wgmma_sm90.py{arg} -- do not edit by hand.
//
{f["doc"]}
#pragma once

#include <cstdint>

namespace attnkit::sm90 {{
""")
    for rs, ns in ((False, f["ss_n"]), (True, f["rs_n"])):
        kind = "rs" if rs else "ss"
        a_param = "const uint32_t (&a)[4]" if rs else "uint64_t desc_a"
        for n in ns:
            m = macro(f, kind, n, rs)
            if m:
                print(m + "\n")
            print(f"""{tmpl}__device__ __forceinline__ void wgmma_{kind}{sfx}_m64n{n}(float (&d)[{n // 2}], {a_param},
    uint64_t desc_b, int scale_d) {{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
{body(f, kind, n, rs)}
#endif
}}
""")
            if m:
                print(f"#undef {macro_name(kind, sfx, n)}\n")
    for n in f.get("rs_zero_n", ()):
        print(f"""{tmpl}__device__ __forceinline__ void wgmma_rs{sfx}_zero_m64n{n}(float (&d)[{n // 2}],
    const uint32_t (&a)[4], uint64_t desc_b) {{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
{body(f, "rs", n, True, zero=True)}
#endif
}}
""")
    print("// Dispatch on N (compile time).")
    for rs, ns in ((False, f["ss_n"]), (True, f["rs_n"])):
        kind = "rs" if rs else "ss"
        a_param, a_arg = ("const uint32_t (&a)[4]", "a") if rs else ("uint64_t desc_a", "desc_a")
        if rs:
            print()
        print(f"""template <{f["dispatch_params"]}>
__device__ __forceinline__ void wgmma_{kind}{sfx}(float (&d)[kN / 2], {a_param},
    uint64_t desc_b, int scale_d) {{""")
        for i, n in enumerate(ns):
            print(f"  {'if' if i == 0 else '} else if'} constexpr (kN == {n}) {{\n"
                  f"    wgmma_{kind}{sfx}_m64n{n}{targs}(d, {a_arg}, desc_b, scale_d);")
        print(f"""  }} else {{
    static_assert(kN == 0, "wgmma_{kind}{sfx}: N not generated");
  }}
}}""")
    if f.get("rs_zero_n"):
        print(f"""
template <{f["dispatch_params"]}>
__device__ __forceinline__ void wgmma_rs{sfx}_zero(float (&d)[kN / 2], const uint32_t (&a)[4],
    uint64_t desc_b) {{""")
        for i, n in enumerate(f["rs_zero_n"]):
            print(f"  {'if' if i == 0 else '} else if'} constexpr (kN == {n}) {{\n"
                  f"    wgmma_rs{sfx}_zero_m64n{n}{targs}(d, a, desc_b);")
        print(f"""  }} else {{
    static_assert(kN == 0, "wgmma_rs{sfx}_zero: N not generated");
  }}
}}""")
    print("\n}  // namespace attnkit::sm90")


if __name__ == "__main__":
    family = sys.argv[1] if len(sys.argv) > 1 else "16bit"
    if family not in FAMILIES:
        sys.exit(f"gen_wgmma_sm90.py: family {family!r} is not one of {', '.join(FAMILIES)}")
    main(family)
