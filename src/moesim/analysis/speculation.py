"""Speculative decoding's arithmetic, shared by simulate, validate and the runtime advice."""
from __future__ import annotations


def accepted_per_step(drafts: int, acceptance: float) -> float:
    """Expected tokens per verify step with a chain of ``drafts`` drafts, each accepted with
    probability ``acceptance`` given its predecessor was: 1 + a + a^2 + ... + a^n."""
    return 1.0 + sum(acceptance ** i for i in range(1, drafts + 1))
