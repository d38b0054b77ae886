"""Human preference collection: `rlhfkit label pairs|serve|invite|export|stats`.

A labeller sees one prompt and two responses (left/right in random order) and picks one
of five options, from "left is significantly better" to "right is significantly better".

Modules, in the order data flows through them:

- ``scale``      the five-point scale and how a choice maps to a signed score
- ``pairs``      the pairs file (JSONL): validation with file:line errors, sampling
- ``identity``   labeller names (one key per person) and invitation tokens
- ``db``         the database file: schema, migrations, read-write and read-only opening
- ``records``    what the store hands out (Shown, Progress, VoteRecord...) and its errors
- ``queries``    read-only questions (votes, counts, activity); ``ReadOnlyStore``
- ``store``      the rules that change data: leases, the per-pair cap, votes, skips, undo
- ``invitations`` invitation links (expiring) and browser sessions, part of the store
- ``app``        the FastAPI web app (JSON API + static UI in ``static/``), who is acting
- ``security``   access token, Host/Origin checks, body limits and security headers
- ``agreement``  Fleiss' and Cohen's kappa
- ``export``     votes -> preference JSONL (prompt, chosen, rejected, strength, margin)
- ``stats``      counts, per-labeller activity and agreement
- ``files``      safe output files (inputs never overwritten, unique temporary names)
- ``server``     uvicorn with a request deadline, a connection cap and quiet accept errors
- ``options``, ``cli``, ``serve``   the command-line front end

Only ``app``, ``security``, ``server`` and ``serve`` import third-party packages (FastAPI,
Starlette, uvicorn, h11); nothing here imports torch.
"""
