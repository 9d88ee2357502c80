"""Should the challenger replace the champion? A paired test over the same eval tasks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from training.evaluation import paired_permutation_test


@dataclass
class Decision:
    promote: bool
    reason: str
    p_value: float | None = None
    manual: bool = False

    def tags(self) -> dict[str, str]:
        return {"swerl.promotion.decision": "promoted" if self.promote else "rejected",
                "swerl.promotion.reason": self.reason[:4000],
                "swerl.promotion.p_value": "" if self.p_value is None else f"{self.p_value:.6g}",
                "swerl.promotion.manual": str(self.manual).lower()}


def decide(challenger: dict[str, Any], champion: dict[str, Any] | None, alpha: float) -> Decision:
    """`challenger` / `champion` are evaluation reports (per_task resolve rates, dataset_hash)."""
    if champion is None:
        return Decision(True, "no champion yet")
    if challenger.get("dataset_hash") != champion.get("dataset_hash"):
        return Decision(False, f"eval sets differ (challenger {challenger.get('dataset_hash')}, "
                               f"champion {champion.get('dataset_hash')}): not comparable")
    p = paired_permutation_test(challenger["per_task"], champion["per_task"])
    delta = challenger["pass@1"] - champion["pass@1"]
    if p < alpha and delta > 0:
        return Decision(True, f"better: pass@1 {challenger['pass@1']:.3f} vs {champion['pass@1']:.3f}, "
                              f"paired p={p:.4g} < {alpha}", p)
    return Decision(False, f"not significantly better: pass@1 {challenger['pass@1']:.3f} vs "
                           f"{champion['pass@1']:.3f}, paired p={p:.4g} >= {alpha}" if delta > 0 else
                           f"not better: pass@1 {challenger['pass@1']:.3f} vs {champion['pass@1']:.3f}", p)
