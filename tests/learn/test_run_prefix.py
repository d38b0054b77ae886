"""Entry 31's A/B takes its shared-trunk arm from the first iterations of a longer run: with the
constant learning rate after warm-up, a run's first k iterations are what a k-iteration run computes."""

from __future__ import annotations

import json

from rlhfkit.learn import tiny


def test_the_first_iterations_of_a_longer_run_are_the_shorter_run(tmp_path):
    """The tiny model of entry 0, 4 and 6 iterations, same seed: the metrics of iterations 0-1 agree
    (timings aside) to the bit; the seconds-long stand-in for the real model's 3 of 18."""
    rows = {}
    for n in (2, 4):
        (tmp_path / str(n)).mkdir()
        tiny.watch_it_learn(tmp_path / str(n), iterations=n)
        lines = (tmp_path / str(n) / "runs" / "vowels" / "metrics.jsonl").read_text().splitlines()
        rows[n] = [{k: v for k, v in json.loads(line).items() if not k.startswith(("timing/", "throughput/"))}
                   for line in lines]
    assert len(rows[2]) == 2 and len(rows[4]) == 4
    assert rows[4][:2] == rows[2]
