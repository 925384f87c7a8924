"""Watching a `ray job submit` job from outside the cluster (job submission and hardware cluster tests)."""

from __future__ import annotations

# Polls a job with the Python client; the token goes in an explicit Authorization header.
# Run as `python -c POLL_SCRIPT ADDRESS TOKEN JOB_ID TIMEOUT_S`; prints {"status", "logs"} as JSON.
POLL_SCRIPT = """
import json, sys, time
from ray.job_submission import JobStatus, JobSubmissionClient
address, token, job_id, timeout = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
client = JobSubmissionClient(address, headers={"Authorization": f"Bearer {token}"})
deadline = time.monotonic() + timeout
status = client.get_job_status(job_id)
while not status.is_terminal() and time.monotonic() < deadline:
    time.sleep(3)
    status = client.get_job_status(job_id)
print(json.dumps({"status": str(status.value), "logs": client.get_job_logs(job_id)}))
"""
