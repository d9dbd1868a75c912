"""Model-based test across primitives, once per store (see ``tests.model.machine``).

The brief profile (``make test``): a fixed seed per store, ``BRIEF_EXAMPLES`` runs of 40 steps,
about half a minute per store. ``make model`` runs the same machine longer, each store with a
seed of its own drawn at random and printed (environment: ``MODEL_EXAMPLES`` runs per store,
``MODEL_STEPS`` steps per run, ``MODEL_RANDOM=1`` for random seeds, ``MODEL_SEED=N`` to repeat
one). A failure prints the shrunk sequence of calls, one line a step, and the rule it broke
(``tests.model.violations``).
"""

from __future__ import annotations

import os
import random

import pytest
from hypothesis import HealthCheck, seed, settings
from hypothesis.stateful import run_state_machine_as_test

from tests.model.machine import ModelMachine
from tests.model.violations import tolerated
from tests.model.world import World

BRIEF_EXAMPLES = {"sqlite": 150, "postgres": 60, "etcd": 40}
"""Runs per store in the brief profile: each store's share of ``make test`` about 20-40 s."""
SEEDS = {"sqlite": 1, "postgres": 2, "etcd": 3}
"""The brief profile's seed per store: the same runs every time, other runs on each store."""
STEPS = int(os.environ.get("MODEL_STEPS") or 40)
EXAMPLES = int(os.environ.get("MODEL_EXAMPLES") or 0)  # 0: BRIEF_EXAMPLES
TIMEOUT_S = max(1800, EXAMPLES * STEPS)
"""A guard against a hang only: a step takes milliseconds; shrinking a failure up to minutes."""


def profile(store: str) -> settings:
    """``MODEL_EXAMPLES`` (default ``BRIEF_EXAMPLES``) runs of ``MODEL_STEPS`` steps; no
    deadline (a step is a few HTTP calls, an expiry on etcd a second or two); shrinking on."""
    return settings(max_examples=EXAMPLES or BRIEF_EXAMPLES[store], stateful_step_count=STEPS,
                    deadline=None, database=None, print_blob=False,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.filter_too_much])


def chosen_seed(store: str) -> int:
    """``MODEL_SEED``; else with ``MODEL_RANDOM`` one drawn now; else the store's fixed one."""
    if os.environ.get("MODEL_SEED"):
        return int(os.environ["MODEL_SEED"])
    if os.environ.get("MODEL_RANDOM", "") not in ("", "0"):
        return random.SystemRandom().randrange(2**32)
    return SEEDS[store]


@pytest.mark.timeout(TIMEOUT_S)
def test_every_primitive_keeps_the_rules_on_overlapping_names(world: World) -> None:
    machine = type(f"ModelOn{world.store.capitalize()}", (ModelMachine,), {"world": world})
    chosen = chosen_seed(world.store)
    print(f"model test on {world.store}: seed {chosen} (MODEL_SEED={chosen} repeats it)")
    try:
        run_state_machine_as_test(seed(chosen)(machine), settings=profile(world.store))
    finally:
        if tolerated:
            print(f"tolerated (MODEL_TOLERATE) on {world.store}: {dict(tolerated)}")
            tolerated.clear()
