"""What the store hands out and the errors it raises (no database code here)."""

from __future__ import annotations

from dataclasses import dataclass

# --------------------------------------------------------------------------- errors


class LabelError(Exception):
    """A request the store or app refuses; ``status`` is the HTTP status the app answers with."""

    status = 400


class Unauthorized(LabelError):
    """No valid labeller credentials (invitation mode)."""

    status = 401


class Forbidden(LabelError):
    """Signed in, but asking to act as someone else."""

    status = 403


class NotFound(LabelError):
    """Unknown pair or labeller."""

    status = 404


class Conflict(LabelError):
    """The action clashes with what is stored (already voted, not assigned, reused request id)."""

    status = 409


class Invalid(LabelError):
    """A request that is well-formed JSON but lacks what this mode needs."""

    status = 422


# --------------------------------------------------------------------------- records


@dataclass(frozen=True)
class Shown:
    """A pair as a labeller sees it: no A/B, no model names, just left and right."""

    pair_id: str
    prompt: str
    left: str
    right: str


@dataclass(frozen=True)
class Progress:
    """A labeller's progress: ``done`` of ``total`` (votes + skips of all they can get)."""

    voted: int
    skipped: int
    remaining: int  # open assignments + pairs still available to this labeller
    name: str = ""  # display name of the labeller

    @property
    def done(self) -> int:
        return self.voted + self.skipped

    @property
    def total(self) -> int:
        return self.done + self.remaining


@dataclass(frozen=True)
class SubmitResult:
    """Outcome of a vote or skip: ``stored`` False means an idempotent replay (nothing new)."""

    stored: bool
    pair_id: str


@dataclass(frozen=True)
class UndoResult:
    """Outcome of an undo: ``reopened`` False when a skipped pair got all its votes meanwhile
    (the skip is taken back, but the pair is not offered to this labeller now)."""

    pair_id: str
    reopened: bool


@dataclass(frozen=True)
class VoteRecord:
    """One stored vote joined with its pair and labeller (for export and stats)."""

    pair_id: str
    labeller: str
    score: int
    choice: int
    left_side: str
    shown_at: str
    created_at: str
    prompt: str
    response_a: str
    response_b: str
    reason: str = ""  # the labeller's free-text reason ('' for none)
    ratings: tuple[tuple[str, int], ...] = ()  # (criterion, canonical score -2..2), sorted by name


@dataclass(frozen=True)
class Resolution:
    """A lead's final label for a pair, kept apart from the votes (``export --resolve``)."""

    pair_id: str
    score: int  # canonical: +2 = response_a significantly better
    note: str
    decided_at: str
    prompt: str
    response_a: str
    response_b: str
