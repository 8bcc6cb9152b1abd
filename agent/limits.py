"""What a run may use, what a sample says it used, and when that is too much --
pure functions of one executor record, used by `AgentState`.

A run's limits are its executor's resources plus its live tasks'; the built-in
command executor gets room for itself on top (`COMMAND_EXECUTOR_*`; a direct run
has no process but its command's), and a run
that asked for no memory is not memory-limited. Under cgroups the kernel enforces
and reports (`RunSample.oom`); under posix the agent compares the summed RSS of
the process tree with the limit itself.
"""

from __future__ import annotations

from agent.model import (
    COMMAND_EXECUTOR_CPUS, COMMAND_EXECUTOR_MEM_MB, MIB, AgentExecutor, Limits, RunSample,
    mib,
)
from dyad.messages import ExecutorUsage


def limits(executor: AgentExecutor) -> Limits:
    parts = [executor.info.resources, *(t.info.resources for t in executor.live_tasks())]
    cpus = sum(part.get("cpus") for part in parts)
    mem_mb = sum(part.get("mem") for part in parts)
    if executor.is_command and not executor.direct:
        cpus += COMMAND_EXECUTOR_CPUS if cpus else 0.0
        mem_mb += COMMAND_EXECUTOR_MEM_MB if mem_mb else 0.0
    revocable = sum(t.info.resources.get("cpus") for t in executor.live_tasks()
                    if t.info.revocable)
    return Limits(cpus=round(cpus, 3), mem_bytes=int(mem_mb * MIB),
                  revocable_cpus=round(revocable, 3))


def usage(executor: AgentExecutor, sample: RunSample) -> ExecutorUsage:
    """The sample as reported, with `cpus_used` from the executor's previous one."""
    cpus_used = 0.0
    before = executor.last_sample
    if before is not None and sample.timestamp > before.timestamp:
        spent = (sample.cpus_user_time + sample.cpus_system_time
                 - before.cpus_user_time - before.cpus_system_time)
        cpus_used = max(0.0, spent / (sample.timestamp - before.timestamp))
    return ExecutorUsage(
        framework_id=executor.framework_id, executor_id=executor.executor_id,
        task_ids=sorted(t.task_id for t in executor.live_tasks()),
        timestamp=sample.timestamp, cpus_used=round(cpus_used, 4),
        cpus_user_time_secs=sample.cpus_user_time,
        cpus_system_time_secs=sample.cpus_system_time, cpus_limit=executor.limits.cpus,
        cpus_nr_throttled=sample.cpus_nr_throttled,
        cpus_throttled_time_secs=sample.cpus_throttled_time,
        mem_rss_bytes=sample.mem_rss_bytes, mem_limit_bytes=executor.limits.mem_bytes,
        processes=sample.processes)


def memory_problem(executor: AgentExecutor, sample: RunSample, isolation: str) -> str:
    """Why the run broke its memory limit, for its tasks' TASK_FAILED ('' if it
    did not)."""
    if executor.info.container is not None:
        return ""  # the engine enforces; its OOM kill comes with the container's exit
    limit = executor.limits.mem_bytes
    over = sample.oom or (isolation == "posix" and limit > 0 and sample.mem_rss_bytes > limit)
    if not over:
        return ""
    # The kernel's high-water mark when it has one: summed RSS counts pages that
    # processes share more than once.
    used = sample.mem_peak_bytes if sample.oom and sample.mem_peak_bytes else \
        sample.mem_rss_bytes
    allowance = (f" ({mib(limit - COMMAND_EXECUTOR_MEM_MB * MIB)} for the task + "
                 f"{COMMAND_EXECUTOR_MEM_MB} MiB for the command executor)"
                 if executor.is_command and not executor.direct and limit else "")
    run = "task" if executor.direct else "executor"
    return (f"Memory limit exceeded: {run} {executor.executor_id} used {mib(used)} "
            f"({sample.processes} processes), its limit is {mib(limit)}{allowance}")
