"""The `diff` of the model from one version to the next, for the version READMEs.

    python tools/make_version_diffs.py            # rewrite the diff blocks in version*/README.md
    python tools/make_version_diffs.py --check    # exit 1 if a README's block is out of date
    python tools/make_version_diffs.py --print v3 # show one version's diff

Whole-file diffs between versions are noisy (V2 reorganises V1's file; V3 and V4 are
small files on top of V2), so each version lists the pieces of model code that
changed - a class, a method, a function - and this script diffs those pieces, read
from the real files with `ast`, so the READMEs can never drift from the code. Each
README holds the result between the markers

    <!-- version-diff:begin -->  ...  <!-- version-diff:end -->
"""
from __future__ import annotations

import argparse
import ast
import difflib
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from harness.config import VERSIONS  # noqa: E402  (imports no torch)

BEGIN, END = "<!-- version-diff:begin -->", "<!-- version-diff:end -->"
V1, V2, V3, V4 = (VERSIONS[v].script for v in ("v1", "v2", "v3", "v4"))

# version -> (README, [(title, old file, old symbols, new file, new symbols)])
DIFFS = {
    "v2": (f"{VERSIONS['v2'].folder}/README.md", [
        ("Attention: one QKV GEMM, scale folded into q, fp32 only inside softmax",
         V1, ["Attention.forward"], V2, ["Attention.forward", "Attention.attend"]),
        ("SwiGLU: one gate+up GEMM, SiLU*mul as one kernel",
         V1, ["SwiGLU.forward"], V2, ["SwiGLU.forward"]),
        ("RMSNorm: one fused kernel", V1, ["RMSNorm.forward"], V2, ["RMSNorm.forward"]),
        ("RoPE tables computed once", V1, ["TinyLlama.forward"], V2, ["TinyLlama.forward"]),
    ]),
    "v3": (f"{VERSIONS['v3'].folder}/README.md", [
        ("Attention core: explicit T x T scores -> our Triton flash-attention kernel",
         V2, ["Attention.attend"], V3, ["TritonAttention.attend"]),
        ("RMSNorm: torch's fused kernel -> our Triton kernel (writes the autocast dtype)",
         V2, ["RMSNorm.forward"], V3, ["TritonRMSNorm.forward", "TritonRMSNorm.out_dtype"]),
        ("RoPE: eight PyTorch operations for q and again for k -> one Triton kernel for both, "
         "one autograd step with attention (or inside the attention kernels)",
         V2, ["Attention.forward", "apply_rope"], V3, ["TritonAttention.forward"]),
        ("Residual adds: a separate add before each norm -> inside the norm's kernels",
         V2, ["Block.forward", "TinyLlama.forward"], V3,
         ["ResidualNormBlock.forward", "ResidualNormLlama.forward"]),
    ]),
    "v4": (f"{VERSIONS['v4'].folder}/README.md", [
        ("Attention core: our Triton kernel -> PyTorch SDPA (the vendor's flash kernels)",
         V3, ["TritonAttention.attend"], V4, ["SDPAAttention.attend", "causal_sdpa"]),
        ("RMSNorm: back to V2's torch kernel (F.rms_norm)",
         V3, ["TritonRMSNorm.forward", "TritonRMSNorm.out_dtype"], V2, ["RMSNorm.forward"]),
        ("RoPE: back to V2's PyTorch operations (torch.compile fuses them)",
         V3, ["TritonAttention.forward"], V2, ["Attention.forward", "apply_rope"]),
        ("Residual adds: back to V2's block (torch.compile fuses them)",
         V3, ["ResidualNormBlock.forward", "ResidualNormLlama.forward"], V2,
         ["Block.forward", "TinyLlama.forward"]),
    ]),
}


class DiffError(Exception):
    pass


def symbol_source(path: str, qualified: str) -> str:
    """Source of `Class.method` or `function` in a file, dedented, decorators included."""
    tree = ast.parse((REPO / path).read_text())
    node, body = None, tree.body
    for part in qualified.split("."):
        node = next((n for n in body if isinstance(n, (ast.ClassDef, ast.FunctionDef))
                     and n.name == part), None)
        if node is None:
            raise DiffError(f"{path}: no {qualified}")
        body = node.body
    first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
    lines = (REPO / path).read_text().splitlines()[first - 1:node.end_lineno]
    return textwrap.dedent("\n".join(lines))


def piece_diff(title, old_file, old_symbols, new_file, new_symbols) -> str:
    old = "\n\n".join(symbol_source(old_file, s) for s in old_symbols).splitlines()
    new = "\n\n".join(symbol_source(new_file, s) for s in new_symbols).splitlines()
    # Full context: the reader sees the whole function with the changed lines marked.
    lines = difflib.unified_diff(old, new, f"{old_file} ({', '.join(old_symbols)})",
                                 f"{new_file} ({', '.join(new_symbols)})",
                                 n=max(len(old), len(new)), lineterm="")
    body = [line for line in lines if not line.startswith("@@")]
    return f"**{title}**\n\n```diff\n" + "\n".join(body) + "\n```\n"


def version_block(version: str) -> str:
    _, pieces = DIFFS[version]
    pairs = dict.fromkeys((p[1], p[3]) for p in pieces)  # in order, without repeats
    commands = ", ".join(f"`diff -u {old} {new}`" for old, new in pairs)
    return (f"{BEGIN}\n<!-- generated by `python tools/make_version_diffs.py`; edit the "
            f"code, not this block -->\n\n" + "\n".join(piece_diff(*p) for p in pieces)
            + f"\nThe whole files: {commands}.\n{END}")


def replace_block(text: str, block: str, readme: str) -> str:
    if BEGIN not in text or END not in text:
        raise DiffError(f"{readme} has no {BEGIN} ... {END} markers")
    head, rest = text.split(BEGIN, 1)
    return head + block + rest.split(END, 1)[1]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="exit 1 if a README is out of date")
    p.add_argument("--print", dest="show", choices=sorted(DIFFS), help="print one version's diff")
    args = p.parse_args(argv)
    try:
        if args.show:
            print(version_block(args.show))
            return 0
        stale = []
        for version, (readme, _) in DIFFS.items():
            path = REPO / readme
            if not path.exists():
                stale.append(f"{readme} is missing")
                continue
            text = path.read_text()
            updated = replace_block(text, version_block(version), readme)
            if updated != text:
                if args.check:
                    stale.append(f"{readme}: the diff block is out of date")
                else:
                    path.write_text(updated)
                    print(f"updated {readme}")
    except (DiffError, OSError, SyntaxError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for line in stale:
        print(f"{line} (run: python tools/make_version_diffs.py)", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
