"""Dyad's batch framework: MapReduce-like jobs with data locality, shuffle over the
agents' ``/files`` API, retries and progress. The guide is docs/batch.md.

    from frameworks.batch import Job, run_job

    result = run_job(Job(module="examples/wordcount.py", inputs=["data/*.txt"],
                         output="out", reducers=4), master="127.0.0.1:5050")
    print(result.summary())

From a shell: ``dyad-batch submit --master HOST:PORT wordcount.py --input ... --output ...``.
"""

from frameworks.batch.config import CoreConfig, Split
from frameworks.batch.core import BatchCore, Progress
from frameworks.batch.job import Job, JobError
from frameworks.batch.scheduler import BatchScheduler, JobResult, run_job, run_job_async

__all__ = ["BatchCore", "BatchScheduler", "CoreConfig", "Job", "JobError", "JobResult",
           "Progress", "Split", "run_job", "run_job_async"]
