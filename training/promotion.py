"""Should the challenger replace the champion? A paired test over the same eval tasks.

Two evaluations are comparable only on the same task set (same `dataset_hash`), and only on the
tasks both actually graded: a task lost to infra errors on either side is left out of the
pairing rather than counted as a failure.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from training.evaluation import paired_permutation_test

TAG_PREFIX = "swerl.promotion."


@dataclass
class Decision:
    promote: bool
    reason: str
    p_value: float | None = None
    manual: bool = False
    delta: float | None = None  # mean paired difference in task resolve rate (challenger - champion)
    paired_tasks: int = 0

    def tags(self) -> dict[str, str]:
        """The decision as registry tags: what the MLflow UI shows next to the version."""
        return {f"{TAG_PREFIX}decision": "promoted" if self.promote else "rejected",
                f"{TAG_PREFIX}reason": self.reason[:4000],
                f"{TAG_PREFIX}p_value": "" if self.p_value is None else f"{self.p_value:.6g}",
                f"{TAG_PREFIX}delta": "" if self.delta is None else f"{self.delta:.6g}",
                f"{TAG_PREFIX}paired_tasks": str(self.paired_tasks),
                f"{TAG_PREFIX}manual": str(self.manual).lower()}

    def to_dict(self) -> dict[str, Any]:
        return {"promoted": self.promote, "reason": self.reason, "p_value": self.p_value,
                "manual": self.manual, "delta": self.delta, "paired_tasks": self.paired_tasks}


def _compare(challenger: dict[str, Any], champion: dict[str, Any]) -> tuple[float, float, int, str]:
    """(p-value, mean paired delta, number of paired tasks, a one-line account)."""
    a, b = challenger["per_task"], champion["per_task"]
    common = sorted(a.keys() & b.keys())
    if not common:
        return 1.0, 0.0, 0, "no task graded in both evaluations"
    delta = sum(a[t] - b[t] for t in common) / len(common)
    p = paired_permutation_test(a, b)
    account = (f"pass@1 {challenger['pass@1']:.3f}±{challenger.get('sem', 0.0):.3f} vs "
               f"{champion['pass@1']:.3f}±{champion.get('sem', 0.0):.3f}; paired over {len(common)} tasks: "
               f"mean delta {delta:+.3f}, p={p:.4g}")
    return p, delta, len(common), account


def decide(challenger: dict[str, Any], champion: dict[str, Any] | None, alpha: float,
           manual: bool = False) -> Decision:
    """`challenger` / `champion` are evaluation reports (per_task resolve rates, pass@1, dataset_hash).

    Promote when there is no champion, or when the challenger is better on the paired tasks with
    one-sided p < alpha. `manual` promotes regardless, but the comparison is still computed and
    recorded so an override is never mistaken for a measured win.
    """
    if champion is None:
        return Decision(True, ("manual override; " if manual else "") + "no champion yet", manual=manual)
    if challenger.get("dataset_hash") != champion.get("dataset_hash"):
        why = (f"eval sets differ (challenger {challenger.get('dataset_hash')}, "
               f"champion {champion.get('dataset_hash')}): not comparable")
        return Decision(manual, f"manual override; {why}" if manual else why, manual=manual)
    p, delta, n, account = _compare(challenger, champion)
    if manual:
        return Decision(True, f"manual override; {account}", p, True, delta, n)
    if n and delta > 0 and p < alpha:
        return Decision(True, f"better: {account} < {alpha}", p, False, delta, n)
    verdict = "not significantly better" if delta > 0 else "not better"
    return Decision(False, f"{verdict}: {account}" + (f" >= {alpha}" if delta > 0 else ""), p, False, delta, n)
