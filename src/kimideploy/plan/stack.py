"""The stack a drafter is served on: the serve image's kernel plan on the cluster's GPU, and what it
means for speculation there (plans show it; drafter check, up and run train say when it cannot
pay, before a drafter is trained for it or gated on it)."""

from __future__ import annotations

from kimideploy.config.project import Project
from kimideploy.formats.check_result import CheckResult
from kimideploy.plan.inputs import PlanInputs, is_speculative
from kimideploy.plan.kernel_plan import KernelPlan, stored_plan


def serve_image_name(ctx: PlanInputs) -> str:
    """The image the drafter is (or will be) served on: this plan's own for serve."""
    return ctx.image_name if ctx.kind.release else ctx.cluster.images.serve


def kernel_plan(ctx: PlanInputs) -> KernelPlan | None:
    return plan_on(ctx.project, ctx.cluster_name, serve_image_name(ctx))


def plan_on(project: Project, cluster_name: str, image_name: str) -> KernelPlan | None:
    return stored_plan(project, image_name, project.clusters[cluster_name].gpu.arch)


def kernels_fact(ctx: PlanInputs, speculative: bool | None = None) -> str:
    """The serve engine's kernels on this cluster; `speculative` None: a release says whether it
    has a drafter, any other plan names the drafter's kernel too."""
    name = serve_image_name(ctx)
    found = kernel_plan(ctx)
    if found is None:
        if ctx.project.images[name].vllm is None:
            return f"{name} has no vLLM"
        return (
            f"not derived for {name} from the sources it pins now and this model's "
            f"config.json: `kimideploy image kernels {name} --write`"
        )
    return found.describe(
        ctx.model.quantization,
        ctx.cluster.workloads.serve.moe_backend,
        speculative=(not ctx.kind.release or is_speculative(ctx))
        if speculative is None
        else speculative,
    )


def cannot_pay(ctx: PlanInputs) -> str | None:
    """Why speculation cannot pay on this cluster's serve stack, or None where it can (or the
    plan does not say)."""
    return cannot_pay_on(ctx.project, ctx.cluster_name, serve_image_name(ctx))


def cannot_pay_on(project: Project, cluster_name: str, image_name: str) -> str | None:
    found = plan_on(project, cluster_name, image_name)
    if found is None or found.speculation_can_pay is not False:
        return None
    return (
        f"speculation cannot pay on {cluster_name}'s serve stack ({image_name}, vLLM "
        f"{found.vllm} on {found.arch}): verification on the {found.verification()}"
    )


def stack_finding(ctx: PlanInputs) -> CheckResult | None:
    """The plan's row for the stack (served drafters and methods alike)."""
    return stack_check(ctx.project, ctx.cluster_name, serve_image_name(ctx))


def stack_check(project: Project, cluster_name: str, image_name: str) -> CheckResult | None:
    """drafter check's row for the stack a drafter or method is served on."""
    found = plan_on(project, cluster_name, image_name)
    if found is None:
        return None
    why = cannot_pay_on(project, cluster_name, image_name)
    return CheckResult(
        "serve stack",
        why is None,
        why or f"verification on the {found.verification()}",
        f"serve {cluster_name} from an image whose kernel plan verifies on the decode path "
        "(clusters.<c>.images.serve; `kimideploy image kernels NAME`)",
    )
