"""IAM policy documents (identity, trust and resource policies) reduced to plain statements."""

from __future__ import annotations

from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Any

from .props import as_list, is_mapping, json_or_value


class DocumentError(ValueError):
    """The document is not a JSON object with statements, so nothing in it can be checked."""


def covers(patterns: list[str], action: str) -> bool:
    """True if one of the Action patterns (wildcards allowed, case-insensitive like IAM) matches `action`."""
    return any(fnmatchcase(action.lower(), pattern.lower()) for pattern in patterns)


@dataclass(frozen=True)
class Statement:
    effect: str
    actions: list[str] = field(default_factory=list)
    not_actions: list[str] = field(default_factory=list)
    resources: list[str] = field(default_factory=list)
    not_resources: list[str] = field(default_factory=list)
    # (kind, value) pairs, kind being "AWS", "Service", "Federated" or "CanonicalUser"; "Principal": "*"
    # is the same as {"AWS": "*"}.
    principals: list[tuple[str, str]] = field(default_factory=list)
    has_not_principal: bool = False
    condition: dict[str, Any] = field(default_factory=dict)
    sid: str = ""

    @property
    def allows(self) -> bool:
        return self.effect.lower() == "allow"

    def grants(self, action: str) -> bool:
        """An Allow statement that grants `action`: matched by Action, or not excluded by NotAction."""
        if not self.allows:
            return False
        if self.not_actions:
            return not covers(self.not_actions, action)
        return covers(self.actions, action)

    @property
    def label(self) -> str:
        return f"statement {self.sid!r}" if self.sid else "a statement"

    def condition_values(self, operator: str, key: str) -> list[Any]:
        """Values of `operator` / `key` in the Condition block (condition keys are case-insensitive)."""
        block = self.condition.get(operator)
        if not is_mapping(block):
            return []
        for name, values in block.items():
            if name.lower() == key.lower():
                return as_list(values)
        return []


def _principals(value: Any) -> list[tuple[str, str]]:
    if value is None:
        return []
    if isinstance(value, str):
        return [("AWS", value)]
    if is_mapping(value):
        return [(kind, str(v)) for kind, values in value.items() for v in as_list(values)]
    raise DocumentError(f"unexpected Principal {value!r}")


def _strings(value: Any) -> list[str]:
    return [str(v) for v in as_list(value)]


def parse(document: Any) -> list[Statement]:
    """Statements of a policy document given as a JSON string or an object."""
    try:
        doc = json_or_value(document)
    except ValueError as error:
        raise DocumentError(f"not valid JSON ({error})") from error
    if not is_mapping(doc) or "Statement" not in doc:
        raise DocumentError("no Statement")
    statements = []
    for raw in as_list(doc["Statement"]):
        if not is_mapping(raw):
            raise DocumentError(f"unexpected statement {raw!r}")
        condition = raw.get("Condition") or {}
        statements.append(
            Statement(
                effect=str(raw.get("Effect", "")),
                actions=_strings(raw.get("Action")),
                not_actions=_strings(raw.get("NotAction")),
                resources=_strings(raw.get("Resource")),
                not_resources=_strings(raw.get("NotResource")),
                principals=_principals(raw.get("Principal")),
                has_not_principal="NotPrincipal" in raw,
                condition=dict(condition) if is_mapping(condition) else {},
                sid=str(raw.get("Sid", "")),
            )
        )
    return statements
