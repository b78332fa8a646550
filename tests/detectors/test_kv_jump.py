from __future__ import annotations

import random

from collector.detectors.config import KvJumpThresholds
from collector.detectors.kv_jump import detect_kv_jump, largest_rise
from collector.model import Severity

THR = KvJumpThresholds(delta=0.3, window_s=5)
L = {"engine": "decode-0"}


def test_largest_rise_is_after_the_low_not_before() -> None:
    assert largest_rise([(0, 0.9), (1, 0.2), (2, 0.5)]) == 0.3  # the fall from 0.9 is not a rise
    assert largest_rise([(0, 0.5)]) == 0.0


def test_a_jump_within_the_window_warns_and_ages_out() -> None:
    usage = [(t / 10, 0.1 if t < 100 else 0.6) for t in range(200)]
    assert detect_kv_jump(usage, now=10.5, labels=L, thr=THR).state is Severity.WARNING
    assert detect_kv_jump(usage, now=19.9, labels=L, thr=THR).state is Severity.OK  # jump older than 5 s


def test_a_slow_climb_is_not_a_jump() -> None:
    usage = [(t / 10, 0.1 + t / 1000) for t in range(800)]  # +0.8 over 80 s
    assert detect_kv_jump(usage, now=80, labels=L, thr=THR).state is Severity.OK


def test_noise_below_delta_never_warns() -> None:
    rng = random.Random(1)
    usage = [(t / 10, 0.5 + rng.uniform(-0.12, 0.12)) for t in range(3000)]
    assert all(detect_kv_jump(usage, now=n, labels=L, thr=THR).state is Severity.OK for n in range(5, 300, 3))
