"""`rlhfkit doctor RUN_DIR` and `rlhfkit report RUN_DIR [RUN_DIR ...]`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rlhfkit.commands.runs import config_defaults
from rlhfkit.core.argv import OptionsHelpFormatter, RawDescriptionOptionsHelpFormatter, parse_command_line
from rlhfkit.diagnostics.findings import SEVERITIES, Finding, severity_rank, summarize
from rlhfkit.diagnostics.monitor import diagnose
from rlhfkit.diagnostics.report import build_report, png_note
from rlhfkit.diagnostics.rules import RULES
from rlhfkit.diagnostics.rundir import load_run
from rlhfkit.diagnostics.thresholds import Thresholds
from rlhfkit.errors import ConfigError, UserError

DOCTOR_EPILOG = """\
exit status:
  0  no critical finding (info and warnings may exist)
  1  at least one critical finding (recomputed from metrics.jsonl; from diagnostics.jsonl
     only when metrics.jsonl is absent or empty)
  2  usage error (no such run folder, malformed files, unknown threshold)

Works on a running run too: an incomplete last line of metrics.jsonl is skipped.
RUN_DIR may also be another tool's log: a TRL / transformers output folder (trainer_state.json),
a trainer_state.json file, or a JSONL file of rows with a "step" key; TRL's metric names are
mapped to rlhfkit's (objective/kl -> rollout/kl, policy/clipfrac_avg -> params/policy_clip_frac,
...). Without params/max_grad_norm in the log, gradient norms are judged against max_grad_norm
in the run's config.yaml, else 1.0.
Rules and thresholds: docs/diagnostics.md.
"""


def _thresholds(args: argparse.Namespace) -> Thresholds:
    values: dict[str, object] = {}
    if args.thresholds:
        import yaml

        path = Path(args.thresholds)
        try:
            loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
        except OSError as e:
            raise UserError(f"cannot read thresholds file '{path}': {e.strerror or e}") from None
        except yaml.YAMLError as e:
            raise ConfigError(f"thresholds file '{path}' is not valid YAML: {e}") from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"thresholds file '{path}' must hold a mapping name: value")
        values.update(loaded)
    for item in args.set or []:
        name, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"--set expects NAME=VALUE, got '{item}'")
        values[name.strip()] = value.strip()
    return Thresholds.from_mapping(values)


def _add_threshold_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--set", action="append", metavar="NAME=VALUE",
                   help="override one diagnostics threshold, e.g. --set clip_frac_warn=0.3 (repeatable; "
                        "names: see docs/diagnostics.md or `rlhfkit doctor --list-rules`)")
    p.add_argument("--thresholds", metavar="FILE",
                   help="YAML file mapping threshold names to values (applied before --set)")


def _print_findings(console, title: str, findings: list[Finding]) -> None:  # noqa: ANN001
    from rich.text import Text

    from rlhfkit.diagnostics.console import SEVERITY_STYLE

    console.print(Text(title, style="bold"))
    if not findings:
        console.print("  none")
    for f in findings:
        line = Text(f"  {f.severity.upper():>8} ", style=SEVERITY_STYLE[f.severity])
        line.append(f"{f.rule} @ it {f.iteration}: ", style="bold")
        line.append(f.message)
        console.print(line)
        console.print(Text(f"           -> {f.action}", style="dim"))


def _list_rules() -> str:
    lines = ["rules (name: what it detects; metrics it reads):"]
    for r in RULES.values():
        lines.append(f"  {r.name}: {r.summary}; {', '.join(r.metrics)}")
    lines.append("")
    lines.append("thresholds (name = default):")
    lines += [f"  {k} = {v}" for k, v in Thresholds().to_dict().items()]
    return "\n".join(lines)


def doctor_parser() -> argparse.ArgumentParser:
    """The options of `rlhfkit doctor`."""
    p = argparse.ArgumentParser(
        prog="rlhfkit doctor", description="Diagnose a finished or running training run: recompute the "
        "training-health findings from RUN_DIR/metrics.jsonl and show those recorded during training "
        "(RUN_DIR/diagnostics.jsonl).", epilog=DOCTOR_EPILOG, formatter_class=RawDescriptionOptionsHelpFormatter)
    p.add_argument("run_dir", nargs="?", metavar="RUN_DIR", help="a run folder, e.g. runs/ppo-demo (or a TRL "
                   "output folder, trainer_state.json or JSONL log)")
    p.add_argument("--all", action="store_true",
                   help="list every finding as it would have been reported online (first time and each "
                        "time it worsened) instead of the worst one per problem")
    p.add_argument("--min-severity", choices=SEVERITIES, default="info",
                   help="hide findings below this severity (default: info, i.e. show all)")
    p.add_argument("--json", action="store_true",
                   help="print the recomputed findings as a JSON list (for scripts) instead of text")
    p.add_argument("--list-rules", action="store_true", help="list the rules and thresholds, then exit")
    _add_threshold_args(p)
    return p


def doctor_main(argv: list[str]) -> int:
    """Print the training-health findings of a run; exit 1 on a critical finding."""
    p = doctor_parser()
    args = parse_command_line(p, argv)
    if args.list_rules:
        print(_list_rules())
        return 0
    if not args.run_dir:
        p.error("RUN_DIR is required")
    thresholds = _thresholds(args)
    run = load_run(args.run_dir)
    recomputed = diagnose(run.metrics, thresholds, defaults=run.defaults)
    shown = recomputed if args.all else summarize(recomputed)
    stored = run.diagnostics if args.all else summarize(run.diagnostics)
    floor = severity_rank(args.min_severity)
    shown = [f for f in shown if f.rank >= floor]
    stored = [f for f in stored if f.rank >= floor]
    basis = recomputed if run.metrics else run.diagnostics
    status = 1 if any(f.severity == "critical" for f in basis) else 0
    if args.json:
        print(json.dumps([f.to_dict() for f in shown], indent=2))
        return status

    from rich.console import Console

    console = Console(highlight=False, soft_wrap=True)  # long lines stay greppable in logs
    last = run.last_iteration
    state = "finished" if run.finished else "no summary.json yet (running or stopped)"
    if run.source != "rlhfkit":
        state = f"a {run.source} log"
    console.print(f"rlhfkit doctor {run.path}: {len(run.metrics)} iterations"
                  + (f" (last {last})" if last is not None else "") + f", {state}", markup=False)
    for note in run.notes:
        console.print(f"  note: {note}", markup=False)
    log_name = run.path.name if run.path.is_file() else "metrics.jsonl"
    _print_findings(console, f"Findings recomputed from {log_name}:", shown)
    if run.diagnostics or (run.path / "diagnostics.jsonl").exists():
        _print_findings(console, "Reported during training (diagnostics.jsonl):", stored)
    counts = {s: sum(f.severity == s for f in summarize(basis)) for s in SEVERITIES}
    verdict = "critical problems found" if status else ("warnings" if counts["warning"] else "healthy")
    console.print(f"{counts['critical']} critical, {counts['warning']} warning, {counts['info']} info: "
                  f"{verdict} (exit status {status})", markup=False)
    return status


def _parse_iterations(text: str | None) -> list[int] | None:
    if not text:
        return None
    try:
        return [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise UserError(f"--iterations expects comma-separated integers, got '{text}'") from None


def report_parser() -> argparse.ArgumentParser:
    """The options of `rlhfkit report`."""
    p = argparse.ArgumentParser(formatter_class=OptionsHelpFormatter,
        prog="rlhfkit report", description="Build a self-contained HTML report of one or more runs: every "
        "metric over iterations (runs overlaid), the findings, sample completions with rewards, the "
        "config and the summary. It opens offline; a PNG of each chart is written to plots/ beside it.")
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run folder(s), e.g. runs/ppo-a runs/ppo-b")
    p.add_argument("--out", metavar="DIR",
                   help="output folder for report.html and plots/ (default: FIRST_RUN_DIR/report/)")
    p.add_argument("--iterations", metavar="I,J,...",
                   help="iterations whose sample completions to show (nearest logged ones; default: "
                        "4 evenly spaced, first and last included)")
    p.add_argument("--samples", type=int, default=4, metavar="N",
                   help="completions shown per chosen iteration (default: 4)")
    p.add_argument("--no-png", action="store_true", help="skip the PNG charts (the HTML has inline SVG charts)")
    p.add_argument("--title", help="report title (default: the run names)")
    _add_threshold_args(p)
    return p


def report_main(argv: list[str]) -> int:
    """Build a self-contained HTML report (plus PNG charts) of one or more runs."""
    args = parse_command_line(report_parser(), argv)
    if args.samples < 0:
        raise UserError(f"--samples must be >= 0, got {args.samples}")
    thresholds = _thresholds(args)
    runs = [load_run(d) for d in args.run_dirs]
    first = Path(args.run_dirs[0])
    out = Path(args.out) if args.out else (first if first.is_dir() else first.parent) / "report"
    path = build_report(runs, out, iterations=_parse_iterations(args.iterations),
                        samples_per_iteration=args.samples, png=not args.no_png, thresholds=thresholds,
                        title=args.title, config_defaults=config_defaults)
    print(f"wrote {path}" + ("" if args.no_png else png_note(path)))
    return 0
