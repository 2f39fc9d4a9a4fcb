"""Asset checks declared one by one and evaluated together, in as few steps as can be.

A step is a process of its own (its instance opened, its resources built, its events written),
which costs more than most checks themselves. So the checks of an asset whose op can run them are
evaluated in that op, after the asset (`evaluate_checks` from an asset's op: the seed's, the
merge's), and the others of one stage in one step (`check_group`: the crawl's). Either way each
check can still be run alone: the ops can be subset.
"""

import inspect
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import dagster as dg

Check = Callable[..., dg.AssetCheckResult]


def check_spec(asset: str, description: str, *, blocking: bool = False):
    """Declares the function below as the check of that name on the asset `asset` (its
    parameters: the resources it needs, and `context`)."""

    def declare(evaluate: Check) -> Check:
        evaluate.spec = dg.AssetCheckSpec(  # type: ignore[attr-defined]
            evaluate.__name__, asset=asset, description=description, blocking=blocking
        )
        return evaluate

    return declare


def specs(checks: list[Check]) -> list[dg.AssetCheckSpec]:
    return [check.spec for check in checks]  # type: ignore[attr-defined]


def resource_keys(checks: list[Check]) -> set[str]:
    """The resources `checks` need (their parameters but `context`)."""
    return {
        param
        for check in checks
        for param in inspect.signature(check).parameters
        if param != "context"
    }


def evaluate_checks(
    context: Any, checks: list[Check], resources: Mapping[str, Any], *, raise_errors: bool
) -> Iterator[dg.AssetCheckResult]:
    """The results of those of `checks` the run selected. A check that raises does not keep the
    others from being reported. With `raise_errors` the step then fails with its error, as the
    check's own step would have; without (checks run in their asset's op, whose materialisation
    stands), it is reported as a failed check of severity ERROR naming the error."""
    selected = context.selected_asset_check_keys
    errors: list[BaseException] = []
    for check in checks:
        spec = check.spec  # type: ignore[attr-defined]
        if spec.key not in selected:
            continue
        wants = inspect.signature(check).parameters
        given = {key: resources[key] for key in wants if key != "context"}
        if "context" in wants:
            given["context"] = context
        try:
            result = check(**given)
        except Exception as exc:  # the other checks are still reported
            context.log.exception(f"check {spec.name} could not be evaluated")
            if raise_errors:
                errors.append(exc)
                continue
            result = dg.AssetCheckResult(
                passed=False,
                severity=dg.AssetCheckSeverity.ERROR,
                description=f"the check could not be evaluated: {type(exc).__name__}: {exc}",
            )
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


def check_group(name: str, checks: list[Check], description: str) -> dg.AssetChecksDefinition:
    """One step that evaluates `checks`, or those of them a run selects."""
    keys = resource_keys(checks)

    @dg.multi_asset_check(
        name=name,
        specs=specs(checks),
        can_subset=True,
        required_resource_keys=keys,
        description=description,
    )
    def evaluate_group(context: dg.AssetCheckExecutionContext):
        resources = {key: getattr(context.resources, key) for key in keys}
        yield from evaluate_checks(context, checks, resources, raise_errors=True)

    return evaluate_group
