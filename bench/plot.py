#!/usr/bin/env python3
"""Render `attnkit bench --json` results (plus optional torch peers and ceilings) as PNG charts.

    python3 bench/plot.py RESULTS.json [MORE.json ...] [--peers torch_peers.json]
                          [--out-dir docs/perf] [--prefix cpu] [--markdown]

One chart per workload kind found in the inputs:
  decode / mla_decode (memory-bound): GB/s per shape, one bar per backend x page size x KV dtype,
      peers' decode GB/s (same batch, kv length, heads, head dim) as extra bars, the measured copy
      ceiling(s) as horizontal lines.
  extend (compute-bound): TFLOP/s per shape, peers' causal prefill at the same shape, compute
      ceilings (the CPU vector peak, --gemm-tflops, or the peers' gemm_bf16) as lines.
--markdown also prints a Markdown table of every result with its ratio to the ceiling.

Inputs: the attnkit JSON ("schema": "attnkit-bench/1", see bench/bench_report.cpp) and the list
written by ../shared/peers/torch_peers.py ([{kind, name, shape, ms, tflops, gbs}], shape strings
such as "B=16 L=4096 Hq=32 Hkv=8 d=128" and "B=4 S=4096 Hq=32 Hkv=8 d=128 causal").
"""
import argparse
import json
import os
import re
import sys

SCHEMA = "attnkit-bench/1"


def load_ours(paths):
    runs = []
    for path in paths:
        with open(path) as f:
            doc = json.load(f)
        if doc.get("schema") != SCHEMA:
            sys.exit(f"plot.py: {path}: schema {doc.get('schema')!r} is not {SCHEMA!r}")
        runs.append(doc)
    return runs


def parse_peer_shape(shape):
    """'B=16 L=4096 Hq=32 Hkv=8 d=128' -> dict of ints (+ causal flag)."""
    out = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", shape)}
    out["causal"] = "causal" in shape
    return out


def load_peers(path):
    if not path:
        return [], []
    with open(path) as f:
        rows = json.load(f)
    if not isinstance(rows, list):
        sys.exit(f"plot.py: {path}: expected the list torch_peers.py writes")
    ceilings = [r for r in rows if r.get("kind") == "ceiling"]
    return [r for r in rows if r.get("kind") != "ceiling"], ceilings


def shape_key(kind, p):
    """The shape a result is grouped by (page size and KV dtype become series instead)."""
    if kind == "extend":
        return (p["batch"], p["prefix_len"], p["new_tokens"], p["q_heads"], p["kv_heads"],
                p["head_dim"], p.get("causal", True))
    if kind == "mla_decode":
        return (p["batch"], p["kv_len"], p["q_heads"])
    return (p["batch"], p["kv_len"], p["q_heads"], p["kv_heads"], p["head_dim"])


def shape_label(kind, key):
    if kind == "extend":
        b, pre, new, hq, hkv, d, causal = key
        return f"B{b} pre{pre}\nnew{new} d{d}" + ("" if causal else " bidir")
    if kind == "mla_decode":
        b, kv, hq = key
        return f"B{b} kv{kv}\nH{hq}"
    b, kv, hq, hkv, d = key
    return f"B{b} kv{kv}\n{hq}/{hkv} d{d}"


def peer_key(kind, peer):
    s = parse_peer_shape(peer["shape"])
    if kind == "decode" and peer["kind"] == "decode":
        return (s["B"], s["L"], s["Hq"], s["Hkv"], s["d"])
    if kind == "extend" and peer["kind"] == "prefill":
        return (s["B"], 0, s["S"], s["Hq"], s["Hkv"], s["d"], s["causal"])
    return None


def metric(kind):
    return "tflops" if kind == "extend" else "gbs"


def series_name(r):
    p = r["params"]
    name = f"{r['backend']} p{p['page_size']}"
    if p["kv_dtype"] != p["dtype"]:
        name += f" {p['kv_dtype']}"
    return name


def collect(runs, peers, kind):
    """{shape_key: {series: value}} for one kind, ours and peers."""
    groups = {}
    m = metric(kind)
    for run in runs:
        for r in run["results"]:
            if r["kind"] != kind or r["status"] != "ok":
                continue
            key = shape_key(kind, r["params"])
            groups.setdefault(key, {})[series_name(r)] = r[m]
    for peer in peers:
        key = peer_key(kind, peer)
        if key is None or key not in groups:
            continue  # only shapes we also measured
        value = peer.get(m)
        if value:
            groups[key]["peer " + peer["name"]] = value
    return groups


def ceiling_lines(runs, peer_ceilings, kind):
    lines = []
    want = "tflops" if kind == "extend" else "gbs"
    for run in runs:
        if not any(r["kind"] == kind for r in run["results"]):
            continue  # a ceiling belongs to the run whose cases it judges
        for c in run.get("ceilings", []):
            if c.get(want):
                lines.append((f"{c['name']} ({run['device']['name']}, {run['date']})", c[want]))
    for c in peer_ceilings:
        if c.get(want):
            lines.append((f"peer {c['name']}", c[want]))
    return lines


def device_label(device):
    if device.get("platform") == "cpu":
        return f"{device['name']} ({device.get('omp_threads', '?')} threads)"
    return device["name"]


def plot_kind(runs, peers, peer_ceilings, kind, out_path, log_scale):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = collect(runs, peers, kind)
    if not groups:
        return False
    keys = sorted(groups)
    series = sorted({s for g in groups.values() for s in g}, key=lambda s: (s.startswith("peer"), s))
    width = 0.8 / max(1, len(series))
    fig_w = max(8.0, 0.9 * len(keys) * max(1, len(series)) * 0.35 + 3)
    fig, ax = plt.subplots(figsize=(min(fig_w, 40.0), 5.5))
    for i, s in enumerate(series):
        xs = [k + (i - (len(series) - 1) / 2) * width for k in range(len(keys))]
        ys = [groups[key].get(s, 0.0) for key in keys]
        ax.bar(xs, ys, width, label=s, hatch="//" if s.startswith("peer") else None)
    styles = ["--", ":", "-.", (0, (5, 1))]
    for j, (name, value) in enumerate(ceiling_lines(runs, peer_ceilings, kind)):
        ax.axhline(value, color="black", linestyle=styles[j % len(styles)], linewidth=1,
                   label=f"{name}: {value:.4g}")
    ax.set_xticks(range(len(keys)))
    ax.set_xticklabels([shape_label(kind, k) for k in keys], fontsize=7)
    unit = "TFLOP/s" if kind == "extend" else "GB/s (K+V+q+out bytes / median time)"
    ax.set_ylabel(unit)
    if log_scale:
        ax.set_yscale("log")
    devices = ", ".join(sorted({device_label(r["device"]) for r in runs}))
    dates = ", ".join(sorted({r["date"][:10] for r in runs}))
    ax.set_title(f"attnkit {kind} - {devices} - {dates}")
    ax.legend(fontsize=7, ncol=2)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out_path, dpi=120)
    plt.close(fig)
    return True


def markdown(runs):
    lines = ["| backend | case | ms | GB/s | TFLOP/s | ratio | ceiling | verified |",
             "|---|---|---:|---:|---:|---:|---|---|"]
    for run in runs:
        for r in run["results"]:
            if r["status"] != "ok":
                lines.append(f"| {r['backend']} | {r['case']} | {r['status']}: {r['message']} "
                             "| | | | | |")
                continue
            ratio = f"{100 * r['ceiling_ratio']:.1f}%" if r.get("ceiling_ratio") else "-"
            verified = "yes" if r.get("verify", {}).get("passed") else "-"
            lines.append(f"| {r['backend']} | {r['case']} | {r['ms_median']:.3f} | "
                         f"{r['gbs']:.2f} | {r['tflops']:.4f} | {ratio} | {r.get('ceiling', '')} "
                         f"| {verified} |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", nargs="+", help="attnkit bench --json outputs")
    ap.add_argument("--peers", help="torch_peers.json from ../shared/peers/torch_peers.py")
    ap.add_argument("--out-dir", default="docs/perf", help="where the PNGs go")
    ap.add_argument("--prefix", default="bench", help="file name prefix of the PNGs")
    ap.add_argument("--markdown", action="store_true", help="print a Markdown results table")
    ap.add_argument("--log", action="store_true", help="logarithmic y axis")
    args = ap.parse_args()

    runs = load_ours(args.results)
    peers, peer_ceilings = load_peers(args.peers)
    os.makedirs(args.out_dir, exist_ok=True)
    kinds = sorted({r["kind"] for run in runs for r in run["results"]})
    for kind in kinds:
        out = os.path.join(args.out_dir, f"{args.prefix}_{kind}.png")
        if plot_kind(runs, peers, peer_ceilings, kind, out, args.log):
            print(f"wrote {out}")
        else:
            print(f"no ok results of kind {kind}; no chart", file=sys.stderr)
    if args.markdown:
        print(markdown(runs))


if __name__ == "__main__":
    main()
