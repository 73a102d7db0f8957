"""The leaderboard: every kernel of a scenario on a GPU (faprof's, PyTorch's, the attention libraries', the
user's) as a share of the ceiling the run measured, per shape and over the shapes it ran.

The ceiling is the one the row's problem is bound by, as the run measured it on that GPU: the copy
bandwidth for a memory-bound row (decode: `pct_copy`, achieved GB/s over the run's measured copy) and
the measured matmul rate for a compute-bound one (prefill: `pct_measured_ceiling`, achieved TFLOP/s over
the run's own bf16/fp16 matmul). A kernel's summary is the geometric mean of its shares over the shapes
it ran right (`ok`); a wrong row is shown, never scored. Several bundles of one scenario on one GPU
merge: each (kernel, shape) takes its row from the newest bundle that timed it (so a later run of the
library baselines alone adds their rows beside the earlier run's), and every row names its bundle.
Only shapes of the scenario as its file has it today count (rows of shapes since changed are left out).

Versions come from the bundle: a library row's `path` names the library and its version as it ran
("fused: FlashInfer 0.6.18.post1 ..."), PyTorch's rows the run's torch (and cuDNN for its cuDNN path),
faprof's kernels the faprof commit that built them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from faprof.analysis.labels import gpu_label, parse_stamp, problem_label
from faprof.errors import FaprofError
from faprof.model import schema
from faprof.model.values import as_float
from faprof.store import Bundle, find_bundles

#: Who wrote a kernel, by the row's variant_kind (and the registry's 'library' tag).
WHO = {"cuda": "faprof", "torch": "PyTorch", "user": "user", "cpu": "reference (CPU)", "library": "library"}

#: The scenarios the leaderboard ranks by default: today's problems, where the library baselines run.
SCENARIOS = ("llama3_70b_decode", "llama3_8b_prefill", "varlen_packed", "mistral_window", "h100_headline")

_LIBRARY_IN_PATH = re.compile(r"\b(FlashInfer|FlashAttention-4) (\d[^\s,;]*)")


@dataclass
class Leaderboard:
    """The tables the page and the dashboard show."""

    rows: pd.DataFrame
    """One row per (scenario, gpu, variant, shape_id): status, median_ms, pct_ceiling, ceiling ('copy' or
    'matmul'), who, version, bundle (the folder it came from), label (the problem in words)."""
    summary: pd.DataFrame
    """One row per (scenario, gpu, variant), best first: who, version, score (geometric mean of pct_ceiling
    over the shapes it ran right), low, high, shapes (ran right), total, wrong, ceiling, bundles."""
    bundles: pd.DataFrame
    """Every bundle read: bundle, run_id, scenario, gpu, created, faprof (commit), rows (rows it gave the
    leaderboard), note (why it gave none)."""
    shapes: dict[tuple[str, str], list[str]] = field(default_factory=dict)
    """(scenario, gpu) -> its shape_ids in the scenario file's order."""


def library_version(path: Any) -> str | None:
    """'FlashInfer 0.6.18.post1' from a library row's path, or None."""
    m = _LIBRARY_IN_PATH.search(str(path or ""))
    return f"{m.group(1)} {m.group(2)}" if m else None


def who_of(variant: str, kind: Any) -> str:
    """faprof, PyTorch, library, user or reference (CPU): who wrote the kernel a row timed."""
    from faprof.model import variant as registry

    try:
        if "library" in registry.get(variant).tags:
            return "library"
    except FaprofError:
        pass  # a user's kernel, registered only in the run that timed it
    return WHO.get(str(kind), str(kind) if isinstance(kind, str) and kind else "user")


def version_of(row: pd.Series | dict[str, Any], env: dict[str, Any], who: str) -> str:
    """What ran, by version: the library's (from the row's path), torch's (and cuDNN's), faprof's commit."""
    path = str(row.get("path") or "")
    if who == "library":
        return library_version(path) or "version not recorded"
    if who == "PyTorch":
        v = f"torch {env.get('torch', '?')}"
        cudnn = row.get("variant") in ("sdpa_cudnn", "sdpa_auto") or "cudnn" in path.lower()
        return f"{v}, cuDNN {cudnn_text(env.get('cudnn'))}" if cudnn and env.get("cudnn") else v
    sha = str(env.get("git_sha") or "")[:8]
    if who == "faprof":
        return f"faprof {env.get('faprof', '?')}" + (f" @ {sha}" if sha else "")
    return f"faprof {sha}" if sha else ""


def cudnn_text(v: Any) -> str:
    """torch.backends.cudnn.version()'s integer (91900) as 9.19.0; anything else as it is."""
    try:
        n = int(v)
    except (TypeError, ValueError):
        return str(v)
    return f"{n // 10000}.{n % 10000 // 100}.{n % 100}" if n >= 10000 else str(n)


def ceiling_share(row: pd.Series | dict[str, Any]) -> tuple[float, str]:
    """(% of the measured ceiling, 'copy' or 'matmul') of a row: copy bandwidth where the problem is
    memory-bound, the measured matmul rate otherwise (NaN where the run measured no such ceiling)."""
    def num(c: str) -> float:
        return as_float(row.get(c))

    if str(row.get("bound")) == "memory":
        return num("pct_copy"), "copy"
    return num("pct_measured_ceiling"), "matmul"


def scenario_shapes(name: str) -> list[str] | None:
    """The shape_ids of shipped scenario `name`, in its file's order (None when no such file)."""
    from faprof.model.scenarios import SCENARIO_DIR, load_scenario

    path = SCENARIO_DIR / f"{name}.toml"
    if not path.is_file():
        return None
    return [p.shape_id for p in load_scenario(str(path)).problems]


def read_bundles(paths: Iterable[str | Path], scenarios: Sequence[str] | None = None
                 ) -> tuple[pd.DataFrame, dict[str, dict[str, Any]]]:
    """Measurement rows of every bundle under `paths` (tagged with run_id) and {run_id: manifest with its
    'path'}; sanitize bundles and bundles without rows are kept in the manifests (the page lists them).
    With `scenarios`, only bundles of those scenarios are read."""
    frames, manifests = [], {}
    for p in paths:
        for b in find_bundles(p):
            m = b.manifest()
            if scenarios is not None and str((m.get("scenario") or {}).get("name", "")) not in scenarios:
                continue
            run_id = str(m.get("run_id") or b.run_id)
            if run_id in manifests:
                continue
            manifests[run_id] = {**m, "path": str(b.path)}
            if m.get("kind") == "sanitize":
                continue
            df = Bundle.measurements(b)
            if not df.empty:
                frames.append(df.assign(run_id=run_id))
    meas = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    return meas, manifests


def build(meas: pd.DataFrame, manifests: dict[str, dict[str, Any]], scenarios: Sequence[str] | None = None,
          root: str | Path | None = None) -> Leaderboard:
    """The leaderboard of the rows given.

    Args:
        meas: measurement rows of several bundles, with run_id (read_bundles, or the dashboard's RunSet).
        manifests: run_id -> manifest, with the bundle's folder under 'path'.
        scenarios: the scenarios to rank (default: SCENARIOS; those without rows are left out).
        root: bundle paths are shown relative to it (default: as given).
    """
    def rel(p: str) -> str:
        if root is None:
            return p
        try:
            return str(Path(p).resolve().relative_to(Path(root).resolve()))
        except ValueError:
            return p

    info: dict[str, dict[str, Any]] = {}
    for run_id, m in manifests.items():
        env = m.get("env") or {}
        info[run_id] = {"bundle": rel(str(m.get("path", run_id))), "run_id": run_id,
                        "scenario": str((m.get("scenario") or {}).get("name", "")), "gpu": gpu_label(env),
                        "created": str(m.get("created_utc") or ""), "faprof": str(env.get("git_sha") or "")[:8],
                        "env": env}
    bundles = pd.DataFrame([{k: v for k, v in i.items() if k != "env"} for i in info.values()],
                           columns=["bundle", "run_id", "scenario", "gpu", "created", "faprof"])
    empty = Leaderboard(pd.DataFrame(), pd.DataFrame(), bundles.assign(rows=0, note=""))
    if meas.empty:
        return _noted(empty, manifests, list(scenarios or SCENARIOS), {})
    t = meas[meas["run_id"].isin(info)].copy()
    t["scenario"] = t["run_id"].map(lambda r: info[r]["scenario"])
    t["gpu"] = t["run_id"].map(lambda r: info[r]["gpu"])
    t["created"] = t["run_id"].map(lambda r: info[r]["created"])
    wanted = list(scenarios or SCENARIOS)
    order = {s: scenario_shapes(s) for s in wanted}
    t = t[t["scenario"].isin(wanted) & (t["variant_kind"] != "cpu" if "variant_kind" in t else True)]
    t = t[[sid in set(order[s] or []) for s, sid in zip(t["scenario"], t["shape_id"], strict=True)]]
    if t.empty:
        return _noted(empty, manifests, wanted, order)
    # the newest bundle's timed row of each (scenario, GPU, kernel, shape); its newest row where none was timed
    t["_timed"] = t["status"].isin(schema.TIMED) & (pd.to_numeric(t["median_ms"], errors="coerce") > 0)
    t = t.sort_values(["_timed", "created", "run_id"], ascending=[False, False, False], kind="stable")
    t = t.drop_duplicates(["scenario", "gpu", "variant", "shape_id"], keep="first")
    out = []
    for _, r in t.iterrows():
        env = info[r["run_id"]]["env"]
        who = who_of(str(r["variant"]), r.get("variant_kind"))
        pct, ceiling = ceiling_share(r)
        out.append({"scenario": r["scenario"], "gpu": r["gpu"], "variant": r["variant"], "shape_id": r["shape_id"],
                    "label": problem_label(r), "status": r["status"], "reason": str(r.get("reason") or ""),
                    "median_ms": r.get("median_ms"), "pct_ceiling": pct if r["status"] in schema.TIMED else math.nan,
                    "ceiling": ceiling, "who": who, "version": version_of(r, env, who),
                    "bundle": info[r["run_id"]]["bundle"], "run_id": r["run_id"]})
    rows = pd.DataFrame(out)
    shapes = {}
    for (s, g), part in rows.groupby(["scenario", "gpu"], sort=True):
        present = set(part["shape_id"])
        shapes[(str(s), str(g))] = [sid for sid in order[s] or [] if sid in present]
    summary = _summary(rows, shapes)
    lb = Leaderboard(rows, summary, bundles, shapes)
    return _noted(lb, manifests, wanted, order)


def _summary(rows: pd.DataFrame, shapes: dict[tuple[str, str], list[str]]) -> pd.DataFrame:
    recs = []
    for (s, g, v), part in rows.groupby(["scenario", "gpu", "variant"], sort=False):
        ok = part[(part["status"] == "ok") & (part["pct_ceiling"] > 0)]
        x = ok["pct_ceiling"].astype(float)
        score = float(math.exp(x.map(math.log).mean())) if len(x) else math.nan
        recs.append({"scenario": s, "gpu": g, "variant": v, "who": part["who"].iloc[0],
                     "version": "; ".join(dict.fromkeys(part["version"])),
                     "score": score, "low": float(x.min()) if len(x) else math.nan,
                     "high": float(x.max()) if len(x) else math.nan, "shapes": len(ok),
                     "total": len(shapes.get((str(s), str(g)), [])), "wrong": int((part["status"] == "wrong").sum()),
                     "ceiling": "/".join(sorted(set(ok["ceiling"]) or set(part["ceiling"]))),
                     "bundles": ", ".join(dict.fromkeys(part["bundle"])),
                     "not_run": _why_not(part)})
    out = pd.DataFrame(recs)
    if out.empty:
        return out
    # kernels timed right on every shape first (a mean over fewer shapes is not comparable), then by score
    out["_partial"] = out["shapes"] < out["total"]
    out["_none"] = out["shapes"] == 0
    out = out.sort_values(["scenario", "gpu", "_none", "_partial", "score"], ascending=[True, True, True, True, False],
                          kind="stable")
    return out.drop(columns=["_partial", "_none"]).reset_index(drop=True)


def _why_not(part: pd.DataFrame) -> str:
    """The reason a kernel has no score on some shapes, once per distinct reason ('' when it ran them all)."""
    bad = part[part["status"] != "ok"]
    words = [f"{r['status']}: {r['reason']}" if r["reason"] else str(r["status"]) for _, r in bad.iterrows()]
    return "; ".join(dict.fromkeys(words))


def _noted(lb: Leaderboard, manifests: dict[str, dict[str, Any]], wanted: Sequence[str] | None,
           order: dict[str, list[str] | None]) -> Leaderboard:
    """Each bundle's count of leaderboard rows and, where none, why."""
    used = lb.rows.groupby("run_id").size() if not lb.rows.empty else pd.Series(dtype=int)
    notes, counts = [], []
    for _, b in lb.bundles.iterrows():
        m = manifests.get(b["run_id"], {})
        n = int(used.get(b["run_id"], 0))
        counts.append(n)
        if n:
            notes.append("")
        elif m.get("kind") == "sanitize":
            notes.append("a compute-sanitizer run (no timings)")
        elif b["scenario"] not in (wanted or ()):
            notes.append("not a scenario the leaderboard ranks")
        else:
            notes.append("every row replaced by a newer bundle's, or of shapes the scenario no longer has")
    lb.bundles = lb.bundles.assign(rows=counts, note=notes).sort_values(["scenario", "gpu", "created"],
                                                                       ascending=[True, True, False], kind="stable")
    return lb


def created_text(stamp: str) -> str:
    """'2026-11-28 02:51 UTC' of a bundle's stamp (the stamp itself when it cannot be read)."""
    when = parse_stamp(stamp)
    return when.strftime("%Y-%m-%d %H:%M UTC") if when else stamp
