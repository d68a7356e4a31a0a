"""The router: learn the task of a prompt, publish per-task policies, decide per request and adapt from feedback."""
