"""What validating a model repository found: findings by model and rule; an ``error`` fails validation."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Finding:
    """One problem: ``error`` fails validation, ``warning`` does not."""

    severity: str
    model: str
    rule: str
    message: str


@dataclass
class ValidationReport:
    repo: Path
    findings: list[Finding] = field(default_factory=list)

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "error"]

    def add(self, severity: str, model: str, rule: str, message: str) -> None:
        self.findings.append(Finding(severity, model, rule, message))

    def to_dict(self) -> dict[str, Any]:
        return {"repo": str(self.repo), "ok": not self.errors, "findings": [asdict(f) for f in self.findings]}
