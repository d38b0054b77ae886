"""Human preference collection: `rlhfkit label pairs|serve|export|stats`.

A labeller sees one prompt and two responses (left/right in random order) and picks one
of five options, from "left is significantly better" to "right is significantly better".

Modules, in the order data flows through them:

- ``scale``      the five-point scale and how a choice maps to a signed score
- ``pairs``      the pairs file (JSONL): validation with file:line errors, sampling
- ``store``      SQLite (WAL) storage: labellers, pairs, assignments, votes, events
- ``app``        the FastAPI web app (JSON API + static UI in ``static/``)
- ``security``   access token, Host/Origin checks and security headers
- ``agreement``  Fleiss' and Cohen's kappa
- ``export``     votes -> preference JSONL (prompt, chosen, rejected, strength, margin)
- ``stats``      counts, per-labeller activity and agreement
- ``cli``        argparse front end

Only ``cli`` and ``app`` import third-party packages; nothing here imports torch.
"""
