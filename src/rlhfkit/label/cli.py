"""`rlhfkit label pairs|serve|invite|export|stats`: collect human preferences in a local web app.

Typical session::

    rlhfkit label pairs --prompts builtin:reviews --limit 20 --out pairs.jsonl
    rlhfkit label serve --pairs pairs.jsonl --votes-per-pair 2      # open the printed URL
    rlhfkit label invite alice --pairs pairs.jsonl                  # a personal link (--auth invite)
    rlhfkit label stats --pairs pairs.jsonl
    rlhfkit label export --pairs pairs.jsonl --out prefs.jsonl   # for `rlhfkit rm` / `rlhfkit dpo`

Every bad option or path is one line (``rlhfkit: error: ...``) and exit code 2; ``stats`` and
``export`` open the database read-only.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from rlhfkit.core.argv import parse_command_line
from rlhfkit.errors import DataError, UserError
from rlhfkit.label.db import writes_reported
from rlhfkit.label.export import preference_rows, write_jsonl
from rlhfkit.label.files import check_output, database_files, looks_like_pairs_file
from rlhfkit.label.identity import clean_name, printable
from rlhfkit.label.options import OneLineParser, check_duration, check_number, check_positive, default_db
from rlhfkit.label.pairs import sample_pairs, write_pairs
from rlhfkit.label.queries import ReadOnlyStore
from rlhfkit.label.records import LabelError
from rlhfkit.label.serve import cmd_serve
from rlhfkit.label.stats import compute_stats, format_stats
from rlhfkit.label.store import MAX_VOTES_PER_PAIR, LabelStore

DEFAULT_MODEL = "smollm2-135m-instruct"
DEFAULT_URL = "http://127.0.0.1:8000/"

__all__ = ["build_parser", "default_db", "main"]


# --------------------------------------------------------------------------- parser


def _add_db_args(p: argparse.ArgumentParser) -> None:
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--db", help="labelling database (SQLite) written by `label serve`")
    g.add_argument("--pairs", help="pairs file; the database is the default one next to it (PAIRS.labels.sqlite)")


def _add_pairs_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("pairs", help="sample two responses per prompt into a pairs file",
                       description="Sample two responses per prompt (two from one model, or one from each of two).")
    p.add_argument("--prompts", required=True, help="prompt set: builtin:NAME or a local file")
    p.add_argument("--split", default="train", help="split of the prompt set (default: train)")
    p.add_argument("--limit", type=int, default=50, help="number of prompts to use; 0 = all (default: 50)")
    p.add_argument("--model-a", "--model", dest="model_a", default=DEFAULT_MODEL,
                   help=f"model for response A (and B when --model-b is not given) (default: {DEFAULT_MODEL})")
    p.add_argument("--model-b", default=None, help="second model; response B comes from it")
    p.add_argument("--max-new-tokens", type=int, default=64, help="tokens per response, 1..32768 (default: 64)")
    p.add_argument("--temperature", type=float, default=1.0,
                   help="sampling temperature, above 0 and at most 100 (default: 1.0)")
    p.add_argument("--seed", type=int, default=0, help="seed for prompt selection and sampling (default: 0)")
    p.add_argument("--out", required=True, help="pairs file to write (JSONL)")
    p.add_argument("--force", action="store_true", help="overwrite --out if it exists")


def _add_serve_parser(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("serve", help="start the labelling web app",
                       description="Serve the labelling app. Votes go to a SQLite database (WAL mode).")
    s.add_argument("--pairs", required=True, help="pairs file (JSONL) to label")
    s.add_argument("--db", default=None, help="database file (default: PAIRS.labels.sqlite next to the pairs)")
    s.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default: 127.0.0.1); any non-loopback address needs --auth invite")
    s.add_argument("--port", type=int, default=8000, help="port (default: 8000)")
    s.add_argument("--auth", choices=["open", "invite"], default=None,
                   help="open: labellers type a name (loopback only); invite: each signs in with the link from "
                        "`label invite NAME` (default: open on loopback, invite otherwise)")
    s.add_argument("--token", default=None,
                   help="extra access token required on every request, 8-128 characters of letters, digits and "
                        "_.~- (default: $RLHFKIT_LABEL_TOKEN; prefer the variable: an option shows in `ps` to "
                        "every user of the machine)")
    s.add_argument("--votes-per-pair", type=int, default=1,
                   help="how many different labellers see each pair, 1..1000 (default: 1)")
    s.add_argument("--lease-minutes", type=float, default=30.0,
                   help="a pair shown but not answered for this long may go to another labeller, "
                        "1..10080 (default: 30)")
    s.add_argument("--criteria", default=None,
                   help="criteria labellers may also rate, comma-separated, at most 8 names of lower-case letters, "
                        "digits, _ and - (e.g. helpfulness,harmlessness,honesty); each on the vote's 5-point scale "
                        "(default: none)")
    s.add_argument("--guidelines", default=None,
                   help="Markdown file shown to labellers in a guidelines pane, at most 64 KiB (default: none)")
    s.add_argument("--lead-token", default=None,
                   help="secret of the lead's view (/lead: disputed pairs, final labels), 8-128 characters of "
                        "letters, digits and _.~- (default: $RLHFKIT_LABEL_LEAD_TOKEN; no lead view without one; "
                        "prefer the variable: an option shows in `ps`)")
    s.add_argument("--log-level", default="warning", choices=["critical", "error", "warning", "info", "debug"],
                   help="server log level (default: warning)")


def build_parser() -> argparse.ArgumentParser:
    """The `rlhfkit label` parser with its five subcommands."""
    parser = OneLineParser(
        prog="rlhfkit label",
        description="Collect human preferences: sample pairs, label them in a local web app, export.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    _add_pairs_parser(sub)
    _add_serve_parser(sub)

    i = sub.add_parser("invite", help="give a labeller a personal sign-in link (for `serve --auth invite`)",
                       description="Create a labeller (if new) and print their personal sign-in link. "
                                   "Inviting the same name again replaces the link.")
    i.add_argument("name", help="labeller name: letters, digits, spaces and . _ - @ ' (case and width are ignored)")
    _add_db_args(i)
    i.add_argument("--url", default=DEFAULT_URL, help=f"address the labellers open (default: {DEFAULT_URL})")
    i.add_argument("--expires", default="7d",
                   help="how long the link works: minutes, hours or days such as 30m, 12h, 7d, at most 366d "
                        "(default: 7d); browsers signed in with it are signed out then")
    i.add_argument("--revoke", action="store_true",
                   help="make the labeller's link stop working and sign out their browsers (votes are kept)")

    e = sub.add_parser("export", help="write preference JSONL for `rlhfkit rm` / `rlhfkit dpo`",
                       description="Aggregate votes into preference pairs (prompt, chosen, rejected, strength, margin).")
    _add_db_args(e)
    e.add_argument("--out", required=True,
                   help="preference JSONL to write: a regular file or a new name, or - for standard output "
                        "(never a device, FIFO, socket or a path in /dev, /proc or /sys)")
    e.add_argument("--force", action="store_true", help="overwrite --out if it exists")
    e.add_argument("--ties", choices=["drop", "keep-as-half"], default="drop",
                   help="pairs judged the same: drop them, or keep both orders as half a win each (default: drop)")
    e.add_argument("--aggregate", choices=["mean", "none"], default="mean",
                   help="mean: one row per pair from the mean signed score; none: one row per vote (default: mean)")
    e.add_argument("--min-votes", type=int, default=1, help="skip pairs with fewer votes, 1..1000 (default: 1)")
    e.add_argument("--resolve", action="store_true",
                   help="pairs with a lead's final label (set in /lead) are exported from that label instead of "
                        "the votes (default: votes only)")
    e.add_argument("--margin-scale", type=float, default=1.0,
                   help="margin = |mean score| / 2 * this; 1.0 for a unanimous 'significantly' (default: 1.0)")

    t = sub.add_parser("stats", help="counts, per-labeller activity and agreement (kappa)",
                       description="Show counts, per-labeller activity and Fleiss'/Cohen's kappa.")
    _add_db_args(t)
    t.add_argument("--json", action="store_true", help="print the statistics as JSON")
    return parser


# --------------------------------------------------------------------------- commands


def cmd_pairs(args: argparse.Namespace) -> int:
    """Sample responses and write the pairs file (never an empty one)."""
    check_number("--limit", args.limit, 0, 10**9)
    check_number("--max-new-tokens", args.max_new_tokens, 1, 32768)
    check_positive("--temperature", args.temperature, 100.0)
    check_number("--seed", args.seed, 0, 2**32 - 2)
    prompts_file = Path(args.prompts)
    out = check_output(args.out, args.force, [("prompts file", prompts_file)] if prompts_file.is_file() else [])
    from rlhfkit.data.prompts import load_prompts  # lazy: heavy imports
    from rlhfkit.rollout.texts import sample_texts

    rows = load_prompts(args.prompts, split=args.split, limit=args.limit or None, seed=args.seed)
    prompts = [r["prompt"] for r in rows]
    if not prompts:
        raise DataError(f"{args.prompts}: no prompts")
    print(f"sampling 2 responses for {len(prompts)} prompt(s) ...", file=sys.stderr)
    pairs, dropped = sample_pairs(
        prompts, sample_texts, args.model_a, args.model_b,
        max_new_tokens=args.max_new_tokens, temperature=args.temperature, seed=args.seed,
    )
    if not pairs:
        raise DataError(f"no pairs: the two responses were identical for all {len(prompts)} prompt(s); "
                        f"{out} not written (use a higher --temperature or two models)")
    write_pairs(pairs, out)
    note = f" ({dropped} dropped: identical responses or duplicates)" if dropped else ""
    print(f"wrote {len(pairs)} pair(s) to {out}{note}")
    return 0


def _db_path(args: argparse.Namespace) -> Path:
    return Path(args.db) if args.db else default_db(args.pairs)


def invite_link(base_url: str, token: str) -> str:
    """``http://h:8000/`` -> ``http://h:8000/?invite=T``; a query already there (``?token=...``,
    the access token of `serve --token`) is kept."""
    parts = urlsplit(base_url)
    query = parse_qsl(parts.query, keep_blank_values=True) + [("invite", token)]
    return urlunsplit((parts.scheme, parts.netloc, parts.path or "/", urlencode(query), ""))


def cmd_invite(args: argparse.Namespace) -> int:
    """Create or re-key a labeller and print their sign-in link (or revoke it)."""
    try:
        clean_name(args.name)
    except ValueError as e:
        raise UserError(f"NAME {args.name!r}: {e}") from None
    if not args.url.startswith(("http://", "https://")) or any(c.isspace() for c in args.url):
        raise UserError(f"--url must be an http:// or https:// address, got {args.url!r}")
    expires = check_duration("--expires", args.expires, 366)
    if args.pairs and not Path(args.pairs).is_file():
        raise DataError(f"{args.pairs}: pairs file not found")
    db = _db_path(args)
    with writes_reported(db):  # a read-only file or folder, a full disk: one line
        store = LabelStore(db)
        try:
            if args.revoke:
                print(f"{printable(store.revoke(args.name))}'s invitation link no longer works (their votes are kept)")
                return 0
            name, token = store.invite(args.name, expires_seconds=expires)
            until = store.invite_expires_at(args.name) or ""
        except LabelError as e:
            raise UserError(str(e)) from None
        finally:
            store.close()
    print(f"invited {printable(name)}; their personal link, valid until {until[:16].replace('T', ' ')} UTC (it signs them "
          "in: send it to them only; inviting the name again replaces it):")
    print(invite_link(args.url, token))
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    """Write preference JSONL from the stored votes (database opened read-only)."""
    check_number("--min-votes", args.min_votes, 1, MAX_VOTES_PER_PAIR)
    check_positive("--margin-scale", args.margin_scale, 1e6)
    db = _db_path(args)
    inputs = [("labelling database", f) for f in database_files(db)]
    inputs += [("pairs file", Path(args.pairs))] if args.pairs else []
    out = None if args.out == "-" else check_output(args.out, args.force, inputs)
    if out is not None and looks_like_pairs_file(out):  # the one being served, maybe under another name
        raise UserError(f"--out {args.out} is a pairs file (it holds response_a/response_b); writing it would "
                        "destroy it, even with --force: choose another file")
    store = ReadOnlyStore(db)
    try:
        votes = store.votes()
        resolutions = store.resolutions() if args.resolve else None
    finally:
        store.close()
    rows = preference_rows(votes, ties=args.ties, aggregate=args.aggregate, min_votes=args.min_votes,
                           margin_scale=args.margin_scale, resolutions=resolutions)
    if out is None:  # `--out -`: rows on stdout, the summary on stderr
        sys.stdout.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
        sys.stdout.flush()
        print(f"wrote {len(rows)} preference row(s) from {len(votes)} vote(s) to standard output", file=sys.stderr)
        return 0
    n = write_jsonl(rows, out)
    print(f"wrote {n} preference row(s) from {len(votes)} vote(s) to {out}")
    return 0


def _json_safe(x: object) -> object:
    """NaN (undefined kappa) -> null, recursively, so the output is valid JSON."""
    if isinstance(x, float) and math.isnan(x):
        return None
    if isinstance(x, dict):
        return {k: _json_safe(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_json_safe(v) for v in x]
    return x


def cmd_stats(args: argparse.Namespace) -> int:
    """Print counts, per-labeller activity and agreement (database opened read-only)."""
    store = ReadOnlyStore(_db_path(args))
    try:
        stats = compute_stats(store)
    finally:
        store.close()
    print(json.dumps(_json_safe(stats), indent=2) if args.json else format_stats(stats))
    return 0


def _serve(args: argparse.Namespace) -> int:
    return cmd_serve(args)


COMMANDS = {"pairs": cmd_pairs, "serve": _serve, "invite": cmd_invite, "export": cmd_export, "stats": cmd_stats}


def main(argv: list[str] | None = None) -> int:
    """Entry point used by `rlhfkit label ...`."""
    args = parse_command_line(build_parser(), sys.argv[1:] if argv is None else argv)
    return COMMANDS[args.command](args)  # a closed pipe (`| head`): errors.run_guarded


if __name__ == "__main__":
    from rlhfkit.errors import run_guarded

    sys.exit(run_guarded(lambda: main()))
