"""Asset checks declared one by one and evaluated together, one step per stage.

The checks of one stage are evaluated together, in one step (`check_group`): a step is a process
of its own (its instance opened, its resources built, its events written), which costs more than
most checks themselves. Each check can still be run alone (the groups can be subset).
"""

import inspect
from collections.abc import Callable
from typing import Any

import dagster as dg


def check_spec(asset: Any, description: str, *, blocking: bool = False):
    """Declares the function below as the check of that name on `asset` (its parameters: the
    resources it needs, and `context`); `check_group` evaluates it."""

    def declare(evaluate: Callable[..., dg.AssetCheckResult]):
        evaluate.spec = dg.AssetCheckSpec(  # type: ignore[attr-defined]
            evaluate.__name__, asset=asset, description=description, blocking=blocking
        )
        return evaluate

    return declare


def check_group(name: str, checks: list[Callable[..., dg.AssetCheckResult]], description: str):
    """One step that evaluates `checks` (each declared with check_spec), or those of them a run
    selects. A check that raises does not keep the others from being reported; the step then
    fails with its error, as the check's own step would have."""
    specs = [check.spec for check in checks]  # type: ignore[attr-defined]
    needs = {
        param: [check for check in checks if param in inspect.signature(check).parameters]
        for check in checks
        for param in inspect.signature(check).parameters
        if param != "context"
    }

    @dg.multi_asset_check(
        name=name,
        specs=specs,
        can_subset=True,
        required_resource_keys=set(needs),
        description=description,
    )
    def evaluate_checks(context: dg.AssetCheckExecutionContext):
        selected = context.selected_asset_check_keys
        errors: list[BaseException] = []
        for check in checks:
            spec = check.spec  # type: ignore[attr-defined]
            if spec.key not in selected:
                continue
            wants = inspect.signature(check).parameters
            given = {key: getattr(context.resources, key) for key in wants if key != "context"}
            if "context" in wants:
                given["context"] = context
            try:
                result = check(**given)
            except Exception as exc:  # the group's other checks are still reported
                context.log.error(f"check {spec.name} could not be evaluated: {exc!r}")
                errors.append(exc)
                continue
            yield dg.AssetCheckResult(
                asset_key=spec.asset_key,
                check_name=spec.name,
                passed=result.passed,
                severity=result.severity,
                metadata=result.metadata,
                description=result.description,
            )
        if errors:
            raise errors[0]

    return evaluate_checks
