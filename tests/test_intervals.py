"""GPU busy time of a call: the union of its kernels' intervals (faprof.rows.intervals)."""

import random

from faprof.rows.intervals import busy_ns


def brute(intervals):
    covered = set()
    for s, e in intervals:
        covered.update(range(s, e))
    return len(covered)


def test_disjoint_kernels_sum():
    assert busy_ns([(0, 10), (20, 25), (30, 31)]) == 16


def test_pdl_overlap_counted_once():
    # a split kernel 0-100 and a combine launched early at 60 that ends at 108: 108, not 148
    assert busy_ns([(0, 100), (60, 108)]) == 108


def test_nested_touching_unordered_and_empty():
    assert busy_ns([(50, 60), (0, 100), (100, 110)]) == 110
    assert busy_ns([]) == 0


def test_matches_brute_force():
    rng = random.Random(0)
    for _ in range(200):
        iv = []
        for _ in range(rng.randint(1, 6)):
            s = rng.randint(0, 80)
            iv.append((s, s + rng.randint(0, 30)))
        assert busy_ns(iv) == brute(iv)
