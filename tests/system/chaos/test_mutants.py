"""The checker still bites: a planted bug (the proxy accepts a fence one below the highest; lockd's
PostgreSQL batch keeping a re-granted lock's fence) run through a short chaos run from a mutated
copy of the tree must be reported; and every mutant
of ``make mutants`` still applies to the current product code (snippets found exactly once)."""

from __future__ import annotations

import pytest

from chaos.mutants import MUTANTS, REPO_ROOT, MutantNoLongerApplies, copy_tree, run_mutant


def test_every_mutant_still_applies_to_the_product_code(tmp_path):
    for mutant in MUTANTS:
        root = copy_tree(tmp_path / mutant.name)
        mutant.apply_to(root)  # raises MutantNoLongerApplies naming the mutant if code drifted
        for path in {e.path for e in mutant.edits}:
            assert (root / path).read_text() != (REPO_ROOT / path).read_text(), mutant.name


def test_a_mutant_whose_snippet_is_gone_fails_loudly(tmp_path):
    root = copy_tree(tmp_path / "t")
    mutant = MUTANTS[0]
    mutant.apply_to(root)
    with pytest.raises(MutantNoLongerApplies, match=f"mutant {mutant.name} no longer applies"):
        mutant.apply_to(root)  # already mutated: the original snippet is gone


@pytest.mark.slow
def test_the_checker_catches_the_off_by_one_fence_check():
    mutant = next(m for m in MUTANTS if m.name == "off_by_one")
    out = run_mutant(mutant, seconds=25, seed=4242)  # its own faults: thaws after a successor
    report = out["report"]
    assert out["detected"], (report["ops"], report["faults"], report["revived"])
    assert "stale_commit" in out["kinds"], out["kinds"]


@pytest.mark.slow
def test_the_churn_catches_a_postgresql_batch_that_keeps_the_fence():
    """lockd's PostgreSQL batches form only when several requests are under way: the churn
    beside the workload makes them, and judges their grants."""
    mutant = next(m for m in MUTANTS if m.name == "pg_batch_same_fence")
    out = run_mutant(mutant, seconds=20, seed=4242)
    report = out["report"]
    assert out["detected"], (report["ops"], report["faults"])
    assert "churn_fence_order" in out["kinds"], out["kinds"]
    assert report["ops"]["churn_grants"] >= 100, report["ops"]
