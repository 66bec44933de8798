"""In-container entrypoints: `python -m kimideploy.workloads NAME --spec /etc/kimideploy/spec.json`.

Exit codes: 0 done, 1 failed, 2 bad spec or input, 75 interrupted by SIGTERM after a clean flush
(the Job's pod failure policy ignores 75, so the replacement pod resumes where this one stopped).
"""
