"""The `// faprof:launch` and `// faprof:setmaxnreg` annotations of kernel files, and their integer expressions.

Launch configurations for the occupancy columns of ptxas' report come from annotations beside each
kernel in its .cu file, one line per kernel, in which `D` is the head-dimension template argument::

    // faprof:launch kernel=fa2_fwd_kernel threads=128 dyn_smem=4*(32*D+64*(D+4)+64*D+4*8*64)

An annotation sits next to the tile struct it describes, so the two are edited together; a
Python table would drift from the code more easily.
"""

from __future__ import annotations

import ast
import operator
import re
from collections.abc import Callable, Sequence

_RE_LAUNCH = re.compile(r"//\s*faprof:launch\s+(?P<fields>.+?)\s*$", re.M)

_BINOPS: dict[type, Callable[[int, int], int]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
}


def parse_launch_annotations(text: str) -> dict[str, dict[str, str]]:
    """`// faprof:launch kernel=NAME [D=EXPR] threads=EXPR dyn_smem=EXPR` lines -> {NAME: {field: EXPR}}.

    NAME is the kernel's name without namespaces or template arguments. Expressions may use D
    and A0, A1, ... (see eval_launch_expr); `D=` sets the report's D column for kernels whose
    head dimension is not their only integer template argument (e.g. D=A0).
    """
    out: dict[str, dict[str, str]] = {}
    for m in _RE_LAUNCH.finditer(text):
        fields = dict(tok.split("=", 1) for tok in m.group("fields").split() if "=" in tok)
        if "kernel" in fields:
            out[fields.pop("kernel")] = fields
    return out


_RE_SETMAXNREG = re.compile(r"//\s*faprof:setmaxnreg\s+(?P<fields>.+?)\s*$", re.M)


def parse_setmaxnreg_annotations(text: str) -> dict[str, dict[str, int]]:
    """`// faprof:setmaxnreg kernel=NAME ROLE=REGS ...` lines -> {NAME: {ROLE: REGS}}: the register
    budgets a warp-specialized kernel's warpgroups set with `setmaxnreg` (static values that ptxas'
    report, which gives the count at launch, does not show)."""
    out: dict[str, dict[str, int]] = {}
    for m in _RE_SETMAXNREG.finditer(text):
        fields = dict(tok.split("=", 1) for tok in m.group("fields").split() if "=" in tok)
        name = fields.pop("kernel", None)
        if name and fields and all(v.isdigit() for v in fields.values()):
            out[name] = {role: int(v) for role, v in fields.items()}
    return out


def eval_launch_expr(expr: str, D: int | None, args: Sequence[int] = ()) -> int:
    """Evaluate an annotation's integer expression: +, -, *, //, parentheses, integers, the
    name D (the head dimension) and A0, A1, ... (the kernel's integer template arguments)."""

    def ev(node: ast.AST) -> int:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.Name) and node.id == "D":
            if D is None:
                raise ValueError(
                    f"{expr!r} uses D but the kernel's D is unknown (add D=... to the annotation)"
                )
            return D
        if isinstance(node, ast.Name) and re.fullmatch(r"A\d+", node.id):
            i = int(node.id[1:])
            if i >= len(args):
                raise ValueError(
                    f"{expr!r} uses {node.id} but the kernel has {len(args)} integer template arguments"
                )
            return args[i]
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            return _BINOPS[type(node.op)](ev(node.left), ev(node.right))
        raise ValueError(f"unsupported element in launch expression {expr!r}")

    return ev(ast.parse(expr, mode="eval"))
