"""`rlhfkit label pairs|serve|export|stats`: collect human preferences in a local web app.

Typical session::

    rlhfkit label pairs --prompts builtin:reviews --limit 20 --out pairs.jsonl
    rlhfkit label serve --pairs pairs.jsonl --votes-per-pair 2      # open the printed URL
    rlhfkit label stats --pairs pairs.jsonl
    rlhfkit label export --pairs pairs.jsonl --out prefs.jsonl   # for `rlhfkit rm` / `rlhfkit dpo`
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import socket
import sys
from pathlib import Path

from rlhfkit.errors import DataError, UserError

DEFAULT_MODEL = "smollm2-135m-instruct"
TOKEN_RE = re.compile(r"^[A-Za-z0-9_.~-]{8,128}$")


def default_db(pairs_path: str | os.PathLike[str]) -> Path:
    """pairs.jsonl -> pairs.labels.sqlite next to it."""
    p = Path(pairs_path)
    return p.with_name(p.stem + ".labels.sqlite")


# --------------------------------------------------------------------------- parser


def _add_db_args(p: argparse.ArgumentParser) -> None:
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--db", help="labelling database (SQLite) written by `label serve`")
    g.add_argument("--pairs", help="pairs file; the database is the default one next to it (PAIRS.labels.sqlite)")


def build_parser() -> argparse.ArgumentParser:
    """The `rlhfkit label` parser with its four subcommands."""
    parser = argparse.ArgumentParser(
        prog="rlhfkit label",
        description="Collect human preferences: sample pairs, label them in a local web app, export.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser("pairs", help="sample two responses per prompt into a pairs file",
                       description="Sample two responses per prompt (two from one model, or one from each of two).")
    p.add_argument("--prompts", required=True, help="prompt set: builtin:NAME or a local file")
    p.add_argument("--split", default="train", help="split of the prompt set (default: train)")
    p.add_argument("--limit", type=int, default=50, help="number of prompts to use; 0 = all (default: 50)")
    p.add_argument("--model-a", "--model", dest="model_a", default=DEFAULT_MODEL,
                   help=f"model for response A (and B when --model-b is not given) (default: {DEFAULT_MODEL})")
    p.add_argument("--model-b", default=None, help="second model; response B comes from it")
    p.add_argument("--max-new-tokens", type=int, default=64, help="tokens per response (default: 64)")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (default: 1.0)")
    p.add_argument("--seed", type=int, default=0, help="seed for prompt selection and sampling (default: 0)")
    p.add_argument("--out", required=True, help="pairs file to write (JSONL)")
    p.add_argument("--force", action="store_true", help="overwrite --out if it exists")

    s = sub.add_parser("serve", help="start the labelling web app",
                       description="Serve the labelling app. Votes go to a SQLite database (WAL mode).")
    s.add_argument("--pairs", required=True, help="pairs file (JSONL) to label")
    s.add_argument("--db", default=None, help="database file (default: PAIRS.labels.sqlite next to the pairs)")
    s.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default: 127.0.0.1); any non-loopback address needs a token")
    s.add_argument("--port", type=int, default=8000, help="port (default: 8000)")
    s.add_argument("--token", default=os.environ.get("RLHFKIT_LABEL_TOKEN"),
                   help="access token required on every request (default: $RLHFKIT_LABEL_TOKEN; generated "
                        "and printed when --host is not loopback)")
    s.add_argument("--votes-per-pair", type=int, default=1,
                   help="how many different labellers see each pair (default: 1)")
    s.add_argument("--lease-minutes", type=float, default=30.0,
                   help="a pair shown but not answered for this long may go to another labeller (default: 30)")
    s.add_argument("--log-level", default="warning", choices=["critical", "error", "warning", "info", "debug"],
                   help="server log level (default: warning)")

    e = sub.add_parser("export", help="write preference JSONL for `rlhfkit rm` / `rlhfkit dpo`",
                       description="Aggregate votes into preference pairs (prompt, chosen, rejected, strength, margin).")
    _add_db_args(e)
    e.add_argument("--out", required=True, help="preference JSONL to write")
    e.add_argument("--ties", choices=["drop", "keep-as-half"], default="drop",
                   help="pairs judged the same: drop them, or keep both orders as half a win each (default: drop)")
    e.add_argument("--aggregate", choices=["mean", "none"], default="mean",
                   help="mean: one row per pair from the mean signed score; none: one row per vote (default: mean)")
    e.add_argument("--min-votes", type=int, default=1, help="skip pairs with fewer votes (default: 1)")
    e.add_argument("--margin-scale", type=float, default=1.0,
                   help="margin = |mean score| / 2 * this; 1.0 for a unanimous 'significantly' (default: 1.0)")

    t = sub.add_parser("stats", help="counts, per-labeller activity and agreement (kappa)",
                       description="Show counts, per-labeller activity and Fleiss'/Cohen's kappa.")
    _add_db_args(t)
    t.add_argument("--json", action="store_true", help="print the statistics as JSON")
    return parser


# --------------------------------------------------------------------------- commands


def cmd_pairs(args: argparse.Namespace) -> int:
    """Sample responses and write the pairs file."""
    from rlhfkit.label.pairs import sample_pairs, write_pairs

    out = Path(args.out)
    if out.exists() and not args.force:
        raise UserError(f"{out} exists; pass --force to overwrite it")
    if args.limit < 0 or args.max_new_tokens < 1:
        raise UserError("--limit must be >= 0 and --max-new-tokens >= 1")
    from rlhfkit.data.prompts import load_prompts  # lazy: heavy imports
    from rlhfkit.generate import sample_texts

    rows = load_prompts(args.prompts, split=args.split, limit=args.limit or None, seed=args.seed)
    prompts = [r["prompt"] for r in rows]
    if not prompts:
        raise DataError(f"{args.prompts}: no prompts")
    print(f"sampling 2 responses for {len(prompts)} prompt(s) ...", file=sys.stderr)
    pairs, dropped = sample_pairs(
        prompts, sample_texts, args.model_a, args.model_b,
        max_new_tokens=args.max_new_tokens, temperature=args.temperature, seed=args.seed,
    )
    write_pairs(pairs, out)
    note = f" ({dropped} dropped: identical responses or duplicates)" if dropped else ""
    print(f"wrote {len(pairs)} pair(s) to {out}{note}")
    return 0


def _check_port_free(host: str, port: int) -> None:
    """Fail with a clear message if the port cannot be bound (instead of a uvicorn traceback)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            raise UserError(f"cannot listen on {host}:{port} ({e.strerror}); choose another --port") from None


def _url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"


def cmd_serve(args: argparse.Namespace) -> int:
    """Import the pairs into the database and run the web app until Ctrl-C."""
    from rlhfkit.label.pairs import read_pairs
    from rlhfkit.label.security import LOOPBACK_HOSTS, is_loopback, new_token
    from rlhfkit.label.store import LabelStore

    if args.votes_per_pair < 1:
        raise UserError(f"--votes-per-pair must be >= 1, got {args.votes_per_pair}")
    if not 0 < args.port < 65536:
        raise UserError(f"--port must be 1..65535, got {args.port}")
    token = args.token
    if token is not None and not TOKEN_RE.match(token):
        raise UserError("--token must be 8-128 characters of letters, digits and _.~-")
    host = args.host.strip("[]")
    loopback = is_loopback(host)
    if not loopback and token is None:
        token = new_token()
    pairs = read_pairs(args.pairs)
    db = Path(args.db) if args.db else default_db(args.pairs)
    store = LabelStore(db, votes_per_pair=args.votes_per_pair, lease_seconds=args.lease_minutes * 60)
    added = store.import_pairs(pairs, source=str(args.pairs))
    store.set_meta("votes_per_pair", str(args.votes_per_pair))
    _check_port_free(host, args.port)

    import uvicorn

    from rlhfkit.label.app import create_app

    app = create_app(store, token=token, allowed_hosts=LOOPBACK_HOSTS if loopback else None)
    url = _url(host, args.port)
    print(f"labelling {len(pairs)} pair(s) ({added} new), each by {args.votes_per_pair} labeller(s); votes in {db}")
    if token is not None:
        print(f"access token: {token}")
        print(f"open {url}?token={token}")
    else:
        print(f"open {url}")
    print("press Ctrl-C to stop (every vote is already saved)", flush=True)
    try:
        uvicorn.run(app, host=host, port=args.port, log_level=args.log_level, access_log=False)
    finally:
        store.close()
    return 0


def _open_existing_store(args: argparse.Namespace):  # -> LabelStore
    from rlhfkit.label.store import LabelStore

    db = Path(args.db) if args.db else default_db(args.pairs)
    if not db.is_file():
        raise DataError(f"{db}: no labelling database (start `rlhfkit label serve` first)")
    return LabelStore(db)


def cmd_export(args: argparse.Namespace) -> int:
    """Write preference JSONL from the stored votes."""
    from rlhfkit.label.export import preference_rows, write_jsonl

    if args.min_votes < 1:
        raise UserError(f"--min-votes must be >= 1, got {args.min_votes}")
    if not (args.margin_scale > 0 and math.isfinite(args.margin_scale)):
        raise UserError(f"--margin-scale must be a positive number, got {args.margin_scale}")
    store = _open_existing_store(args)
    votes = store.votes()
    rows = preference_rows(votes, ties=args.ties, aggregate=args.aggregate,
                           min_votes=args.min_votes, margin_scale=args.margin_scale)
    n = write_jsonl(rows, args.out)
    print(f"wrote {n} preference row(s) from {len(votes)} vote(s) to {args.out}")
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
    """Print counts, per-labeller activity and agreement."""
    from rlhfkit.label.stats import compute_stats, format_stats

    stats = compute_stats(_open_existing_store(args))
    print(json.dumps(_json_safe(stats), indent=2) if args.json else format_stats(stats))
    return 0


COMMANDS = {"pairs": cmd_pairs, "serve": cmd_serve, "export": cmd_export, "stats": cmd_stats}


def main(argv: list[str] | None = None) -> int:
    """Entry point used by `rlhfkit label ...`."""
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    return COMMANDS[args.command](args)


if __name__ == "__main__":
    from rlhfkit.errors import run_guarded

    sys.exit(run_guarded(lambda: main()))
