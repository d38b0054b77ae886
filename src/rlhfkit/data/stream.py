"""A reproducible, endless pass over training records."""

from __future__ import annotations

import random


class PromptStream:
    """Endless, reproducible pass over records (prompts, examples, pairs): shuffled per epoch with
    the run seed.

    With `world` processes, `next(n)` draws the next n x world records (the same on every process)
    and returns this process's share [rank::world]: each process gets different records, and
    together they get exactly what one process would get from `next(n x world)`.
    """

    def __init__(self, records: list, seed: int, rank: int = 0, world: int = 1):
        self.records = records
        self.seed = seed
        self.rank, self.world = rank, world
        self.epoch = 0
        self.pos = 0
        self._order = self._shuffle()

    def _shuffle(self) -> list[int]:
        order = list(range(len(self.records)))
        random.Random(self.seed * 1_000 + self.epoch).shuffle(order)
        return order

    def next(self, n: int) -> list:
        out = []
        while len(out) < n * self.world:
            if self.pos >= len(self._order):
                self.epoch, self.pos = self.epoch + 1, 0
                self._order = self._shuffle()
            out.append(self.records[self._order[self.pos]])
            self.pos += 1
        return out[self.rank :: self.world]

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "pos": self.pos}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.pos = state["epoch"], state["pos"]
        self._order = self._shuffle()
