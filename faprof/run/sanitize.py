"""`faprof sanitize VARIANT`: run a variant under NVIDIA compute-sanitizer and tabulate what it reports.

For each tool (memcheck, racecheck, initcheck, synccheck) faprof runs the Nsight target process
(`python -m faprof.nsight.target --tool none`: fresh inputs, 3 warm-up calls and 1 call of every
selected (variant, shape) pair) under ``compute-sanitizer --tool T``, keeps the tool's text output
in the bundle (raw/sanitizer_<tool>.txt) and parses it into `sanitizer.parquet`: one row per
(tool, severity, kind, function, source line) with the number of reports (racecheck's
"[N hazards]" counted as N).

The parser reads compute-sanitizer's documented text format: every line starts with the
``=========`` prefix; a report starts on a line with no further indent ("Invalid __global__ read
of size 4 bytes", "Error: Race reported between Write access at ... and Read access at ...
[32 hazards]", "Uninitialized __global__ memory read of size 4 bytes", "Barrier error detected.
...", "Program hit cudaErrorLaunchFailure (error 719) ..."), and its indented continuation lines
name the place: ``at FUNCTION+0xOFFSET in FILE:LINE`` (newer releases) or
``at 0xOFFSET in FILE:LINE:FUNCTION`` (older ones); FILE:LINE needs `-lineinfo`, which faprof's
and user kernels are built with. Summary lines (ERROR SUMMARY, RACECHECK SUMMARY) give the totals.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from faprof import variants
from faprof.errors import FaprofError
from faprof.model.plan import select_shapes
from faprof.model.scenarios import load_scenario
from faprof.store import Bundle, utc_stamp
from faprof.variants import build

TOOLS = ("memcheck", "racecheck", "initcheck", "synccheck")

#: Columns of sanitizer.parquet.
COLUMNS = ("tool", "severity", "kind", "kernel", "source", "count", "message")

#: Where a CUDA toolkit usually lives when it is not on PATH.
DEFAULT_CUDA_ROOTS = (Path("/usr/local/cuda"),)

#: Reports compute-sanitizer prints per tool run at most (--print-limit).
PRINT_LIMIT = 1000

_PREFIX = re.compile(r"^=+ ?")
_AT_NEW = re.compile(r"\bat (?P<func>.+?)\+0x[0-9a-fA-F]+ in (?P<file>\S+?):(?P<line>\d+)\b")
_AT_OLD = re.compile(r"\bat 0x[0-9a-fA-F]+ in (?P<file>[^:\s]+):(?P<line>\d+):(?P<func>.+?)(?: \[\d+ hazards?\])?$")
_AT_NOFILE = re.compile(r"\bat (?P<func>[^\s+]+)\+0x[0-9a-fA-F]+\b")
_HAZARDS = re.compile(r"\[(\d+) hazards?\]")
_SEVERITY = re.compile(r"^(?P<sev>Error|ERROR|Warning|WARNING|Info|INFO): (?P<rest>.*)$")
_RACE = re.compile(r"Race reported between (?P<a>\w+) access .*?and (?P<b>\w+) access", re.S)
_API = re.compile(r"^Program hit (?P<err>\w+)")
_SIZE = re.compile(r" of size \d+ bytes?")
_NOT_REPORTS = ("COMPUTE-SANITIZER", "ERROR SUMMARY", "RACECHECK SUMMARY", "LEAK SUMMARY", "Target application")


@dataclass
class Report:
    """One report of the tool (a first line and its indented continuation lines)."""

    lines: list[str]

    def text(self) -> str:
        return "\n".join(self.lines)


def split_reports(text: str) -> tuple[list[Report], list[str]]:
    """compute-sanitizer output -> (reports, summary lines). Lines without the ===== prefix (the
    application's own output) are ignored."""
    reports: list[Report] = []
    summaries: list[str] = []
    current: Report | None = None
    for raw in text.splitlines():
        if not raw.startswith("="):
            continue
        body = _PREFIX.sub("", raw, count=1)
        if not body.strip():
            current = None
            continue
        if body[0].isspace():  # continuation of the current report
            if current is not None:
                current.lines.append(body.strip())
            continue
        if body.startswith(_NOT_REPORTS):
            current = None
            if "SUMMARY" in body:
                summaries.append(body.strip())
            continue
        current = Report([body.strip()])
        reports.append(current)
    return reports, summaries


def classify(report: Report, tool: str) -> dict[str, Any]:
    """One report -> {tool, severity, kind, kernel, source, count, message}."""
    first = report.lines[0]
    severity = "error"
    m = _SEVERITY.match(first)
    if m:
        severity = m.group("sev").lower()
        first = m.group("rest")
    whole = " ".join(report.lines)
    if (r := _RACE.search(whole)) is not None:
        kind = f"race {r.group('a').lower()}-{r.group('b').lower()}"
    elif (a := _API.match(first)) is not None:
        kind = f"api error {a.group('err')}"
    else:
        kind = _SIZE.sub("", first).rstrip(".").strip()
    func, source = "", ""
    for line in report.lines:
        found = _AT_NEW.search(line) or _AT_OLD.search(line)
        if found:
            func, source = found.group("func").strip(), f"{found.group('file')}:{found.group('line')}"
            break
        nofile = _AT_NOFILE.search(line)
        if nofile and not func:
            func = nofile.group("func")
    hz = _HAZARDS.search(whole)
    return {"tool": tool, "severity": severity, "kind": kind, "kernel": func, "source": source,
            "count": int(hz.group(1)) if hz else 1, "message": report.lines[0]}


def parse_output(text: str, tool: str) -> pd.DataFrame:
    """A tool's text output -> sanitizer rows, aggregated over identical (tool, severity, kind,
    kernel, source): `count` sums the reports (hazards for racecheck), `message` keeps the first."""
    reports, _ = split_reports(text)
    rows = [classify(r, tool) for r in reports]
    if not rows:
        return pd.DataFrame(columns=list(COLUMNS))
    df = pd.DataFrame(rows)
    keys = ["tool", "severity", "kind", "kernel", "source"]
    out = df.groupby(keys, sort=False, dropna=False).agg(count=("count", "sum"), message=("message", "first"))
    return out.reset_index()[list(COLUMNS)]


def error_summary(text: str) -> int | None:
    """The number of hazards the tool reported: 'ERROR SUMMARY: N errors' (memcheck, initcheck,
    synccheck), or racecheck's 'RACECHECK SUMMARY: N hazards displayed (E errors, W warnings)';
    None when the tool printed neither (it did not finish)."""
    _, summaries = split_reports(text)
    for pattern in (r"ERROR SUMMARY: (\d+) errors?", r"RACECHECK SUMMARY: (\d+) hazards? displayed"):
        for s in summaries:
            m = re.match(pattern, s)
            if m:
                return int(m.group(1))
    return None


# ---------------------------------------------------------------------------------- running
def find_compute_sanitizer() -> str:
    """compute-sanitizer on PATH, in $CUDA_HOME/bin or /usr/local/cuda/bin; FaprofError otherwise."""
    which = shutil.which("compute-sanitizer")
    if which:
        return which

    homes = [Path(os.environ[v]) for v in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(v)]
    home = build.find_cuda_home()
    if home is not None:
        homes.append(home)
    homes.extend(DEFAULT_CUDA_ROOTS)
    for h in homes:
        for c in (h / "bin" / "compute-sanitizer", h / "compute-sanitizer" / "compute-sanitizer"):
            if c.is_file() and os.access(c, os.X_OK):
                return str(c)
    raise FaprofError("compute-sanitizer was not found on PATH, in $CUDA_HOME/bin or in /usr/local/cuda/bin; it comes "
                      "with the CUDA toolkit (e.g. `apt install cuda-sanitizer-13-0`), or put its folder on PATH")


def parse_tools(text: str | None) -> list[str]:
    tools = [t.strip() for t in (text or ",".join(TOOLS)).split(",") if t.strip()]
    bad = [t for t in tools if t not in TOOLS]
    if bad or not tools:
        raise FaprofError(f"--tool {text!r}: choose from {', '.join(TOOLS)} (comma-separated)")
    return list(dict.fromkeys(tools))


def sanitizer_command(sanitizer: str, tool: str, target_argv: Sequence[str]) -> list[str]:
    """compute-sanitizer's command line for one tool around the target process."""
    return [sanitizer, "--tool", tool, "--print-limit", str(PRINT_LIMIT), *target_argv]


def run(variant: str, scenario_spec: str, tools: Sequence[str], out_dir: Path, shapes: Sequence[str] = ("smallest",),
        user_variants: Sequence[str] = (), timeout_s: float = 900.0,
        progress: Callable[[str], None] = lambda _m: None) -> Any:
    """Run `variant` (a name, or comma-separated names) on the scenario's selected shapes under each tool;
    returns the bundle. Pairs a variant does not support are skipped by the target."""

    sanitizer = find_compute_sanitizer()
    for spec in user_variants:
        variants.load_user_variants(spec)
    vs = variants.resolve(variant)  # one name or a comma-separated list
    scenario = load_scenario(scenario_spec)
    shape_ids = select_shapes(scenario, shapes)
    supported = [p.shape_id for p in scenario.problems if p.shape_id in shape_ids and
                 any(v.supports(p, cuda_available=True)[0] for v in vs)]
    if not supported:
        raise FaprofError(f"{variant} supports none of the shapes {', '.join(shape_ids)} of {scenario.name}; "
                          "choose other shapes (--shapes) or another scenario")
    import torch

    if not torch.cuda.is_available():
        raise FaprofError("faprof sanitize needs an NVIDIA GPU with CUDA; none is visible here (see `faprof doctor`)")
    if any(v.needs_extension for v in vs):  # build outside the sanitizer (nvcc under it would be slow and checked for nothing)

        build.load(on_status=progress)
    gpu = torch.cuda.get_device_name(0)
    label = vs[0].name if len(vs) == 1 else f"{len(vs)}-variants"
    bundle = Bundle.create(out_dir, f"sanitize {label} {scenario.name}", gpu, {
        "kind": "sanitize", "scenario": {"name": scenario.name, "path": str(scenario.path) if scenario.path else None},
        "env": {"gpu_name": gpu}, "settings": {"variants": [v.name for v in vs], "shapes": supported, "tools": list(tools),
                                               "user_variants": list(user_variants), "sanitizer": sanitizer},
    })
    frames, totals = [], {}
    for tool in tools:
        plan_out = bundle.raw_dir() / f"plan_{tool}.json"
        target = [sys.executable, "-m", "faprof.nsight.target", "--scenario", str(scenario.path or scenario_spec),
                  "--tool", "none", "--variants", ",".join(v.name for v in vs), "--shapes", ",".join(supported), "--iters", "1",
                  "--plan-out", str(plan_out)]
        for spec in user_variants:
            target += ["--user-variants", spec]
        progress(f"{tool}: {variant} on {', '.join(supported)}")
        try:
            proc = subprocess.run(sanitizer_command(sanitizer, tool, target), capture_output=True, text=True,
                                  timeout=timeout_s, env={**os.environ, "PYTHONUNBUFFERED": "1"})
            text = proc.stdout + proc.stderr
        except subprocess.TimeoutExpired as e:
            text = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
            text += f"\nfaprof: compute-sanitizer --tool {tool} ran past {timeout_s:.0f} s and was stopped\n"
        (bundle.raw_dir() / f"sanitizer_{tool}.txt").write_text(text)
        frames.append(parse_output(text, tool))
        totals[tool] = error_summary(text)
    df = pd.concat([f for f in frames if not f.empty], ignore_index=True) if any(not f.empty for f in frames) \
        else pd.DataFrame(columns=list(COLUMNS))
    df["count"] = df["count"].astype("int64")
    bundle.write("sanitizer", df)
    bundle.update_manifest(status="complete", finished_utc=utc_stamp(), sanitizer_error_summary=totals)
    return bundle


# ---------------------------------------------------------------------------------- reading
def tool_totals(bundle: Any) -> pd.DataFrame:
    """One row per tool of a sanitize bundle: hazards reported (from the tool's own summary line in
    the kept raw output, read with this faprof's parser; else the manifest's), findings parsed, and
    a status ('clean', 'N reported', 'did not finish')."""
    m = bundle.manifest()
    tools = list((m.get("settings") or {}).get("tools") or [])
    recorded = m.get("sanitizer_error_summary") or {}
    table = bundle.read("sanitizer")
    rows = []
    for tool in tools:
        raw = bundle.path / "raw" / f"sanitizer_{tool}.txt"
        total = error_summary(raw.read_text(errors="replace")) if raw.exists() else recorded.get(tool)
        found = int(table[table["tool"] == tool]["count"].sum()) if not table.empty and "tool" in table else 0
        status = "did not finish" if total is None else ("clean" if total == 0 else f"{total} reported")
        rows.append({"tool": tool, "hazards": total, "findings": found, "status": status})
    return pd.DataFrame(rows, columns=["tool", "hazards", "findings", "status"])


def markdown(bundle: Any) -> str:
    """A short Markdown report of a `faprof sanitize` bundle: what ran, each tool's total, the findings."""
    m = bundle.manifest()
    st = m.get("settings") or {}
    gpu = (m.get("env") or {}).get("gpu_name") or "a GPU"
    lines = [f"# compute-sanitizer: {', '.join(st.get('variants') or [])} on {gpu}", "",
             f"Run `{m.get('run_id')}` · scenario {(m.get('scenario') or {}).get('name')} · shapes "
             f"{', '.join(f'`{x}`' for x in st.get('shapes') or [])} · tools {', '.join(st.get('tools') or [])}.", "",
             "## Each tool", ""]
    totals = tool_totals(bundle)
    lines += [totals.to_markdown(index=False), ""]
    table = bundle.read("sanitizer")
    lines += ["## Findings", ""]
    if table.empty:
        lines.append("None: no tool reported a hazard." if (totals["status"] == "clean").all() else
                     "No finding parsed (see each tool's status above and its raw output under raw/).")
    else:
        lines.append(table.to_markdown(index=False))
    return "\n".join(lines) + "\n"
